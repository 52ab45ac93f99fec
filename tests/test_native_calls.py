"""How the compiled kernel is called: directly where nothing needs its custom op or its setup_context autograd
Function (eager, no transform, no trace, no mode), through them everywhere else -- the same bits either way."""
import pytest
import torch
import torch.autograd.forward_ad as forward_ad
from torch.utils._python_dispatch import TorchDispatchMode

from attnlab.functional import FunctionBias, StructuredBias, attention, masks
from attnlab.functional.backends import native, native_ops
from attnlab.positional import ALiBi, ShawRelative

pytestmark = pytest.mark.skipif(native.why_unavailable() is not None, reason="the kernel is not built")


class Ops(TorchDispatchMode):
    """Records the name of every op dispatched under it (and changes nothing)."""

    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(str(func.overloadpacket))
        return func(*args, **(kwargs or {}))


def inputs(dtype=torch.float32, grad=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(2, 4, 40, 16, generator=g, dtype=dtype).requires_grad_(grad) for _ in range(3)]


def call(q, k, v, **kw):
    return attention(q, k, v, mask=masks.padding(torch.tensor([33, 17])) & masks.causal(), backend="native", **kw)


def refuse(*_args, **_kwargs):
    raise AssertionError("reached the custom op or the setup_context Function")


def test_eager_inference_calls_the_kernel_directly(monkeypatch):
    q, k, v = inputs()
    with Ops() as mode:
        want = call(q, k, v)                                      # under a mode: through the op, which it sees
    assert "attnlab.native_fwd" in mode.names
    monkeypatch.setattr(native_ops, "_fwd", refuse)
    monkeypatch.setattr(native_ops._NativeAttention, "apply", refuse)
    monkeypatch.setattr(native_ops._NativeAttentionEager, "apply", refuse)
    with torch.no_grad():
        assert torch.equal(call(q, k, v), want)
    assert torch.equal(call(q, k, v), want)                       # grad enabled, but no input requires it


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_eager_training_skips_the_op_and_gives_the_same_gradients(monkeypatch, dtype):
    q, k, v = inputs(dtype, grad=True)
    dout = torch.randn(2, 4, 40, 16, generator=torch.Generator().manual_seed(1), dtype=dtype)
    with Ops() as mode:
        out = call(q, k, v)
        want = (out, *torch.autograd.grad(out, (q, k, v), dout))
    assert {"attnlab.native_fwd", "attnlab.native_bwd"} <= set(mode.names)
    monkeypatch.setattr(native_ops, "_fwd", refuse)
    monkeypatch.setattr(native_ops, "_bwd", refuse)
    monkeypatch.setattr(native_ops._NativeAttention, "apply", refuse)
    out = call(q, k, v)
    got = (out, *torch.autograd.grad(out, (q, k, v), dout))
    for a, b in zip(got, want):
        assert a.dtype == b.dtype and torch.equal(a, b)


def test_a_bias_that_requires_grad_takes_the_autograd_function():
    q, k, v = inputs()
    slopes = torch.tensor([0.5, 0.25, 0.125, 0.0625], requires_grad=True)
    bias = FunctionBias(lambda i, j, s: -s[:, None, None] * (i - j).abs(), slopes)
    bias.relative = True
    out = attention(q, k, v, bias=bias, backend="native")
    (grad,) = torch.autograd.grad(out.sum(), slopes)
    ref = attention(q, k, v, bias=bias, backend="reference")
    (want,) = torch.autograd.grad(ref.sum(), slopes)
    torch.testing.assert_close(grad, want, rtol=1e-4, atol=1e-5)


def test_forward_mode_ad_is_refused_not_dropped():
    """A dual input needs no grad, yet the kernel has no forward-mode formula: the direct call would return the
    output without its tangent. It must stay the Function's NotImplementedError."""
    q, k, v = inputs()
    with forward_ad.dual_level():
        dual = forward_ad.make_dual(q, torch.ones_like(q))
        with pytest.raises(NotImplementedError, match="jvp"):
            call(dual, k, v)


def test_vmap_and_jit_trace_still_take_the_op_path():
    q, k, v = inputs()
    causal = dict(mask=masks.causal(), backend="native")
    want = attention(q, k, v, **causal)
    got = torch.vmap(lambda a, b, c: attention(a[None], b[None], c[None], **causal)[0])(q, k, v)
    assert torch.equal(got, want)
    graph = torch.jit.trace(lambda a, b, c: call(a, b, c), (q, k, v))
    assert "_NativeAttention[" in str(graph.graph)                    # the Function, recorded as one node


def test_has_table_builds_no_table_for_a_relative_bias(monkeypatch):
    alibi = ALiBi(4).bias()
    relative = FunctionBias(lambda i, j, s: -s[:, None, None] * (i - j).abs(), torch.ones(4))
    relative.relative = True
    monkeypatch.setattr("attnlab.functional.bias.relative_table", refuse)
    assert relative.has_table(40, 40)
    assert not FunctionBias(lambda i, j: (i * j).float()).has_table(40, 40)
    assert alibi.has_table(40, 40)


def test_has_table_asks_a_subclass_with_its_own_table():
    class Sometimes(StructuredBias):
        def tile(self, i, j):
            return (j - i).float()

        def table(self, L, S):
            return None if L > 8 else (torch.arange(L + S - 1.0)[None, None, None], L - 1)

    assert Sometimes().has_table(8, 8) and not Sometimes().has_table(9, 9)
    q, k, v = inputs()
    with pytest.raises(ValueError, match="has none"):
        attention(q, k, v, bias=Sometimes(), backend="native")
    shaw = ShawRelative(16, 4).bias(q, 40, 40, scale=0.25)
    assert shaw.has_table(40, 40)


def test_fp16_copies_kept_between_calls_never_leak_into_the_next():
    """float16 is converted into float32 buffers kept per thread (csrc/bindings.cpp, `computed`): a later call,
    smaller, larger, strided (an expanded V, a transposed q) or a backward, must see only its own values."""
    g = torch.Generator().manual_seed(3)

    def half(*shape):
        return torch.randn(*shape, generator=g).half()

    calls = [(half(1, 2, 50, 16), half(1, 2, 70, 16), half(1, 2, 70, 16)),
             (half(1, 2, 9, 16), half(1, 2, 12, 16), half(1, 2, 12, 16)),                        # smaller: fits
             (half(2, 30, 4, 16).transpose(1, 2), half(2, 4, 90, 16), half(2, 1, 1, 16).expand(2, 4, 90, 16)),
             (half(1, 2, 50, 16), half(1, 2, 70, 16), half(1, 2, 70, 16))]
    for q, k, v in calls:
        want = attention(q.float(), k.float(), v.float(), mask=masks.causal(), backend="native").half()
        assert torch.equal(attention(q, k, v, mask=masks.causal(), backend="native"), want)
    q, k, v = (t.clone().requires_grad_() for t in calls[2])
    q32, k32, v32 = (t.detach().float().requires_grad_() for t in (q, k, v))
    dout = half(2, 4, 30, 16)
    grads = torch.autograd.grad(attention(q, k, v, backend="native"), (q, k, v), dout)
    want = torch.autograd.grad(attention(q32, k32, v32, backend="native"), (q32, k32, v32), dout.float())
    for a, b in zip(grads, want):
        assert torch.equal(a, b.half())
