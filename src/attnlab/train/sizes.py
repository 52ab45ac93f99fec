"""Memory a model needs, estimated from its config before anything is allocated, and the check against
what the machine has.

A config can ask for more than any machine holds (``--batch-size 1000000000``, a checkpoint.json whose
``n_layers`` was edited to 10**7): building it would spend a minute allocating before failing. So sizes
are estimated from the numbers alone, and refused when they exceed the memory available now
(``MemAvailable``, or the cgroup's limit when lower), with the estimate and the option that shrinks it.

- ``model_params(config)``: the parameter count of any attnlab model config (a checkpoint's
  ``model_config`` dict: GPT, seq2seq, ViT, captioner/VQA, Evoformer, the code LSTM), within ~10%;
  0 for a config it does not know (nothing is refused then).
- ``SizeEstimate``: parameters, one training step's activations and the batches held at once; a task's
  ``size_estimate(batch_size)`` returns one (``tasks/*``), with the options that shrink it.
- ``check_fits(need, ...)``: ``SizeError`` (a ValueError) when ``need`` bytes exceed what is available.

Every reader of a checkpoint gets the check: ``load_checkpoint`` estimates the weights of the config it
reads before the model exists (eval, generate, show, resume); the trainer checks the whole training step.

Example::

    est = SizeEstimate(params=model_params(cfg.to_dict()), activation_bytes=2**30)
    check_fits(est.train_bytes, what="one training step", detail=est.describe(), fix=est.fix())
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional

from ..functional.memory import available_ram, human_bytes

__all__ = ["SizeEstimate", "SizeError", "model_params", "check_fits", "training_estimate", "check_training_fits",
           "INDEX", "block_params", "stack_activations", "FLOAT"]

FLOAT = 4                   # bytes of an fp32 value: weights, gradients, optimizer moments and activations
INDEX = 8                   # bytes of an int64 token id in a batch


class SizeError(ValueError):
    """A model or a batch that cannot fit in the memory this machine has (refused before allocating)."""


@dataclass
class SizeEstimate:
    """What one training step holds: the model's state, the activations kept for backward, the batches.

    ``model_fix`` / ``batch_fix`` name the options that shrink the model / the step (the error says the
    one for the larger part).
    """
    params: int                         # parameters (fp32)
    activation_bytes: int = 0           # one micro-batch's forward activations kept for backward
    data_bytes: int = 0                 # batches held at once (a training batch and the fixed validation ones)
    model_fix: str = "choose a smaller model"
    batch_fix: str = "lower --batch-size"

    @property
    def state_bytes(self) -> int:
        """Weights, gradients and AdamW's two moments: four fp32 copies of the parameters."""
        return 4 * FLOAT * self.params

    @property
    def train_bytes(self) -> int:
        return self.state_bytes + self.activation_bytes + self.data_bytes

    @property
    def checkpoint_bytes(self) -> int:
        """One checkpoint on disk: weights and AdamW's moments, plus 1 MiB of RNG states and JSON."""
        return 3 * FLOAT * self.params + 2 ** 20

    def describe(self) -> str:
        return (f"{self.params / 1e6:,.2f}M parameters: {human_bytes(self.state_bytes)} with gradients and AdamW "
                f"state; activations {human_bytes(self.activation_bytes)}; batches {human_bytes(self.data_bytes)}")

    def fix(self) -> str:
        return self.model_fix if self.state_bytes >= self.activation_bytes + self.data_bytes else self.batch_fix


def check_fits(need: int, *, what: str, detail: str, fix: str, available: Optional[int] = None) -> None:
    """SizeError when ``need`` bytes exceed the memory available (``available``, else measured now).

    >>> check_fits(10**15, what="one training step", detail="...", fix="lower --batch-size")  # doctest: +SKIP
    SizeError: one training step needs about 909.5 TiB of memory (...), 18.2 GiB is available; lower --batch-size
    """
    have = available_ram() if available is None else available
    if have is not None and need > have:
        raise SizeError(f"{what} needs about {human_bytes(need)} of memory ({detail}), {human_bytes(have)} is "
                        f"available; {fix}")


# ---------------------------------------------------------------------------- parameter counts
def block_params(d: int, ffn: Optional[int] = None, context: Optional[int] = None) -> int:
    """A pre-norm transformer block of width d: q, k, v, out projections, an MLP of width ffn (4 d), two
    norms and the biases; ``context``: also a cross-attention reading a context of that width."""
    ffn = ffn or 4 * d
    n = 4 * d * d + 2 * d * ffn + 9 * d + ffn
    if context is not None:
        n += 2 * d * d + 2 * d * context + 4 * d
    return n


def _gpt(c: dict) -> int:
    d, v = c["d_model"], c["vocab_size"]
    n = v * d * (1 if c.get("tie_weights", True) else 2) + 2 * d
    if c.get("positional", "learned") == "learned":
        n += c["max_len"] * d
    return n + c["n_layers"] * block_params(d)


def _seq2seq(c: dict) -> int:
    d, v = c["d_model"], c["vocab_size"]
    tv = c.get("tgt_vocab_size") or v
    n = v * d + (0 if c.get("share_embeddings", True) else tv * d) + (0 if c.get("tie_output", True) else tv * d)
    if c.get("positional") == "learned":
        n += 2 * c["max_len"] * d
    ffn = c.get("d_ff")
    return n + c["n_encoder_layers"] * block_params(d, ffn) + c["n_decoder_layers"] * block_params(d, ffn, d) + 4 * d


def _vit(c: dict) -> int:
    size = c.get("image_size", (8, 8))
    h, w = (size, size) if isinstance(size, int) else size
    p, d = c["patch_size"], c["d_model"]
    patches = (h // p) * (w // p)
    n = c.get("channels", 1) * p * p * d + 2 * d + c["n_layers"] * block_params(d, c.get("d_ff")) + 2 * d
    if c.get("positional") == "learned":
        n += patches * d
    return n + (c.get("n_classes") or 0) * (d + 1)


def _captioner(c: dict) -> int:
    d, v = c["d_model"], c["vocab_size"]
    vit = c["vit"]
    n = _vit(vit) + v * d * (1 if c.get("tie_weights", True) else 2) + c["max_len"] * d + 2 * d
    return n + c["n_layers"] * block_params(d, c.get("d_ff"), vit["d_model"])


def _msa(c: dict) -> int:
    from ..models.msa import MSAConfig, param_count
    return param_count(MSAConfig.from_dict(c))


def _evoformer(c: dict) -> int:
    if c.get("kind") == "flat":
        d = c.get("flat_dim") or 2 * c["msa_dim"]
        emb = (c["vocab"] + c["max_rows"] + c["max_cols"]) * d + 2 * d * d
        return emb + c["n_blocks"] * block_params(d, c.get("flat_ff")) + 3 * d
    m, z, h, hd, o, t = (c[k] for k in ("msa_dim", "pair_dim", "n_heads", "head_dim", "opm_dim", "transition"))
    attention = 2 * (4 * m * h * hd + 2 * m) + z * h                 # row (with the pair bias) and column
    transitions = 2 * t * (m * m + z * z) + 4 * (m + z)
    block = attention + transitions + 2 * m * o + o * o * z + z
    if c.get("triangle"):
        block += 2 * (6 * z * z + 4 * z)
    return c["vocab"] * m + (2 * c.get("max_relpos", 16) + 1) * z + m * z + c["n_blocks"] * block + 2 * z


def _lstm(c: dict) -> int:
    v, e, h, layers = c["vocab_size"], c.get("d_embed", 128), c.get("hidden", 256), c.get("n_layers", 2)
    return v * e + 4 * h * (e + h + 2) + (layers - 1) * 4 * h * (2 * h + 2) + h * v + v


def model_params(config: dict) -> int:
    """The parameter count of an attnlab model config (a dict, as checkpoints store it), within ~10%;
    0 for a config of an unknown kind or with values that are not numbers (the model's own checks speak).

    >>> model_params({"vocab_size": 65, "max_len": 256, "n_layers": 4, "d_model": 128})
    834432
    """
    if not isinstance(config, dict):
        return 0
    if config.get("arch") == "lstm":
        count = _lstm
    elif "vit" in config:
        count = _captioner
    elif "image_size" in config:
        count = _vit
    elif "msa_dim" in config:
        count = _evoformer
    elif "row" in config and "symbols" in config:
        count = _msa
    elif "n_encoder_layers" in config:
        count = _seq2seq
    elif "vocab_size" in config and "n_layers" in config:
        count = _gpt
    else:
        return 0
    try:
        return max(0, int(count(config)))
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return 0


# ---------------------------------------------------------------------------- activations
def stack_activations(rows: int, tokens: int, d: int, layers: int, *, heads: int = 1, keys: Optional[int] = None,
                      ffn: Optional[int] = None, context: Optional[int] = None) -> int:
    """Bytes a stack of ``layers`` blocks keeps for backward over ``rows`` x ``tokens``: per token and layer
    ~10 width-sized vectors (norms, q, k, v, attention output, residuals) and the MLP's hidden twice, one
    (heads x keys) score row (``keys``: the attended length, default ``tokens``), and for a cross-attending
    block (``context`` keys) its q, output and scores too."""
    ffn = ffn or 4 * d
    per_token = 10 * d + 2 * ffn + heads * (keys or tokens)
    if context is not None:
        per_token += 3 * d + heads * context
    return FLOAT * rows * tokens * layers * per_token



def training_estimate(task, batch_size: int, eval_iters: int) -> SizeEstimate:
    """One training step of ``task`` at ``batch_size`` rows, with the ``eval_iters`` fixed validation batches
    the trainer keeps: the task's ``size_estimate`` (the parameters of its ``model_config()`` without one)."""
    est = (task.size_estimate(batch_size) if hasattr(task, "size_estimate")
           else SizeEstimate(model_params(task.model_config())))
    return replace(est, data_bytes=est.data_bytes * (eval_iters + 1))


def check_training_fits(task, batch_size: int, eval_iters: int) -> SizeEstimate:
    """``training_estimate``, or SizeError when it exceeds the memory available (before anything is built)."""
    est = training_estimate(task, batch_size, eval_iters)
    check_fits(est.train_bytes, what=f"training {task.name} with batches of {batch_size:,}", detail=est.describe(),
               fix=est.fix())
    return est
