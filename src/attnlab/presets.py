"""Config helpers shared by every model config: named presets, and the config keys renamed over time.

``LEGACY_KEYS`` is the one place that knows the old config names: checkpoints written before the
renames (``load_checkpoint`` upgrades their ``model_config``), presets and configs built from dicts
(``XConfig.from_dict``) accept them.

Example::

    cfg = from_preset(GPTConfig, PRESETS, "micro", {"dropout": 0.1}, what="GPT")   # GPTConfig(...)
    upgrade_keys({"n_layer": 4, "block_size": 256})         # {"n_layers": 4, "max_len": 256}
"""
from __future__ import annotations

from typing import Any, Mapping, TypeVar

__all__ = ["from_preset", "from_known_fields", "LEGACY_KEYS", "LEGACY_DATA_KEYS", "upgrade_keys"]

C = TypeVar("C")

# Model-config keys renamed so that one idea has one word (issue 19): old -> new. "block" now means
# only a transformer layer; the longest sequence a model takes is max_len in every config.
LEGACY_KEYS: dict[str, str] = {
    "n_layer": "n_layers",            # GPTConfig, EncoderConfig, CodeLSTMConfig
    "n_head": "n_heads",              # GPTConfig, EncoderConfig
    "block_size": "max_len",          # GPTConfig: the context
    "max_position": "max_len",        # EncoderConfig: the learned position table's length
}
# A task's data info (checkpoint extra["data"]): the code task's training window.
LEGACY_DATA_KEYS: dict[str, str] = {"block_size": "seq_len"}


def upgrade_keys(d: Mapping[str, Any], legacy: Mapping[str, str] = LEGACY_KEYS) -> dict:
    """``d`` with its old keys renamed (a new dict); a key given under both names is a ValueError."""
    out = dict(d)
    for old, new in legacy.items():
        if old in out:
            if new in out:
                raise ValueError(f"config has both {old!r} (the old name) and {new!r}: give only {new!r}")
            out[new] = out.pop(old)
    return out


def from_preset(cls: type[C], presets: Mapping[str, Mapping[str, Any]], name: str, overrides: Mapping[str, Any],
                *, what: str = "") -> C:
    """``cls(**{**presets[name], **overrides})`` (old key names accepted); an unknown name is a ValueError."""
    if name not in presets:
        label = f"{what} preset" if what else "preset"
        raise ValueError(f"unknown {label} {name!r}; choose from {sorted(presets)}")
    return cls(**{**presets[name], **upgrade_keys(overrides)})


def from_known_fields(cls: type[C], d: Mapping[str, Any]) -> C:
    """``cls(**d)`` for a dataclass, with fields ``cls`` does not have named in a ValueError (a checkpoint of
    another version, or a typo) rather than a TypeError about keyword arguments.

    Example::

        from_known_fields(TrainConfig, {"steps": 10})          # TrainConfig(steps=10, ...)
    """
    from dataclasses import fields
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(d) - known)
    if unknown:
        raise ValueError(f"unknown {cls.__name__} fields {unknown}; known: {sorted(known)}")
    return cls(**d)
