"""``attnlab bench --contention``: every contestant timed quiet, then beside a busy process pinned to one core.

A kernel that issues hundreds of small parallel regions from Python waits, at every region, for
its slowest thread; put one busy process on one of the cores and that thread is the one sharing
the core, so such a kernel slows several-fold where a kernel with one parallel region per call
slows about 1.5x. The bench shows it per row: after the quiet round-robin timing of a case, the
same warmed-up contestants are timed again while ``BusyProcess`` spins on one core, and each row
gets ``slowdown_busy`` = median beside the busy process / median quiet.

The busy process is a child Python process running a fixed busy loop, pinned with
``os.sched_setaffinity`` (core 1 when the bench may use it, else the last core it may use). It is
started before the contended runs, waited for until it is spinning, and killed after them; it
also stops by itself after ``bound_s`` seconds (its own deadline) and as soon as its parent is
gone, so it can never outlive the bench, even if the bench is killed. If it stopped before the
timing ended, the row says so and gets no ratio.

Example::

    with BusyProcess(bound_s=60) as busy:
        times = time_interleaved(steps)          # timed beside one spinning core
    busy.report()                                # {"core": 1, "cpu_s": ..., "wall_s": ..., ...}
"""
from __future__ import annotations

import logging
import os
import statistics
import subprocess
import sys
import time
from typing import Optional

__all__ = ["BusyProcess", "busy_core", "DEFAULT_BOUND_S", "add_slowdowns", "time_contended"]

log = logging.getLogger(__name__)

DEFAULT_BOUND_S = 600.0       # the busy child exits by itself after this long, whatever happens to the bench
START_TIMEOUT_S = 30.0        # how long to wait for the child to report that it is spinning

# The child: pin itself, say so on stdout, then spin until its deadline, until it is killed, or
# until its parent is gone (re-parented: the bench died without killing it).
_CHILD = """
import os, sys, time
core, bound = int(sys.argv[1]), float(sys.argv[2])
deadline, parent = time.monotonic() + bound, os.getppid()
if hasattr(os, "sched_setaffinity"):
    os.sched_setaffinity(0, {core})
sys.stdout.write("spinning\\n")
sys.stdout.flush()
x = 0
while time.monotonic() < deadline and os.getppid() == parent:
    for _ in range(10000):
        x = (x * 1103515245 + 12345) & 0xFFFFFFFF
"""


def busy_core() -> int:
    """The core the busy process is pinned to: 1 when this process may run on it, else its last core."""
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else [0]
    return 1 if 1 in cores else cores[-1]


def _cpu_s(pid: int) -> Optional[float]:
    """CPU seconds (user + system) process ``pid`` has used, from /proc (None where unreadable)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


class BusyProcess:
    """A child process spinning on one core while the ``with`` block runs; always stopped on exit.

    Args:
        core: the core to pin it to (default ``busy_core()``).
        bound_s: the child's own deadline in seconds: it exits after this even if never killed.
    Attributes after the block: ``pid``, ``alive_at_end`` (False = it stopped before the block
    ended, so the block was not fully contended), ``cpu_s`` / ``wall_s`` (its CPU time and the
    block's wall time; cpu_s / wall_s near 1 = it really kept its core busy).
    """

    def __init__(self, core: Optional[int] = None, bound_s: float = DEFAULT_BOUND_S):
        if not bound_s > 0:
            raise ValueError(f"bound_s={bound_s}: the busy process needs a positive time bound")
        self.core = busy_core() if core is None else core
        self.bound_s = float(bound_s)
        self.proc: Optional[subprocess.Popen] = None
        self.pid: Optional[int] = None
        self.alive_at_end: Optional[bool] = None
        self.cpu_s: Optional[float] = None
        self.wall_s: Optional[float] = None
        self._t0 = 0.0
        self._cpu0: Optional[float] = None

    def __enter__(self) -> "BusyProcess":
        self.proc = subprocess.Popen([sys.executable, "-c", _CHILD, str(self.core), str(self.bound_s)],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.pid = self.proc.pid
        try:
            line = self._wait_until_spinning()
        except BaseException:
            self.stop()
            raise
        if line != "spinning":
            err = self.proc.stderr.read() if self.proc.poll() is not None else ""
            self.stop()
            raise RuntimeError(f"the busy process did not start (pinned to core {self.core}): "
                               f"{(err or line or 'no output').strip().splitlines()[-1]}")
        self._t0, self._cpu0 = time.perf_counter(), _cpu_s(self.pid)
        log.info("  busy process %d spinning on core %d (bound %.0f s)", self.pid, self.core, self.bound_s)
        return self

    def _wait_until_spinning(self) -> str:
        import selectors
        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            if not sel.select(timeout=START_TIMEOUT_S):
                return ""
        return self.proc.stdout.readline().strip()

    def __exit__(self, *exc) -> None:
        if self.proc is None:
            return
        self.wall_s = time.perf_counter() - self._t0
        self.alive_at_end = self.proc.poll() is None
        cpu1 = _cpu_s(self.pid) if self.alive_at_end else None
        self.cpu_s = cpu1 - self._cpu0 if cpu1 is not None and self._cpu0 is not None else None
        self.stop()

    def stop(self) -> None:
        """Kill the child (if still running) and reap it; safe to call twice."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for stream in (self.proc.stdout, self.proc.stderr):
            stream.close()

    def report(self) -> dict:
        """What the JSON stores about this busy process."""
        return {"pid": self.pid, "core": self.core, "bound_s": self.bound_s, "alive_at_end": self.alive_at_end,
                "cpu_s": self.cpu_s, "wall_s": self.wall_s}


def add_slowdowns(rows: list[dict], times: list[list[float]], busy: BusyProcess) -> None:
    """Store each row's contended timing and ``slowdown_busy`` = busy median / quiet median.

    Args:
        rows: result rows that already hold their quiet ``median_ms``, in the order of ``times``.
        times: per row, the seconds of each run timed while ``busy`` spun.
        busy: the (exited) busy process; rows get no ratio if it stopped before the timing ended.
    """
    for row, ts in zip(rows, times):
        row["busy"] = busy.report()
        if not busy.alive_at_end:
            row["notes"].append(f"busy process ended before the timing did (bound {busy.bound_s:g} s): no slowdown")
            continue
        med = statistics.median(ts)
        row.update(median_ms_busy=med * 1e3, times_ms_busy=[t * 1e3 for t in ts],
                   slowdown_busy=med * 1e3 / row["median_ms"])


def time_contended(rows: list[dict], steps: list, quiet_times: list[list[float]], repeats: Optional[int],
                   core: Optional[int] = None) -> BusyProcess:
    """Time warmed-up ``steps`` round-robin beside a ``BusyProcess``; add each row's slowdown.

    The busy process's bound is 20x the quiet timing's wall time plus 30 s: room for a 20x
    slowdown, and still a hard limit.
    """
    from ..measure.timing import time_interleaved
    bound = 30.0 + 20.0 * sum(sum(ts) for ts in quiet_times)
    with BusyProcess(core=core, bound_s=bound) as busy:
        times = time_interleaved(steps, repeats)
    add_slowdowns(rows, times, busy)
    for row in rows:
        if "slowdown_busy" in row:
            log.info("  %-31s %-10s %9.2f ms beside a busy core: %.2fx", _label(row), row["contestant"],
                     row["median_ms_busy"], row["slowdown_busy"])
    return busy


def _label(row: dict) -> str:
    c = row["case"]
    return f"{c['mask']} n={c['n']} {c['dtype']} {c['mode']}"
