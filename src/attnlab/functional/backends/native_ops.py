"""The compiled kernel as torch sees it: two ``torch.library`` custom ops (forward, backward) with fake (meta)
kernels and vmap rules, the autograd Function that ties them together, and ``run_forward``, which calls the
kernel directly wherever none of that machinery has anything to do (eager, no transform, no trace, no mode).

``torch.compile`` sees one opaque node per op, ``torch.func`` (grad, vjp, jacrev, vmap) composes with the
Function, and batched gradcheck works; in eager mode the same kernel call skips 0.2 ms of Python per call
(docs/design.md, "Called directly where nothing needs the op"). ``native.py`` prepares the arguments.

Example::

    out, lse = run_forward(q, k, v, None, None, None, (0, 0, 0, 0.125, 0.0, 0.0, 0, 256, 512))   # no mask or bias
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.autograd.forward_ad as _forward_ad
from torch import Tensor

from . import native_build
from .reference import accum_dtype

__all__ = ["run_forward", "backward_op", "kernel", "ISA", "WHY_ISA"]

# One module per instruction-set level (native_build.py); when none loads, every other backend still works.
kernel, ISA, WHY_ISA = native_build.load()


def run_forward(q: Tensor, k: Tensor, v: Tensor, bias: Optional[Tensor], spans: Optional[Tensor],
                bits: Optional[Tensor], args: tuple) -> tuple[Tensor, Tensor]:
    """(out, lse) of the compiled forward, differentiable in q, k, v and a tensor bias: the kernel itself where
    autograd records nothing and ``_direct`` holds, the older-form Function in eager training, else the
    setup_context Function and the custom ops. ``args``: (bias_kind, tW, tc0, scale, softcap, dropout_p, seed,
    tile_q, tile_k). out is in float32 for float16 inputs (the caller rounds it)."""
    direct = _direct(q, k, v, bias)
    if direct and not _records_grad(q, k, v, bias):         # nothing for autograd: the kernel itself
        return _kernel_forward(q, k, v, spans, bits, args[0], bias, *args[1:])
    function = _NativeAttentionEager if direct else _NativeAttention
    return function.apply(q, k, v, bias, spans, bits, args)


def _no_grad(t: Optional[Tensor]) -> Optional[Tensor]:
    """Detached if it requires grad (the ops' own generated autograd must never run; no double backward)."""
    return t.detach() if t is not None and t.requires_grad else t


def _contiguous(t: Optional[Tensor]) -> Optional[Tensor]:
    return t if t is None else t.contiguous()


@torch.library.custom_op("attnlab::native_fwd", mutates_args=())
def _fwd(q: Tensor, k: Tensor, v: Tensor, spans: Optional[Tensor], bits: Optional[Tensor], bias_kind: int,
         bias: Optional[Tensor], tW: int, tc0: int, scale: float, softcap: float, dropout_p: float, seed: int,
         tile_q: int, tile_k: int) -> tuple[Tensor, Tensor]:
    return _kernel_forward(q, k, v, spans, bits, bias_kind, bias, tW, tc0, scale, softcap, dropout_p, seed,
                           tile_q, tile_k)


def _kernel_forward(q, k, v, spans, bits, bias_kind, bias, tW, tc0, scale, softcap, dropout_p, seed, tile_q,
                    tile_k) -> tuple[Tensor, Tensor]:
    """The compiled forward itself: the custom op's body, and what ``run_forward`` calls when nothing needs the
    op (``_direct``)."""
    out, lse = kernel.forward(q, k, v, _contiguous(spans), _contiguous(bits), bias_kind, bias, tW, tc0, scale,
                              softcap, dropout_p, seed, tile_q, tile_k)
    return out, lse                 # a tuple (the binding returns a list, which autograd.Function would not track)


def _computed(dtype: torch.dtype) -> torch.dtype:
    """The dtype the kernel computes and returns its output in: float32 for float16 (native._DTYPES), else dtype."""
    return torch.float32 if dtype == torch.float16 else dtype


@_fwd.register_fake
def _(q, k, v, spans, bits, bias_kind, bias, tW, tc0, scale, softcap, dropout_p, seed, tile_q, tile_k):
    B, H, L, _ = q.shape
    return q.new_empty(B, H, L, v.shape[3], dtype=_computed(q.dtype)), q.new_empty(B, H, L, dtype=accum_dtype(q.dtype))


@torch.library.custom_op("attnlab::native_bwd", mutates_args=())
def _bwd(q: Tensor, k: Tensor, v: Tensor, dout: Tensor, lse: Tensor, delta: Tensor, spans: Optional[Tensor],
         bits: Optional[Tensor], bias_kind: int, bias: Optional[Tensor], tW: int, tc0: int, scale: float,
         softcap: float, dropout_p: float, seed: int, tile_q: int, tile_k: int,
         want_dbias: bool) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    return _kernel_backward(q, k, v, dout, lse, delta, spans, bits, bias_kind, bias, tW, tc0, scale, softcap,
                            dropout_p, seed, tile_q, tile_k, want_dbias)


def _kernel_backward(q, k, v, dout, lse, delta, spans, bits, bias_kind, bias, tW, tc0, scale, softcap, dropout_p,
                     seed, tile_q, tile_k, want_dbias) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The compiled backward itself: the custom op's body, called directly where nothing needs the op."""
    lse, delta, spans, bits = _contiguous(lse), _contiguous(delta), _contiguous(spans), _contiguous(bits)
    dq, dk, dv, dbias = kernel.backward(q, k, v, dout, lse, delta, spans, bits, bias_kind, bias, tW, tc0, scale,
                                        softcap, dropout_p, seed, tile_q, tile_k, want_dbias)
    return dq, dk, dv, dbias if dbias is not None else q.new_empty(0, dtype=dq.dtype)


@_bwd.register_fake
def _(q, k, v, dout, lse, delta, spans, bits, bias_kind, bias, tW, tc0, scale, softcap, dropout_p, seed,
      tile_q, tile_k, want_dbias):
    B, H, L, D = q.shape
    S, acc = k.shape[2], accum_dtype(q.dtype)
    if want_dbias and bias_kind == 1:
        db = q.new_empty(B, H, L, S, dtype=acc)
    elif want_dbias and bias_kind == 2:
        db = q.new_empty(B, H, bias.shape[2], tW, dtype=acc)
    else:
        db = q.new_empty(0, dtype=acc)
    return (q.new_empty(B, H, L, D, dtype=acc), q.new_empty(B, H, S, D, dtype=acc),
            q.new_empty(B, H, S, v.shape[3], dtype=acc), db)


def _fold(x: Optional[Tensor], d: Optional[int], n: int, B: int, broadcast_ok: bool) -> Optional[Tensor]:
    """Fold a vmapped dim into the batch: (n at dim d, b0, ...) -> (n * B, ...).

    Tensors whose batch may broadcast (mask spans/bits, biases, b0 == 1) stay unfolded when vmap
    does not touch them; q, k, v (and unbatched per-example tensors) are repeated n times.
    """
    if x is None or x.dim() == 0 or (x.dim() == 1 and x.numel() == 0):
        return x
    if d is None:
        if broadcast_ok and x.shape[0] == 1:
            return x
        return x.expand(n, *x.shape).reshape(n * x.shape[0], *x.shape[1:])
    y = x.movedim(d, 0)                                            # (n, b0, ...)
    if y.shape[1] == 1 and B > 1:
        y = y.expand(n, B, *y.shape[2:])
    return y.reshape(n * y.shape[1], *y.shape[2:])


def _batch_of(x: Tensor, d: Optional[int]) -> int:
    return x.shape[0] if d is None else x.movedim(d, 0).shape[1]


@_fwd.register_vmap
def _fwd_vmap(info, in_dims, q, k, v, spans, bits, bias_kind, bias, tW, tc0, scale, softcap, dropout_p, seed,
              tile_q, tile_k):
    n, B = info.batch_size, _batch_of(q, in_dims[0])
    qf, kf, vf = (_fold(t, d, n, B, False) for t, d in zip((q, k, v), in_dims[:3]))
    sf, bf = _fold(spans, in_dims[3], n, B, True), _fold(bits, in_dims[4], n, B, True)
    biasf = _fold(bias, in_dims[6], n, B, True)
    out, lse = _fwd(qf, kf, vf, sf, bf, bias_kind, biasf, tW, tc0, scale, softcap, dropout_p, seed, tile_q, tile_k)
    return (out.unflatten(0, (n, B)), lse.unflatten(0, (n, B))), (0, 0)


@_bwd.register_vmap
def _bwd_vmap(info, in_dims, q, k, v, dout, lse, delta, spans, bits, bias_kind, bias, tW, tc0, scale, softcap,
              dropout_p, seed, tile_q, tile_k, want_dbias):
    n, B = info.batch_size, _batch_of(q, in_dims[0])
    folded = [_fold(t, d, n, B, False) for t, d in zip((q, k, v, dout, lse, delta), in_dims[:6])]
    sf, bf = _fold(spans, in_dims[6], n, B, True), _fold(bits, in_dims[7], n, B, True)
    biasf = _fold(bias, in_dims[9], n, B, True)
    dq, dk, dv, db = _bwd(*folded, sf, bf, bias_kind, biasf, tW, tc0, scale, softcap, dropout_p, seed,
                          tile_q, tile_k, want_dbias)
    db_dim = 0 if db.numel() else None
    return ((dq.unflatten(0, (n, B)), dk.unflatten(0, (n, B)), dv.unflatten(0, (n, B)),
             db.unflatten(0, (n, B)) if db_dim == 0 else db), (0, 0, 0, db_dim))


class _NativeAttention(torch.autograd.Function):
    """Autograd around the two custom ops; forward/setup_context split and a generated vmap rule,
    so torch.func (grad, vjp, jacrev, vmap) composes with it (the ops carry their own vmap rules)."""

    generate_vmap_rule = True

    @staticmethod
    def forward(q, k, v, bias, spans, bits, args):
        bias_kind, tW, tc0, scale, softcap, dropout_p, seed, bq, bk = args
        # detached: the op's own (generated) autograd path must stay out of torch.func's way; this
        # Function is the one autograd formula
        q, k, v, bias = (_no_grad(t) for t in (q, k, v, bias))
        fwd = _kernel_forward if _direct(q, k, v, bias) else _fwd
        return fwd(q, k, v, spans, bits, bias_kind, bias, tW, tc0, scale, softcap, dropout_p, seed, bq, bk)

    @staticmethod
    def setup_context(ctx, inputs, output):
        q, k, v, bias, spans, bits, args = inputs
        out, lse = output
        ctx.save_for_backward(q, k, v, bias, spans, bits, out, lse)
        ctx.args = args
        ctx.mark_non_differentiable(lse)

    @staticmethod
    def backward(ctx, dout, _dlse):
        q, k, v, bias, spans, bits, out, lse = ctx.saved_tensors
        bias_kind, tW, tc0, scale, softcap, dropout_p, seed, bq, bk = ctx.args
        acc = accum_dtype(q.dtype)
        delta = (dout.to(acc) * out.to(acc)).sum(-1)                   # (B, H, L) rowsum(dO o O)
        want_dbias = bias is not None and ctx.needs_input_grad[3]
        # fp16: out and dout arrive in float32 (the output is rounded outside this Function); dout was an fp16 value
        dout = dout.to(q.dtype)
        q, k, v, bias, dout, delta = (_no_grad(t) for t in (q, k, v, bias, dout, delta))
        bwd = _kernel_backward if _direct(q, k, v, bias, dout) else _bwd
        dq, dk, dv, dbias = bwd(q, k, v, dout, lse, delta, spans, bits, bias_kind, bias, tW, tc0,
                                scale, softcap, dropout_p, seed, bq, bk, want_dbias)
        B, Hkv, S = k.shape[:3]
        H = q.shape[1]
        if H != Hkv:                                                   # sum each GQA group onto its kv head
            dk = dk.reshape(B, Hkv, H // Hkv, S, -1).sum(2)
            dv = dv.reshape(B, Hkv, H // Hkv, S, -1).sum(2)
        db = dbias.sum_to_size(bias.shape).to(bias.dtype) if want_dbias else None
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), db, None, None, None


class _NativeAttentionEager(torch.autograd.Function):
    """``_NativeAttention`` in the older form (``forward(ctx, ...)``), for calls that need no torch.func transform
    or trace (``_direct``): torch binds a setup_context Function's arguments with ``inspect`` on every call, 60 us
    of a 64-token training step's 0.6 ms. The same forward, context and backward."""

    @staticmethod
    def forward(ctx, *inputs):
        output = _NativeAttention.forward(*inputs)
        _NativeAttention.setup_context(ctx, inputs, output)
        return output

    backward = staticmethod(_NativeAttention.backward)


_legacy_batched = torch._C._functorch.is_legacy_batchedtensor


def _records_grad(q: Tensor, k: Tensor, v: Tensor, bias: Optional[Tensor]) -> bool:
    """Will autograd record this call? Where not (and ``_direct`` holds), the forward calls the kernel past the
    autograd Function too: the Function and the custom op cost 0.2 ms a call from Python, 2-3x the kernel's own
    time on a 64-token request (docs/benchmarks.md, "Issue #27: small requests")."""
    return torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad
                                        or (bias is not None and bias.requires_grad))


def _direct(*tensors: Optional[Tensor]) -> bool:
    """May the compiled kernel be called directly instead of through its custom op (the same call, the same
    bits)? Yes when the op has nothing to do. Not under a torch.func transform (vmap, grad), a torch.compile or
    jit trace, a forward-mode AD level (a dual tensor's tangent would be dropped), a Python dispatch or function
    mode (FlopCounterMode, FakeTensorMode); not for a tensor subclass or a batched tensor of the older vmap
    (``torch._vmap_internals``, which gradcheck's batched check uses and no global flag shows)."""
    if torch.compiler.is_compiling() or torch.jit.is_tracing():    # first: a trace must not reach the checks below
        return False
    for t in tensors:
        if t is not None and (type(t) is not Tensor or _legacy_batched(t)):
            return False
    return (not torch._C._are_functorch_transforms_active()
            and _forward_ad._current_level < 0           # a dual level: the Function refuses forward AD, loudly
            and torch._C._len_torch_dispatch_stack() == 0 and not torch._C._is_torch_function_mode_enabled())


backward_op = _bwd           # ring attention's per-block backward (native.native_block_backward)
