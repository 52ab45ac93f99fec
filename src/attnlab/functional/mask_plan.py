"""Plan once, run many: what the kernels derive from a mask, built on first use and kept with the mask.

Every backend turns a ``Mask`` into a table before it runs: the tiled kernel its row tiles and key
spans (``tiled_plan.make_plan``), the sparse kernel its chunks (``sparse_layout.make_layout``), the
compiled kernel its row intervals and bit-packed rest (``native.mask_args``), the sdpa backend the dense
bool mask it hands torch, the triton kernel its tile tables, ``auto`` the share of tiles it could skip
(``auto_rule.skippable``). Each is a pure function of the mask and the problem's sizes,
so ``planned`` remembers it with the mask: a model that passes one mask object to every layer (the
stacks in ``nn.blocks`` do) plans in its first layer and reads the plan in the others, and a loop that
keeps one mask (a causal model's, at a fixed length) plans once for the whole run.

The comparison is FlexAttention's ``BlockMask``: built once by ``create_block_mask`` and passed to every
call, it makes the plan a value the user holds. Here the plan rides on the mask the user already holds,
so no call site changes; ``planned(..., build)`` is the one door, and ``caching(False)`` turns it off,
auto's kept decisions with it (``auto_memo.py``; the benchmark's "today's code" side, ``attnlab bench --plan``).

A plan is reused only while the mask is what it was. The key names the mask's parts by identity (an
``&`` built afresh in each layer from the same parts still shares; the plans live on its first part
that holds tensors, the per-batch data, so they go when the batch goes), and each entry keeps weak
references to those parts and to their tensors with each tensor's version counter: a tensor edited in
place, a part that died and whose id was reused, or an inference tensor (which has no version counter)
all mean "build again", never a stale plan. Plans are never built inside a ``torch.compile`` graph
(the backends plan statically there). At most ``MAX_PLANS`` entries per mask, least recently used first
out (a decode loop asks for a new (L, S) at every step); entries whose parts are gone are dropped.

A tensor the caller passes again and again, rather than a mask (a bool mask given as ``mask=t``, torch's masks
given to ``nn.MultiheadAttention``), keeps what is made from it the same way, with the tensor object:
``kept_for`` (``masks.dense(t)`` is one mask per live tensor, so its plans are kept with that mask).

Example::

    m = masks.causal() & masks.padding(lengths)
    for layer in layers:                 # the first call plans, the others reuse it
        x = layer(x, mask=m)
    value = planned(m, ("mine", L, S), lambda: expensive(m, L, S))   # a backend's own table
"""
from __future__ import annotations

import contextlib
import functools
import threading
import weakref
from collections import OrderedDict
from typing import Callable, Iterator, Optional, TypeVar

import torch
from torch import Tensor

from .mask_base import PLANS_ATTR as _ATTR
from .mask_base import Mask, parts

__all__ = ["planned", "caching", "caching_on", "plan_count", "MAX_PLANS", "kept_for"]

T = TypeVar("T")

#: entries kept per mask (least recently used first out)
MAX_PLANS = 16


class _State(threading.local):
    enabled = True          # a class default: reading it never raises (a missing attribute's getattr costs 0.6 us)


_state = _State()


@contextlib.contextmanager
def caching(enabled: bool) -> Iterator[None]:
    """Within the ``with`` body (this thread), ``planned`` keeps and reuses plans (True, the default) or
    builds every one afresh (False: what every call did before plans were kept)."""
    outer = _state.enabled
    _state.enabled = bool(enabled)
    try:
        yield
    finally:
        _state.enabled = outer


def caching_on() -> bool:
    """Whether this thread keeps plans now (``caching``): also read by ``auto_memo`` for auto's decisions."""
    return _state.enabled


def planned(mask: Optional[Mask], key: tuple, build: Callable[[], T]) -> T:
    """``build()``, remembered with ``mask`` under ``key`` (module docstring: when it is reused).

    ``key`` must name everything besides the mask that ``build`` reads (the purpose, L, S, tile sizes,
    batch size, device...). The value is shared: callers must not modify it.
    """
    if mask is None or not _state.enabled or torch.compiler.is_compiling():
        return build()
    leaves = parts(mask)
    stamp = _stamp(leaves)
    memo = _memo(_owner(stamp)) if stamp is not None else None
    if memo is None:
        return build()
    full_key = (key, tuple(map(id, leaves)))
    entry = memo.get(full_key)
    if entry is not None and _same(entry[0], stamp):
        try:
            memo.move_to_end(full_key)
        except KeyError:                              # another thread may have just evicted it
            pass
        return entry[1]
    value = build()
    try:
        refs = _refs(stamp)
    except TypeError:                                # a part without weak references: nothing is kept
        return value
    with contextlib.suppress(KeyError, RuntimeError):     # another thread's change to the same plans
        for dead in [k for k, (kept, _) in memo.items() if not _alive(kept)]:
            del memo[dead]                           # plans for parts that are gone cannot match again
        memo[full_key] = (refs, value)
        memo.move_to_end(full_key)
        while len(memo) > MAX_PLANS:
            memo.popitem(last=False)
    return value


def plan_count(mask: Mask) -> int:
    """How many plans ``mask``'s owner holds (tests, and the benchmark's check that plans were kept)."""
    stamp = _stamp(parts(mask))
    memo = None if stamp is None else getattr(_owner(stamp), _ATTR, None)
    return 0 if memo is None else len(memo)


def _owner(stamp: tuple) -> Mask:
    """The part that keeps the plans of an ``&``: the first that holds tensors (per-batch data, such as
    padding lengths or document ids: its plans die with it), else the first (causal, windows)."""
    for leaf, tensors in stamp:
        if tensors:
            return leaf
    return stamp[0][0]


def _memo(owner: Mask) -> Optional[OrderedDict]:
    """The owner's plans, or None when it cannot hold attributes (a ``__slots__`` class): then nothing is
    kept."""
    memo = owner.__dict__.get(_ATTR) if hasattr(owner, "__dict__") else None
    if memo is None:
        try:
            memo = OrderedDict()
            setattr(owner, _ATTR, memo)
        except AttributeError:
            return None
    return memo


def _stamp(leaves: list[Mask]) -> Optional[tuple]:
    """Per part: (the part, ((tensor, version), ...) of every tensor it holds), or None when a tensor has
    no version counter (inference tensors) or a tensor hides where it cannot be looked at."""
    out = []
    for leaf in leaves:
        tensors: list = []
        if not _tensors(leaf, tensors, depth=0):
            return None
        try:
            out.append((leaf, tuple([(t, t._version) for t in tensors])))
        except (RuntimeError, NotImplementedError):  # "Inference tensors do not track version counter"
            return None
    return tuple(out)


# Attribute types that hold no tensor, tested first: a stamp is read twice per masked call (auto's decision, the
# kernel's plan), and most of a mask's attributes are sizes and flags.
_PLAIN = frozenset({int, float, bool, str, type(None)})


def _tensors(obj, found: list, depth: int) -> bool:
    """Collect the tensors among ``obj``'s attributes (and in masks, tuples and lists they hold); False if
    the search goes deeper than a mask's plain structure (then nothing is kept)."""
    if depth > 4:
        return False
    for name, value in getattr(obj, "__dict__", {}).items():
        kind = type(value)
        if kind is Tensor:
            found.append(value)
        elif kind in _PLAIN or name == _ATTR or isinstance(value, dict):   # its plans; caches derived from it
            continue
        elif not _collect(value, found, depth):
            return False
    return True


def _collect(value, found: list, depth: int) -> bool:
    if isinstance(value, Tensor):
        found.append(value)
    elif isinstance(value, Mask):
        return _tensors(value, found, depth + 1)
    elif isinstance(value, (tuple, list)):
        return all(_collect(v, found, depth + 1) for v in value)
    return True


def _refs(stamp: tuple) -> tuple:
    """The stamp as weak references (an entry must not keep its mask's parts or tensors alive)."""
    return tuple((weakref.ref(leaf), tuple((weakref.ref(t), v) for t, v in tensors)) for leaf, tensors in stamp)


def _alive(kept: tuple) -> bool:
    """Whether every part and tensor a kept entry refers to still exists."""
    return all(leaf_ref() is not None and all(t_ref() is not None for t_ref, _ in tensor_refs)
               for leaf_ref, tensor_refs in kept)


def _same(kept: tuple, stamp: tuple) -> bool:
    """Whether a kept entry's references still point at these very parts and tensors, at these versions."""
    if len(kept) != len(stamp):
        return False
    for (leaf_ref, tensor_refs), (leaf, tensors) in zip(kept, stamp):
        if leaf_ref() is not leaf or len(tensor_refs) != len(tensors):
            return False
        for (t_ref, version), (t, now) in zip(tensor_refs, tensors):
            if t_ref() is not t or version != now:
                return False
    return True


def kept_for(t: Tensor, purpose: tuple, build: Callable[[Tensor], T], *, reads_values: bool) -> T:
    """``build(t.detach())``, kept for the next call with the same live tensor object and ``purpose``.

    The table (by ``id``) holds a weak reference to ``t``, never ``t`` itself: ``build`` gets a ``detach()``ed
    alias (the same storage and version counter, another object), so an entry never keeps the caller's tensor
    alive and goes when it does. It is reused only while ``t`` is over the same memory (``set_``, ``resize_`` or
    ``.data =`` give a new value) and, where ``reads_values`` (the value is computed from ``t``'s entries, not an
    alias of them), at the same version (an in-place edit gives a new value). Built afresh every call inside a
    ``torch.compile`` graph, for a tensor subclass, and for a tensor without memory or a version counter of its
    own (``torch.func``'s batched tensors, inference tensors).

    >>> t = torch.tensor([True, False])
    >>> kept_for(t, ("not",), torch.logical_not, reads_values=True) is kept_for(t, ("not",), torch.logical_not,
    ...                                                                          reads_values=True)
    True
    """
    if type(t) is not Tensor or torch.compiler.is_compiling():
        return build(t)
    try:
        where = (t.data_ptr(), t.shape, t.stride(), t._version if reads_values else None)
    except (RuntimeError, NotImplementedError):       # no memory to name, or no version counter: no table
        return build(t)
    key = (id(t), purpose)
    kept = _KEPT.get(key)
    if kept is not None and kept[0]() is t and kept[2] == where:
        return kept[1]
    value = build(t.detach())
    _KEPT[key] = (weakref.ref(t, functools.partial(_forget, key)), value, where)
    return value


#: (id(tensor), purpose) -> (weak reference to the tensor, the value kept for it, (data_ptr, shape, stride, version))
_KEPT: dict = {}


def _forget(key: tuple, ref: weakref.ref) -> None:
    """The tensor behind ``_KEPT[key]`` died: drop its value (unless the id was already reused for a new one)."""
    kept = _KEPT.get(key)
    if kept is not None and kept[0] is ref:
        _KEPT.pop(key, None)
