"""``auto``'s decisions, kept per kind of request: decide once, reuse while nothing it read has changed.

Choosing a backend asks every backend whether it can run the request, reads this machine's profile and
classifies the mask's tiles: 35-70 us per call on the Intel Xeon with AMX (docs/benchmarks.md, issue #29),
paid again by every layer of every step although the answer is the same. ``decided`` remembers the answer
under the request's ``signature``, everything ``auto_rule.pick`` and the backends' ``unsupported`` read from it:

* dtype and sizes (B, H, Hkv, L, S, D, Dv); whether every input's last dim is contiguous (SDPA's kernel);
  whether gradients are wanted; dropout on or off; ``return_weights``; score capping on or off; a tensor
  bias's dtype; a structured bias's class, its ``kept_key`` (what its tiles read besides positions and
  params), whether it is ``relative`` and its params' dtypes, devices, shapes and whether they require
  grad: what the backends read of it (its values' dtype, whether it has a table) follows from these;
* this machine's CPU class, this thread's speed profile (``attnlab tune``; it changes with the thread count
  and the cache directory) and the backend registry's generation (a backend registered later counts);
* the mask, by keeping the decision with the mask (``mask_plan.planned``): an in-place edit of a dense
  mask, a mask that died and whose id was reused, or an inference tensor mean "decide again".

Not kept, decided afresh on every call: requests off the CPU (CUDA's triton rule reads the device),
structured biases without a ``kept_key`` (a FunctionBias: its function may read anything) and anything inside
a ``torch.compile`` graph. ``mask_plan.caching(False)`` turns this off with the plans, and ``forget()``
drops every decision (tests that swap the rules).

Example::

    name, why = decided(req, auto_rule.pick)      # the first call decides; the next of the same kind reads it
"""
from __future__ import annotations

import contextlib
from typing import Callable, Optional

import torch
from .bias import StructuredBias
from .cpu import cpu_class
from .mask_plan import caching_on, planned
from .profile import current_profile
from .registry import registry_generation
from .request import AttentionRequest

__all__ = ["decided", "signature", "forget", "MAX_DECISIONS"]

#: decisions kept for requests without a mask (oldest out first); masks keep theirs (mask_plan.MAX_PLANS)
MAX_DECISIONS = 256
Decision = tuple[str, str]                      # (backend name, why)
_unmasked: dict[tuple, tuple[object, Decision]] = {}
_generation = 0                                 # forget() moves it on: keys of older decisions no longer match


def signature(req: AttentionRequest) -> Optional[tuple]:
    """Everything ``auto`` reads from ``req`` besides its mask, as a hashable key; None where the
    decision must be taken afresh (module docstring)."""
    q, k, v, bias = req.q, req.k, req.v, req.bias
    if not q.is_cpu or torch.compiler.is_compiling():                 # is_cpu: 0.1 us, q.device.type: 0.5
        return None
    if isinstance(bias, StructuredBias):
        config = bias.kept_key()
        if config is None:                                          # its tile may read anything
            return None
        bias_kind = (type(bias), config, bias.relative, tuple((p.dtype, p.device, tuple(p.shape), p.requires_grad)
                                                              for p in bias.params))
    else:
        bias_kind = None if bias is None else bias.dtype            # a tensor: SDPA wants q's dtype
    B, H, L, D = q.shape
    _, Hkv, S, Dv = v.shape
    contiguous = q.stride()[-1] == 1 and k.stride()[-1] == 1 and v.stride()[-1] == 1
    return (_generation, registry_generation(), cpu_class(), q.dtype, B, H, Hkv, L, S, D, Dv, contiguous,
            req.needs_grad, req.dropout_p > 0.0, req.return_weights, req.softcap is None, bias_kind)


def decided(req: AttentionRequest, decide: Callable[[AttentionRequest], Decision]) -> Decision:
    """``decide(req)``, remembered for requests of the same kind (module docstring: when it is reused).

    The profile is part of the key by identity; the entry holds it, so its id cannot pass to another."""
    key = signature(req)
    if key is None:
        return decide(req)
    profile = current_profile()
    key = ("auto", id(profile), *key)
    if req.mask is not None:
        return planned(req.mask, key, lambda: (profile, decide(req)))[1]
    entry = _unmasked.get(key) if caching_on() else None
    if entry is not None:
        return entry[1]
    decision = decide(req)
    if caching_on():
        with contextlib.suppress(KeyError, RuntimeError, StopIteration):    # another thread's eviction
            while len(_unmasked) >= MAX_DECISIONS:
                del _unmasked[next(iter(_unmasked))]
        _unmasked[key] = (profile, decision)
    return decision


def forget() -> None:
    """Drop every kept decision (those kept with masks too: their keys name the old generation)."""
    global _generation
    _generation += 1
    _unmasked.clear()
