"""What a benchmark result depends on besides the code: versions, CPU, threads, compiler cache.

Example::

    info = machine_info(argv=["bench", "--quick"])
    info["cpu_model"], info["torch_threads"]
"""
from __future__ import annotations

import datetime
import os
import platform
import subprocess
import sys
import time
from typing import Optional

import torch

from ..functional.cpu import cpu_class, cpu_features, cpu_model

__all__ = ["machine_info", "cpu_model", "cpu_label", "inductor_cache_warm", "LoadMonitor", "BUSY_WARN",
           "busy_warning"]


def cpu_label(meta: dict) -> str:
    """The CPU as every report footer names it: model and class, e.g. 'Intel(R) Xeon(R) Processor [amx]'
    (a figure means little without the CPU class: AMX alone makes bf16 ~5x faster in torch's SDPA)."""
    return f"{meta['cpu_model']} [{meta.get('cpu_class', 'class not recorded')}]"


def inductor_cache_warm() -> bool:
    """Whether torch.compile's on-disk cache already holds entries.

    A warm cache cuts FlexAttention's first-call compile time from ~20 s to ~2 s on a 2-core
    machine, so the compile times in a report mean little without this bit.
    """
    try:
        from torch._inductor.runtime.cache_dir_utils import cache_dir
        d = cache_dir()
        return os.path.isdir(d) and any(os.scandir(d))
    except Exception:           # a private torch API: its absence must not break the bench
        return False


def code_version() -> dict:
    """The git commit of the attnlab source and whether it has uncommitted changes (None outside git)."""
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        def git(*args):
            return subprocess.run(["git", *args], cwd=here, capture_output=True, text=True, timeout=10).stdout.strip()
        commit = git("rev-parse", "HEAD")
        dirty = bool(git("status", "--porcelain", "--", os.path.dirname(here)))
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}
    return {"commit": commit or None, "dirty": dirty if commit else None}


def _native_level() -> Optional[str]:
    from ..functional.backends import native
    return native.ISA


def machine_info(argv: Optional[list[str]] = None) -> dict:
    """Metadata stored with every benchmark report."""
    return {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": " ".join(["attnlab", *(sys.argv[1:] if argv is None else argv)]),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "cpu_model": cpu_model(),
        "cpu_class": cpu_class(),             # the rules of auto are measured per class (functional/cpu.py)
        "cpu_features": cpu_features(),
        "native_build": _native_level(),      # which level of the compiled kernel ran (amx, avx512_bf16, ...)
        "platform": platform.platform(),
        "inductor_cache_warm_at_start": inductor_cache_warm(),
        "attnlab_source": code_version(),     # kernels change often: which code these numbers are for
    }


def _busy_jiffies() -> Optional[int]:
    """CPU time (all CPUs, in clock ticks) the whole machine spent not idle, from /proc/stat."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)     # idle + iowait
    return sum(fields[:8]) - idle


def _own_cpu_s() -> float:
    t = os.times()                       # this process and its finished children (memory runs)
    return t.user + t.system + t.children_user + t.children_system


#: other processes' share of the CPUs above which a run's timings are called untrustworthy (report, tune)
BUSY_WARN = 0.1


def busy_warning(meta: dict) -> list[str]:
    """The report footer's warning, as a list of one line, when other processes used more than BUSY_WARN of the
    CPUs while the benchmark ran (``meta["load"]``, from ``LoadMonitor.stop``); else no line."""
    busy = (meta.get("load") or {}).get("other_cpu_fraction")
    if busy is None or busy <= BUSY_WARN:
        return []
    return [f"WARNING: other processes used {100 * busy:.0f}% of the CPUs during this run; "
            f"the timings are not trustworthy, rerun on an idle machine"]


class LoadMonitor:
    """How much of the machine *other* processes used while the bench ran.

    On a 2-core machine one concurrent job halves the bench's speed and makes its medians
    meaningless, so the report says so instead of silently publishing slow numbers.

    Example::

        mon = LoadMonitor()
        ...                              # run the benchmark
        mon.stop()["other_cpu_fraction"] # 0.0 on an idle machine, 0.5 if another job used one of 2 cores
    """

    def __init__(self):
        self.t0, self.busy0, self.own0 = time.perf_counter(), _busy_jiffies(), _own_cpu_s()
        self.load0 = os.getloadavg()[0] if hasattr(os, "getloadavg") else None

    def stop(self) -> dict:
        wall = time.perf_counter() - self.t0
        busy1, own = _busy_jiffies(), _own_cpu_s() - self.own0
        out = {"loadavg_1min_start": self.load0,
               "loadavg_1min_end": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
               "other_cpu_fraction": None}
        if busy1 is not None and self.busy0 is not None and wall > 0:
            busy = (busy1 - self.busy0) / os.sysconf("SC_CLK_TCK")
            out["other_cpu_fraction"] = max(0.0, (busy - own) / (wall * (os.cpu_count() or 1)))
        return out
