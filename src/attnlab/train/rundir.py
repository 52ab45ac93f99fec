"""The run directory as a resource: one trainer writes it at a time, leftovers of a killed run are
cleaned, and a failed run says what it left intact.

**The lock.** A trainer holds ``fcntl.flock`` on ``OUT/.lock`` while it writes OUT (checkpoints,
metrics.jsonl, loss.png); the file records who holds it (pid, host, start time, command line). A second
trainer on the same OUT (a fresh run, a resume, a branch into it) refuses at once with ``RunLocked``
naming the holder. The OS drops a flock when its process dies, however it dies, so a lock file left by
a killed run blocks nothing: a lock is stale when it can be taken, not when the file exists. Under
torchrun only rank 0 writes, so only rank 0 locks (``take_lock``; the other ranks get its verdict).

**Leftovers.** Whoever takes the lock removes ``.tmp-step-*`` directories: half-written checkpoints of
a run that was killed while saving (no live writer can own them, since the lock is ours).

**Failures.** ``RunFailed`` is a run that could not go on (a disk error, a non-finite loss); its
message ends with ``intact(out)``: which checkpoint and which metrics survived.

Example::

    with RunLock("runs/a").acquire():                    # RunLocked if another trainer writes runs/a
        ...                                              # write checkpoints
    intact("runs/a")   # 'checkpoint step-000200 and metrics up to step 250 are intact in runs/a'
"""
from __future__ import annotations

import fcntl
import json
import os
import shutil
import socket
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Union

from .checkpoint import list_checkpoints
from .metrics import read_records

__all__ = ["LOCK_FILE", "RunLock", "NoLock", "RunLocked", "RunFailed", "NonFiniteLoss", "take_lock", "intact",
           "check_destination", "copy_history",
           "clean_leftovers"]

LOCK_FILE = ".lock"


class RunLocked(ValueError):
    """The run directory is being written by another trainer."""


class RunFailed(Exception):
    """A run that had to stop (a disk error, a non-finite loss); the message says what survived.

    Not a RuntimeError: in a distributed run those become "another rank died" (``DistContext.failures``).
    """


class NonFiniteLoss(RunFailed):
    """The loss became NaN or infinite: training stopped without saving the weights that produced it."""


class RunLock:
    """An exclusive ``flock`` on ``out/.lock``; ``acquire()`` creates ``out`` if needed.

    ``created``: whether acquire() made the directory (``abandon()`` then removes it again when nothing
    but the lock file was written into it).
    """

    def __init__(self, out: Union[str, os.PathLike]):
        self.out = Path(out)
        self.path = self.out / LOCK_FILE
        self.created = False
        self._file = None
        self._depth = 0

    @property
    def held(self) -> bool:
        return self._file is not None

    def acquire(self) -> "RunLock":
        """Take the lock (a no-op if held), or raise ``RunLocked`` naming the holder. Cleans ``.tmp-step-*``."""
        if self.held:
            return self
        self.created = not self.out.exists()
        self.out.mkdir(parents=True, exist_ok=True)
        f = open(self.path, "a+")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = _describe_holder(f.read())
            f.close()
            raise RunLocked(f"{self.out} is being written by another trainer ({holder}); wait for it to finish, or "
                            "give another directory (--out)") from None
        f.seek(0)
        f.truncate()
        f.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                            "started": time.strftime("%Y-%m-%d %H:%M:%S %z"), "argv": sys.argv}) + "\n")
        f.flush()
        self._file = f
        clean_leftovers(self.out)
        return self

    @contextmanager
    def holding(self):
        """Hold the lock inside (taken if not held); only the outermost exit drops it, so a save inside
        ``train()`` keeps it, and a trainer that has finished does not block the next one."""
        outer = self._depth == 0
        if outer:
            self.acquire()
        self._depth += 1
        try:
            yield self
        finally:
            self._depth -= 1
            if outer:
                self.release()

    def release(self) -> None:
        """Drop the lock (closing the file drops the flock); the file stays, stale and harmless."""
        if self._file is not None:
            self._file.close()
            self._file = None

    def abandon(self) -> None:
        """Release, and remove the directory again if acquire() created it and nothing else was written."""
        self.release()
        if self.created and self.out.is_dir() and [p.name for p in self.out.iterdir()] == [LOCK_FILE]:
            self.path.unlink(missing_ok=True)
            self.out.rmdir()

    def __enter__(self) -> "RunLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


class NoLock(RunLock):
    """What ranks above 0 hold: they write nothing, so they lock nothing."""

    @property
    def held(self) -> bool:
        return True

    def acquire(self) -> "NoLock":
        return self

    def release(self) -> None:
        pass

    def abandon(self) -> None:
        pass


def take_lock(out: Union[str, os.PathLike], dist) -> RunLock:
    """Rank 0 locks ``out``; every rank raises the same ``RunLocked`` if it is taken (a collective under
    torchrun: call it on every rank). Returns the lock (a ``NoLock`` on ranks above 0)."""
    lock: RunLock = RunLock(out) if dist.is_main else NoLock(out)
    problem = None
    try:
        lock.acquire()
    except RunLocked as e:
        problem = str(e)
    problem = dist.from_main(problem)
    if problem:
        raise RunLocked(problem)
    return lock


def _describe_holder(text: str) -> str:
    try:
        info = json.loads(text)
        return f"pid {info['pid']} on {info['host']}, started {info['started']}"
    except (json.JSONDecodeError, TypeError, KeyError):
        return "its lock file does not say which; it is starting"


def clean_leftovers(out: Path) -> list[str]:
    """Remove the ``.tmp-step-*`` directories of saves that never finished; returns their names.

    Only under the lock: then no live writer can own them.
    """
    removed = []
    for p in sorted(out.glob(".tmp-step-*")):
        if p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
            removed.append(p.name)
    return removed


def intact(out: Union[str, os.PathLike]) -> str:
    """What a stopped run left: 'checkpoint step-000200 and metrics up to step 250 are intact in runs/x'."""
    out = Path(out)
    ckpts = list_checkpoints(out)
    try:
        records = read_records(out / "metrics.jsonl")
        steps = [r["step"] for r in records if isinstance(r, dict) and isinstance(r.get("step"), int)]
    except (OSError, UnicodeDecodeError):
        steps = []
    if ckpts and steps:
        return f"checkpoint {ckpts[-1].name} and metrics up to step {max(steps)} are intact in {out}"
    if ckpts:
        return f"checkpoint {ckpts[-1].name} is intact in {out} (no metrics)"
    if steps:
        return f"no checkpoint was written yet; metrics up to step {max(steps)} are intact in {out}"
    return f"nothing was written to {out} yet"


def check_destination(out: Path, checkpoint=None) -> None:
    """ValueError unless a run may write ``out``: a fresh run (``checkpoint`` None) needs a directory without
    checkpoints; a resume into another directory (a branch) too, since pruning there would delete another
    run's checkpoints; a resume in place needs no checkpoints newer than the one it continues."""
    found = list_checkpoints(out)
    if checkpoint is None:
        if found:
            raise ValueError(f"{out} already holds checkpoints ({found[-1].name}); resume it (--resume) or choose "
                             "another output directory (--out)")
        return
    if found and checkpoint.path.parent.resolve() != out.resolve():
        raise ValueError(f"{out} already holds checkpoints of another run ({found[-1].name}); resuming "
                         f"{checkpoint.path} there would mix two runs and prune theirs: choose an empty or new "
                         "output directory (--out)")
    here = f"step-{checkpoint.step:06d}"
    newer = [c.name for c in found if c.name > here]
    if newer:
        raise ValueError(f"{out} holds checkpoints newer than step {checkpoint.step} ({', '.join(newer)}); "
                         "resuming would mix two histories: move them away (or resume from the latest)")


def copy_history(src: Path, dst: Path) -> None:
    """Start a branched run's metrics.jsonl with its source's (MetricsLog then drops records after the step)."""
    if src.is_file() and not dst.exists():
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dst)
