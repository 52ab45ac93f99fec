"""Structured additive biases: computed per tile, never materialized as (B, H, L, S).

A structured bias is a function of (query rows, key columns) and a few parameter tensors
(ALiBi slopes, a T5 bucket table, ...). The tiled backend asks it for one tile at a time and,
in the backward pass, pulls the tile's gradient back onto the parameters with autograd.

Example::

    slopes = torch.tensor([0.5, 0.25])                       # one per head
    alibi = FunctionBias(lambda i, j, s: -s[:, None, None] * (i - j).abs(), slopes)
    out = attention(q, k, v, bias=alibi)                     # q: (B, 2, L, D)
"""
from __future__ import annotations

import contextlib
import threading
import weakref
import warnings
from collections import OrderedDict
from typing import Callable, Optional, TypeVar

import torch
from torch import Tensor

from .mask_plan import caching_on

__all__ = ["StructuredBias", "FunctionBias", "relative_table", "kept", "MAX_KEPT"]

T = TypeVar("T")


class StructuredBias:
    """Base class: ``tile`` returns the bias of one tile, broadcastable to (B, H, r1 - r0, c1 - c0).

    ``params`` are the tensors the bias depends on (may require grad). ``tile`` receives the
    absolute query positions ``i`` (lr, 1) -- already shifted by S - L, bottom-right aligned --
    and key positions ``j`` (1, lc), plus the params, and must be differentiable in the params.
    """

    params: tuple[Tensor, ...] = ()
    #: True when the bias depends on (batch, head, j - i) only (ALiBi, T5 buckets): then a per-offset
    #: table of L + S - 1 values is exact, and kernels read it instead of calling ``tile``.
    relative: bool = False

    def kept_key(self) -> Optional[tuple]:
        """Everything ``tile`` reads besides its positions and ``params`` (hashable), for a class that knows it:
        then its table, its check and its values' dtype are kept across calls while the params are the same
        tensors, unchanged (``kept``), and ``auto`` decides once per kind of such a bias (``auto_memo``). None
        (the default, and FunctionBias's: its function may read anything): built and decided per call."""
        return None

    def tile(self, i: Tensor, j: Tensor, *params: Tensor) -> Tensor:
        raise NotImplementedError

    def tile_values(self, r0: int, r1: int, c0: int, c1: int, L: int, S: int,
                    params: tuple[Tensor, ...] | None = None) -> Tensor:
        """The bias on the tile of rows r0:r1 and keys c0:c1, as a (B|1, H|1, lr, lc) tensor (what
        ``Mask.tile`` is for masks; ``tile`` itself is the function of positions a bias defines)."""
        params = self.params if params is None else params
        device = params[0].device if params else None
        return self.at(torch.arange(r0, r1, device=device), torch.arange(c0, c1, device=device), L, S, params)

    def block(self, r0: int, r1: int, c0: int, c1: int, L: int, S: int,
              params: tuple[Tensor, ...] | None = None) -> Tensor:
        """Deprecated name of ``tile_values`` (kernels say "tile"; "block" is a transformer layer)."""
        warnings.warn(f"{type(self).__name__}.block(...) is deprecated: call tile_values(...)", FutureWarning,
                      stacklevel=2)
        return self.tile_values(r0, r1, c0, c1, L, S, params)

    def at(self, rows: Tensor, cols: Tensor, L: int, S: int, params: tuple[Tensor, ...]) -> Tensor:
        """The bias at query rows (lr,) and key columns (lc,) (indices, any order): (B|1, H|1, lr, lc).

        Rows sit at positions rows + S - L (bottom-right); ``masks.aligned`` overrides this to use
        each sequence's own positions.
        """
        b = self.tile(rows[:, None] + (S - L), cols[None, :], *params)   # i (lr, 1), j (1, lc)
        return b.reshape((1,) * (4 - b.dim()) + tuple(b.shape))

    def dense(self, L: int, S: int) -> Tensor:
        """The whole bias (B|1, H|1, L, S), differentiable in ``params``."""
        return self.tile_values(0, L, 0, S, L, S)

    def table(self, L: int, S: int) -> "tuple[Tensor, int] | None":
        """The bias as a small table that kernels index, or None (then only ``tile`` describes it).

        Returns ``(T, c0)`` with T of shape (B|1, H|1, L|1, W) such that the bias of query row i and
        key j is ``T[b, h, i (or 0), clamp(j - i + c0, 0, W - 1)]``, differentiable in ``params``.
        A relative bias gives its per-offset table (W = L + S - 1, one row); Shaw's key term gives
        one row of 2k + 1 clipped offsets per query. O(L + S) or O(L k), never O(L S).
        """
        if not self.relative:
            return None
        return kept(self, ("table", L, S), lambda: relative_table(self, L, S))[:, :, None, :], L - 1

    def has_table(self, L: int, S: int) -> bool:
        """Whether ``table(L, S)`` gives a table, read without building one where the class knows (a relative
        bias; a subclass with its own ``table`` may override this): a backend asks it to accept a request."""
        if type(self).table is StructuredBias.table:
            return self.relative
        return self.table(L, S) is not None

    def distance_slopes(self) -> "Tensor | None":
        """Per-head slopes m (H,) when the bias is exactly -m_h |i - j| (ALiBi), else None.

        Kernels that can compute that form from the slopes alone (the Triton kernel) ask this
        instead of knowing positional schemes by name.
        """
        return None

    def values_dtype(self, L: int, S: int) -> torch.dtype:
        """The dtype of the bias's values, read from a one-pair tile (kept as the table is: ``kept``)."""
        return kept(self, ("dtype", L, S), lambda: self.tile_values(0, min(L, 1), 0, min(S, 1), L, S).dtype)

    def check(self, B: int, H: int, L: int, S: int) -> None:
        kept(self, ("checked", B, H, L, S), lambda: self._check(B, H, L, S))

    def _check(self, B: int, H: int, L: int, S: int) -> bool:
        probe = self.tile_values(0, min(L, 1), 0, min(S, 1), L, S)
        if probe.dim() != 4 or probe.shape[0] not in (1, B) or probe.shape[1] not in (1, H):
            raise ValueError(f"{type(self).__name__} gives tiles of shape {tuple(probe.shape)}, which do not "
                             f"broadcast to (B, H, lr, lc) with B={B}, H={H}")
        return True


class FunctionBias(StructuredBias):
    """A structured bias from a function ``fn(i, j, *params)`` of positions (i: (lr, 1), j: (1, lc))."""

    def __init__(self, fn: Callable[..., Tensor], *params: Tensor):
        self.fn, self.params = fn, tuple(params)

    def tile(self, i, j, *params):
        return self.fn(i, j, *params)

    def __repr__(self):
        return f"FunctionBias({getattr(self.fn, '__name__', 'fn')}, {len(self.params)} params)"


def relative_table(bias: StructuredBias, L: int, S: int) -> Tensor:
    """(B|1, H|1, L + S - 1) values of a relative bias at offsets j - p = -(S - 1) ... L - 1.

    Entry d + S - 1 holds the bias at offset d (so query row i and key j read entry j - i + L - 1).
    The offsets <= 0 are read from the last query's row, the others from the last key's column:
    only positions the mask math already uses. Differentiable in the bias's parameters.
    With L = 0 or S = 0 no pair reads it: zeros of width max(L + S - 1, 0), still tied to the parameters.
    """
    if L == 0 or S == 0:
        # the slices below would ask for rows 0 .. L - 2 or key S - 1, and torch.arange(0, -1) raises
        none = bias.tile_values(0, 0, 0, 0, L, S).sum((-2, -1))          # (B|1, H|1) zeros
        return none[..., None] + none.new_zeros(max(L + S - 1, 0))      # a fresh, contiguous (.., W) table
    last_row = bias.tile_values(L - 1, L, 0, S, L, S)        # (B|1, H|1, 1, S): d = -(S-1) .. 0
    last_col = bias.tile_values(0, L - 1, S - 1, S, L, S)    # (B|1, H|1, L-1, 1): d = L-1 .. 1
    Bb = max(last_row.shape[0], last_col.shape[0])
    Hb = max(last_row.shape[1], last_col.shape[1])
    row = last_row[:, :, 0, :].expand(Bb, Hb, S)
    col = last_col[:, :, :, 0].flip(-1).expand(Bb, Hb, L - 1)
    return torch.cat([row, col], -1)                         # (Bb, Hb, L + S - 1)


#: entries ``kept`` holds (least recently used first out): a decoding loop asks for a new (L, S) at every step
MAX_KEPT = 64
_kept: OrderedDict = OrderedDict()
_lock = threading.Lock()


def kept(bias: StructuredBias, key: tuple, build: Callable[[], T]) -> T:
    """``build()``, remembered for a bias whose class names what its tiles read (``kept_key``), under ``key``
    (the purpose and the sizes), while its params are the same tensors at the same versions.

    A model builds a new bias object in every layer of every call (``ALiBi.bias()``) over the same slopes: the
    per-offset table, the shape check and the values' dtype cost 0.2-0.3 ms a call on the AMD EPYC Zen 3, more
    than the kernel at small n (docs/benchmarks.md, "Issue #27: kept bias tables"). Built afresh instead: inside
    a torch.compile graph, under ``mask_plan.caching(False)``, for inference tensors (no version counter), and
    when a param requires grad with grad mode on (the table must carry this call's graph). The value is shared:
    callers must not modify it.
    """
    config = bias.kept_key()
    params = bias.params
    if (config is None or torch.compiler.is_compiling() or not caching_on()
            or (torch.is_grad_enabled() and any(p.requires_grad for p in params))):
        return build()
    try:
        versions = tuple(p._version for p in params)
    except (RuntimeError, NotImplementedError):        # "Inference tensors do not track version counter"
        return build()
    # inference mode in the key: a table built there is an inference tensor, which autograd may not save
    full = (type(bias), config, tuple(id(p) for p in params), versions, torch.is_inference_mode_enabled(), key)
    entry = _kept.get(full)
    if entry is not None and all(ref() is p for ref, p in zip(entry[0], params)):
        with contextlib.suppress(KeyError):             # another thread may have just evicted it
            _kept.move_to_end(full)
        return entry[1]
    value = build()
    with _lock, contextlib.suppress(KeyError, RuntimeError):     # another thread's move_to_end
        for dead in [k for k, (refs, _) in _kept.items() if any(ref() is None for ref in refs)]:
            del _kept[dead]                             # params that are gone: their ids may be reused
        _kept[full] = (tuple(weakref.ref(p) for p in params), value)
        while len(_kept) > MAX_KEPT:
            _kept.popitem(last=False)
    return value
