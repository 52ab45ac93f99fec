"""The code claims' models: a GPT and a parameter-matched LSTM trained for the same CPU time, and a bigram.

"The same time" is CPU time (``time.process_time``) on ``threads`` threads, not wall time: on a
shared machine a wall-clock budget would hand whichever model ran while others were busy fewer
steps. On an idle machine with ``threads`` = its cores, CPU time is about ``threads`` x wall time;
and there the GPT's position-parallel matrix products use a second core where the LSTM's n small
sequential steps mostly cannot. Each architecture's CPU seconds per step are measured over a few
steps first; it then gets ``cpu_budget_s / s_per_step`` steps, trained by the ordinary ``Trainer``
(checkpoints in ``out/code-<arch>``, loadable by ``attnlab generate`` / ``show`` / ``eval``). The
record says what the run really took (``cpu_s``, ``wall_s``): the Trainer's own per-step work is
not in the calibration (18-25% more on 2 threads, docs/results.md). A finished run found there with
the same configuration is reused (the claim says so): that is the cache that lets the three code
claims share one pair of models, and a later run reuse them.

Example::

    models = code_models(CODE_QUICK_TRAIN, Path("runs/verify/work"))
    models.gpt, models.lstm, models.bigram, models.data, models.provenance
"""
from __future__ import annotations

import json
import logging
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

import torch

from ..measure.threads import threads
from ..tasks.code import CODE_PRESETS, CodeData, make_code_task, prepare_code_data
from ..tasks.code_models import BigramLM

__all__ = ["CodeTrainConfig", "CodeModels", "calibrate", "train_code_model", "finished_record", "code_models"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CodeTrainConfig:
    preset: str                    # tasks.code.CODE_PRESETS
    max_bytes: int                 # stdlib source used
    vocab_size: int                # byte-level BPE
    cpu_budget_s: float            # per model, CPU seconds on `threads` threads (all of them counted)
    # batch 8, GPT lr 4e-3: 100 CPU-s each on the 5 MB corpus, held-out loss (nats/token) GPT batch 16 / lr 2e-3
    # 3.66, batch 8 3.40, batch 8 / lr 4e-3 3.33; LSTM (lr 3e-3) batch 16 3.69, batch 8 3.33 (docs/results.md)
    batch_size: int = 8
    lr_gpt: float = 4e-3
    lr_lstm: float = 3e-3
    seed: int = 0
    threads: int = 1               # torch threads while calibrating and training

    def tag(self) -> str:
        return f"{self.preset}-{self.max_bytes}-{self.vocab_size}"


@dataclass
class CodeModels:
    gpt: torch.nn.Module
    lstm: torch.nn.Module
    bigram: BigramLM
    data: CodeData
    provenance: dict               # per arch: steps, CPU s/step, trained now or reused, directory


def calibrate(task, batch_size: int, lr: float, steps: int = 4) -> float:
    """CPU seconds per training step of a fresh model of ``task`` (one warm-up step, then ``steps`` timed)."""
    model = task.build_model().train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    sampler = task.sampler(batch_size, seed=12345)
    for i in range(steps + 1):
        if i == 1:
            t0 = time.process_time()
        loss = model.loss(*sampler.next())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return (time.process_time() - t0) / steps


def finished_record(out: Path) -> Optional[dict]:
    """The record a finished ``train_code_model`` run wrote into ``out`` (code-budget.json), else None."""
    meta = out / "code-budget.json"
    return json.loads(meta.read_text()) if meta.exists() else None


def train_code_model(arch: str, cfg: CodeTrainConfig, out: Path, data: Optional[CodeData] = None, *,
                     steps: Optional[int] = None, checkpoints: int = 1) -> dict:
    """Train ``arch`` ("gpt" / "lstm") for ``cfg.cpu_budget_s`` CPU seconds on ``cfg.threads`` threads into ``out``.

    ``steps`` given: exactly that many steps, no calibration (``scripts/code_budget.py``: the claims
    against training length); the record then says ``"steps_from": "fixed"`` and ``code_models``
    never reuses it. ``checkpoints``: one every ceil(steps / checkpoints) steps and one at the end
    (the learning rate decays over the whole run, so an earlier one is not a shorter run's end).
    Writes ``out/code-budget.json`` last ({config, steps, cpu_s_per_step, wall_s}), so a run cut
    short is never mistaken for a finished one.
    """
    from ..train import Trainer, TrainConfig
    if checkpoints < 1 or (steps is not None and steps < checkpoints):
        raise ValueError(f"need steps >= checkpoints >= 1, got steps={steps}, checkpoints={checkpoints}")
    if out.exists():                                  # an unfinished run: start again from scratch
        shutil.rmtree(out)
    with threads(cfg.threads):
        task = make_code_task(arch, cfg.preset, cfg.vocab_size, cfg.max_bytes, data=data)
        lr = cfg.lr_gpt if arch == "gpt" else cfg.lr_lstm
        s_per_step = calibrate(task, cfg.batch_size, lr) if steps is None else None
        fixed = steps is not None
        steps = steps if fixed else max(10, int(cfg.cpu_budget_s / s_per_step))
        tc = TrainConfig(steps=steps, batch_size=cfg.batch_size, lr=lr, min_lr=lr / 20,
                         warmup_steps=min(100, steps // 10), eval_interval=max(1, steps // max(4, 2 * checkpoints)),
                         eval_iters=5, checkpoint_interval=-(-steps // checkpoints), keep_checkpoints=checkpoints + 1,
                         seed=cfg.seed, out_dir=str(out))
        t0, c0 = time.perf_counter(), time.process_time()
        trainer = Trainer(task, tc, progress=False)
        trainer.train(plot=False)
        record = {"config": asdict(cfg), "arch": arch, "steps": steps, "steps_from": "fixed" if fixed else "budget",
                  "cpu_s_per_step": None if fixed else round(s_per_step, 4),
                  "cpu_s": round(time.process_time() - c0, 1), "wall_s": round(time.perf_counter() - t0, 1),
                  "params": sum(p.numel() for p in trainer.model.parameters()), "val_loss": trainer.last_val}
    (out / "code-budget.json").write_text(json.dumps(record, indent=1))
    log.info("code %s: %d steps in %.0f s", arch, steps, record["wall_s"])
    return record


def code_models(cfg: CodeTrainConfig, workdir: Path) -> CodeModels:
    """The GPT, the LSTM (reused from ``workdir/code-<tag>-<arch>`` when finished with this config) and the bigram."""
    from ..tasks import load_model
    provenance, models, data = {}, {}, None
    for arch in ("gpt", "lstm"):
        out = Path(workdir) / f"code-{cfg.tag()}-{arch}"
        record = finished_record(out)
        if record is not None and record["config"] == asdict(cfg) and record.get("steps_from", "budget") == "budget":
            provenance[arch] = {**record, "source": f"reused: finished run in {out}"}
        else:
            if data is None:
                data = prepare_code_data(cfg.max_bytes, cfg.vocab_size)
            provenance[arch] = {**train_code_model(arch, cfg, out, data), "source": f"trained now into {out}"}
        models[arch], task = load_model(out)
        data = data or task.data
    bigram = BigramLM.from_ids(data.train_ids, data.tokenizer.vocab_size)
    if CODE_PRESETS[cfg.preset]["max_len"] != models["gpt"].cfg.max_len:
        raise ValueError("the reused GPT's context does not match its preset")
    return CodeModels(models["gpt"], models["lstm"], bigram, data, provenance)
