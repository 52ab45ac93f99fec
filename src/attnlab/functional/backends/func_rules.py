"""torch.func support for the hand-written kernels (tiled, sparse): a vmap rule and a grad Function.

The kernels schedule their tiles in Python from the mask (empty tiles skipped, per-example
schedules), so they cannot run on vmap's batched tensors op by op. Their autograd.Functions
therefore use ``setup_context`` (what torch.func requires) and a ``vmap`` staticmethod that runs
the kernel once per vmapped slice (``vmap_by_loop``). The backward is itself an autograd.Function
(``KernelGrad``) with the same rule, so ``jacrev``, ``vjp`` under ``vmap`` and
``gradcheck(check_batched_grad=True)`` (which vmap the backward over many output gradients) work.

Example (inside an autograd.Function)::

    @staticmethod
    def vmap(info, in_dims, *args):
        return vmap_by_loop(MyFunction.apply, info, in_dims, args)
"""
from __future__ import annotations

import re
from typing import Callable

import torch
from torch import Tensor

__all__ = ["vmap_by_loop", "KernelGrad", "kernel_grad", "none_if_empty", "grads_in_input_dtypes",
           "bias_param_grads", "reduce_to"]


def vmap_by_loop(apply: Callable, info, in_dims, args) -> tuple[tuple[Tensor, ...], tuple[int, ...]]:
    """Run ``apply`` on each of the ``info.batch_size`` slices and stack every output along dim 0.

    Arguments with an in_dim of None (unbatched tensors, configuration) are passed as they are.
    The kernels' dropout is counter-based on its seed, so every slice gets the same keep mask
    (vmap's randomness="same").
    """
    if getattr(info, "randomness", "error") == "different":
        raise RuntimeError("the tiled/sparse kernels draw dropout from one seed per call, so every vmapped "
                           "slice gets the same keep mask: use vmap(..., randomness='same') or 'error'")
    outs = []
    for i in range(info.batch_size):
        # a non-tensor argument's in_dims mirror its pytree (a dict of Nones for a config dict)
        sliced = [a.select(d, i) if isinstance(a, Tensor) and isinstance(d, int) else a
                  for a, d in zip(args, in_dims)]
        res = apply(*sliced)
        outs.append(res if isinstance(res, tuple) else (res,))
    stacked = tuple(torch.stack(list(col)) for col in zip(*outs))
    return stacked, (0,) * len(stacked)


def grads_in_input_dtypes(dq, dk, dv, dbias, dparams, q, k, v, bias_t, params) -> tuple[Tensor, ...]:
    """A kernel's gradients in its inputs' dtypes; an absent bias gradient as an empty tensor."""
    return (dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype),
            dbias.to(bias_t.dtype) if dbias is not None else q.new_empty(0),
            *[g.to(p.dtype) for g, p in zip(dparams, params)])


def none_if_empty(t: Tensor):
    """Functions cannot return None from vmap rules: an absent gradient travels as an empty tensor."""
    return None if t.numel() == 0 and t.dim() == 1 else t


def _legacy_vmap_level():
    """The level of the legacy vmap (torch._vmap_internals) running now, or None outside it."""
    if torch.compiler.is_compiling():        # traced code never runs under the legacy vmap; and probing
        return None                          # the nesting while tracing leaked a level (later backward()
    level = torch._C._vmapmode_increment_nesting()      # calls then failed "inside torch.vmap")
    try:
        return level - 1 if level > 1 else None
    finally:
        torch._C._vmapmode_decrement_nesting()


def _is_legacy_batched(t: Tensor) -> bool:
    return re.search(r"\bBatched\b", str(torch._C._dispatch_keys(t))) is not None


class KernelGrad(torch.autograd.Function):
    """The backward pass of a kernel as a Function of its own: ``run(*tensors) -> tuple of tensors``.

    Called from the kernel Function's ``backward`` as ``KernelGrad.apply(run, *tensors)``; it exists so
    that torch.func can vmap the backward (vmap rule: one run per slice). Gradients of the gradient
    (double backward) are refused with a clear message.
    """

    @staticmethod
    def forward(run, *tensors):
        level = _legacy_vmap_level()
        batched = [level is not None and isinstance(t, Tensor) and _is_legacy_batched(t) for t in tensors]
        if not any(batched):
            return run(*tensors)
        # torch.autograd.grad(is_grads_batched=True) -- what gradcheck(check_batched_grad=True) runs --
        # still uses the legacy vmap, which knows no Function vmap rules: unwrap, loop, wrap back.
        phys = [torch._remove_batch_dim(t, level, 1, 0) if b else t for t, b in zip(tensors, batched)]
        n = next(p.shape[0] for p, b in zip(phys, batched) if b)
        outs = [run(*[p[i] if b else p for p, b in zip(phys, batched)]) for i in range(n)]
        return tuple(torch._add_batch_dim(torch.stack(col), 0, level) for col in zip(*outs))

    @staticmethod
    def setup_context(ctx, inputs, output):
        pass

    @staticmethod
    def backward(ctx, *grads):
        raise RuntimeError("double backward (gradients of gradients) through the tiled/sparse kernels is not "
                           "supported: use backend='reference' or 'sdpa' for higher-order derivatives")

    @staticmethod
    def vmap(info, in_dims, run, *tensors):
        return vmap_by_loop(lambda *t: KernelGrad.apply(run, *t), info, in_dims[1:], tensors)


def kernel_grad(run: Callable, *tensors) -> tuple[Tensor, ...]:
    """``KernelGrad.apply(run, *tensors)``; under torch.compile ``run(*tensors)`` itself, traced into the
    backward graph (dynamo cannot trace a Function that takes a function; a compiled graph has no
    torch.func transforms to serve, and refuses double backward itself)."""
    if torch.compiler.is_compiling():
        return run(*tensors)
    return KernelGrad.apply(run, *tensors)


def reduce_to(x: Tensor, shape) -> Tensor:
    """Sum x over the dims where ``shape`` is 1 (undo broadcasting)."""
    dims = [d for d, (a, b) in enumerate(zip(x.shape, shape)) if b == 1 and a != 1]
    return x.sum(dims, keepdim=True) if dims else x


def bias_param_grads(bias_of: Callable[[tuple], Tensor], params: tuple, g: Tensor) -> tuple:
    """Gradients of a structured bias's parameters from one tile: the vector-Jacobian product of
    ``b = bias_of(params)`` with the logits' gradient ``g`` summed down to b's (broadcast) shape.
    An unused parameter gets None (or zeros under torch.compile, which traces ``torch.func.vjp``
    where it cannot trace ``torch.autograd.grad``)."""
    if torch.compiler.is_compiling():
        b, vjp = torch.func.vjp(lambda *p: bias_of(p), *params)
        return vjp(reduce_to(g, b.shape).to(b.dtype))
    with torch.enable_grad():
        leaves = tuple(p.detach().requires_grad_() for p in params)
        b = bias_of(leaves)
        return torch.autograd.grad(b, leaves, reduce_to(g, b.shape).to(b.dtype), allow_unused=True)
