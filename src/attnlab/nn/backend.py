"""``set_backend``: pin every attention layer of a model to one backend, in one call (issue #29).

A model's layers each carry a ``backend`` (their config's field, ``"auto"`` unless pinned); this walks the
module tree once and sets it on every attnlab attention layer and config it finds, so one call serves GPT,
the encoders, seq2seq, ViT, the captioner, Evoformer and the drop-in ``MultiheadAttention``. For a scope
rather than a pin (what runs inside a ``with`` block), use ``attnlab.use_backend``.

Example::

    model = GPT(GPTConfig(vocab_size=65, ...))
    set_backend(model, "native")          # every layer; set_backend(model, "auto") undoes it
"""
from __future__ import annotations

import dataclasses
import warnings

from torch import nn

from ..functional.registry import get_backend

__all__ = ["set_backend", "deprecated_backend_alias"]


def set_backend(module: nn.Module, name: str) -> nn.Module:
    """Run every attention layer of ``module`` on backend ``name`` ("auto" or an available backend) and
    return ``module``. ValueError naming the known backends, before anything changes, if ``name`` is not one.
    """
    if name != "auto":
        get_backend(name)
    for m in module.modules():
        cfg = getattr(m, "cfg", None)
        if dataclasses.is_dataclass(cfg) and any(f.name == "backend" for f in dataclasses.fields(cfg)):
            m.cfg = dataclasses.replace(cfg, backend=name)           # the configs a layer reads and saves
        elif isinstance(getattr(m, "backend", None), str):
            m.backend = name                                         # nn.MultiheadAttention's drop-in
    return module


def deprecated_backend_alias(module: nn.Module, name: str, old: str) -> nn.Module:
    """What the old per-model methods (``GPT.with_backend``, ``Encoder.set_backend``) now do: warn, then
    ``set_backend``."""
    warnings.warn(f"{old} is deprecated; use attnlab.nn.set_backend(model, {name!r}) or, for a scope, "
                  f"`with attnlab.use_backend({name!r}):`", DeprecationWarning, stacklevel=3)
    return set_backend(module, name)
