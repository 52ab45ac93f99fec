"""``attnlab train NAME`` and ``attnlab eval CHECKPOINT``: train any registered task, print its metric.

    attnlab train gpt --data docs --preset micro                  # char-level, time-budgeted (see TRAIN_PRESETS)
    attnlab train gpt --data stdlib --preset nano --tokenizer bpe --steps 300 --out runs/code
    attnlab train gpt --out runs/code --resume --steps 600        # continue (same data, same schedule unless changed)
    attnlab train gpt --resume runs/code --out runs/code2 --steps 900   # a branch: runs/code is only read
    attnlab train seq2seq --task reversal                         # the other models of the theory (attnlab.tasks)
    attnlab eval runs/seq2seq-reversal                            # the task metric of a saved model
    torchrun --nproc_per_node=4 -m attnlab train gpt --preset mini --batch-size 64   # data-parallel, 16 rows each

Every task takes the trainer's options (steps, time limit, batch size, learning rate, seed, output
directory, resume...) and adds its own (``TaskSpec.add_arguments``). Under torchrun every process
trains its slice of the global ``--batch-size``; only rank 0 writes (checkpoints, metrics, output)
and the other ranks log warnings only (see ``train/distributed.py``).

Before any work, every option is checked (the trainer's and the task's: ``TaskSpec.validate``), the
output directory is checked for writing and for room for a checkpoint (``writable_dir``), and one
training step's memory is estimated from the config (``train.sizes``): a refused run reads no data and
creates no directory. The run directory is locked while a trainer writes it (``OUT/.lock``, an OS
``flock`` holding the holder's pid, host and start time; released however the process ends): a second
``attnlab train`` on the same ``--out``, fresh or ``--resume``, refuses at once, naming the holder.
Under torchrun only rank 0 locks. A ``.tmp-step-*`` left by a killed run is removed by the next trainer
that takes the lock.

Results go to stdout, progress and warnings to stderr. Every error is one "attnlab: error: ..." line
naming the flag and the fix. Exit status:

    0    the run finished (a checkpoint at its last step)
    1    the run failed while training: a non-finite loss (nothing saved from that step), a full disk
         or a failed write; the line says which checkpoint and which metrics are intact
    2    refused before training: a bad option, an unwritable --out, a step too big for memory, a
         broken or oversized checkpoint, a run directory locked by another trainer
    130  Ctrl-C: the step finishes, a checkpoint is saved, then the run stops
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .util import EXIT_INTERRUPTED, fail, fail_run, writable_dir
from ..tasks import get_spec, task_names

__all__ = ["add_train", "add_eval"]


# TrainConfig field -> the flag that sets it (errors name the flag, never the field)
FLAGS = {"steps": "--steps", "time_limit_min": "--time-limit", "batch_size": "--batch-size", "lr": "--lr",
         "grad_accum": "--grad-accum", "seed": "--seed", "bf16": "--bf16", "eval_interval": "--eval-interval",
         "eval_iters": "--eval-iters", "checkpoint_interval": "--checkpoint-interval", "warmup_steps": "--warmup"}
_AT_LEAST_ONE = ("steps", "batch_size", "grad_accum", "eval_interval", "eval_iters", "checkpoint_interval")


def _flag_values(args: argparse.Namespace) -> dict:
    """{field: value} of the trainer flags given on the command line."""
    dests = {"time_limit_min": "time_limit", "warmup_steps": "warmup"}
    return {f: getattr(args, dests.get(f, f)) for f in FLAGS if getattr(args, dests.get(f, f)) is not None}


def _check_flags(args: argparse.Namespace) -> None:
    """ValueError naming the flag for a value no run can use (before any data is read)."""
    from ..train.config import check_seed
    given = _flag_values(args)
    if "seed" in given:
        check_seed(given["seed"], "--seed")
    for field in _AT_LEAST_ONE:
        if field in given and given[field] < 1:
            raise ValueError(f"{FLAGS[field]} must be >= 1, got {given[field]}")
    if given.get("warmup_steps", 0) < 0:
        raise ValueError(f"--warmup must be >= 0 steps, got {given['warmup_steps']}")
    for field, unit in (("time_limit_min", " minutes"), ("lr", "")):
        if field in given and not 0 < given[field] < float("inf"):
            raise ValueError(f"{FLAGS[field]} must be a positive number{unit}, got {given[field]}")
    if not 0 < args.dist_timeout < float("inf"):
        raise ValueError(f"--dist-timeout must be a positive number of seconds, got {args.dist_timeout}")


def _overrides(args: argparse.Namespace) -> dict:
    """TrainConfig fields given explicitly on the command line.

    --steps alone replaces a time budget; --time-limit alone replaces a step count (a preset's or a
    checkpoint's): the schedule is sized to fit the time. Given both, the run stops at whichever comes first.
    """
    over = _flag_values(args)
    if args.steps is not None and args.time_limit is None:
        over["time_limit_min"] = None                       # an explicit step count replaces a time budget
    if args.time_limit is not None and args.steps is None:
        over["steps"] = None                                # an explicit time budget replaces a step count
    return over


def _config_error(e: ValueError) -> ValueError:
    """A TrainConfig error in terms of flags ("lr" -> "--lr"); min_lr, which has no flag, is said to be the preset's."""
    import re
    msg = re.sub(r"\b(" + "|".join(FLAGS) + r")\b", lambda m: FLAGS[m.group(1)], str(e))
    return ValueError(msg + ("; min_lr comes from the preset or task: give a larger --lr" if "min_lr" in msg else ""))


def _lock_if_present(out: Path, dist):
    """The run directory's lock if the directory exists (RunLocked at once, before any data is read, when
    another trainer writes it); None for a new directory: the Trainer creates and locks it after every check."""
    from ..train.rundir import take_lock
    return take_lock(out, dist) if dist.from_main(out.is_dir()) else None


def _run_train(args: argparse.Namespace) -> int:
    import logging

    from ..train.distributed import DistributedError, init_distributed
    try:
        dist = init_distributed(timeout_s=args.dist_timeout)
    except ValueError as e:
        return fail(str(e))
    if not dist.is_main:                                    # one voice: the other ranks only warn
        logging.getLogger("attnlab").setLevel(logging.WARNING)
    try:
        code = _train(args, dist)
        if code == 0:
            dist.shutdown(synchronize=True)             # every rank done before any leaves
        return code
    except DistributedError as e:
        return fail(str(e))
    finally:
        dist.shutdown()


def _make_trainer(args: argparse.Namespace, spec, dist, say):
    """The Trainer for a new run or a resumed one. Every option, the output directory and the memory a step
    needs are checked first: a refused run creates no directory (and leaves an existing one as it was)."""
    from ..train import Trainer, TrainConfig
    from ..train.sizes import check_training_fits
    _check_flags(args)
    spec.validate(args)
    if args.resume is not None:
        return _resume_trainer(args, spec, dist, say)
    out = writable_dir(args.out or spec.run_dir(args), "--out")           # checked, not created
    fields = {**spec.defaults_for(args), "out_dir": str(out)}
    try:
        cfg = TrainConfig(**{**fields, **_overrides(args)})
    except ValueError as e:
        raise _config_error(e) from None
    lock = _lock_if_present(out, dist)
    try:
        args.val_fraction = cfg.val_fraction
        task = spec.from_args(args)
        est = check_training_fits(task, cfg.batch_size, cfg.eval_iters)    # before anything is allocated
        writable_dir(out, "--out", need_bytes=est.checkpoint_bytes)
        trainer = Trainer(task, cfg, progress=not args.no_progress, dist=dist, lock=lock)
    except BaseException:
        if lock is not None:
            lock.release()
        raise
    n = sum(p.numel() for p in trainer.model.parameters())
    say(f"training {spec.name} ({n / 1e6:.2f}M parameters) {_describe(task)} -> {out}", file=sys.stderr)
    return trainer


def _resume_trainer(args: argparse.Namespace, spec, dist, say):
    from ..train import Trainer, load_checkpoint
    source = args.resume or args.out                    # --resume CHECKPOINT, or --out DIR --resume
    if not source:
        raise ValueError("--resume needs the run to continue: --resume RUN_DIR (or a step-NNNNNN directory), "
                         "or --out RUN_DIR --resume")
    ckpt = load_checkpoint(source)                      # verified, and its model's size checked
    trained = ckpt.extra.get("task", "gpt")
    if trained != spec.name:
        raise ValueError(f"the run in {source} trained {trained!r}, not {spec.name!r}: "
                         f"resume it with `attnlab train {trained} --resume {source}`")
    info = ckpt.extra.get("data", {})
    if getattr(args, "data", None) is not None and args.data != info.get("name"):
        raise ValueError(f"the run in {source} was trained on {info.get('name')!r}, not {args.data!r}")
    # --out: a branch there; without it the run continues in the checkpoint's own directory
    out, flag = (Path(args.out), "--out") if args.out is not None else (ckpt.path.parent, "--resume")
    need = sum(f.stat().st_size for f in ckpt.path.iterdir() if f.is_file())     # one more checkpoint like it
    try:
        writable_dir(out, flag, need_bytes=need)
    except ValueError as e:
        in_place = out.resolve() == ckpt.path.parent.resolve()
        hint = f" (or continue the run elsewhere: --resume {source} --out NEW_DIR)" if in_place else ""
        raise ValueError(f"{e}{hint}") from None
    lock = _lock_if_present(out, dist)
    try:
        task = spec.from_checkpoint(ckpt)
        try:
            trainer = Trainer.from_checkpoint(ckpt, task, progress=not args.no_progress, dist=dist, lock=lock,
                                              **_overrides(args), out_dir=str(out) if args.out is not None else None)
        except ValueError as e:
            raise _config_error(e) from None
    except BaseException:
        if lock is not None:
            lock.release()
        raise
    say(f"resuming {ckpt.path} at step {ckpt.step} -> {trainer.out}", file=sys.stderr)
    return trainer


def _describe(task) -> str:
    """The task's own one-line description of its data (``describe()``), or its flat ``info()`` items."""
    if hasattr(task, "describe"):
        return task.describe()
    return "on " + ", ".join(f"{k}={v}" for k, v in task.info().items() if isinstance(v, (str, int, float)))


def _train(args: argparse.Namespace, dist) -> int:
    from ..train import CheckpointError
    from ..train.metrics import format_metrics
    from ..train.rundir import RunFailed
    say = print if dist.is_main else (lambda *a, **k: None)
    spec = get_spec(args.task_name)
    try:
        trainer = _make_trainer(args, spec, dist, say)
        trainer.train()
        if not dist.is_main:
            return 0
        metric = trainer.task.evaluate(trainer.model)
    except RunFailed as e:                              # a non-finite loss, a full disk: the input was fine
        return fail_run(str(e))
    except (ValueError, CheckpointError) as e:          # a bad option, a broken checkpoint, a busy directory
        return fail(str(e))
    out = trainer.out
    more = format_metrics(trainer.task.val_metrics(trainer.last_val))
    print(f"step {trainer.step}: validation loss {trainer.last_val:.4f}" + (f" ({more})" if more else ""))
    print(f"{spec.name} on held-out data: {format_metrics(metric)}")
    print(f"checkpoint: {out / f'step-{trainer.saved_step:06d}'}; metrics: "
          f"{out / 'metrics.jsonl'}; loss curve: {out / 'loss.png'}")
    if trainer.cfg.steps is not None and trainer.step < trainer.cfg.steps:
        print(f"stopped early; continue with: attnlab train {spec.name} --out {out} --resume")
    if spec.name == "gpt":
        print(f"sample: attnlab generate {out} --prompt 'The ' --max-new-tokens 200 --top-k 20")
    else:
        print(f"evaluate again: attnlab eval {out}")
    return EXIT_INTERRUPTED if trainer.interrupted else 0    # Ctrl-C: saved, but the run did not finish


def _add_trainer_options(t: argparse.ArgumentParser) -> None:
    g = t.add_argument_group("training (every model)")
    g.add_argument("--steps", type=int, help="optimizer steps (replaces the default time budget)")
    g.add_argument("--time-limit", type=float, metavar="MIN",
                   help="stop after MIN minutes; without --steps the schedule is sized to fit")
    g.add_argument("--batch-size", type=int,
                   help="rows per micro-batch, in total: under torchrun it is split evenly over the processes")
    g.add_argument("--grad-accum", type=int, help="micro-batches per optimizer step")
    g.add_argument("--lr", type=float, help="peak learning rate")
    g.add_argument("--warmup", type=int, help="warmup steps")
    g.add_argument("--bf16", choices=["auto", "on", "off"], help="bfloat16 autocast (auto: off on CPU, "
                   "measured on an AMD Zen 4 only)")
    g.add_argument("--eval-interval", type=int, help="steps between validation losses (default: the preset's)")
    g.add_argument("--eval-iters", type=int,
                   help="validation batches averaged per evaluation (default: the preset's, else 20)")
    g.add_argument("--checkpoint-interval", type=int,
                   help="steps between checkpoints; one is always written at the end (default: the preset's)")
    g.add_argument("--seed", type=int, help="seed of the model's init, batch order and dropout (default 0)")
    g.add_argument("--out", help="run directory (default runs/NAME-...)")
    g.add_argument("--resume", nargs="?", const="", metavar="CHECKPOINT",
                   help="continue a run from its latest checkpoint: alone, the run in --out; with CHECKPOINT (a run "
                        "or step-NNNNNN directory), that one, writing to --out (default: its own run directory)")
    g.add_argument("--no-progress", action="store_true", help="no progress bar")
    g.add_argument("--dist-timeout", type=float, default=300.0, metavar="SEC",
                   help="under torchrun: fail (not hang) when another process is silent this long (default 300)")


def add_train(sub) -> None:
    t = sub.add_parser("train", help=f"train a model ({', '.join(task_names())}), with checkpoints",
                       description="Train one of attnlab's models on its embedded data. Checkpoints are "
                                   "safetensors + JSON, written atomically; --resume continues a run exactly.")
    # dest is not "model": a task may have its own --model option (evoformer's axial | flat)
    models = t.add_subparsers(dest="task_name", required=True, metavar="MODEL")
    for name in task_names():
        spec = get_spec(name)
        m = models.add_parser(name, help=spec.help.replace("%", "%%"), description=spec.help)  # help is %-formatted
        spec.add_arguments(m)
        _add_trainer_options(m)
        m.set_defaults(run=_run_train)


def _run_eval(args: argparse.Namespace) -> int:
    import json

    from ..tasks import load_model
    from ..train import CheckpointError
    from ..train.metrics import format_metrics
    try:
        model, task = load_model(args.checkpoint)
        metric = task.evaluate(model)
    except (ValueError, CheckpointError) as e:
        return fail(str(e))
    if args.json:
        print(json.dumps({"task": task.name, **metric}))
    else:
        print(f"{task.name} on held-out data: {format_metrics(metric)}")
    return 0


def add_eval(sub) -> None:
    e = sub.add_parser("eval", help="print the task metric of a trained model (exact match, accuracy, ...)",
                       description="Load a checkpoint written by `attnlab train` and evaluate it on its task's "
                                   "held-out data.")
    e.add_argument("checkpoint", help="a run directory (its latest checkpoint) or a step-NNNNNN directory")
    e.add_argument("--json", action="store_true", help="print the metric as one JSON object")
    e.set_defaults(run=_run_eval)
