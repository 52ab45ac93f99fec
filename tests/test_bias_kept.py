"""Structured biases' tables and checks kept across calls (functional/bias.py, ``kept``).

A model builds a new ``AlibiBias`` in every layer of every call over the same slopes; the per-offset table and
the shape check are kept while the params are the same tensors at the same versions, for the classes that name
what their tiles read (``kept_key``). Never a stale value: an in-place edit, a param that requires grad (with
grad on), inference mode, a function bias, ``caching(False)`` and a compiled graph all build afresh.
"""
import pytest
import torch

from attnlab.functional import FunctionBias, attention, mask_plan
from attnlab.functional import bias as bias_mod
from attnlab.positional.alibi import ALiBi, AlibiBias
from attnlab.positional.t5 import T5Bias, T5BucketBias


@pytest.fixture
def builds(monkeypatch):
    """How many tables ``relative_table`` built."""
    count = [0]
    real = bias_mod.relative_table

    def counting(bias, L, S):
        count[0] += 1
        return real(bias, L, S)
    monkeypatch.setattr(bias_mod, "relative_table", counting)
    bias_mod._kept.clear()
    yield count
    bias_mod._kept.clear()


def _qkv(n=48, H=4, dtype=torch.float32, grad=False):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(1, H, n, 16, generator=g, dtype=dtype).requires_grad_(grad) for _ in range(3)]


def _ref(q, k, v, bias):
    return attention(q.double(), k.double(), v.double(), bias=bias, causal=True, backend="reference")


def test_a_new_bias_over_the_same_slopes_reads_the_kept_table(builds):
    alibi = ALiBi(4)
    q, k, v = _qkv()
    outs = [attention(q, k, v, bias=alibi.bias(), causal=True, backend="native") for _ in range(3)]
    assert builds[0] == 1
    with mask_plan.caching(False):                       # the same bits built afresh
        fresh = attention(q, k, v, bias=alibi.bias(), causal=True, backend="native")
    assert builds[0] == 2
    for out in outs:
        assert torch.equal(out, fresh)
    attention(q[:, :, :40], k, v, bias=alibi.bias(), causal=True, backend="native")     # another (L, S)
    assert builds[0] == 3


def test_an_in_place_edit_builds_again(builds):
    alibi = ALiBi(4)
    q, k, v = _qkv()
    attention(q, k, v, bias=alibi.bias(), causal=True, backend="native")
    alibi.slopes.mul_(2.0)                               # a new version of the same tensor
    out = attention(q, k, v, bias=alibi.bias(), causal=True, backend="native")
    assert builds[0] == 2
    assert (out.double() - _ref(q, k, v, alibi.bias())).abs().max() < 1e-5


def test_params_that_need_grad_build_every_call_and_get_their_gradients(builds):
    slopes = torch.tensor([0.5, 0.25, 0.125, 0.0625], requires_grad=True)
    q, k, v = _qkv()
    grads = []
    for _ in range(2):
        out = attention(q, k, v, bias=AlibiBias(slopes), causal=True, backend="native")
        grads.append(torch.autograd.grad(out.sum(), slopes)[0])
    assert builds[0] == 2
    s64 = slopes.detach().double().requires_grad_()
    want = torch.autograd.grad(_ref(q, k, v, AlibiBias(s64)).sum(), s64)[0]
    for g in grads:
        assert (g.double() - want).abs().max() < 1e-4
    with torch.no_grad():                                # no graph to carry: kept
        attention(q, k, v, bias=AlibiBias(slopes), causal=True, backend="native")
        attention(q, k, v, bias=AlibiBias(slopes), causal=True, backend="native")
    assert builds[0] == 3


def test_inference_mode_tables_never_reach_training(builds):
    alibi = ALiBi(4)
    q, k, v = _qkv(grad=True)
    with torch.inference_mode():
        attention(q.detach(), k.detach(), v.detach(), bias=alibi.bias(), causal=True, backend="native")
    out = attention(q, k, v, bias=alibi.bias(), causal=True, backend="native")
    out.sum().backward()                                 # an inference tensor saved for backward would raise
    assert builds[0] == 2 and q.grad is not None


def test_what_is_never_kept(builds, monkeypatch):
    q, k, v = _qkv()
    slopes = torch.tensor([0.5, 0.25, 0.125, 0.0625])
    fb = FunctionBias(lambda i, j, s: -s[:, None, None] * (i - j).abs(), slopes)
    fb.relative = True                                   # a table, but its function may read anything
    for _ in range(2):
        attention(q, k, v, bias=fb, causal=True, backend="native")
    assert builds[0] == 2
    with mask_plan.caching(False):
        for _ in range(2):
            attention(q, k, v, bias=ALiBi(4).bias(), causal=True, backend="native")
    assert builds[0] == 4
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert bias_mod.kept(ALiBi(4).bias(), ("x",), lambda: object()) is not \
        bias_mod.kept(ALiBi(4).bias(), ("x",), lambda: object())


def test_t5_keys_its_settings_not_only_its_table(builds):
    t5 = T5Bias(4, max_distance=64)
    q, k, v = _qkv()
    with torch.no_grad():
        near = attention(q, k, v, bias=t5.bias(), backend="native")
        t5.max_distance = 16                             # same table tensor, other buckets
        far = attention(q, k, v, bias=t5.bias(), backend="native")
        assert builds[0] == 2
        ref = attention(q.double(), k.double(), v.double(), backend="reference",
                        bias=T5BucketBias(t5.table.weight.double(), True, 16))
    assert (far.double() - ref).abs().max() < 1e-5 and not torch.equal(near, far)


def test_bounded_and_dead_params_dropped(builds):
    q, k, v = _qkv(n=8)
    alibi = ALiBi(4)
    for n in range(1, bias_mod.MAX_KEPT + 10):
        attention(q[:, :, :1], k[:, :, :n], v[:, :, :n], bias=alibi.bias(), backend="native")
    assert len(bias_mod._kept) <= bias_mod.MAX_KEPT
    del alibi
    ALiBi(4).bias().check(1, 4, 2, 2)                  # an insert drops the entries of slopes that are gone
    assert len(bias_mod._kept) == 1


def test_a_failed_check_is_not_kept():
    bad = ALiBi(3).bias()                                # 3 heads for a request of 4
    q, k, v = _qkv()
    for _ in range(2):
        with pytest.raises(ValueError, match="do not broadcast"):
            attention(q, k, v, bias=bad)
