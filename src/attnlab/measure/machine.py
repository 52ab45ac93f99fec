"""What a benchmark result depends on besides the code: versions, CPU, threads, compiler cache.

Example::

    info = machine_info(argv=["bench", "--quick"])
    info["cpu_model"], info["torch_threads"]
"""
from __future__ import annotations

import datetime
import glob
import json
import os
import platform
import subprocess
import sys
import time
from typing import Optional

import torch

from ..functional.cpu import cpu_class, cpu_features, cpu_model

__all__ = ["machine_info", "write_script_result", "cpu_model", "cpu_label", "inductor_cache_warm", "LoadMonitor",
           "BUSY_WARN", "busy_warning", "free_page_reporting", "reported_free_kib", "reclaim_note", "run_warnings"]


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


def write_script_result(path: str, rows: list[dict]) -> str:
    """Write a script's rows with this machine's metadata (its command: ``python <script> <args>``) as JSON at
    ``path`` (creating its folder); return the line for the script to print: the CPU, threads and the path
    (scripts/bench_*.py)."""
    meta = machine_info()
    meta["command"] = " ".join(["python", os.path.relpath(sys.argv[0]), *sys.argv[1:]])
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    return f"{cpu_label(meta)}, {meta['torch_threads']} threads; wrote {path}"


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


_BALLOON = "/sys/bus/virtio/drivers/virtio_balloon"
_REPORTED_KIB = "/sys/module/page_reporting/parameters/reported_kib"
VIRTIO_BALLOON_F_REPORTING = 5          # the virtio spec's feature bit for free-page reporting
#: host-reclaimed memory during a run from which the report notes it (MiB)
RECLAIM_NOTE_MIB = 1024


def free_page_reporting() -> bool:
    """Does this machine, a VM, report the memory it frees to its host (virtio-balloon's free-page reporting)?

    The host then takes those pages back, and whatever touches them next waits while the host faults them in
    again: a cost no process of the guest is charged CPU time for (issue #27, docs/benchmarks.md).
    """
    for path in glob.glob(f"{_BALLOON}/virtio*/features"):     # one '0'/'1' character per feature bit
        try:
            with open(path) as f:
                bits = f.read().strip()
        except OSError:
            continue
        if len(bits) > VIRTIO_BALLOON_F_REPORTING and bits[VIRTIO_BALLOON_F_REPORTING] == "1":
            return True
    return False


def reported_free_kib() -> Optional[int]:
    """KiB this guest has reported to its host so far, where its kernel counts them (a ``reported_kib``
    parameter of page_reporting, which not every kernel has); else None."""
    try:
        with open(_REPORTED_KIB) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def reclaim_note(meta: dict) -> list[str]:
    """The report footer's note, as a list of one line, when the host took back RECLAIM_NOTE_MIB or more of the
    memory the guest freed during the run (or an unknown amount, where the kernel does not count it); else no line.

    Measured on the AMD EPYC Zen 3 of issue #27 (n = 8192, D = 128, fp32 ALiBi forward, 4 rounds): with the
    default allocator the host took back 11,276 MiB in the 64 s run, and `auto` and `native`, the same kernel,
    were judged 0.899 apart; with freed memory kept in the process, 8 MiB and 0.998."""
    load = meta.get("load") or {}
    if not load.get("free_page_reporting"):
        return []
    mib = load.get("host_reclaimed_mib")
    if mib is not None and mib < RECLAIM_NOTE_MIB:
        return []
    amount = "an unknown amount" if mib is None else f"{mib:,.0f} MiB"
    return [f"NOTE: this VM reports the memory it frees to its host, which took back {amount} during this run. "
            "A run that touches fresh memory after a memory-heavy step (a dense mask or bias built per call) "
            "waits while the host faults it in again, up to 25% slower: enough to split two runs of the same "
            "kernel in an auto verdict. To keep freed memory in the process, prefix the command with "
            "MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=68719476736"]


def run_warnings(meta: dict) -> list[str]:
    """Every footer line on what the machine did during the run: ``busy_warning`` and ``reclaim_note``."""
    return busy_warning(meta) + reclaim_note(meta)


class LoadMonitor:
    """How much of the machine *other* processes used while the bench ran, and how much freed memory the host
    of a VM took back meanwhile (``reclaim_note``).

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
        self.reported0 = reported_free_kib()

    def stop(self) -> dict:
        wall = time.perf_counter() - self.t0
        busy1, own = _busy_jiffies(), _own_cpu_s() - self.own0
        out = {"loadavg_1min_start": self.load0,
               "loadavg_1min_end": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
               "other_cpu_fraction": None, "free_page_reporting": free_page_reporting(), "host_reclaimed_mib": None}
        reported1 = reported_free_kib()
        if reported1 is not None and self.reported0 is not None:
            out["host_reclaimed_mib"] = (reported1 - self.reported0) / 1024
        if busy1 is not None and self.busy0 is not None and wall > 0:
            busy = (busy1 - self.busy0) / os.sysconf("SC_CLK_TCK")
            out["other_cpu_fraction"] = max(0.0, (busy - own) / (wall * (os.cpu_count() or 1)))
        return out
