"""Named presets for config dataclasses: one lookup, one error message, for every config that has them.

Example::

    cfg = from_preset(GPTConfig, PRESETS, "micro", {"dropout": 0.1}, what="GPT")   # GPTConfig(...)
"""
from __future__ import annotations

from typing import Any, Mapping, TypeVar

__all__ = ["from_preset"]

C = TypeVar("C")


def from_preset(cls: type[C], presets: Mapping[str, Mapping[str, Any]], name: str, overrides: Mapping[str, Any],
                *, what: str = "") -> C:
    """``cls(**{**presets[name], **overrides})``; an unknown name is a ValueError listing the known ones."""
    if name not in presets:
        label = f"{what} preset" if what else "preset"
        raise ValueError(f"unknown {label} {name!r}; choose from {sorted(presets)}")
    return cls(**{**presets[name], **overrides})
