"""The Evoformer case: contacts read from an MSA model's row attention, against DCA, an ablation and chance.

The claim of the source text: self-attention over a multiple sequence alignment infers which
residues are in contact, long-range ones included. After Rao et al. 2021 ("MSA Transformer"): a
small MSA Transformer (``models.msa``: tied row attention and column attention) is trained only
to predict masked residues of synthetic families (``data.potts``: a made-up fold, an MSA sampled
from a Potts model coupled on its contacts). Its row-attention maps — one per layer and head,
shared by the rows, averaged over the MSA's blocks of ``rows`` sequences — are symmetrized and
APC-corrected, and a logistic regression over them, fitted on the *fit* families, scores every
pair of a held-out *test* family. Judged: the precision of the top L/5 long-range pairs
(|i - j| >= 6), averaged over the test families, against

- the base rate (a random ranking's expected precision),
- the same model with row attention replaced by mean pooling (``row="mean"``), trained alike; it
  has no maps, so its contacts are read from its categorical Jacobian (``lab.contacts``), the
  readout any model admits (the full model's Jacobian is shown beside it),
- mean-field DCA on the same MSAs (the classical method; shown, not judged).

The criteria were written in docs/results.md ("Issue #30: the criteria") before the first run.
Training takes 2 x ``minutes`` of the machine, so the claim is a long experiment, outside
``verify``'s module list: ``scripts/msa_contacts.py`` runs it.

Example::

    models = contact_models(CONTACTS_FULL, Path("runs/msa-contacts"))
    m = measure_contacts(models["attention"], models["mean"], models["attention_task"], CONTACTS_FULL)
    judge_contacts(m, CONTACTS_FULL.base_ratio, CONTACTS_FULL.ablation_ratio)     # [Check, Check]
"""
from __future__ import annotations

import json
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from ..data.potts import PottsConfig, base_rate, family_set
from ..measure.threads import threads
from .contacts import (categorical_jacobian_scores, fit_logistic, long_range_pairs, mean_field_dca, top_l_over,
                            pair_features, precision_at, predict_logistic)
from .claims import Check, Claim, VerifyContext
from .report import new_figure, png_bytes

__all__ = ["ContactClaimConfig", "CONTACTS_FULL", "contact_models", "measure_contacts",
           "judge_contacts", "claim_msa_contacts", "CLAIMS"]


@dataclass(frozen=True)
class ContactClaimConfig:
    potts: PottsConfig = field(default_factory=PottsConfig)
    train_families: int = 400       # the model's training families
    fit_families: int = 10          # the logistic regression's families
    test_families: int = 20         # the held-out families judged
    minutes: float = 12.0           # training time per model (the trainer's time limit)
    rows: int = 64                  # sequences per training MSA and per attention block at read-out
    batch_size: int = 4             # families per step
    threads: int = 2
    base_ratio: float = 3.0         # precision >= this x the base rate ...
    ablation_ratio: float = 2.0     # ... and >= this x the ablation's
    top_fraction: int = 5           # the top L / top_fraction long-range pairs
    seed: int = 0


CONTACTS_FULL = ContactClaimConfig()


def _train(row: str, cfg: ContactClaimConfig, out: Path) -> None:
    from ..tasks.msa import MSATask
    from ..train import TrainConfig, Trainer
    if out.exists():                                   # an unfinished run: start again
        shutil.rmtree(out)
    task = MSATask(cfg.potts, row=row, rows=cfg.rows, families=cfg.train_families)
    tc = TrainConfig(steps=None, time_limit_min=cfg.minutes, batch_size=cfg.batch_size, lr=1e-3, min_lr=1e-4,
                     warmup_steps=100, eval_interval=500, eval_iters=4, checkpoint_interval=10**9,
                     seed=cfg.seed, out_dir=str(out))
    Trainer(task, tc, progress=False).train(plot=False)


def contact_models(cfg: ContactClaimConfig, workdir: Path) -> dict:
    """The model and its ablation, trained into ``workdir/msa-<row>`` for ``cfg.minutes`` each, or reused when a
    finished run with the same configuration is there: {"attention", "mean": model; "attention_task",
    "mean_task": their tasks; "provenance": per row, the steps and where it came from}."""
    from ..tasks import load_model
    models, provenance = {}, {}
    with threads(cfg.threads):
        for row in ("attention", "mean"):
            out = Path(workdir) / f"msa-{row}"
            done = out / "contact-claim.json"
            record = json.loads(done.read_text()) if done.exists() else None
            if record is not None and record["config"] == _jsonable(cfg):
                provenance[row] = {**record, "source": f"reused: finished run in {out}"}
            else:
                _train(row, cfg, out)
                steps = max(int(p.name.split("-")[1]) for p in out.glob("step-*"))
                provenance[row] = {"config": _jsonable(cfg), "steps": steps}
                done.write_text(json.dumps(provenance[row], indent=1))
                provenance[row] = {**provenance[row], "source": f"trained now into {out}"}
            models[row], models[f"{row}_task"] = load_model(out)
    return {**models, "provenance": provenance}


def _jsonable(cfg: ContactClaimConfig) -> dict:
    return json.loads(json.dumps(asdict(cfg)))


def _long_range_rows(feats: np.ndarray, contacts: np.ndarray, min_sep: int) -> tuple[np.ndarray, np.ndarray]:
    i, j = long_range_pairs(len(contacts), min_sep)
    return feats[i, j], contacts[i, j]                          # (pairs, F), (pairs,)


def _jacobian(model, msa: np.ndarray, cfg: ContactClaimConfig) -> np.ndarray:
    predict = lambda rows: model.predict(torch.as_tensor(rows)).numpy()              # (N, R, L) -> (N, R, L, q)
    return categorical_jacobian_scores(predict, msa[:cfg.rows], cfg.potts.symbols)


@torch.no_grad()
def measure_contacts(model, ablation, task, cfg: ContactClaimConfig) -> dict:
    """Precision of the top L/k long-range pairs per test family for each readout, and what they rest on.

    ``task.row_maps(model, msa)``: the tied maps averaged over the family's blocks of ``cfg.rows`` sequences."""
    p = cfg.potts
    k = top_l_over(p.length, cfg.top_fraction)
    fit = family_set(p, "fit", cfg.fit_families)
    test = family_set(p, "test", cfg.test_families)
    X, y = zip(*(_long_range_rows(pair_features(task.row_maps(model, f.msa)), f.contacts, p.long_range)
                 for f in fit))
    reg = fit_logistic(np.concatenate(X), np.concatenate(y))
    out = {"attention": [], "dca": [], "ablation_jacobian": [], "model_jacobian": [], "base_rate": []}
    example = None
    for n, f in enumerate(test):
        feats = pair_features(task.row_maps(model, f.msa))                   # (L, L, layers * H)
        scores = predict_logistic(reg, feats.reshape(-1, feats.shape[-1])).reshape(p.length, p.length)
        scores = (scores + scores.T) / 2
        out["attention"].append(precision_at(scores, f.contacts, k, p.long_range))
        out["dca"].append(precision_at(mean_field_dca(f.msa, p.symbols), f.contacts, k, p.long_range))
        out["ablation_jacobian"].append(precision_at(_jacobian(ablation, f.msa, cfg), f.contacts, k, p.long_range))
        out["model_jacobian"].append(precision_at(_jacobian(model, f.msa, cfg), f.contacts, k, p.long_range))
        out["base_rate"].append(base_rate(f.contacts, p.long_range))
        if n == 0:
            example = {"scores": scores, "contacts": f.contacts}
    means = {name: float(np.mean(v)) for name, v in out.items()}
    return {"mean": means, "per_family": out, "top_k": k, "families": {"fit": len(fit), "test": len(test)},
            "example": example}


def judge_contacts(m: dict, base_ratio: float, ablation_ratio: float) -> list[Check]:
    """Attention read-out precision >= ``base_ratio`` x the base rate and >= ``ablation_ratio`` x the ablation's."""
    a, base, abl = m["mean"]["attention"], m["mean"]["base_rate"], m["mean"]["ablation_jacobian"]
    return [Check(f"precision of the top L/5 long-range pairs from row attention >= {base_ratio} x the base rate",
                  a >= base_ratio * base, f"{a:.3f} vs {base:.3f} ({a / max(base, 1e-12):.1f}x)"),
            Check(f"... and >= {ablation_ratio} x the same model's with row attention replaced by mean pooling "
                  "(read from its categorical Jacobian)",
                  a >= ablation_ratio * abl and a > 0, f"{a:.3f} vs {abl:.3f} ({a / max(abl, 1e-12):.1f}x)")]


def _plot(m: dict) -> bytes:
    fig, (a1, a2, a3) = new_figure(3, width=4.4)                     # width per panel
    names = ["attention", "dca", "model_jacobian", "ablation_jacobian", "base_rate"]
    labels = ["row attention\n(logistic read-out)", "mean-field\nDCA", "full model's\nJacobian",
              "no row attention\n(Jacobian)", "base rate"]
    a1.bar(range(len(names)), [m["mean"][n] for n in names], color=["tab:blue", "tab:green", "tab:cyan",
                                                                      "tab:orange", "tab:grey"])
    a1.set(xticks=range(len(names)), ylim=(0, 1), ylabel="precision of the top L/5 long-range pairs",
           title=f"{m['families']['test']} held-out families")
    a1.set_xticklabels(labels, fontsize=7)
    ex = m["example"]
    a2.imshow(ex["contacts"], cmap="Greys")
    a2.set(title="test family 0: true contacts", xlabel="residue j", ylabel="residue i")
    a3.imshow(ex["scores"], cmap="viridis")
    a3.set(title="read from row attention", xlabel="residue j")
    return png_bytes(fig)


def claim_msa_contacts(ctx: VerifyContext) -> Claim:
    """An MSA model trained only to fill in masked residues has row attention that reads out contacts."""
    cfg = CONTACTS_FULL
    models = contact_models(cfg, ctx.workdir)
    m = measure_contacts(models["attention"], models["mean"], models["attention_task"], cfg)
    checks = judge_contacts(m, cfg.base_ratio, cfg.ablation_ratio)
    mean = m["mean"]
    return Claim(
        "msa-contacts", "Evoformer case: contacts read from row attention",
        statement="Attention over a multiple sequence alignment infers which residues are in contact, long-range "
                  "ones included.",
        criterion=f"an MSA Transformer trained {cfg.minutes:g} minutes by masked-residue prediction on "
                  f"{cfg.train_families} synthetic Potts families; a logistic regression over its symmetrized, "
                  f"APC-corrected row-attention maps fitted on {cfg.fit_families} other families; precision of the "
                  f"top L/{cfg.top_fraction} = {m['top_k']} pairs with |i - j| >= {cfg.potts.long_range}, averaged "
                  f"over {m['families']['test']} held-out families",
        checks=checks,
        measurement={"precision": mean, "per_family": m["per_family"], "top_k": m["top_k"],
                     "potts": asdict(cfg.potts), "models": models["provenance"]},
        summary=f"top-L/5 precision: row attention {mean['attention']:.2f}, DCA {mean['dca']:.2f}, no row "
                f"attention {mean['ablation_jacobian']:.2f}, base rate {mean['base_rate']:.2f}",
        figure=_plot(m),
        notes="DCA and the full model's Jacobian are shown, not judged. The families share one contact energy "
              "(a fixed 'chemistry'), as real proteins do; with a different coupling rule per contact a "
              "bilinear attention score would have nothing generic to learn.")


CLAIMS = [claim_msa_contacts]
