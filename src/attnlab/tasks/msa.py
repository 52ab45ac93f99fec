"""``attnlab train msa``: a small MSA Transformer trained by masked-residue prediction on Potts families.

The data are ``attnlab.data.potts`` families (a made-up lattice fold; an MSA of M sequences Gibbs-sampled
from a Potts model coupled on its contacts), generated once per process and never stored. A training
batch draws ``batch_size`` families of the *train* split (the first ``families`` of it), from each a
random subset of ``rows`` of its M sequences, and masks them BERT-style (``mask_msa``): 15% of the
residues are chosen; of those 80% become the mask token, 10% a random symbol, 10% stay; only the chosen
positions carry a target. The model (``models.msa``) never sees a contact map.

``--row mean`` trains the ablation (row attention replaced by mean pooling over the row's columns).
Validation batches and ``evaluate`` use the *fit* split, never the *test* split: the test families are
the contact claim's (``lab.exp_contacts``), judged once. ``evaluate`` reports on every disjoint block of
``rows`` sequences of the first ``eval_families`` fit families, each masked with a fixed seed, at the
positions the mask token hides (the chosen positions that show a symbol are left out: a model can copy
it, and so beat the baseline below without any context):

    accuracy, loss                    masked-residue accuracy and cross-entropy (nats) of the model
    profile_accuracy, profile_loss    the same positions predicted from the family's column frequencies
                                      (all M sequences, pseudocount 0.5): a strong column-only baseline
    block_profile_accuracy, _loss     ... from the frequencies of what the model sees of the column (the
                                      block's residues the mask token leaves, pseudocount 0.5): the fair
                                      column-only baseline; a loss below it needs context from the row

Example::

    task = MSATask(PottsConfig(), row="attention")
    trainer = Trainer(task, TrainConfig(**SPEC.train_defaults, out_dir="runs/msa-attention"))
    trainer.train()
    task.evaluate(trainer.model)            # {"accuracy": ..., "loss": ..., "profile_loss": ..., ...}
    maps = task.row_maps(trainer.model, family.msa)   # (layers, H, L, L), mean over blocks of `rows`
"""
from __future__ import annotations

import argparse
from dataclasses import asdict, fields
from typing import Optional

import numpy as np
import torch
from torch import Tensor, nn

from ..data.potts import SPLIT_OFFSETS, Family, PottsConfig, family_set, make_family
from ..models.msa import IGNORE, ROWS, MSAConfig, MSATransformer, param_count
from ..train.sizes import FLOAT, INDEX, SizeEstimate
from ..train.task import DrawSampler, TaskSpec, check_options

__all__ = ["MSATask", "mask_msa", "SPEC", "MASK_RATE"]

MASK_RATE = 0.15             # BERT's: of these, 80% mask token, 10% random symbol, 10% unchanged
EVAL_SEED = 31337            # the masks ``evaluate`` scores
PROFILE_PSEUDOCOUNT = 0.5


def _log_profile(counts: Tensor) -> Tensor:
    """Log column frequencies (..., q) from counts (..., q), with ``PROFILE_PSEUDOCOUNT`` per symbol."""
    p = counts.double() + PROFILE_PSEUDOCOUNT
    return (p / p.sum(-1, keepdim=True)).log()


def mask_msa(msa: Tensor, symbols: int, generator: torch.Generator, rate: float = MASK_RATE) -> tuple[Tensor, Tensor]:
    """BERT-style masking of an MSA batch.

    Args:
        msa: (B, R, C) int64 symbols in [0, symbols).
        symbols: q; the mask token is q.
        generator: draws which positions are chosen and how each is corrupted.
        rate: the share of positions chosen (each independently).
    Returns:
        (inputs, targets), both (B, R, C) int64: a chosen position is the mask token (80%), a uniformly
        random symbol (10%) or itself (10%) in inputs, and its true symbol in targets; every other
        position is itself in inputs and ``IGNORE`` in targets.
    Example:
        x, y = mask_msa(torch.randint(0, 8, (4, 64, 48)), 8, torch.Generator().manual_seed(0))
    """
    chosen = torch.rand(msa.shape, generator=generator) < rate                 # (B, R, C)
    how = torch.rand(msa.shape, generator=generator)                           # (B, R, C)
    noise = torch.randint(0, symbols, msa.shape, generator=generator)          # (B, R, C)
    inputs = torch.where(chosen & (how < 0.8), torch.full_like(msa, symbols), msa)
    inputs = torch.where(chosen & (how >= 0.8) & (how < 0.9), noise, inputs)
    return inputs, torch.where(chosen, msa, torch.full_like(msa, IGNORE))


class MSATask:
    """The ``Task`` (``attnlab.train.task``) of masked-residue prediction on Potts families."""

    name = "msa"
    unit = "ex"
    loss_label = "cross-entropy (nats / masked residue)"

    def __init__(self, data: Optional[PottsConfig] = None, model: Optional[MSAConfig] = None, *,
                 row: Optional[str] = None, rows: int = 64, families: int = 400, eval_families: int = 10):
        data = data or PottsConfig()
        if model is None:
            model = MSAConfig(symbols=data.symbols, max_len=max(64, data.length), row=row or "attention")
        if row is not None and row != model.row:
            raise ValueError(f"row={row!r} but the model config has row={model.row!r}: give one of them")
        if model.symbols != data.symbols:
            raise ValueError(f"the model has symbols={model.symbols} but the families use {data.symbols}: "
                             "make them equal")
        if model.max_len < data.length:
            raise ValueError(f"the model embeds max_len={model.max_len} columns but the families have "
                             f"{data.length}: raise max_len")
        if not 1 <= rows <= data.depth:
            raise ValueError(f"rows={rows} must be from 1 to the families' depth {data.depth}")
        if families < 1 or eval_families < 1:
            raise ValueError(f"families={families} and eval_families={eval_families} must be >= 1")
        self.data, self.model_cfg = data, model
        self.rows, self.families, self.eval_families = rows, families, eval_families
        self._msas: dict[str, Tensor] = {}

    def model_config(self) -> dict:
        return self.model_cfg.to_dict()

    def build_model(self) -> nn.Module:
        return MSATransformer(self.model_cfg)

    def info(self) -> dict:
        return {"name": "potts", **asdict(self.data), "rows": self.rows, "families": self.families,
                "eval_families": self.eval_families}

    def title(self) -> str:
        d = self.data
        return (f"(row {self.model_cfg.row}) masked residues of {d.length}-residue Potts families, "
                f"{self.rows} of {d.depth} sequences")

    def tokenizer_json(self) -> Optional[str]:
        return None                                   # symbols are ids already

    def msas(self, split: str) -> Tensor:
        """(F, M, L) int64: the MSAs of the split's families this task uses (train: ``families``, fit:
        ``eval_families``), generated on first use (``data.potts.family_set`` memoizes them)."""
        if split not in self._msas:
            n = {"train": self.families, "fit": self.eval_families}[split]
            self._msas[split] = torch.from_numpy(np.stack([f.msa for f in family_set(self.data, split, n)]))
        return self._msas[split]

    def _draw(self, split: str):
        def draw(g: torch.Generator, b: int) -> tuple[Tensor, Tensor]:
            msas = self.msas(split)                                            # (F, M, L)
            F, M, _ = msas.shape
            fam = torch.randint(F, (b,), generator=g)                          # (b,)
            rows = torch.rand(b, M, generator=g).argsort(dim=1)[:, :self.rows]  # (b, R) a subset per family
            return mask_msa(msas[fam[:, None], rows], self.data.symbols, g)    # (b, R, L) each
        return draw

    def sampler(self, batch_size: int, seed: int) -> DrawSampler:
        self.msas("train")                   # sample the families now: the trainer's clock starts after this
        return DrawSampler(self._draw("train"), batch_size, seed)

    def eval_batches(self, batch_size: int, n: int, seed: int) -> list[tuple[Tensor, Tensor]]:
        return DrawSampler(self._draw("fit"), batch_size, seed).fixed_batches(n)

    def units_per_batch(self, batch_size: int) -> int:
        return batch_size

    def size_estimate(self, batch_size: int) -> SizeEstimate:
        """The grid (B, R, L, d) through every layer (norms, q, k, v, outputs, residuals, the FFN's hidden
        twice), the tied maps (B, H, L, L) and the column maps (B, L, H, R, R)."""
        m = self.model_cfg
        B, R, C = batch_size, self.rows, self.data.length
        per_layer = B * R * C * (10 * m.dim + 2 * m.ffn_width()) + B * m.n_heads * (C * C + C * R * R)
        return SizeEstimate(param_count(m), FLOAT * m.n_layers * per_layer, INDEX * 2 * B * R * C,
                            model_fix="lower --layers", batch_fix="lower --batch-size or --rows")

    def val_metrics(self, val_loss: float) -> dict:
        return {}

    def _eval_set(self) -> list[tuple[Tensor, Tensor, Tensor]]:
        """Per fit family: (inputs, targets) of its disjoint blocks of ``rows`` sequences, (blocks, R, L) each,
        masked with ``EVAL_SEED``, and the family's column counts over all M sequences (L, q)."""
        g = torch.Generator().manual_seed(EVAL_SEED)
        out = []
        for msa in self.msas("fit"):                                           # (M, L)
            n = msa.shape[0] // self.rows
            blocks = msa[:n * self.rows].reshape(n, self.rows, -1)             # (n, R, L)
            counts = torch.nn.functional.one_hot(msa, self.data.symbols).sum(0)   # (L, q)
            out.append((*mask_msa(blocks, self.data.symbols, g), counts))
        return out

    @torch.no_grad()
    def evaluate(self, model: nn.Module) -> dict:
        """Accuracy and loss at the mask-token positions of the fit families, beside those of the column
        frequencies of the family and of the block (see the module docstring)."""
        was_training = model.training
        model.eval()
        device = next(model.parameters()).device
        q = self.data.symbols
        sums = {name: [0.0, 0.0] for name in ("", "profile_", "block_profile_")}   # nll, right
        total = 0
        for inputs, targets, counts in self._eval_set():
            logits = model(inputs.to(device)).float().cpu()                    # (n, R, L, q)
            scored = (targets >= 0) & (inputs == q)                            # (n, R, L) hidden by the mask
            y = targets[scored]                                                # (N,)
            col = torch.arange(targets.shape[-1]).expand_as(targets)           # (n, R, L) each position's column
            # what the block shows of each column (the mask token and the 1.5% random symbols aside)
            shown = torch.nn.functional.one_hot(inputs, q + 1)[..., :q].sum(1, keepdim=True)   # (n, 1, L, q)
            predictions = {"": logits.log_softmax(-1)[scored],                  # (N, q) each
                           "profile_": _log_profile(counts)[col[scored]],
                           "block_profile_": _log_profile(shown.expand(*inputs.shape, q)[scored])}
            for name, lp in predictions.items():
                sums[name][0] += -lp.gather(1, y[:, None]).sum().item()
                sums[name][1] += (lp.argmax(1) == y).sum().item()
            total += len(y)
        model.train(was_training)
        total = max(total, 1)
        return {f"{name}{what}": v / total for name, (nll, right) in sums.items()
                for what, v in (("accuracy", right), ("loss", nll))}

    def test_family(self, i: int) -> Family:
        """Held-out family ``i`` of the *test* split (``family_set(data, "test", n)[i]`` for any n > i), made
        alone: for pictures only; the contact claim judges the test split once (``lab.exp_contacts``)."""
        if i < 0:
            raise ValueError(f"test family index must be >= 0, got {i}")
        return make_family(self.data, SPLIT_OFFSETS["test"] + i)

    def row_maps(self, model: MSATransformer, msa: np.ndarray) -> np.ndarray:
        """The tied row-attention maps of one family (M, L), averaged over its disjoint blocks of ``rows``
        sequences (the training depth; a remainder is left out): (layers, H, L, L) numpy."""
        blocks = [msa[i:i + self.rows] for i in range(0, len(msa) - self.rows + 1, self.rows)]
        return np.mean([model.row_maps(torch.as_tensor(b)) for b in blocks], axis=0)


def _add_arguments(p: argparse.ArgumentParser) -> None:
    d, m = PottsConfig(), MSAConfig()
    p.add_argument("--row", choices=ROWS, default="attention",
                   help="attention: tied row attention (MSA Transformer); mean: the ablation, mean pooling over "
                        "each row's columns instead")
    p.add_argument("--rows", type=int, default=64, help="sequences per training MSA, drawn from each family's M")
    p.add_argument("--families", type=int, default=400, help="training families (the first N of the train split)")
    p.add_argument("--eval-families", type=int, default=10,
                   help="fit-split families scored by validation and evaluate (never the test split)")
    p.add_argument("--layers", type=int, default=m.n_layers, help="MSA Transformer layers")
    p.add_argument("--length", type=int, default=d.length, help="residues per family (L)")
    p.add_argument("--depth", type=int, default=d.depth, help="sequences per family (M)")


def _validate(args: argparse.Namespace) -> None:
    check_options(args, positive=("--rows", "--families", "--eval-families", "--layers", "--length", "--depth"),
                  at_most={"--families": 10**6 - 1, "--eval-families": 10**6 - 1})
    if args.rows > args.depth:
        raise ValueError(f"--rows {args.rows} is more than the families' --depth {args.depth}")


def _from_args(args: argparse.Namespace) -> MSATask:
    data = PottsConfig(length=args.length, depth=args.depth)
    model = MSAConfig(symbols=data.symbols, max_len=max(64, data.length), n_layers=args.layers, row=args.row)
    return MSATask(data, model, rows=args.rows, families=args.families, eval_families=args.eval_families)


def _from_checkpoint(ckpt) -> MSATask:
    info = ckpt.extra.get("data")
    if not isinstance(info, dict) or info.get("name") != "potts":
        raise ValueError("the checkpoint is marked task 'msa' but has no Potts data description "
                         "(extra['data'] of name 'potts'): it was not written by `attnlab train msa`")
    data = PottsConfig(**{f.name: info[f.name] for f in fields(PottsConfig) if f.name in info})
    return MSATask(data, MSAConfig.from_dict(ckpt.model_config), rows=info["rows"], families=info["families"],
                   eval_families=info["eval_families"])


SPEC = TaskSpec(
    name="msa",
    help="a small MSA Transformer (tied row + column attention) by masked-residue prediction on Potts families",
    add_arguments=_add_arguments,
    from_args=_from_args,
    from_checkpoint=_from_checkpoint,
    run_name=lambda args: f"msa-{args.row}",              # runs/msa-attention, runs/msa-mean
    validate=_validate,
    # 12 minutes: the issue #30 claim's budget per model (docs/results.md); the lead's exp_contacts trains alike
    train_defaults=dict(steps=None, time_limit_min=12.0, batch_size=4, lr=1e-3, min_lr=1e-4, warmup_steps=100,
                        eval_interval=250, eval_iters=4, checkpoint_interval=500),
)
