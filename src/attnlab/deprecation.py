"""Names that moved (issue #29: one name per concept): the old name still works, with a DeprecationWarning
naming the new one, so code written against an older attnlab keeps running while it is updated.

A module lists its renames and installs the look-up as its module ``__getattr__`` (PEP 562), which Python
asks only for names the module does not define: the new names cost nothing.

Example::

    __getattr__ = renamed(globals(), {"Encoder": "EncoderStack"}, "attnlab.nn.blocks")
    from attnlab.nn.blocks import Encoder      # DeprecationWarning: ... is now attnlab.nn.blocks.EncoderStack
"""
from __future__ import annotations

import warnings
from typing import Any, Callable, Optional

__all__ = ["renamed", "moved"]


def renamed(namespace: dict[str, Any], old_to_new: dict[str, str], module: str) -> Callable[[str], Any]:
    """A module ``__getattr__`` that answers each old name of ``old_to_new`` with ``namespace[new]`` and a
    DeprecationWarning, and raises AttributeError for any other missing name."""
    def __getattr__(name: str) -> Any:
        new = old_to_new.get(name)
        if new is None:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        warnings.warn(f"{module}.{name} is deprecated: it is now {module}.{new} (same object)",
                      DeprecationWarning, stacklevel=2)
        return namespace[new]
    return __getattr__


def moved(old_module: str, new: Any, names: Optional[set[str]] = None) -> Callable[[str], Any]:
    """A module ``__getattr__`` for names that moved to module ``new`` (all of its names, or only ``names``):
    each is answered with ``new``'s own object and a DeprecationWarning naming its new home.

    Example::

        __getattr__ = moved(__name__, attnlab.measure.timing)       # in the old attnlab/bench/timing.py
        __getattr__ = moved(__name__, attnlab.measure.threads, {"threads"})     # one function moved out
    """
    def __getattr__(name: str) -> Any:
        if (names is not None and name not in names) or not hasattr(new, name):
            raise AttributeError(f"module {old_module!r} has no attribute {name!r}")
        warnings.warn(f"{old_module}.{name} is deprecated: it is now {new.__name__}.{name} (same object)",
                      DeprecationWarning, stacklevel=2)
        return getattr(new, name)
    return __getattr__
