"""Attention maps of a named model for a text, with the knobs the theory talks about.

Models are chosen by registered NAME only (the web lab never passes a path):

    minilm        the real pretrained all-MiniLM-L6-v2 (``Encoder.from_minilm()``), loaded once and cached
    toy-encoder   a small seeded random encoder (2 layers x 4 heads, sinusoidal positions, word tokens);
                  always available, loads instantly
    gpt-demo      the GPT checkpoint ``make demo`` writes to runs/demo/gpt (listed when that directory exists)

``register_model(name, loader)`` adds more (``attnlab show --checkpoint PATH`` registers a path-based
model from the CLI). Knobs of ``attention_maps``:

* ``positional=False`` switches position information off: the encoders skip their position
  embeddings (for MiniLM: the learned position embeddings' contribution is zeroed before the
  embedding LayerNorm; [CLS]/[SEP] still mark the ends), GPT skips its absolute encoding, and
  RoPE/ALiBi layers drop their scheme. A bidirectional encoder then becomes order-blind:
  permuting the words permutes the attention matrix.
* ``scale_factor`` multiplies every layer's 1/sqrt(d_k) score scaling: large factors saturate
  the softmax (low entropy, near one-hot rows), small ones flatten it.
* ``backend`` picks the attention backend; ``agreement`` is max |weights - reference weights|
  over every layer and head (exact backends agree to ~1e-6; linear/favor are approximations).

Example::

    maps = attention_maps("toy-encoder", "the dog bit the man", layer=0, backend="tiled")
    maps.tokens                     # ['the', 'dog', 'bit', 'the', 'man']
    maps.weights.shape              # (1, 4, 5, 5): (layers, heads, L, L), rows sum to 1
    maps.agreement                  # ~1e-7: tiled agrees with the reference
"""
from __future__ import annotations

import math
import re
import threading
import zlib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Optional

import torch
from torch import Tensor, nn

from ..deprecation import renamed

__all__ = ["AttentionMaps", "InspectModel", "UnknownModelError", "InputTooLongError", "ModelLoadError",
           "attention_maps", "attention_entropy", "list_models", "register_model", "registered_model",
           "backend_choices", "DEMO_GPT", "MAX_TOKENS"]

MAX_TOKENS = 128                       # default cap: a 128 x 128 map is still readable on a page
DEMO_GPT = Path("runs/demo/gpt")       # where `make demo` saves its GPT (relative to the working directory)
MAX_SCALE_FACTOR = 100.0


class UnknownModelError(ValueError):
    """A model name that is not registered (or whose files are not installed)."""


class InputTooLongError(ValueError):
    """A text longer than the token cap."""


class ModelLoadError(RuntimeError):
    """A registered model whose files could not be loaded (a broken or half-written checkpoint)."""


@dataclass
class AttentionMaps:
    tokens: list[str]                  # L token strings, as the model sees them ([CLS]/[SEP] included)
    weights: Tensor                    # (len(layers), len(heads), L, L) float32 softmax probabilities
    model: str
    backend: str
    agreement: Optional[float]         # max |weights - reference backend's|; None when backend is "reference"
    layers: list[int]                  # which layers dim 0 holds
    heads: list[int]                   # which heads dim 1 holds


@dataclass
class InspectModel:
    """A loaded model with what inspection needs: ``model`` is an ``attnlab.models.Encoder`` or ``GPT``;
    ``tokenize(text) -> (tokens: list[str], ids: list[int])``."""
    model: nn.Module
    tokenize: Callable[[str], tuple[list[str], list[int]]]
    description: str = ""

    @property
    def attn_layers(self) -> list[nn.Module]:
        blocks = self.model.layers if hasattr(self.model, "layers") else self.model.blocks
        return [b.self_attn for b in blocks]

    @property
    def n_layers(self) -> int:
        return len(self.attn_layers)

    @property
    def n_heads(self) -> int:
        return self.attn_layers[0].cfg.n_heads


# -- tokenizers ------------------------------------------------------------------------------------
class WordTokenizer:
    """The toy encoder's tokenizer: lower-cased words and punctuation, hashed (crc32) into ``vocab_size``
    ids. Same word, same id: what order-blindness needs, with no vocabulary file."""

    def __init__(self, vocab_size: int):
        self.vocab_size = vocab_size

    def __call__(self, text: str) -> tuple[list[str], list[int]]:
        words = re.findall(r"\w+|[^\w\s]", text.lower())
        return words, [zlib.crc32(w.encode()) % self.vocab_size for w in words]


def _wordpiece(tokenizer) -> Callable[[str], tuple[list[str], list[int]]]:
    """A private copy of a WordPieceTokenizer's tokenizer without truncation or padding: the cap is
    checked by attention_maps (an error), never applied silently; the model's own stays as it was."""
    from tokenizers import Tokenizer
    tok = Tokenizer.from_str(tokenizer.tok.to_str())
    tok.no_truncation()
    tok.no_padding()

    def tokenize(text: str):
        enc = tok.encode(text)
        return list(enc.tokens), list(enc.ids)
    return tokenize


def _lm_tokens(tok) -> Callable[[str], tuple[list[str], list[int]]]:
    def tokenize(text: str):
        ids = tok.encode(text)
        return [tok.decode([i]) for i in ids], ids
    return tokenize


# -- the built-in models ---------------------------------------------------------------------------
def _load_minilm() -> InspectModel:
    from ..models import Encoder
    model = Encoder.from_minilm()
    return InspectModel(model, _wordpiece(model.tokenizer))


def _load_toy(seed: int = 0) -> InspectModel:
    """2 layers x 4 heads, d_model 64, random weights from ``seed``; positions are the sinusoidal table
    (frozen in the position embedding). Weights are N(0, 1/fan_in) so scores are O(1): the maps are
    neither uniform nor one-hot, and the knobs visibly move them."""
    from ..models import Encoder, EncoderConfig
    from ..positional.absolute import sinusoidal
    cfg = EncoderConfig(vocab_size=1024, d_model=64, n_layers=2, n_heads=4, d_ff=128, max_len=256,
                        dropout=0.0, attn_dropout=0.0, mlm_head=False)
    model = Encoder(cfg)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("embeddings.weight"):
                p.copy_(torch.randn(p.shape, generator=g))
            elif p.dim() == 2:                                                # linear (out, in)
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p.shape[1]))
        model.position_embeddings.weight.copy_(sinusoidal(cfg.max_len, cfg.d_model))   # (P, C)
    model.position_embeddings.weight.requires_grad_(False)
    return InspectModel(model.eval(), WordTokenizer(cfg.vocab_size))


def _load_demo_gpt() -> InspectModel:
    from ..train import load_gpt
    model, tok = load_gpt(DEMO_GPT)
    return InspectModel(model, _lm_tokens(tok))


def _minilm_available() -> bool:
    try:
        from ..models.minilm import minilm_path
        minilm_path()
        return True
    except (ImportError, FileNotFoundError):
        return False


@dataclass
class _Entry:
    loader: Callable[[], InspectModel]
    description: str
    available: Callable[[], bool]
    shape: Optional[tuple[int, int]]   # (layers, heads) when known without loading


_REGISTRY: dict[str, _Entry] = {
    "minilm": _Entry(_load_minilm, "all-MiniLM-L6-v2, the real pretrained sentence encoder (WordPiece tokens)",
                     _minilm_available, (6, 12)),
    "toy-encoder": _Entry(_load_toy, "a small random encoder (seed 0) with sinusoidal positions, word tokens",
                          lambda: True, (2, 4)),
    "gpt-demo": _Entry(_load_demo_gpt, f"the causal GPT trained by `make demo` ({DEMO_GPT})",
                       lambda: DEMO_GPT.is_dir(), None),
}
_LOADED: dict[str, InspectModel] = {}
_LOCK = threading.RLock()              # loading, and the temporary per-call knob settings, are serialised


def register_model(name: str, loader: Callable[[], object], *, description: str = "") -> None:
    """Register ``loader`` under ``name``; it returns an ``InspectModel``, an Encoder with a tokenizer
    (``from_minilm``), or a ``(GPT, tokenizer)`` pair (``attnlab.train.load_gpt``). Called once, lazily.

    Example::

        register_model("mine", lambda: load_gpt("runs/mine"), description="my checkpoint")
    """
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9._-]{1,64}", name):
        raise ValueError(f"model names are 1-64 letters, digits, '.', '_' or '-', got {name!r}")

    def load() -> InspectModel:
        got = loader()
        if isinstance(got, InspectModel):
            return got
        if isinstance(got, tuple) and len(got) == 2:
            return InspectModel(got[0].eval(), _lm_tokens(got[1]))
        if getattr(got, "tokenizer", None) is not None:
            return InspectModel(got.eval(), _wordpiece(got.tokenizer))
        raise TypeError(f"the loader of {name!r} returned {type(got).__name__}; return an InspectModel, an "
                        "Encoder with a tokenizer, or a (GPT, tokenizer) pair")

    with _LOCK:
        _REGISTRY[name] = _Entry(load, description or name, lambda: True, None)
        _LOADED.pop(name, None)


def registered_model(name: str) -> InspectModel:
    """The model registered as ``name``, loaded on first use and cached."""
    with _LOCK:
        entry = _REGISTRY.get(name) if isinstance(name, str) else None
        if entry is None or not entry.available():
            avail = [n for n, e in _REGISTRY.items() if e.available()]
            why = "is not available here" if entry is not None else "is not a registered model"
            raise UnknownModelError(f"model {name!r} {why}; choose from {avail}")
        if name not in _LOADED:
            try:
                _LOADED[name] = entry.loader()
            except Exception as e:         # any loader failure: one error type with the cause, nothing cached
                raise ModelLoadError(f"model {name!r} could not be loaded: {type(e).__name__}: {e}") from e
        return _LOADED[name]


def list_models() -> list[dict]:
    """Registered models: ``[{name, description, layers, heads, available}]`` (layers/heads None if unknown
    until loaded). Does not load anything except what is already cached, and never waits for the lock a
    running computation holds (snapshots of the two dicts instead: the web lab lists models during a burst)."""
    out = []
    loaded = dict(_LOADED)
    for name, e in list(_REGISTRY.items()):
        shape = (loaded[name].n_layers, loaded[name].n_heads) if name in loaded else e.shape
        out.append(dict(name=name, description=e.description, layers=shape[0] if shape else None,
                        heads=shape[1] if shape else None, available=bool(e.available())))
    return out


def backend_choices() -> list[dict]:
    """``[{name, exact}]`` for "auto" and every registered attention backend."""
    from ..functional.registry import all_backends
    return [dict(name="auto", exact=True)] + [dict(name=b.name, exact=b.exact) for b in all_backends()]


# -- running ---------------------------------------------------------------------------------------
def attention_entropy(weights: Tensor) -> Tensor:
    """Entropy (nats) of each attention row: weights (..., L, S) -> (..., L); 0 log 0 = 0.

    A uniform row over S keys has log S; a one-hot row has 0.
    Example:
        attention_entropy(torch.full((1, 4), 0.25))       # tensor([1.3863])
    """
    w = weights.double()
    return -(w * torch.where(w > 0, w.log(), torch.zeros_like(w))).sum(-1)


def _forward(m: InspectModel, ids: Tensor, positional: bool, capture: list) -> None:
    """Run the model's layers on ids (1, L), recording each self-attention's Intermediates."""
    model = m.model
    if hasattr(model, "position_embeddings"):                      # attnlab.models.Encoder (Encoder.forward,
        L = ids.shape[1]                                           # with the position term optional)
        x = model.word_embeddings(ids) + model.token_type_embeddings(torch.zeros_like(ids))   # (1, L, C)
        if positional:
            x = x + model.position_embeddings(torch.arange(L))
        model.stack(model.embed_norm(x), capture=capture)
    else:                                                          # attnlab.models.GPT (its forward, no head)
        x = model.tok_emb(ids)                                     # (1, L, C)
        if positional and model.pos_enc is not None:
            x = model.pos_enc(x, 0)
        for block in model.blocks:
            x = block(x, capture=capture)


def _weights(m: InspectModel, ids: Tensor, *, positional: bool, scale_factor: float, backend: str) -> Tensor:
    """All layers' weights (layers, H, L, L) with the knobs set on the modules for this call only."""
    attns = m.attn_layers
    saved = [(a.cfg, a.positional) for a in attns]
    try:
        for a in attns:
            # AttentionLayer reads cfg.scale / cfg.backend per call: a replaced cfg is the knob
            a.cfg = replace(a.cfg, scale=a.scale * scale_factor, backend=backend)
            if not positional and a.positional is not None:
                a.positional = None                                # RoPE / ALiBi / relative: off
        capture: list = []
        with torch.no_grad():
            _forward(m, ids, positional, capture)
    finally:
        for a, (cfg, pos) in zip(attns, saved):
            a.cfg, a.positional = cfg, pos
    return torch.cat([c.weights for c in capture]).float()        # (layers, H, L, L)


def _pick(value: Optional[int], n: int, what: str, model: str) -> list[int]:
    if value is None:
        return list(range(n))
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < n:
        raise ValueError(f"{what} {value!r} does not exist: {model!r} has {n} {what}s, numbered 0..{n - 1}")
    return [value]


def attention_maps(name: str, text: str, *, layer: Optional[int] = None, head: Optional[int] = None,
                   positional: bool = True, scale_factor: float = 1.0, backend: str = "auto",
                   max_tokens: int = MAX_TOKENS) -> AttentionMaps:
    """Tokenize ``text``, run model ``name`` and return its attention weights.

    Args:
        name: a registered model name (``list_models()``).
        text: the input; empty or over ``max_tokens`` tokens is a ValueError (InputTooLongError).
        layer, head: one layer / head, or None for all.
        positional: False switches position information off (see the module docstring).
        scale_factor: multiplies each layer's 1/sqrt(d_k) scaling, in (0, 100].
        backend: "auto" or a name of ``attnlab.available_backends()``.
    Returns:
        AttentionMaps with weights (len(layers), len(heads), L, L).
    Example:
        attention_maps("minilm", "The cat sat", layer=2, head=5).weights.shape   # (1, 1, 5, 5)
    """
    from ..functional.registry import get_backend
    if not isinstance(text, str) or not text.strip():
        raise ValueError("the text is empty: type a sentence to see its attention")
    if isinstance(scale_factor, bool) or not isinstance(scale_factor, (int, float)) or \
            not 0 < scale_factor <= MAX_SCALE_FACTOR:
        raise ValueError(f"scale_factor must be a number in (0, {MAX_SCALE_FACTOR:g}], got {scale_factor!r}")
    if backend != "auto":
        get_backend(backend)                                       # ValueError listing the backends
    m = registered_model(name)
    layers, heads = _pick(layer, m.n_layers, "layer", name), _pick(head, m.n_heads, "head", name)
    tokens, ids = m.tokenize(text)
    limit = min(max_tokens, m.model.cfg.max_len)
    if not tokens:
        raise ValueError(f"the text has no tokens for {name!r}: type words, not only spaces or symbols")
    if len(tokens) > limit:
        raise InputTooLongError(f"the text is {len(tokens)} tokens for {name!r}, over the cap of {limit}; "
                                "shorten it")
    idx = torch.tensor([ids], dtype=torch.int64)                   # (1, L)
    with _LOCK:
        w = _weights(m, idx, positional=positional, scale_factor=float(scale_factor), backend=backend)
        agreement = None
        if backend != "reference":
            ref = _weights(m, idx, positional=positional, scale_factor=float(scale_factor), backend="reference")
            agreement = float((w - ref).abs().max())
    w = w[layers][:, heads]                                        # (len(layers), len(heads), L, L)
    return AttentionMaps(tokens, w.contiguous(), name, backend, agreement, layers, heads)


# registered_model was load_model until issue #29: tasks.load_model reads a checkpoint, another idea.
__getattr__ = renamed(globals(), {"load_model": "registered_model"}, __name__)
