"""Shared test inputs: shapes, masks of every kind, and the fp64-gold error comparison."""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch

from attnlab.functional import masks
from attnlab.functional.backends.reference import reference_attention
from attnlab.functional.backends.sdpa import sdpa_attention
from attnlab.functional.backends.native import native_attention
from attnlab.functional.backends.tiled import tiled_attention

MASK_KINDS = ["none", "causal", "padding", "window", "documents", "dense", "fully_masked"]

# Exact backends under test. The tiled kernel runs with tiny tiles here so that every path
# (several row tiles, several spans, empty/partial/full tiles) is exercised on small shapes.
CANDIDATES = {
    "sdpa": sdpa_attention,
    "tiled": partial(tiled_attention, tile_q=8, tile_k=16),
    # the compiled kernel, with tiles small enough that every row kind and chunk boundary occurs
    "native": partial(native_attention, tile_q=8, tile_k=16),
}

# Absolute error floor per dtype, for cases where the same-dtype reference happens to be exact.
FLOOR = {torch.float64: 1e-12, torch.float32: 1e-6, torch.bfloat16: 1e-3, torch.float16: 1e-4}


@dataclass(frozen=True)
class Case:
    B: int
    H: int
    Hkv: int
    L: int
    S: int
    D: int
    Dv: int
    noncontig: bool = False
    bias: bool = False

    def __str__(self):
        extra = ("-nc" if self.noncontig else "") + ("-bias" if self.bias else "")
        return f"B{self.B}H{self.H}kv{self.Hkv}L{self.L}S{self.S}D{self.D}Dv{self.Dv}{extra}"


# Awkward shapes: decode (L=1), odd lengths, L<S and L>S, D=40, Dv != D, MHA/GQA/MQA, strided inputs.
CASES = [
    Case(2, 4, 4, 1, 33, 16, 16),
    Case(2, 4, 2, 17, 17, 40, 40, bias=True),
    Case(1, 4, 1, 13, 29, 16, 24),
    Case(2, 6, 3, 29, 13, 8, 8, bias=True),
    Case(2, 4, 4, 35, 35, 16, 16, noncontig=True),
    Case(1, 2, 1, 40, 70, 32, 16, noncontig=True, bias=True),
]


def make_inputs(case: Case, dtype: torch.dtype, seed: int = 0):
    """q, k, v (and bias or None) as leaf tensors of ``dtype``; non-contiguous when asked."""
    g = torch.Generator().manual_seed(seed)
    c = case

    def rnd(*shape):
        if c.noncontig:   # build (.., D, n) and transpose: same values layout, non-unit last stride
            t = torch.randn(*shape[:-2], shape[-1], shape[-2], generator=g).transpose(-1, -2)
        else:
            t = torch.randn(*shape, generator=g)
        return t.to(dtype)

    q, k, v = rnd(c.B, c.H, c.L, c.D), rnd(c.B, c.Hkv, c.S, c.D), rnd(c.B, c.Hkv, c.S, c.Dv)
    bias = torch.randn(1, c.H, c.L, c.S, generator=g).to(dtype) if c.bias else None
    return q, k, v, bias


def make_mask(kind: str, B: int, H: int, L: int, S: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed + 1)
    if kind == "none":
        return None
    if kind == "causal":
        return masks.causal()
    if kind == "padding":
        return masks.padding(torch.tensor([S, (S + 1) // 2, 1][:B]))
    if kind == "window":
        return masks.window(3, 2)
    if kind == "documents":
        cuts = torch.sort(torch.randint(0, S + 1, (B, 3), generator=g)).values
        ids = (torch.arange(S)[None, None, :] >= cuts[:, :, None]).sum(1)      # (B, S) sorted doc ids
        return masks.documents(ids)
    if kind == "dense":
        return masks.dense(torch.rand(B, H, L, S, generator=g) > 0.4)
    if kind == "fully_masked":
        m = torch.rand(B, H, L, S, generator=g) > 0.4
        m[:, :, 0] = False
        m[:, :, L // 2] = False
        return masks.dense(m)
    raise ValueError(kind)


def errors(fn, q, k, v, bias, mask, scale=None, seed=0, dout=None, grad=True, **kw):
    """Max abs errors of ``fn`` and of the same-dtype reference, both against the fp64 reference.

    ``fn`` gets q, k, v, bias (and ``dout``, the incoming gradient; random by default) in the layout
    given; the two references get row-major copies of the same values, so a layout the reference
    mishandled could not hide in its own yardstick (tests/test_layouts.py). ``grad=False``: outputs
    only, no tensor requires grad. ``kw`` (softcap, dropout_p, dropout_seed...) goes to all three.
    ``bias`` may also be a structured bias's maker, ``dtype -> bias`` (``lambda dt: ALiBi(H).to(dt).bias()``):
    each of the three gets it in its own dtype, and there is no dbias.
    Returns {name: (candidate_err, reference_err)} for out, dq, dk, dv (and dbias).
    """
    made = callable(bias) and not isinstance(bias, torch.Tensor)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    if dout is None:
        g = torch.Generator().manual_seed(seed + 7)
        dout = torch.randn(q.shape[:-1] + (v.shape[-1],), generator=g)

    def run(f, dtype, as_given=False):
        # a fresh row-major copy: .to() keeps a same-dtype view, and .contiguous() a size-1 dim's odd stride
        lay = (lambda t: t) if as_given else (lambda t: t.clone(memory_format=torch.contiguous_format))
        leaves = [lay(t.detach().to(dtype)).requires_grad_(grad) if t is not None else None
                  for t in (q, k, v, None if made else bias)]
        out = f(*leaves[:3], mask=mask, bias=bias(dtype) if made else leaves[3], scale=scale, **kw)
        if grad:
            out.backward(lay(dout.to(out.dtype)))
        return [out.detach()] + [t.grad if t is not None else None for t in leaves]

    gold = run(reference_attention, torch.float64)
    ref = run(reference_attention, q.dtype)
    cand = run(fn, q.dtype, as_given=True)
    names = ["out", "dq", "dk", "dv", "dbias"]
    result = {}
    for name, g64, r, c in zip(names, gold, ref, cand):
        if g64 is None:
            continue
        assert c.dtype == r.dtype and c.shape == r.shape, \
            f"{name}: {c.dtype}{tuple(c.shape)} vs {r.dtype}{tuple(r.shape)}"
        assert torch.isfinite(c).all(), f"{name} has non-finite values"
        result[name] = ((c.double() - g64).abs().max().item(), (r.double() - g64).abs().max().item())
    return result


def check_dropout_equals_reference(kernel, q, k, v, **kw):
    """``kernel(q, k, v, **kw)`` (with a dropout_seed) equals the reference for that seed, output and q/k/v
    gradients, and the next seed gives a different output."""
    out, ref = kernel(q, k, v, **kw), reference_attention(q, k, v, **kw)
    torch.testing.assert_close(out, ref)
    g = torch.randn_like(out)
    for a, b in zip(torch.autograd.grad(out, (q, k, v), g), torch.autograd.grad(ref, (q, k, v), g)):
        torch.testing.assert_close(a, b)
    assert not torch.allclose(out, kernel(q, k, v, **{**kw, "dropout_seed": kw["dropout_seed"] + 1}))
