"""The backend registry: one dict, filled by a decorator, read by name.

A backend is a plain function with one keyword-only signature::

    fn(q, k, v, *, mask=None, bias=None, scale, dropout_p=0.0, dropout_seed=None,
       return_weights=False, softcap=None) -> out | (out, weights)

``softcap`` (None or > 0) caps the scores, s = softcap * tanh(scale * q k^T / softcap), before the
bias and the mask; a backend that cannot do it says so in ``unsupported``.

``mask`` is a structured ``attnlab.masks.Mask`` (causal already folded in) or None; the
arguments arrive validated by ``attnlab.functional.request``. Alongside the function each backend
registers ``unsupported(request) -> str | None``: why it cannot compute this exact request
(None when it can), so ``attention`` can refuse with a clear message and ``auto`` can skip it.
A backend that needs hardware or a package this machine may lack also registers
``available() -> bool``; ``available_backends()`` lists only those that can run here.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

from torch import Tensor

from .request import AttentionRequest

__all__ = ["Backend", "register_backend", "get_backend", "available_backends"]

AttentionFn = Callable[..., "Tensor | tuple[Tensor, Tensor]"]


def _always(_: AttentionRequest) -> Optional[str]:
    return None


def _here() -> bool:
    return True


@dataclass(frozen=True)
class Backend:
    name: str
    fn: AttentionFn
    exact: bool                                             # approximate backends are never picked by "auto"
    unsupported: Callable[[AttentionRequest], Optional[str]]
    summary: str                                            # one line for explain()
    available: Callable[[], bool] = _here                   # False: cannot run on this machine (no GPU...)


_BACKENDS: dict[str, Backend] = {}
_generation = [0]                                           # moves on with every registration


def registry_generation() -> int:
    """How many registrations there have been: a decision that read the registry is stale once it moves."""
    return _generation[0]


def register_backend(name: str, *, exact: bool = True, summary: str = "",
                     unsupported: Callable[[AttentionRequest], Optional[str]] = _always,
                     available: Callable[[], bool] = _here):
    """Decorator: register ``fn`` under ``name``."""
    def wrap(fn: AttentionFn) -> AttentionFn:
        _BACKENDS[name] = Backend(name, fn, exact, unsupported, summary or (fn.__doc__ or "").split("\n")[0],
                                  available)
        _generation[0] += 1
        return fn
    return wrap


def get_backend(name: str) -> Backend:
    if not isinstance(name, str):
        raise TypeError(f"backend must be a name (str), got {type(name).__name__}; "
                        f"choose from {available_backends()} or 'auto'")
    if name not in _BACKENDS:
        raise ValueError(f"unknown attention backend {name!r}; available: {available_backends()} or 'auto'")
    return _BACKENDS[name]


def available_backends() -> list[str]:
    """Names of the registered backends that can run here, e.g. ['reference', 'sdpa', 'tiled']
    (one whose ``available()`` is False — triton without a GPU — is left out)."""
    return sorted(n for n, b in _BACKENDS.items() if b.available())


def all_backends() -> list[Backend]:
    return [_BACKENDS[n] for n in available_backends()]
