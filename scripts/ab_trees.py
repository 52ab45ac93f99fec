"""The compiled kernel of two source trees, before and after a change, on the bench's cases: one process per tree
and round (an extension module cannot be loaded twice in one process), the trees' order alternating between
rounds, medians over rounds of each process's median. Each tree needs its kernel built in place (``python setup.py
build_ext --inplace`` there; ``git worktree add`` gives the old one).

    git worktree add /tmp/old HEAD~1
    (cd /tmp/old && ATTNLAB_BUILD_ISAS=avx512_bf16 python setup.py build_ext --inplace)
    python scripts/ab_trees.py --old /tmp/old/src --new src --rounds 8 \\
        --cases float32:window:fwd:8192 bfloat16:causal:fwdbwd:4096:128 --json docs/bench-results-ab.json

A case is dtype:mask:mode:n[:head_dim] with the bench's masks (attnlab.bench.cases; B=1 H=8, D = 64 by default).
The ratio old/new > 1: the new tree is faster. Run it alone on an idle machine (docs/benchmarks.md).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys


def _case(spec: str):
    from attnlab.bench.cases import Case
    dtype, mask, mode, n, *d = spec.split(":")
    return Case(mask=mask, n=int(n), dtype=dtype, mode=mode, head_dim=int(d[0]) if d else 64)


def time_cases(specs: list[str], repeats: int) -> dict:
    """{spec: median ms of the native backend over ``repeats`` steps after two warm-up steps}, in this process."""
    from attnlab.bench.cases import attnlab_mask, make_inputs
    from attnlab.bench.contestants import timed_step
    from attnlab.functional import attention
    from attnlab.measure.timing import time_median
    out = {}
    for spec in specs:
        case = _case(spec)
        q, k, v = make_inputs(case)
        mask, bias = attnlab_mask(case)
        step = timed_step(case, q, k, v, lambda: attention(q, k, v, mask=mask, bias=bias, backend="native"))
        step()                                                     # the first warm-up; time_median makes the second
        out[spec] = time_median(step, repeats).median_s * 1e3
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--old", help="the old tree's src folder (its kernel built in place)")
    p.add_argument("--new", help="the new tree's src folder")
    p.add_argument("--cases", nargs="+", required=True, help="dtype:mask:mode:n[:head_dim]")
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--repeats", type=int, default=5, help="timed steps per case in each process")
    p.add_argument("--json", help="write the rows and this machine's metadata here")
    p.add_argument("--time-only", action="store_true", help=argparse.SUPPRESS)    # the child process's mode
    args = p.parse_args()
    if args.time_only:
        print(json.dumps(time_cases(args.cases, args.repeats)))  # noqa: T201
        return
    if not (args.old and args.new):
        p.error("--old and --new are both needed")
    for c in args.cases:                          # a malformed case fails here, not in a child
        _case(c)
    runs = {"old": {c: [] for c in args.cases}, "new": {c: [] for c in args.cases}}
    for r in range(args.rounds):
        for tree in (("old", "new") if r % 2 == 0 else ("new", "old")):
            env = dict(os.environ, PYTHONPATH=os.path.abspath(getattr(args, tree)), ATTNLAB_PROFILE="off")
            cmd = [sys.executable, os.path.abspath(__file__), "--time-only", "--repeats", str(args.repeats),
                   "--cases", *args.cases]
            got = json.loads(subprocess.run(cmd, env=env, cwd="/", check=True, capture_output=True,
                                            text=True).stdout.splitlines()[-1])
            for c, ms in got.items():
                runs[tree][c].append(ms)
    rows = []
    for c in args.cases:
        old, new = statistics.median(runs["old"][c]), statistics.median(runs["new"][c])
        rows.append({"case": c, "old_ms": old, "new_ms": new, "old_over_new": old / new,
                     "old_runs_ms": runs["old"][c], "new_runs_ms": runs["new"][c]})
        print(f"{c:34s} old {old:9.2f} ms  new {new:9.2f} ms  old/new {old / new:5.2f}")  # noqa: T201
    if args.json:
        from attnlab.measure.machine import write_script_result
        print(write_script_result(args.json, rows))  # noqa: T201


if __name__ == "__main__":
    main()
