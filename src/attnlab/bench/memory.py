"""Peak memory of one step, measured in a fresh subprocess, and power-law extrapolation.

Each (contestant, case) runs in its own ``python -m attnlab.bench.memory SPEC_JSON`` process, so
nothing earlier in the bench (allocator caches, other cases' buffers) hides or inflates its
peak. The child builds the inputs, resets the kernel's peak-RSS counter (``5`` to
/proc/self/clear_refs resets VmHWM), runs the step once and reports VmHWM minus the RSS just
before: the extra memory the step needed beyond its inputs (and beyond a peer's prebuilt dense
mask or BlockMask, which it is given like its inputs).

Example::

    r = measure_peak("tiled", Case("causal", 1024, "float32", "fwdbwd"))
    r["peak_extra_bytes"]                  # a few MB: tiled never holds (n, n) scores
    c, p = fit_power_law([1024, 2048, 4096], [4e6, 1.6e7, 6.4e7])     # p == 2.0
"""
from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from dataclasses import replace
from typing import Optional, Sequence

from .cases import Case, make_inputs
from .contestants import make_runner

__all__ = ["measure_peak", "fit_power_law", "extrapolate", "peak_in_this_process"]

# glibc otherwise raises its mmap threshold after big frees and keeps later big buffers on the
# heap, where a freed warm-up buffer stays resident and hides the measured step's growth.
_CHILD_ENV = {"MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "65536"}


def _status_bytes(field: str) -> int:
    with open("/proc/self/status") as f:
        kb = re.search(rf"^{field}:\s+(\d+) kB", f.read(), re.M)
    if kb is None:
        raise RuntimeError(f"/proc/self/status has no {field}: peak memory needs Linux")
    return int(kb.group(1)) * 1024


def peak_in_this_process(spec: dict) -> dict:
    """Run one step of ``spec`` ({"contestant": name, "case": Case fields}) here; report its peak.

    Meant for a fresh process (``python -m attnlab.bench.memory``): it resets this process's peak.
    """
    import torch
    case, name = Case(**spec["case"]), spec["contestant"]
    if name != "flex":
        # Lazy one-off set-up (thread pools, kernel caches) at a tiny size, outside the measurement.
        tiny = replace(case, n=min(case.n, 128))
        make_runner(name, tiny, *make_inputs(tiny)).step()
    q, k, v = make_inputs(case)
    run = make_runner(name, case, q, k, v)
    if name == "flex":
        run.step()                        # compile at this shape now; its memory is not the kernel's
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")                      # reset VmHWM to the current RSS
    before = _status_bytes("VmRSS")
    out = run.step()
    peak = _status_bytes("VmHWM")
    return {"peak_extra_bytes": peak - before, "rss_before_bytes": before, "hwm_bytes": peak,
            "out_finite": bool(torch.isfinite(out).all())}


def measure_peak(name: str, case: Case, timeout_s: float = 900) -> dict:
    """Peak extra memory of one step of contestant ``name`` on ``case``, in a fresh subprocess.

    Returns the child's report ({"peak_extra_bytes": ...}) or {"error": reason}.
    """
    spec = json.dumps({"contestant": name, "case": case.to_dict()})
    env = {**os.environ, **_CHILD_ENV}
    try:
        proc = subprocess.run([sys.executable, "-m", "attnlab.bench.memory", spec], env=env,
                              capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout_s:.0f} s"}
    if proc.returncode != 0:
        lines = (proc.stderr or "").strip().splitlines() or [f"exit status {proc.returncode}"]
        return {"error": lines[-1][:200]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def fit_power_law(ns: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """Least-squares fit of y = c * n^p in log-log space; returns (c, p). Needs >= 2 points.

    Example:
        fit_power_law([1, 2, 4], [3, 12, 48])          # (3.0, 2.0)
    """
    pts = [(math.log(n), math.log(y)) for n, y in zip(ns, ys) if n > 0 and y > 0]
    if len(pts) < 2 or len({x for x, _ in pts}) < 2:
        raise ValueError(f"a power-law fit needs >= 2 positive points at distinct n, got n={list(ns)}, y={list(ys)}")
    mx = sum(x for x, _ in pts) / len(pts)
    my = sum(y for _, y in pts) / len(pts)
    p = sum((x - mx) * (y - my) for x, y in pts) / sum((x - mx) ** 2 for x, _ in pts)
    return math.exp(my - p * mx), p


def extrapolate(ns: Sequence[float], ys: Sequence[float], n: float, last: Optional[int] = 3) -> dict:
    """Value at ``n`` of the power law fitted to the ``last`` largest points (the asymptotic regime).

    Returns {"value": ..., "exponent": ..., "fit_n": [...]} so the caller can label it clearly.
    """
    pts = sorted(zip(ns, ys))
    if last is not None:
        pts = pts[-last:]
    c, p = fit_power_law([a for a, _ in pts], [b for _, b in pts])
    return {"value": c * n ** p, "exponent": p, "fit_n": [a for a, _ in pts]}


def main(argv: Optional[list[str]] = None) -> int:
    """Child entry point: one JSON spec on argv (or stdin), one JSON report line on stdout."""
    argv = sys.argv[1:] if argv is None else argv
    spec = json.loads(argv[0] if argv else sys.stdin.read())
    sys.stdout.write(json.dumps(peak_in_this_process(spec)) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
