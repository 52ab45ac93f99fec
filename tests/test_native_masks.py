"""The compiled kernel on random masks over many tiles (hypothesis): every mask form and combination, tile sizes
that split the rows into several query tiles and the keys into several chunks, row blocks of 6 cut anywhere, L != S,
GQA, Dv != D, tensor and relative biases, softcap and dropout, in fp32, bf16 and fp16 (computed as fp32); outputs
and every gradient against the fp64 truth.

tests/test_native_tiles.py walks a fixed grid of these; this draws them. What it exercises most is the row bounds
(csrc/microkernel.h ``RowBounds``): per block of 6 rows the products take only the columns the rows may attend, so a
mask whose rows' key ranges differ row by row -- windows, left padding, documents, random intervals -- and a tile
or chunk edge anywhere in them is where a hull off by one would drop or add a key.

The yardstick is the suite's (helpers.errors: 2x the same-dtype reference's error for outputs, 3x for gradients,
plus a floor) with one addition: the ``tiled`` backend's own error where it is larger. The kernel is FlashAttention:
its backward takes delta = rowsum(dO o O), where the reference differentiates through the softmax, and on rows with
one key (S = 1) or a few the two round differently (the reference's dq and dk are exactly 0 there, a FlashAttention
backward's are not). ``tiled``, the same algorithm in PyTorch, rounds the FlashAttention way: the kernel's error may be
a few times the larger of two other exact computations' errors, and is never measured against its own output.
"""
from functools import partial

import pytest
import torch
from hypothesis import given, settings, strategies as st

from attnlab.functional import masks
from attnlab.functional.backends.native import native_attention
from attnlab.functional.backends.tiled import tiled_attention
from attnlab.positional import ALiBi
from helpers import FLOOR, errors

FACTOR = {"out": 2, "dq": 3, "dk": 3, "dv": 3, "dbias": 3}
ROWS = [1, 5, 6, 7, 13, 63, 64, 65, 97, 130, 200, 257]      # around the 6-row blocks and the tiles' edges
KEYS = [1, 15, 16, 17, 33, 100, 129, 200, 260]               # around the 16-key vectors and the chunks' edges
MASK_KINDS = ["none", "causal", "window", "wide window", "padding", "left padding", "documents", "dense",
              "causal & padding", "window & documents", "causal & dense", "intervals"]


def intervals(L: int, S: int, g: torch.Generator) -> torch.Tensor:
    """(L, S) bool: row i may attend an interval of 0-59 keys starting anywhere (empty and one-key rows included)."""
    lo = torch.randint(0, S, (L,), generator=g)
    width = torch.randint(0, 60, (L,), generator=g)
    j = torch.arange(S)
    return (j >= lo[:, None]) & (j < (lo + width)[:, None])


def make_mask(kind: str, B: int, H: int, L: int, S: int, draw, g: torch.Generator):
    lengths = lambda: torch.randint(0, S + 1, (B,), generator=g)         # 0: rows with nothing to attend
    ids = lambda n: torch.sort(torch.randint(0, n, (B, S), generator=g)).values
    return {
        "none": lambda: None,
        "causal": masks.causal,
        "window": lambda: masks.window(draw(st.integers(0, 40)), draw(st.integers(0, 40))),
        "wide window": lambda: masks.window(draw(st.integers(0, 300)), draw(st.sampled_from([0, None, 150]))),
        "padding": lambda: masks.padding(lengths()),
        "left padding": lambda: masks.padding(lengths(), side="left"),
        "documents": lambda: masks.documents(ids(draw(st.integers(1, 6)))),
        "dense": lambda: masks.dense(torch.rand(B, draw(st.sampled_from([1, H])), L, S, generator=g)
                                     > draw(st.floats(0.0, 1.0))),
        "causal & padding": lambda: masks.causal() & masks.padding(lengths()),
        "window & documents": lambda: masks.window(draw(st.integers(0, 50)), draw(st.integers(0, 50)))
        & masks.documents(ids(4)),
        "causal & dense": lambda: masks.causal() & masks.dense(torch.rand(B, 1, L, S, generator=g) > 0.4),
        "intervals": lambda: masks.dense(intervals(L, S, g)[None, None]),
    }[kind]()


@st.composite
def problems(draw):
    """(q, k, v, mask, bias (None, a tensor or "alibi"), the kernel's tile sizes, kwargs for every backend
    (softcap, dropout), a description)."""
    Hkv = draw(st.integers(1, 2))
    B, H = draw(st.integers(1, 2)), Hkv * draw(st.integers(1, 3))
    L = draw(st.sampled_from(ROWS))
    S = L if draw(st.booleans()) else draw(st.sampled_from(KEYS))
    D = draw(st.sampled_from([16, 32, 64, 128]))                 # multiples of 16: the AVX-512 tiles
    Dv = draw(st.sampled_from([16, 64, 128, D]))
    dtype = draw(st.sampled_from([torch.float32, torch.bfloat16, torch.float16]))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    kind = draw(st.sampled_from(MASK_KINDS))
    mask = make_mask(kind, B, H, L, S, draw, g)
    q = torch.randn(B, H, L, D, generator=g) * draw(st.sampled_from([1.0, 3.0]))
    k, v = torch.randn(B, Hkv, S, D, generator=g), torch.randn(B, Hkv, S, Dv, generator=g)
    bias = draw(st.sampled_from([None, "tensor", "alibi"]))
    if bias == "tensor":
        bias = torch.randn(draw(st.sampled_from([1, B])), draw(st.sampled_from([1, H])), L, S, generator=g)
    kw = {}
    if draw(st.integers(0, 5)) == 0:
        kw["softcap"] = draw(st.sampled_from([2.0, 10.0]))
    if draw(st.integers(0, 3)) == 0:
        kw.update(dropout_p=draw(st.sampled_from([0.1, 0.5])), dropout_seed=draw(st.integers(0, 99)))
    tiles = dict(tile_q=draw(st.sampled_from([None, 6, 12, 30, 64, 100])),
                 tile_k=draw(st.sampled_from([None, 16, 32, 48, 128, 256])))
    named = bias if bias is None or isinstance(bias, str) else "tensor"
    what = f"B{B} H{H} Hkv{Hkv} L{L} S{S} D{D} Dv{Dv} {dtype} mask={kind} bias={named} {kw} {tiles}"
    return q.to(dtype), k.to(dtype), v.to(dtype), mask, bias, tiles, kw, what


def judged(problem) -> list[str]:
    """The names whose error is beyond the yardstick (module docstring), with the figures."""
    q, k, v, mask, bias, tiles, kw, _ = problem
    if isinstance(bias, str):                                           # "alibi": made in each dtype
        bias = lambda dtype: ALiBi(q.shape[1]).to(dtype).bias()
    measure = partial(errors, q=q, k=k, v=v, bias=bias, mask=mask, **kw)
    kernel, flash = measure(partial(native_attention, **tiles)), measure(tiled_attention)
    bad = []
    for name, (err, ref) in kernel.items():
        yardstick = max(ref, flash[name][0])
        if not err <= FACTOR[name] * yardstick + FLOOR[q.dtype]:
            bad.append(f"{name}: {err:.2e} vs reference {ref:.2e}, tiled {flash[name][0]:.2e}")
    return bad


@settings(max_examples=60, deadline=None, derandomize=True)
@given(problems())
def test_the_kernel_is_exact_on_random_masks_over_many_tiles(problem):
    bad = judged(problem)
    assert not bad, f"{problem[-1]}: {bad}"


@pytest.mark.slow
@settings(max_examples=400, deadline=None, derandomize=True, database=None)
@given(problems())
def test_the_kernel_is_exact_on_many_more_random_masks(problem):
    bad = judged(problem)
    assert not bad, f"{problem[-1]}: {bad}"
