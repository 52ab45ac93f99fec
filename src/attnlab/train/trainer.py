"""The trainer: AdamW, warmup + cosine, clipping, accumulation, validation, checkpoints, resume.

It trains any ``Task`` (``task.py``: the GPT language model, seq2seq, ViT, ...): the task builds
the model and its batches, the trainer owns the loop. One optimizer step = ``grad_accum``
micro-batches (each ``batch_size`` rows), each loss divided by grad_accum before backward, then
global-norm clipping, then AdamW at ``lr_at(step)``.
Validation loss is the mean over ``eval_iters`` batches drawn once from the validation split
(the same batches at every evaluation, so the curve is not sampling noise). Everything a step
depends on (weights, optimizer moments, step, the batch sampler's and torch's RNG states) is in
the checkpoint: a run stopped at step k and resumed reproduces the uninterrupted run's losses
exactly. The first Ctrl-C finishes the current step, checkpoints and stops. Under torchrun
(``dist=init_distributed()``) the same run is data-parallel: see ``distributed`` for what changes.

Before anything is built, one training step's memory is estimated (``sizes``) and refused if it cannot
fit. The run directory is locked while the trainer writes it (``rundir.RunLock``: from construction to
the end of ``train()``; a later ``train()`` or ``save()`` takes it again), so a second trainer on it
refuses. A non-finite loss stops the run (``NonFiniteLoss``) without saving the weights that made it,
and a write that fails (a full disk) stops it as ``RunFailed``; both say which checkpoint survived.

Example::

    data = prepare_lm_data("docs", "char")
    task = LMTask(GPTConfig.preset("nano", vocab_size=data.tokenizer.vocab_size), data)
    trainer = Trainer(task, TrainConfig.for_preset("nano", out_dir="runs/a"))
    trainer.train()                                        # runs/a: step-*/, metrics.jsonl, loss.png
    trainer = Trainer.from_checkpoint(load_checkpoint("runs/a"), task, steps=1000)   # continue
"""
from __future__ import annotations

import json
import logging
import math
import signal
import threading
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch
from tqdm import tqdm

from .checkpoint import Checkpoint, save_checkpoint
from .config import TrainConfig
from .distributed import DistContext, QuietLog
from .metrics import MetricsLog, format_metrics, plot_loss_curve
from .rundir import NonFiniteLoss, RunFailed, RunLock, check_destination, copy_history, intact, take_lock
from .schedule import lr_at, make_optimizer
from .sizes import check_training_fits
from .task import Task

__all__ = ["Trainer", "BF16_AUTO", "use_bf16"]

log = logging.getLogger(__name__)

# bf16="auto" resolves to this on CPU. Measured on the micro preset (fwd + bwd + AdamW step, torch 2.13,
# 2-core Zen 4 shared with other jobs, best of 3-4): batch 16 x 256: fp32 4085 tok/s, bf16 autocast 4111
# tok/s; batch 32 x 256 under heavier load: 1549 vs 1692 tok/s (command not recorded). No reliable gain, so
# "auto" stays fp32. Not measured on a CPU with AMX, where bf16 matmuls run on AMX tiles: re-measure there.
BF16_AUTO = False


_RATE_KEY = {"tok": "tokens_per_s", "ex": "examples_per_s"}     # metrics.jsonl throughput field per task unit


def use_bf16(setting: str) -> bool:
    return {"on": True, "off": False, "auto": BF16_AUTO}[setting]


class Trainer:
    """Trains ``task``'s model on its batches; ``train()`` runs to ``cfg.steps`` (or the time limit, or max_steps)."""

    def __init__(self, task: Task, cfg: TrainConfig, *, progress: bool = True,
                 checkpoint: Optional[Checkpoint] = None, dist: Optional[DistContext] = None,
                 lock: Optional[RunLock] = None):
        """``lock``: the run directory's lock, already taken by the caller (the CLI takes it before reading
        any data); None: taken here (RunLocked if another trainer holds it)."""
        self.dist = dist or DistContext.current()
        self.dist.check_batch(cfg.batch_size)
        self.out = Path(cfg.out_dir)
        check_training_fits(task, cfg.batch_size, cfg.eval_iters)     # SizeError before anything is allocated
        self._lock = lock if lock is not None else take_lock(self.out, self.dist)
        try:
            self._setup(task, cfg, checkpoint, progress)
        except BaseException:
            if lock is None:
                self._lock.abandon()                    # a directory made just now is removed again
            raise

    def _setup(self, task: Task, cfg: TrainConfig, checkpoint: Optional[Checkpoint], progress: bool) -> None:
        check_destination(self.out, checkpoint)
        source = checkpoint.path.parent if checkpoint is not None else None
        elsewhere = source is not None and source.resolve() != self.out.resolve()
        here = f"step-{checkpoint.step:06d}" if checkpoint is not None else None
        self.cfg, self.task = cfg, task
        self.progress = progress and self.dist.is_main
        self.dist.check_same({"task": task.name, "data": task.info(), "tokenizer": task.tokenizer_json(),
                              "train_config": cfg.to_dict(), "model_config": task.model_config(),
                              "resumed_from": here})
        torch.manual_seed(cfg.seed)
        self.model = task.build_model()
        self.optimizer = make_optimizer(self.model, cfg)
        self.loss_fn = self.dist.loss_fn(self.model)            # model.loss, or through DDP (gradient averaging)
        self.dist.seed_rank_rng(cfg.seed)
        self.sampler = task.sampler(cfg.batch_size, cfg.seed)
        self.eval_batches = task.eval_batches(cfg.batch_size, cfg.eval_iters, cfg.seed + 1)   # the same every time
        self.bf16 = use_bf16(cfg.bf16)
        self.step = 0
        self.extra: dict = {"task": task.name, "data": task.info()}
        if checkpoint is not None:
            self._restore(checkpoint)
        # time-budgeted: no step count given, or one sized from the budget before this resume
        self.budgeted = cfg.time_limit_min is not None and (cfg.steps is None or "calibration" in self.extra)
        self.saved_step = self.evaluated_step = self.step if checkpoint is not None else None
        if elsewhere and self.dist.is_main:              # a branch: its log starts with the source's history
            copy_history(source / "metrics.jsonl", self.out / "metrics.jsonl")
        self.metrics = (MetricsLog(self.out / "metrics.jsonl", resume_step=self.step if checkpoint else None)
                        if self.dist.is_main else QuietLog())
        self.last_val: Optional[float] = None
        self.eval_seconds: Optional[float] = None        # the last evaluation's duration
        self.eval_total = 0.0                             # all evaluations' (time budgeting leaves them out)
        self.interrupted = False                          # the last train() call was stopped by Ctrl-C

    @classmethod
    def from_checkpoint(cls, ckpt: Checkpoint, task: Task, *, progress: bool = True,
                        dist: Optional[DistContext] = None, lock: Optional[RunLock] = None,
                        **overrides) -> "Trainer":
        """Continue the run saved in ckpt (task rebuilt from it); overrides change TrainConfig fields.

        The run continues in ``out_dir`` if given, else in the checkpoint's own run directory
        (``ckpt.path.parent``, wherever it now lies: never the ``out_dir`` string stored in it, which
        is relative to the directory the run was started from). A different ``out_dir`` starts a
        branch there (it must hold no checkpoints; the source run is only read).
        """
        if json.loads(json.dumps(task.model_config())) != ckpt.model_config:
            raise ValueError(f"the task's model config {task.model_config()} differs from the checkpoint's "
                             f"{ckpt.model_config}; rebuild the task from the checkpoint (TaskSpec.from_checkpoint)")
        overrides = {k: v for k, v in overrides.items() if k != "out_dir" or v is not None}
        cfg = TrainConfig.from_dict({**ckpt.train_config, "out_dir": str(ckpt.path.parent), **overrides})
        if overrides.get("steps") is not None:                 # an explicit length ends time budgeting
            ckpt.extra.pop("calibration", None)
        return cls(task, cfg, progress=progress, checkpoint=ckpt, dist=dist, lock=lock)

    def _restore(self, ckpt: Checkpoint) -> None:
        self.model.load_state_dict(ckpt.model_state)
        if ckpt.optimizer_state is not None:
            self.optimizer.load_state_dict(ckpt.optimizer_state)
        self.dist.restore_rng(ckpt.rng, self.cfg.seed, ckpt.step)
        self.sampler.set_state(ckpt.rng["batches"])
        self.step = ckpt.step
        self.extra = {**ckpt.extra, "task": self.task.name, "data": self.task.info()}

    # ---------------------------------------------------------------- pieces
    def _autocast(self):
        return torch.autocast("cpu", dtype=torch.bfloat16) if self.bf16 else nullcontext()

    def _train_step(self) -> float:
        """One optimizer step; returns the mean micro-batch loss."""
        cfg = self.cfg
        lr = lr_at(self.step, cfg.lr, cfg.min_lr, cfg.warmup_steps, cfg.steps)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.model.train()
        total = 0.0
        for micro in range(cfg.grad_accum):
            batch = self.sampler.next()                                       # (B, ...) each: the global batch
            batch = [self.dist.shard(t) for t in batch]                       # (B / ranks, ...): this rank's rows
            last = micro == cfg.grad_accum - 1
            with nullcontext() if last else self.dist.no_sync(self.loss_fn):   # DDP averages grads on the last
                with self._autocast():
                    loss = self.loss_fn(*batch)
                (loss / cfg.grad_accum).backward()
            total += loss.item()
        mean = self.dist.mean(total / cfg.grad_accum)                        # the same on every rank
        if not math.isfinite(mean):                                           # before the step spreads it
            self._non_finite(f"step {self.step + 1}: the training loss is {mean} (learning rate {lr:.3g})")
        if cfg.grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.grad_clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self._lr = lr
        return mean

    def _non_finite(self, what: str) -> None:
        raise NonFiniteLoss(f"{what}: training stopped, and nothing from this step was saved; {intact(self.out)}. "
                            "Lower --lr, or check the data for bad values")

    @torch.no_grad()
    def evaluate(self) -> float:
        """Mean validation loss (the model's loss: nats / token for a language model) over the fixed batches."""
        t0 = time.perf_counter()
        self.model.eval()
        losses = []
        for batch in self.eval_batches:
            with self._autocast():
                losses.append(self.model.loss(*[self.dist.shard(t) for t in batch]).item())
        self.eval_seconds = time.perf_counter() - t0
        self.eval_total += self.eval_seconds
        return self.dist.mean(sum(losses) / len(losses))                 # equal shards: the global mean

    def _evaluate_and_log(self) -> float:
        val = self.evaluate()
        if not math.isfinite(val):
            self._non_finite(f"step {self.step}: the validation loss is {val}")
        more = self.task.val_metrics(val)
        self.metrics.write({"step": self.step, "val_loss": val, **more})
        log.info("step %d: validation loss %.4f%s", self.step, val, f" ({format_metrics(more)})" if more else "")
        self.last_val, self.evaluated_step = val, self.step
        return val

    def save(self) -> Path:
        """Checkpoint the current step (refused, as NonFiniteLoss, if any weight is NaN or infinite)."""
        bad = [n for n, p in self.model.named_parameters() if not torch.isfinite(p).all()]
        if bad:
            self._non_finite(f"step {self.step}: {len(bad)} weight tensors ({bad[0]}, ...) are not finite")
        rng = {**self.dist.rng_states(), "batches": self.sampler.state()}    # collective: every rank calls save
        if not self.dist.is_main:
            self.saved_step = self.step
            return self.out / f"step-{self.step:06d}"
        with self._lock.holding():
            try:
                path = save_checkpoint(self.out, self.step, self.model, tokenizer_json=self.task.tokenizer_json(),
                                       model_config=self.task.model_config(), train_config=self.cfg.to_dict(),
                                       optimizer=self.optimizer, rng=rng, extra=self.extra,
                                       keep=self.cfg.keep_checkpoints)
            except OSError as e:
                if e.errno is not None and e.filename is None:          # a failed write() names no file
                    raise OSError(e.errno, e.strerror, str(self.out / f"step-{self.step:06d}")) from e
                raise
        self.saved_step = self.step
        return path

    @contextmanager
    def _disk_failures(self):
        """A failed write (a full disk, a directory turned read-only) as one RunFailed saying what survived."""
        try:
            yield
        except OSError as e:
            where = e.filename or self.out
            raise RunFailed(f"writing {where} failed at step {self.step} ({e.strerror or e}): training stopped; "
                            f"{intact(self.out)}") from e

    def _size_to_budget(self, s_per_step: float, elapsed: float) -> None:
        """Set cfg.steps so that the run, its evaluations and the final save fit in time_limit_min.

        Called after calibrate_steps steps and again at every evaluation (the machine's speed may
        change), so the cosine reaches min_lr when the time is up. Not bit-reproducible on resume:
        give --steps for that.
        """
        cfg = self.cfg
        t_eval = self.eval_seconds or cfg.eval_iters * s_per_step / (3 * cfg.grad_accum)  # forward ~ 1/3 of a step
        left = 0.98 * cfg.time_limit_min * 60 - elapsed - t_eval - 5.0                   # 5 s: save + plot
        steps = self.step + max(1, math.floor(left / (s_per_step + t_eval / cfg.eval_interval)))
        self.cfg = cfg.but(steps=steps)
        self.extra["calibration"] = {"s_per_step": s_per_step, "eval_s": t_eval, "steps": steps, "at_step": self.step}
        log.info("time budget %.1f min at %.3f s/step: the schedule runs to step %d",
                 cfg.time_limit_min, s_per_step, steps)

    # ---------------------------------------------------------------- the loop
    def train(self, max_steps: Optional[int] = None, *, plot: bool = True) -> list[float]:
        """Train until cfg.steps, the time limit, Ctrl-C or ``max_steps`` (a step count); returns this call's losses.

        Always ends with a checkpoint and a validation loss at the last step, then (``plot``) the
        loss-curve PNG of the whole run. In a distributed run a failure on another rank is a
        ``DistributedError`` here (after at most the collective timeout), not a hang. A non-finite loss
        raises ``NonFiniteLoss`` and a failed write ``RunFailed`` (nothing more is saved; the message says
        which checkpoint is intact).
        """
        with self.dist.failures(), self._lock.holding(), self._disk_failures():
            return self._train(max_steps, plot)

    def _train(self, max_steps: Optional[int], plot: bool) -> list[float]:
        pace = _Pace(t0=time.perf_counter())
        stop = {"why": None}
        old_handler = self._catch_sigint(stop)
        units_per_step = self.task.units_per_batch(self.cfg.batch_size) * self.cfg.grad_accum   # tokens or examples
        bar = tqdm(total=self.cfg.steps, initial=self.step, disable=not self.progress, unit="step", dynamic_ncols=True)
        losses: list[float] = []
        try:
            if self.step == 0 and self.evaluated_step is None:
                self._evaluate_and_log()
            while self.cfg.steps is None or self.step < self.cfg.steps:
                stop["why"] = self._stop_rule(max_steps, pace) or stop["why"]
                stop["why"] = self.dist.first_stop(stop["why"])              # all ranks stop at the same step
                if stop["why"]:
                    log.info("stopping at step %d: %s", self.step, stop["why"])
                    break
                losses.append(self._timed_step(pace, units_per_step))
                if self.budgeted:                # size the schedule to the time left, again at every evaluation
                    self._fit_schedule_to_budget(pace)
                    bar.total = self.cfg.steps
                self._evaluate_and_save_when_due()
                self._show_progress(bar, pace, units_per_step)
        finally:
            bar.close()
            self.interrupted = stop["why"] == "interrupted"
            if old_handler is not None and not self.interrupted:
                signal.signal(signal.SIGINT, old_handler)
        self._finish(plot)
        return losses

    # ---------------------------------------------------------------- the loop's steps
    @staticmethod
    def _catch_sigint(stop: dict):
        """Make the first Ctrl-C set ``stop["why"]`` (the loop then checkpoints and stops); the second
        one is the previous handler's (stops at once). Returns the previous handler (None off the main thread)."""
        if threading.current_thread() is not threading.main_thread():
            return None
        old_handler = None

        def on_sigint(signum, frame):
            stop["why"] = "interrupted"
            signal.signal(signal.SIGINT, old_handler)                         # a second Ctrl-C stops at once
        old_handler = signal.signal(signal.SIGINT, on_sigint)
        return old_handler

    def _stop_rule(self, max_steps: Optional[int], pace: "_Pace") -> Optional[str]:
        """Why to stop before the next step (max_steps reached, or it would overrun the time limit), or None."""
        if max_steps is not None and self.step >= max_steps:
            return f"max_steps={max_steps}"
        if self.cfg.time_limit_min is not None and pace.step_s is not None:
            budget = self.cfg.time_limit_min * 60 - (self.eval_seconds or 0.0) - 5.0
            if time.perf_counter() - pace.t0 + (pace.loop_s or pace.step_s) > budget:
                return f"time limit ({self.cfg.time_limit_min} min)"
        return None

    def _timed_step(self, pace: "_Pace", units_per_step: int) -> float:
        """One optimizer step, timed; updates the running step time and loss, writes the metrics record."""
        ts = time.perf_counter()
        loss = self._train_step()
        dt = time.perf_counter() - ts
        self.step += 1
        pace.step_s = dt if pace.step_s is None else 0.9 * pace.step_s + 0.1 * dt
        pace.ema_loss = loss if pace.ema_loss is None else 0.95 * pace.ema_loss + 0.05 * loss
        self.metrics.write({"step": self.step, "loss": loss, "lr": self._lr,
                            _RATE_KEY.get(self.task.unit, f"{self.task.unit}_per_s"): units_per_step / dt,
                            "elapsed_s": time.perf_counter() - pace.t0})
        return loss

    def _fit_schedule_to_budget(self, pace: "_Pace") -> None:
        """Re-measure the loop's speed (evaluations excluded) and resize cfg.steps to the time left:
        after calibrate_steps steps (or 5% of the budget), then at every evaluation."""
        cfg = self.cfg
        now = time.perf_counter()
        if pace.win is None:                                           # this call's first step warms up
            pace.win = (self.step, now, self.eval_total)
        n, spent = self.step - pace.win[0], now - pace.win[1] - (self.eval_total - pace.win[2])
        enough = n >= cfg.calibrate_steps or (n >= 2 and spent > 3 * cfg.time_limit_min)  # or 5% of budget
        if enough and (cfg.steps is None or self.step % cfg.eval_interval == 0):
            pace.loop_s = spent / n                                    # a whole loop turn, bookkeeping included
            self._size_to_budget(pace.loop_s, now - pace.t0)
            pace.win = (self.step, now, self.eval_total)
        if self.dist.active:                                           # rank 0's timing rules
            self.cfg = self.cfg.but(steps=self.dist.from_main(self.cfg.steps))

    def _evaluate_and_save_when_due(self) -> None:
        if self.step % self.cfg.eval_interval == 0 or self.step == self.cfg.steps:
            self._evaluate_and_log()
        if self.step % self.cfg.checkpoint_interval == 0:
            self.save()

    def _show_progress(self, bar, pace: "_Pace", units_per_step: int) -> None:
        bar.update(1)
        val = f"{self.last_val:.3f}" if self.last_val is not None else "-"
        bar.set_postfix(loss=f"{pace.ema_loss:.3f}", val=val,
                        **{f"{self.task.unit}_s": f"{units_per_step / pace.step_s:.0f}"}, refresh=False)

    def _finish(self, plot: bool) -> None:
        """A validation loss and a checkpoint at the last step (unless just done), then the loss-curve PNG."""
        if self.evaluated_step != self.step:
            self._evaluate_and_log()
        if self.saved_step != self.step:
            path = self.save()
            log.info("checkpoint %s", path)
        if plot and self.dist.is_main:
            plot_loss_curve(self.metrics.records(), self.out / "loss.png",
                            title=f"{self.task.name} {_num_params(self.model) / 1e6:.2f}M parameters "
                                  f"{getattr(self.task, 'title', lambda: '')()}".rstrip(),
                            ylabel=getattr(self.task, "loss_label", "training loss (the model's loss)"))


@dataclass
class _Pace:
    """One ``train()`` call's timing and smoothed loss (the loop's state between its steps)."""
    t0: float                                   # when the call began (perf_counter)
    step_s: Optional[float] = None              # a step's time, exponentially smoothed
    loop_s: Optional[float] = None              # a whole loop turn, bookkeeping included (time budgeting)
    win: Optional[tuple] = None                 # (step, time, eval time) when the timing window began
    ema_loss: Optional[float] = None            # the progress bar's smoothed loss


def _num_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
