"""``attnlab train evoformer``: contact prediction from co-variation, Evoformer vs a flat transformer.

The data are ``attnlab.data.pairs`` (generated, seeded, never stored): MSA-like grids (B, R, C)
whose target is a hidden map of long-range column contacts (B, C, C). ``--model axial`` trains
the Evoformer-style model, ``--model flat`` the non-axial baseline of equal parameter count
(``attnlab.models.evoformer``). Training and validation batches come from disjoint contact maps
(the "train" and "eval" splits); ``evaluate`` scores a fixed held-out set.

``--ablate NAME ...`` removes parts of every axial block (``models.evoformer.ABLATIONS``: row
attention, column attention, the pair bias, the outer product mean); ``--coupling tagged`` is the
data variant whose contacts show only in three columns at once, so only attention can reveal them
(``data.pairs``). The ablation table in docs/results.md is these flags, one run each.

Metrics (``contact_metrics``), over the pairs i < j of every held-out sample:

    contact_f1, precision, recall   a pair is predicted a contact when its logit > 0 (p > 0.5)
    top_k_precision                 per sample, the share of true contacts among its K highest-scoring
                                    pairs (K = its number of contacts), averaged: threshold-free
    pair_accuracy                   share of pairs classified right (mostly negatives: read with F1)
    map_exact                       share of samples whose whole contact map is right

Example::

    task = EvoformerTask(PairTaskConfig(), EvoformerConfig(kind="flat"))
    trainer = Trainer(task, TrainConfig(steps=500, out_dir="runs/evo-flat"))
    trainer.train()
    task.evaluate(trainer.model)          # {"contact_f1": ..., "top_k_precision": ..., ...}
"""
from __future__ import annotations

import argparse
from dataclasses import fields, replace
from typing import Optional

import torch
from torch import Tensor, nn

from ..data.pairs import COUPLINGS, PairTaskConfig, draw_pairs
from ..models.evoformer import ABLATIONS, KINDS, Evoformer, EvoformerConfig, matched_flat_size
from ..train.sizes import FLOAT, INDEX, SizeEstimate, model_params, stack_activations
from ..train.task import DrawSampler, TaskSpec, check_options

__all__ = ["EvoformerTask", "contact_metrics", "SPEC", "MODEL_DEFAULTS"]

EVAL_SEED = 31337            # the fixed held-out set that ``evaluate`` scores
EVAL_BATCH = 64

# The default model (both kinds): measured to fit the task's time budget on the 2-core CPU.
MODEL_DEFAULTS = dict(n_blocks=2, msa_dim=32, pair_dim=16, n_heads=4, head_dim=8, opm_dim=8)
# --coupling tagged's data: 12 columns (unless --cols), 2-3 contacts at least 3 apart, a smaller problem
# (and cheaper steps) than the pairwise default, since the three-way signal is the harder one to find
TAGGED_DATA = dict(cols=12, max_pairs=3, min_sep=3)


def contact_metrics(logits: Tensor, contacts: Tensor) -> dict[str, float]:
    """Contact metrics of logits (B, C, C) against contacts (B, C, C) bool, over the pairs i < j."""
    if logits.shape != contacts.shape or logits.dim() != 3 or logits.shape[1] != logits.shape[2]:
        raise ValueError(f"logits {tuple(logits.shape)} and contacts {tuple(contacts.shape)} must both be (B, C, C)")
    i, j = torch.triu_indices(logits.shape[1], logits.shape[2], offset=1, device=logits.device)
    score, truth = logits[:, i, j].float(), contacts[:, i, j].bool()                   # (B, P) each
    pred = score > 0
    tp = (pred & truth).sum().item()
    fp = (pred & ~truth).sum().item()
    fn = (~pred & truth).sum().item()
    precision = tp / (tp + fp) if tp + fp else 0.0
    recall = tp / (tp + fn) if tp + fn else 0.0
    # top-K: rank the pairs of each sample, K = its own number of contacts (samples with none skipped)
    k = truth.sum(dim=1)                                                                # (B,)
    order = score.argsort(dim=1, descending=True)                                       # (B, P)
    ranked = truth.gather(1, order)                                                     # (B, P) truth by rank
    in_top = torch.arange(score.shape[1], device=score.device)[None, :] < k[:, None]   # (B, P)
    has = k > 0
    top_k = ((ranked & in_top).sum(dim=1)[has].float() / k[has].float()).mean().item() if has.any() else 0.0
    return {
        "contact_f1": 2 * tp / (2 * tp + fp + fn) if tp + fp + fn else 1.0,
        "precision": precision,
        "recall": recall,
        "top_k_precision": top_k,
        "pair_accuracy": (pred == truth).float().mean().item(),
        "map_exact": (pred == truth).all(dim=1).float().mean().item(),
    }


class EvoformerTask:
    """The ``Task`` (``attnlab.train.task``) of contact prediction; ``model.kind`` picks axial or flat."""

    name = "evoformer"
    unit = "ex"
    loss_label = "binary cross-entropy (nats / column pair)"

    def __init__(self, data: Optional[PairTaskConfig] = None, model: Optional[EvoformerConfig] = None, *,
                 eval_samples: int = 512):
        data = data or PairTaskConfig()
        model = model or EvoformerConfig(vocab=data.n_symbols, max_rows=data.rows, max_cols=data.cols,
                                         **MODEL_DEFAULTS)
        if model.vocab != data.n_symbols:
            raise ValueError(f"the model has vocab={model.vocab} but the data use {data.n_symbols} symbols: "
                             "make them equal")
        if model.kind == "flat" and (model.max_rows < data.rows or model.max_cols < data.cols):
            raise ValueError(f"the flat model embeds max_rows={model.max_rows}, max_cols={model.max_cols} but the "
                             f"data are {data.rows} x {data.cols}: raise max_rows / max_cols")
        if eval_samples < 1:
            raise ValueError(f"eval_samples must be >= 1, got {eval_samples}")
        if model.kind == "flat" and model.flat_dim is None:    # saved resolved: a checkpoint rebuilds the same size
            model = replace(model, **dict(zip(("flat_dim", "flat_ff"), matched_flat_size(model))))
        self.data, self.model_cfg, self.eval_samples = data, model, eval_samples
        self._test: Optional[list[tuple[Tensor, Tensor]]] = None

    def model_config(self) -> dict:
        return self.model_cfg.to_dict()

    def build_model(self) -> nn.Module:
        return Evoformer(self.model_cfg)

    def info(self) -> dict:
        return {"name": "pairs", **self.data.to_dict(), "eval_samples": self.eval_samples}

    def title(self) -> str:
        d, m = self.data, self.model_cfg
        without = f" without {', '.join(m.ablate)}" if m.ablate else ""
        return f"({m.kind}{without}) {d.coupling} contacts from {d.rows} x {d.cols} MSAs"

    def tokenizer_json(self) -> Optional[str]:
        return None                                   # symbols are ids already

    def _draw(self, split: str):
        return lambda g, b: draw_pairs(self.data, g, b, split)

    def sampler(self, batch_size: int, seed: int) -> DrawSampler:
        return DrawSampler(self._draw("train"), batch_size, seed)

    def eval_batches(self, batch_size: int, n: int, seed: int) -> list[tuple[Tensor, Tensor]]:
        return DrawSampler(self._draw("eval"), batch_size, seed).fixed_batches(n)

    def units_per_batch(self, batch_size: int) -> int:
        return batch_size

    def size_estimate(self, batch_size: int) -> SizeEstimate:
        """The MSA track (B, R, C, d_m) and the pair track (B, C, C, d_z) through every block, with the row
        and column attention scores and the outer product's (B, C, C, c, c); flat: R*C tokens per sample."""
        d, m = self.data, self.model_cfg
        B, R, C = batch_size, d.rows, d.cols
        if m.kind == "flat":
            act = stack_activations(B, R * C, m.flat_dim, m.n_blocks, heads=m.n_heads, ffn=m.flat_ff)
            act += FLOAT * B * C * C * 3 * m.flat_dim                          # the pair head over column pairs
        else:
            per_block = (B * R * C * (10 + 2 * m.transition) * m.msa_dim
                         + B * C * C * ((10 + 2 * m.transition + 12 * m.triangle) * m.pair_dim + m.opm_dim ** 2)
                         + B * m.n_heads * (R * C * C + C * R * R))
            act = FLOAT * m.n_blocks * per_block
        return SizeEstimate(model_params(m.to_dict()), act, INDEX * B * (R * C + C * C),
                            model_fix="lower --blocks", batch_fix="lower --batch-size, --rows or --cols")

    def val_metrics(self, val_loss: float) -> dict:
        return {}

    def test_set(self) -> list[tuple[Tensor, Tensor]]:
        """The fixed held-out samples ``evaluate`` scores (eval split, seed ``EVAL_SEED``), drawn once."""
        if self._test is None:
            sampler = DrawSampler(self._draw("eval"), EVAL_BATCH, EVAL_SEED)
            full, rest = divmod(self.eval_samples, EVAL_BATCH)
            self._test = sampler.fixed_batches(full)
            if rest:
                sampler.batch_size = rest
                self._test.append(sampler.next())
        return self._test

    @torch.no_grad()
    def evaluate(self, model: nn.Module) -> dict:
        """``contact_metrics`` on the held-out test set, pooled over all its samples."""
        was_training = model.training
        model.eval()
        device = next(model.parameters()).device
        logits, contacts = [], []
        for msa, c in self.test_set():
            logits.append(model(msa.to(device)).cpu())                               # (b, C, C)
            contacts.append(c)
        model.train(was_training)
        return contact_metrics(torch.cat(logits), torch.cat(contacts))


def _add_arguments(p: argparse.ArgumentParser) -> None:
    d = PairTaskConfig()
    # dest "kind": the CLI's own "model" attribute holds the task name (attnlab train MODEL)
    p.add_argument("--model", dest="kind", choices=KINDS, default="axial",
                   help="axial: the Evoformer-style model; flat: a plain transformer over the R*C grid of equal size")
    p.add_argument("--rows", type=int, default=d.rows, help="sequences per sample (R)")
    p.add_argument("--cols", type=int, default=None,
                   help=f"positions per sequence (C; default {d.cols}; --coupling tagged: {TAGGED_DATA['cols']} "
                        f"columns with {d.min_pairs}-{TAGGED_DATA['max_pairs']} contacts >= "
                        f"{TAGGED_DATA['min_sep']} apart)")
    p.add_argument("--blocks", type=int, default=MODEL_DEFAULTS["n_blocks"],
                   help="Evoformer blocks (or flat transformer layers)")
    p.add_argument("--triangle", action="store_true", help="add triangle multiplicative updates to the pair track")
    p.add_argument("--ablate", nargs="+", choices=ABLATIONS, default=[], metavar="PART",
                   help=f"remove these parts from every axial block: {', '.join(ABLATIONS)}")
    p.add_argument("--coupling", choices=COUPLINGS, default="pairwise",
                   help="pairwise: x_j = pi(x_i), seen by an outer product mean alone; tagged: x_j = pi(x_i + a "
                        "per-row tag held in another column), seen only after attention brings the tag in")
    p.add_argument("--eval-samples", type=int, default=512, help="held-out samples scored at the end")


def _validate(args: argparse.Namespace) -> None:
    check_options(args, positive=("--rows", "--cols", "--blocks", "--eval-samples"))


def _from_args(args: argparse.Namespace) -> EvoformerTask:
    if args.ablate and args.kind != "axial":
        raise ValueError(f"--ablate removes parts of the axial Evoformer; --model {args.kind} has none of them")
    shape = dict(TAGGED_DATA) if args.coupling == "tagged" else {}          # its contact counts even with --cols
    if args.cols is not None:
        shape["cols"] = args.cols
    data = PairTaskConfig(rows=args.rows, coupling=args.coupling, **shape)
    model = EvoformerConfig(**{**MODEL_DEFAULTS, "n_blocks": args.blocks}, kind=args.kind, vocab=data.n_symbols,
                            max_rows=data.rows, max_cols=data.cols, triangle=args.triangle, ablate=tuple(args.ablate))
    return EvoformerTask(data, model, eval_samples=args.eval_samples)


def _from_checkpoint(ckpt) -> EvoformerTask:
    info = ckpt.extra.get("data")
    if not isinstance(info, dict) or info.get("name") != "pairs":
        raise ValueError("the checkpoint is marked task 'evoformer' but has no contact-task data description "
                         "(extra['data'] of name 'pairs'): it was not written by `attnlab train evoformer`")
    data = PairTaskConfig(**{f.name: info[f.name] for f in fields(PairTaskConfig) if f.name in info})
    return EvoformerTask(data, EvoformerConfig(**ckpt.model_config), eval_samples=info["eval_samples"])


def _run_name(args: argparse.Namespace) -> str:
    """evoformer-axial, evoformer-flat; evoformer-tagged-axial-no-row-attention-no-pair-bias, ..."""
    tagged = "-tagged" if args.coupling == "tagged" else ""
    return f"evoformer{tagged}-{args.kind}" + "".join(f"-no-{a}" for a in ABLATIONS if a in args.ablate)


SPEC = TaskSpec(
    name="evoformer",
    help="contact maps from MSA-like co-variation: Evoformer (--model axial) vs a flat transformer (--model flat)",
    add_arguments=_add_arguments,
    from_args=_from_args,
    from_checkpoint=_from_checkpoint,
    run_name=_run_name,                                    # runs/evoformer-axial, runs/evoformer-tagged-flat, ...
    validate=_validate,
    train_defaults=dict(steps=None, time_limit_min=4.0, batch_size=16, lr=2e-3, min_lr=1e-4, warmup_steps=50,
                        weight_decay=0.01, eval_interval=100, eval_iters=4, checkpoint_interval=500),
)
