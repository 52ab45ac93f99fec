"""``attnlab explain``: the backend ``attention(..., backend="auto")`` picks for a shape, and why not the others.

    attnlab explain --L 4096 --mask causal --dtype bfloat16
    attnlab explain --L 1 --S 8192 --heads 32 --kv-heads 8 --mask window --window 1024 --grad
    attnlab explain --L 16384 --mask bigbird --block 64 --bias alibi --backend tiled

It prints ``attnlab.explain``'s text for q (B, H, L, D), k (B, Hkv, S, D) and v (B, Hkv, S, Dv) of the
dtype given. The inputs cost no (B, H, L, D) memory: each is one row of zeros expanded to its shape
(stride 0, last stride 1). The rule reads shapes, dtypes, the last dim's stride and the mask, never the
values, so these take the route contiguous tensors of that shape take (tests/test_cli_explain.py checks
it). Masks are built as the library builds them; a mask's tiles may be classified (about 20 bytes per
tile), so a mask's tile grid is bounded (``MAX_TILES``).
"""
from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from typing import Callable

from .util import fail

__all__ = ["add_explain", "MASKS", "BIASES", "MAX_TILES"]

# A mask's tiles at the tiled kernel's classification grid (``tiled_plan.skip_grid``) that explain may
# classify: ~20 bytes each at its peak, so about 1.25 GB at most (L = S = 740k for a window mask).
MAX_TILES = 2 ** 26
MAX_ELEMENTS = 2 ** 26            # a dense mask's L * S bools, a documents mask's S ids
DTYPES = ("float32", "bfloat16", "float16", "float64")


@dataclass(frozen=True)
class MaskKind:
    """A ``--mask`` choice: what it builds from the parsed flags and (L, S, B), and the flags it reads."""
    help: str
    build: Callable[[argparse.Namespace, int, int, int], object]
    flags: tuple[str, ...] = ()


def _masks():
    from .. import masks
    return masks


def _padding(a: argparse.Namespace, L: int, S: int, B: int):
    import torch
    lengths = a.lengths or [max(1, 3 * S // 4)]
    return _masks().padding(torch.tensor(lengths * B if len(lengths) == 1 else lengths))


def _documents(a: argparse.Namespace, L: int, S: int, B: int):
    import torch
    return _masks().documents(torch.arange(S) * a.docs // S)            # (S,) ids of --docs equal documents


MASKS: dict[str, MaskKind] = {
    "none": MaskKind("every query sees every key", lambda a, L, S, B: None),
    "causal": MaskKind("query i sees keys j <= i + S - L (bottom-right aligned)",
                       lambda a, L, S, B: _masks().causal()),
    "window": MaskKind("causal sliding window of W past keys: masks.window(W, 0)",
                       lambda a, L, S, B: _masks().window(a.window, 0), ("--window",)),
    "padding": MaskKind("key padding: example b sees keys j < --lengths[b] (default 3S/4 for every example)",
                        _padding, ("--lengths",)),
    "documents": MaskKind("S split into --docs equal-length packed documents: masks.documents(ids)",
                          _documents, ("--docs",)),
    "strided": MaskKind("Sparse Transformer strided pattern, l = --block: masks.strided(l)",
                        lambda a, L, S, B: _masks().strided(a.block), ("--block",)),
    "fixed": MaskKind("Sparse Transformer fixed pattern, l = --block, c = --summary: masks.fixed(l, c)",
                      lambda a, L, S, B: _masks().fixed(a.block, a.summary), ("--block", "--summary")),
    "dilated": MaskKind("Longformer's one-sided dilated window: masks.dilated_window(W, 0, --dilation)",
                        lambda a, L, S, B: _masks().dilated_window(a.window, 0, a.dilation),
                        ("--window", "--dilation")),
    "global": MaskKind("Longformer window |i - j| <= W/2 (W even) plus global token 0: masks.global_window(W, [0])",
                       lambda a, L, S, B: _masks().global_window(a.window, [0]), ("--window",)),
    "bigbird": MaskKind("BigBird blocks of --block positions, 3 random blocks: masks.bigbird(block, 3)",
                        lambda a, L, S, B: _masks().bigbird(a.block, 3), ("--block",)),
    "dense": MaskKind("the causal pattern as a bool tensor (L, S): a mask auto has to read",
                      lambda a, L, S, B: _masks().causal().dense(L, S)),
}

# defaults of the mask flags, applied only for the masks that read them
_MASK_DEFAULTS = {"window": 256, "block": 64, "summary": 8, "dilation": 2, "docs": 8}


def _bias(kind: str, H: int, L: int, S: int, dtype):
    """The ``--bias`` of that kind for H heads: structured ones hold (H,)-sized tables; a tensor one is
    a row of zeros expanded to (1, H, L, S)."""
    import torch
    if kind == "none":
        return None
    if kind == "alibi":
        from ..positional.alibi import AlibiBias, alibi_slopes
        return AlibiBias(alibi_slopes(H))
    if kind == "t5":
        from ..positional.t5 import T5BucketBias
        return T5BucketBias(torch.zeros(32, H), bidirectional=True, max_distance=128)
    return torch.zeros(1, 1, 1, S, dtype=dtype).expand(1, H, L, S)


BIASES = {"none": "no bias", "alibi": "ALiBi, -slope_h |i - j| (a structured bias)",
          "t5": "T5 relative buckets, 32 buckets (a structured bias)",
          "tensor": "an additive float tensor (1, H, L, S) in q's dtype"}


def _check(a: argparse.Namespace) -> None:
    """ValueError naming the flag for any value no request can have, before anything is built; fills in the
    defaults of the mask flags the chosen mask reads."""
    S = a.L if a.S is None else a.S
    for flag, v in (("--L", a.L), ("--S", S), ("--batch", a.batch), ("--heads", a.heads),
                    ("--kv-heads", a.kv_heads), ("--head-dim", a.head_dim), ("--value-dim", a.value_dim)):
        if v is not None and v < 1:
            raise ValueError(f"{flag} must be >= 1, got {v}")
    if a.kv_heads is not None and a.heads % a.kv_heads:
        raise ValueError(f"--heads {a.heads} is not a multiple of --kv-heads {a.kv_heads}: each group of query "
                         "heads shares one key/value head")
    if not 0.0 <= a.dropout < 1.0:
        raise ValueError(f"--dropout must be in [0, 1), got {a.dropout:g}")
    kind = MASKS[a.mask]
    for flag in ("--window", "--block", "--summary", "--dilation", "--docs", "--lengths"):
        dest = flag[2:]
        if getattr(a, dest) is not None and flag not in kind.flags:
            users = [name for name, k in MASKS.items() if flag in k.flags]
            raise ValueError(f"{flag} is not used by --mask {a.mask} (it is for --mask {', '.join(users)})")
        if getattr(a, dest) is None and dest in _MASK_DEFAULTS:
            setattr(a, dest, _MASK_DEFAULTS[dest])
    _check_mask_flags(a, S)


def _check_mask_flags(a: argparse.Namespace, S: int) -> None:
    for flag, v, low in (("--window", a.window, 0), ("--block", a.block, 1), ("--summary", a.summary, 0),
                         ("--dilation", a.dilation, 1), ("--docs", a.docs, 1)):
        if v < low:
            raise ValueError(f"{flag} must be >= {low}, got {v}")
    if a.mask == "global" and (a.window < 2 or a.window % 2):
        raise ValueError(f"--window must be even and >= 2 for --mask global (|i - j| <= W/2), got {a.window}")
    if a.mask == "fixed" and a.summary > a.block:
        raise ValueError(f"--summary {a.summary} exceeds --block {a.block}: a block of l keys has at most l "
                         "summary keys")
    if a.mask == "documents" and a.docs > S:
        raise ValueError(f"--docs {a.docs} is more documents than the --S {S} keys")
    if a.lengths is not None:
        if len(a.lengths) not in (1, a.batch):
            raise ValueError(f"--lengths takes one length for every example or one per example (--batch "
                             f"{a.batch}), got {len(a.lengths)}")
        if any(not 0 <= n <= S for n in a.lengths):
            raise ValueError(f"--lengths must be in 0..S = {S}, got {' '.join(map(str, a.lengths))}")


def _check_built_size(a: argparse.Namespace, L: int, S: int) -> None:
    """ValueError when the mask itself would be too big to build (a dense mask's L * S, documents' S ids)."""
    n = {"dense": L * S, "documents": S}.get(a.mask, 0)
    if n > MAX_ELEMENTS:
        what = "mask entries (L * S)" if a.mask == "dense" else "document ids (one per key)"
        raise ValueError(f"--mask {a.mask} at --L {L} --S {S} needs {n:,} {what}, over the {MAX_ELEMENTS:,} explain "
                         "builds; give a smaller --L or --S")


def _check_tiles(a: argparse.Namespace, L: int, S: int, mask, dtype) -> None:
    """ValueError when auto might classify more of the mask's tiles than ``MAX_TILES`` (its memory)."""
    from ..functional.backends.tiled_plan import skip_grid
    if mask is None:
        return
    tq, tk = skip_grid(dtype, mask)
    tiles = math.ceil(L / tq) * math.ceil(S / tk)
    if tiles > MAX_TILES:
        raise ValueError(f"--mask {a.mask} at --L {L} --S {S} has {tiles:,} tiles of {tq}x{tk} for auto to "
                         f"classify, over the {MAX_TILES:,} (about {20 * MAX_TILES / 2**30:.1f} GB) explain allows; "
                         "give a smaller --L or --S")


def _inputs(a: argparse.Namespace, L: int, S: int, dtype):
    """q (B, H, L, D), k (B, Hkv, S, D), v (B, Hkv, S, Dv): zeros of one row each, expanded (no memory)."""
    import torch
    Hkv, Dv = a.kv_heads or a.heads, a.value_dim or a.head_dim

    def expanded(*shape):
        row = torch.zeros(1, 1, 1, shape[-1], dtype=dtype, requires_grad=a.grad)
        return row.expand(*shape)                 # strides (0, 0, 0, 1): the route of a contiguous tensor
    return expanded(a.batch, a.heads, L, a.head_dim), expanded(a.batch, Hkv, S, a.head_dim), \
        expanded(a.batch, Hkv, S, Dv)


def explain_text(a: argparse.Namespace) -> str:
    """``attnlab.explain``'s text for the request the parsed flags describe (ValueError naming a flag)."""
    import torch

    from ..functional import explain
    _check(a)
    L, S = a.L, a.L if a.S is None else a.S
    dtype = getattr(torch, a.dtype)
    _check_built_size(a, L, S)
    mask = MASKS[a.mask].build(a, L, S, a.batch)
    _check_tiles(a, L, S, mask, dtype)
    q, k, v = _inputs(a, L, S, dtype)
    return explain(q, k, v, mask=mask, bias=_bias(a.bias, a.heads, L, S, dtype), dropout_p=a.dropout,
                   backend=a.backend)


def _run_explain(args: argparse.Namespace) -> int:
    try:
        text = explain_text(args)
    except ValueError as e:
        return fail(str(e))
    print(text)
    return 0


def add_explain(sub) -> None:
    """Register ``attnlab explain`` on an argparse subparsers object."""
    from ..functional import available_backends
    e = sub.add_parser(
        "explain", help="which attention backend auto picks for a shape, and why not the others",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Print attnlab.explain() for q (B, H, L, D), k and v (B, Hkv, S, D): the backend "
                    "attention(backend='auto')\nruns for this shape, dtype, mask and bias, and why each other "
                    "backend was not picked. Nothing is\ncomputed: the inputs are expanded zeros of that shape.",
        epilog="masks (--mask):\n" + "\n".join(f"  {k:<10} {v.help}" for k, v in MASKS.items())
               + "\nbiases (--bias):\n" + "\n".join(f"  {k:<10} {v}" for k, v in BIASES.items()))
    e.add_argument("--L", type=int, default=1024, help="query length (default 1024)")
    e.add_argument("--S", type=int, help="key/value length (default: --L, self-attention)")
    e.add_argument("--batch", type=int, default=1, help="B (default 1)")
    e.add_argument("--heads", type=int, default=8, help="H, query heads (default 8)")
    e.add_argument("--kv-heads", type=int, help="Hkv, key/value heads dividing --heads (default: --heads; 1: MQA)")
    e.add_argument("--head-dim", type=int, default=64, help="D (default 64)")
    e.add_argument("--value-dim", type=int, help="Dv, v's head dim (default: --head-dim)")
    e.add_argument("--dtype", choices=DTYPES, default="float32", help="default float32")
    e.add_argument("--mask", choices=list(MASKS), default="none", metavar="KIND",
                   help=f"{', '.join(MASKS)} (default none; see below)")
    e.add_argument("--bias", choices=list(BIASES), default="none", help="default none; see below")
    e.add_argument("--grad", action="store_true", help="q, k, v require grad (training: forward and backward)")
    e.add_argument("--dropout", type=float, default=0.0, help="dropout_p on the weights (default 0)")
    e.add_argument("--backend", choices=["auto", *available_backends()], default="auto", metavar="NAME",
                   help=f"also say whether this backend can run it: {', '.join(available_backends())} "
                        "(default auto)")
    p = e.add_argument_group("mask parameters (each only for the masks that read it)")
    p.add_argument("--window", type=int, metavar="W",
                   help="window: W past keys; dilated: W steps back; global: the window width (default 256)")
    p.add_argument("--block", type=int, help="strided and fixed: l; bigbird: the block size (default 64)")
    p.add_argument("--summary", type=int, metavar="C", help="fixed: summary keys per block (default 8)")
    p.add_argument("--dilation", type=int, help="dilated: the step between keys (default 2)")
    p.add_argument("--docs", type=int, help="documents: how many (default 8)")
    p.add_argument("--lengths", type=int, nargs="+", metavar="N",
                   help="padding: the key length of every example, or one per example (default 3S/4)")
    e.set_defaults(run=_run_explain)
