"""The triton backend: exact FlashAttention-2 attention as fused Triton GPU kernels.

One forward kernel (online softmax, per-row log-sum-exp saved) and two backward kernels (dk/dv
per key tile, dq per query tile; ``triton_attn_bwd``) run every structured mask and bias of
attnlab without an (L, S) buffer and without a compile step per mask *shape*: the mask's tile
classification is computed on the host (``Mask.tile_kinds``, as for the tiled backend) and passed
as compact tile tables, so EMPTY tiles are never visited and FULL tiles do no masking work.
Kernels are specialized only per mask *kind* (a constexpr bit field), dtype and head dims.

Supported: masks causal, window, padding, documents, dense bool, block layouts (bigbird,
block_sparse), any other ``Mask`` through host-built bitmaps of its partial tiles; additive bias
tensors (broadcastable, with gradient) and relative structured biases (ALiBi, T5: a per-offset
table, O(L + S)); GQA/MQA; Dv != D; D, Dv <= 256; fp16/bf16/fp32 inputs with fp32 accumulation
(fp32 matmuls in full fp32, not TF32); dropout (the same hash as the other backends, so a seed
gives the same mask); fully masked rows give 0 and finite (zero) gradients.

Availability: needs ``triton`` (``pip install 'attnlab[gpu]'``) and CUDA tensors; with
``TRITON_INTERPRET=1`` set before the kernels are first used, Triton's interpreter runs them on
CPU tensors (slowly: for tests).
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from collections import OrderedDict
from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor

from ..bias import StructuredBias
from ..dropout import _mix, new_seed
from ..mask_plan import planned
from ..masks import Mask
from ..memory import check_weights_fit
from ..registry import register_backend
from ..request import AttentionRequest, Bias
from .func_rules import reduce_to as _reduce_to
from .reference import accum_dtype, attention_probs, reference_attention
from .tiled_plan import TileStats
from . import triton_attn_plan as P

__all__ = ["triton_attention", "triton_unavailable", "default_tiles", "Tiles", "prefer_triton"]

LOG2E = 1.4426950408889634
DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MAX_HEAD_DIM = 256
MAX_GRID_Y = 65535           # the kernels launch one program per (tile, b * h): b * h on grid axis 1
# Tile tables of value-described masks (none, causal, windows) by shape: a model calls attention
# with the same mask in every layer and step; rebuilding the tables is host work that grows with n
# and, at long n, is comparable to the kernel itself.
PLAN_CACHE_SIZE = 64
_PLAN_CACHE: "OrderedDict[tuple, tuple]" = OrderedDict()


def _interpret_env() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "yes", "on")


def _kernels():
    """The kernel modules, imported on first use (Triton reads TRITON_INTERPRET at decoration)."""
    fwd = importlib.import_module(".triton_attn_kernels", __package__)
    bwd = importlib.import_module(".triton_attn_bwd", __package__)
    return fwd, bwd


def _interpreted() -> bool:
    """Would the kernels run in the interpreter? Their import decided it, if it happened."""
    mod = sys.modules.get(f"{__package__}.triton_attn_kernels")
    return (mod.INTERPRETED if mod is not None else True) and _interpret_env()


_TRITON_INSTALLED: list[bool] = []        # the answer, once found


@torch.compiler.assume_constant_result
def _triton_installed() -> bool:
    # Asked on every auto dispatch: the import system's search can cost more than a small
    # attention call; packages do not appear in a running process, so the answer is kept.
    # A constant to torch.compile, which would otherwise trace the import system's search
    # (not functools.cache: torch.compile warns that it traces past the cache).
    if not _TRITON_INSTALLED:
        _TRITON_INSTALLED.append(importlib.util.find_spec("triton") is not None)
    return _TRITON_INSTALLED[0]


def triton_unavailable(device: Optional[torch.device] = None) -> Optional[str]:
    """Why the triton backend cannot run here (on ``device``, if given), or None."""
    if not _triton_installed():
        return "the triton package is not installed (pip install 'attnlab[gpu]')"
    if _interpreted():
        return None
    if not torch.cuda.is_available():
        return ("no CUDA device: Triton compiles these kernels for GPUs (set TRITON_INTERPRET=1 before "
                "first use to run them, slowly, on CPU tensors)")
    if device is not None and device.type != "cuda":
        return f"the tensors are on {device}; the triton backend needs CUDA tensors (move them with .cuda())"
    return None


def _unsupported(req: AttentionRequest) -> Optional[str]:
    why = triton_unavailable(req.q.device)
    if why is not None:
        return why
    if req.softcap is not None:
        return (f"softcap={req.softcap}: the triton kernels do not cap scores yet; use backend='tiled' "
                f"(or 'sparse', 'reference')")
    B, H, D, Dv = req.shape.B, req.shape.H, req.shape.D, req.shape.Dv
    if B * H > MAX_GRID_Y:
        return f"B * H = {B * H} programs exceed CUDA's grid limit of {MAX_GRID_Y}: split the batch"
    if req.q.dtype not in DTYPES:
        return (f"the kernels take float16, bfloat16 or float32 inputs, not {req.q.dtype} "
                f"(use backend='tiled' or 'reference' for float64)")
    if max(D, Dv) > MAX_HEAD_DIM:
        return f"head dims D={D}, Dv={Dv} above {MAX_HEAD_DIM} do not fit the kernel's registers"
    if isinstance(req.bias, StructuredBias) and not P.is_relative(req.bias):
        return (f"{type(req.bias).__name__} is not a relative bias: the kernels evaluate a structured bias "
                f"only if it depends on (head, j - i) alone (ALiBi, T5, or a StructuredBias with relative = True); "
                f"use backend='tiled', or pass the bias as a tensor")
    return None


def _pow2(n: int) -> int:
    return max(16, 1 << (max(n, 1) - 1).bit_length())


@dataclass(frozen=True)
class Tiles:
    """One kernel's launch shape: (block_m query rows) x (block_n keys), warps, pipeline stages."""
    block_m: int
    block_n: int
    num_warps: int = 4
    num_stages: int = 2


def default_tiles(dtype: torch.dtype, D: int, Dv: int) -> dict[str, Tiles]:
    """Launch shapes of the forward, dk/dv and dq kernels.

    Chosen so that each kernel compiles for sm_90 without register spills (Triton 3.9's ptxas,
    run through ``triton.compile`` on a machine without a GPU: ``tests/test_triton.py``), after
    the FlashAttention-2 Triton tutorial: wide query tiles for the forward and dq, wide key tiles
    for dk/dv; smaller tiles for fp32 operands (full-precision matmuls) and heads above 128.
    Not yet timed on a GPU (none was available when this was written): a first tuning target.
    """
    d = max(_pow2(D), _pow2(Dv))
    if _interpreted():                        # the interpreter runs programs one by one: few, big ones
        t = Tiles(32, 32)
        return {"fwd": t, "dkdv": t, "dq": t}
    if dtype == torch.float32:
        if d <= 64:
            return {"fwd": Tiles(64, 32, 4), "dkdv": Tiles(16, 64, 8), "dq": Tiles(64, 32, 8)}
        return {"fwd": Tiles(64, 32, 8), "dkdv": Tiles(16, 32, 8), "dq": Tiles(64, 32, 8)}
    if d <= 64:
        return {"fwd": Tiles(128, 64, 4, 3), "dkdv": Tiles(64, 128, 8), "dq": Tiles(128, 64, 8)}
    if d <= 128:
        return {"fwd": Tiles(128, 64, 8, 3), "dkdv": Tiles(16, 128, 8), "dq": Tiles(128, 32, 8)}
    return {"fwd": Tiles(64, 32, 8), "dkdv": Tiles(32, 32, 8), "dq": Tiles(64, 32, 8)}


def _seed_table(seed: Optional[int], p: float, BH: int, device) -> tuple[Tensor, int, float]:
    """(first hash mix per b * H + h, keep threshold, 1 / (1 - p)) of ``dropout.keep_at``."""
    if p <= 0.0:
        return torch.zeros(1, dtype=torch.int64, device=device), 0, 1.0
    seed = new_seed() if seed is None else seed
    bh = torch.arange(BH, dtype=torch.int64)
    return _mix((bh + (seed & 0xFFFFFFFF) * 0x9E37) & 0xFFFFFFFF).to(device), int(p * 2**32), 1.0 / (1.0 - p)


def _strides(t: Tensor) -> list[int]:
    return list(t.stride())


def _launch(kernel, grid, args, kw) -> None:
    """kernel[grid](*args, **kw); where the GPU has less shared memory than the tiles were sized for
    (an H100's 227 KB; an A100 has 164 KB), retry once without software pipelining."""
    try:
        kernel[grid](*args, **kw)
    except Exception as e:
        if type(e).__name__ != "OutOfResources" or kw.get("num_stages", 1) == 1:
            raise
        kernel[grid](*args, **{**kw, "num_stages": 1})


@dataclass
class _Call:
    """One attention call's host-side state, shared by its forward and backward launches."""
    mask: Optional[Mask]
    dims: tuple[int, int, int, int, int, int, int]   # B, H, Hkv, L, S, D, Dv
    device: torch.device
    tiles: dict[str, Tiles]
    scale: float
    bias_kind: int                  # 0 none, 1 a tensor (bias or relative table), 2 ALiBi in-kernel
    relative: bool                  # the bias is a relative table (B|1, H|1, L + S - 1)
    bias_params: Tensor             # [offset, strides] of the bias (zeros without one)
    drop: tuple                     # (per-head seed mixes, keep threshold, 1 / (1 - p))
    dropout: bool
    deterministic: bool
    need_grad: bool                 # keep the fp32 output for the backward's D_i
    ieee: bool                      # fp32 operands: full-precision matmuls (no TF32)
    _plans: dict

    def plan(self, kernel: str) -> tuple[P.TilePlan, P.MaskArgs]:
        """Tile tables and mask arguments at this kernel's tile shape (built once per shape; kept across
        calls: by value for masks fully described by it (none, causal, windows), else with the mask object)."""
        t = self.tiles[kernel]
        B, H, _, L, S, _, _ = self.dims
        key = (t.block_m, t.block_n)
        if key not in self._plans:
            vkey = P.value_key(self.mask)
            ckey = None if vkey is None else (vkey, B, H, L, S, t.block_m, t.block_n, str(self.device))
            if ckey is not None and ckey in _PLAN_CACHE:
                _PLAN_CACHE.move_to_end(ckey)
                self._plans[key] = _PLAN_CACHE[ckey]
            else:
                def build():
                    kinds, margs = P.compile_mask(self.mask, B, H, L, S, t.block_m, t.block_n, self.device)
                    return P.make_tile_plan(kinds, L, S, B, t.block_m, t.block_n, margs.slots, self.device), margs
                # a tensor-valued mask: planned with the mask object (mask_plan: rebuilt if its tensors change)
                self._plans[key] = build() if ckey is not None else \
                    planned(self.mask, ("triton", B, H, L, S, t.block_m, t.block_n, str(self.device)), build)
                if ckey is not None:
                    _PLAN_CACHE[ckey] = self._plans[key]
                    while len(_PLAN_CACHE) > PLAN_CACHE_SIZE:
                        _PLAN_CACHE.popitem(last=False)
        return self._plans[key]

    def args(self, kernel: str, bias_t: Optional[Tensor], cols: bool = False) -> tuple[list, dict]:
        """(positional tail from the tile table on, constexpr and launch keywords) of one kernel."""
        plan, margs = self.plan(kernel)
        B, H, Hkv, L, S, D, Dv = self.dims
        t = self.tiles[kernel]
        table = [plan.col_ptr, plan.col_runs, plan.nk if plan.per_example else 0] if cols else \
                [plan.row_ptr, plan.row_runs, plan.nq if plan.per_example else 0]
        tail = table + [*margs.tensors, margs.params, bias_t if bias_t is not None else self.bias_params,
                        self.bias_params, *self.drop, H, H // Hkv, L, S, D, Dv, self.scale * LOG2E]
        kw = dict(BM=t.block_m, BN=t.block_n, BD=_pow2(D), BDV=_pow2(Dv), MFLAGS=margs.flags,
                  BIAS_KIND=self.bias_kind, DROPOUT=self.dropout, IEEE=self.ieee,
                  num_warps=t.num_warps, num_stages=t.num_stages)
        return tail, kw


class _TritonAttention(torch.autograd.Function):
    """out = attention(q, k, v, bias_t) for the call in ``call``; bias_t: a bias tensor or relative table."""

    @staticmethod
    def forward(ctx, q, k, v, bias_t, call: _Call):
        fwd, _ = _kernels()
        B, H, Hkv, L, S, D, Dv = call.dims
        # The backward pass takes D_i = dO . O from the unrounded fp32 output (as the tiled backend).
        out = q.new_empty(B, H, L, Dv, dtype=torch.float32 if call.need_grad else q.dtype)
        lse = q.new_empty(B, H, L, dtype=torch.float32)
        tail, kw = call.args("fwd", bias_t)
        _launch(fwd.attn_fwd, (call.plan("fwd")[0].nq, B * H),
                (q, k, v, out, lse, *_strides(q), *_strides(k), *_strides(v), *_strides(out), *tail), kw)
        ctx.save_for_backward(q, k, v, bias_t, out, lse)
        ctx.call = call
        return out.to(q.dtype) if out.dtype != q.dtype else out

    @staticmethod
    def backward(ctx, dout):
        _, bwd = _kernels()
        q, k, v, bias_t, out, lse = ctx.saved_tensors
        call: _Call = ctx.call
        B, H, Hkv, L, S, D, Dv = call.dims
        dout = dout.to(q.dtype)
        delta = (dout.float() * out.float()).sum(-1).contiguous()                     # (B, H, L)
        dq = torch.empty(B, H, L, D, dtype=q.dtype, device=q.device)
        dk = torch.empty(B, Hkv, S, D, dtype=k.dtype, device=k.device)
        dv = torch.empty(B, Hkv, S, Dv, dtype=v.dtype, device=v.device)
        want_bias = bias_t is not None and ctx.needs_input_grad[3]
        mode, db, gp = _bias_grad_buffer(bias_t, call, B, H, L, S) if want_bias else (0, lse, call.bias_params)
        strides = (*_strides(q), *_strides(k), *_strides(v), *_strides(dout))
        tail, kw = call.args("dkdv", bias_t, cols=True)
        _launch(bwd.attn_bwd_dkdv, (call.plan("dkdv")[0].nk, B * Hkv),
                (q, k, v, dout, dk, dv, lse, delta, *strides, *tail, call.scale), kw)
        tail, kw = call.args("dq", bias_t)
        _launch(bwd.attn_bwd_dq, (call.plan("dq")[0].nq, B * H),
                (q, k, v, dout, dq, lse, delta, db, gp, *strides, *tail, call.scale), {**kw, "BIAS_GRAD": mode})
        dbias = _finish_bias_grad(db, bias_t, call, mode) if want_bias else None
        return dq, dk, dv, dbias, None


def _bias_grad_buffer(bias_t: Tensor, call: _Call, B: int, H: int, L: int, S: int):
    """(mode, fp32 buffer, its [offset, strides]) for the bias gradient.

    A full (B, H, L, S) bias tensor is written once per entry (mode 1, deterministic). A broadcast
    bias or a relative table is accumulated with atomics (mode 2), or -- ``deterministic=True`` --
    written to a (B, H, L, S) buffer and reduced afterwards (O(B H L S) memory).
    """
    full = not call.relative and tuple(bias_t.shape) == (B, H, L, S)
    if full or call.deterministic:
        db = torch.zeros(B, H, L, S, dtype=torch.float32, device=bias_t.device)
        return 1, db, torch.tensor(P.bias_strides(db, False, L), dtype=torch.int64, device=db.device)
    db = torch.zeros(bias_t.shape, dtype=torch.float32, device=bias_t.device)
    return 2, db, torch.tensor(P.bias_strides(db, call.relative, L), dtype=torch.int64, device=db.device)


def _finish_bias_grad(db: Tensor, bias_t: Tensor, call: _Call, mode: int) -> Tensor:
    if mode == 1 and call.relative:
        db = _reduce_to(P.diagonal_sums(db), bias_t.shape)
    elif mode == 1:
        db = _reduce_to(db, bias_t.shape)
    return db.to(bias_t.dtype)


def prefer_triton(req: AttentionRequest) -> Optional[str]:
    """Why ``auto`` should pick triton for this request, or None (then the usual rule applies).

    Conservative until measured on a GPU: only CUDA requests with a mask or bias, where SDPA would
    need the dense (L, S) mask or bias and compute every pair, and the tiled backend would launch
    many small PyTorch ops per tile. Plain requests (no mask, or causal with L == S) stay with SDPA's
    flash kernel.
    """
    if not req.q.is_cuda or _unsupported(req) is not None or req.return_weights:
        return None
    if req.bias is None and (req.mask is None or (req.is_causal_only and req.shape.L == req.shape.S)):
        return None
    return ("CUDA with a mask or bias: the fused triton kernel skips empty tiles and computes structured masks "
            "and biases in-kernel, where SDPA would need the dense (L, S) mask (rule not yet measured on a GPU)")


@register_backend("triton", unsupported=_unsupported,
                  summary="fused Triton kernels (FlashAttention-2 forward and backward), skips empty mask tiles; CUDA",
                  available=lambda: triton_unavailable() is None)   # listed only where it can run
def triton_attention(q: Tensor, k: Tensor, v: Tensor, *, mask: Optional[Mask] = None,
                     bias: Optional[Bias] = None, scale: float, dropout_p: float = 0.0,
                     dropout_seed: Optional[int] = None, return_weights: bool = False,
                     block_m: Optional[int] = None, block_n: Optional[int] = None,
                     deterministic: bool = False, stats: Optional[TileStats] = None,
                     softcap: Optional[float] = None):
    """Exact attention in fused Triton kernels; O(L + S) memory beyond the inputs and a dense mask.

    Args:
        q: (B, H, L, D); k: (B, Hkv, S, D); v: (B, Hkv, S, Dv); fp16, bf16 or fp32, CUDA tensors
            (CPU tensors under TRITON_INTERPRET=1).
        mask, bias, scale, dropout_p, dropout_seed, return_weights: as for the reference backend;
            a structured bias must be relative (ALiBi, T5).
        block_m, block_n: tile sizes (powers of two >= 16; defaults from ``default_tiles``).
        deterministic: reduce a broadcast bias's gradient without atomics (costs a (B, H, L, S)
            fp32 buffer); dq, dk and dv are always deterministic.
        stats: if given, filled with the tiles computed, masked and skipped.
    Returns:
        out (B, H, L, Dv) in q's dtype; with return_weights also the (B, H, L, S) weights.
    Example:
        q, k, v = (torch.randn(1, 8, 4096, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        out = triton_attention(q, k, v, mask=masks.window(256, 0), scale=0.125)
    """
    if softcap is not None:
        raise ValueError(f"backend 'triton' cannot compute softcap={softcap}: its kernels do not cap scores "
                         f"yet; use backend='tiled' (or 'sparse', 'reference')")
    B, H, L, D = q.shape
    Hkv, S, Dv = k.shape[1], k.shape[2], v.shape[3]
    if L == 0 or S == 0:
        return reference_attention(q, k, v, mask=mask, bias=bias, scale=scale, return_weights=return_weights)
    if return_weights:                  # attention_probs' 3 copies of (B, H, L, S), before the forward
        check_weights_fit("the triton backend", B, H, L, S, accum_dtype(q.dtype), q.device, copies=3)
    tiles = default_tiles(q.dtype, D, Dv)
    if block_m is not None or block_n is not None:
        for name, val in (("block_m", block_m), ("block_n", block_n)):
            if val is not None and (val < 16 or val & (val - 1)):
                raise ValueError(f"{name}={val}: tile sizes must be powers of two >= 16 (tl.dot's minimum)")
        tiles = {kern: Tiles(block_m or t.block_m, block_n or t.block_n, t.num_warps, t.num_stages)
                 for kern, t in tiles.items()}
    kind, bias_t, relative, bp = P.bias_form(bias, L, S)
    bp = torch.tensor(bp, dtype=torch.int64, device=q.device)
    ins = (q, k, v) + ((bias_t,) if bias_t is not None else ())
    call = _Call(mask, (B, H, Hkv, L, S, D, Dv), q.device, tiles, scale, kind, relative, bp,
                 _seed_table(dropout_seed, dropout_p, B * H, q.device), dropout_p > 0.0, deterministic,
                 torch.is_grad_enabled() and any(t.requires_grad for t in ins), q.dtype == torch.float32, {})
    if stats is not None:
        stats.add(call.plan("fwd")[0].stats())
    out = _TritonAttention.apply(q, k, v, bias_t, call)
    if return_weights:
        with torch.no_grad():
            return out, attention_probs(q, k, mask=mask, bias=bias, scale=scale)
    return out


