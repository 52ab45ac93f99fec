"""``use_backend``: one switch for the backend every ``attention`` call under it takes (issue #29).

torch has ``torch.nn.attention.sdpa_kernel(...)`` as a context manager; this is attnlab's one way to say
"run this code on that backend": a call that asks for ``backend="auto"`` (the default of every module and
config) takes the scope's backend instead. A backend named explicitly in the call, or pinned in a module's
config, still wins: a scope changes what was left to ``auto``, never what a user fixed.

The scope is thread-local (another thread keeps its own) and nestable (the inner one wins until it exits);
the name is checked at entry, so a typo fails before any work.

Example::

    with use_backend("native"):
        y = model(x)                       # every attention layer left on "auto" runs the compiled kernel
        with use_backend("reference"):
            y_ref = model(x)               # the inner scope wins
    current_backend()                      # 'auto' again
"""
from __future__ import annotations

import contextlib
import threading
from typing import Iterator

from .registry import get_backend

__all__ = ["use_backend", "current_backend"]


class _Scope(threading.local):
    name = "auto"                          # each thread starts outside every scope


_scope = _Scope()


def current_backend() -> str:
    """The backend ``auto`` resolves to in this thread: the innermost ``use_backend``'s, else 'auto'."""
    return _scope.name


@contextlib.contextmanager
def use_backend(name: str) -> Iterator[str]:
    """Run the ``with`` body with ``backend="auto"`` meaning ``name`` ("auto" restores the rule inside an
    outer scope). ValueError at entry, naming the known backends, if ``name`` is not one."""
    if name != "auto":
        get_backend(name)                  # unknown names fail here, not mid-forward
    outer = _scope.name
    _scope.name = name
    try:
        yield name
    finally:
        _scope.name = outer
