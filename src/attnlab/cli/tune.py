"""``attnlab tune``: measure this machine for ``auto`` (the compiled kernel against SDPA) and save a profile.

    attnlab tune                   # 60 s on the idle 2-core Xeon with AMX (docs/benchmarks.md): fp32 and bf16,
                                   # fwd and fwd+bwd, n 1024 4096, a padding sweep at n 2048
    attnlab tune --quick           # n 1024 and fewer padding points, 3 runs each
    attnlab tune --show            # the profile auto reads now, and where it lives
    attnlab tune --forget          # remove it: auto goes back to the built-in rules of this CPU class

The profile is keyed by this machine (CPU model and features, torch threads, versions, kernel build;
``functional/profile.py``) and read by ``auto`` on every later run; ``attnlab explain`` says when a choice
came from it. Timings are only as good as the machine is quiet: a run during which other processes used
more than ``BUSY_LIMIT`` of the CPUs is not saved (``--keep-busy`` saves it anyway).
"""
from __future__ import annotations

import argparse
import json
import sys
import time

from .util import fail, fail_run

__all__ = ["add_tune", "BUSY_LIMIT"]

BUSY_LIMIT = 0.25            # share of the CPUs other processes may use during a tune that is still saved


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def add_tune(sub) -> None:
    p = sub.add_parser("tune", help="measure this machine for auto's choices and save a profile",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="n 1024 only, three padding points, 3 runs each")
    p.add_argument("--n", type=_positive_int, nargs="+", help="sequence lengths of the plain sweep "
                   "(default 1024 4096)")
    p.add_argument("--dtype", nargs="+", choices=["float32", "bfloat16", "float16"],
                   help="default: float32 bfloat16. float16 on request: every CPU class has built-in fp16 rules "
                        "(measured on the AMD Zen 3 and Zen 4 and the Xeon with AMX), and the built-in rule decides "
                        "fp16 training whatever a tune measured. Without AVX-512 SDPA's fp16 training takes seconds "
                        "a step at n = 4096")
    p.add_argument("--head-dim", type=_positive_int, default=64, help="D of every case (default 64)")
    p.add_argument("--repeats", type=_positive_int, help="timed runs per contestant, rounded up to even: every other "
                   "round runs the contestants in reverse order (default: adaptive, 4-10)")
    p.add_argument("--keep-busy", action="store_true", help="save the profile even if other processes used "
                   f"more than {BUSY_LIMIT * 100:.0f}%% of the CPUs during the run")   # %%: argparse formats help
    p.add_argument("--show", action="store_true", help="print the profile auto reads now and exit")
    p.add_argument("--forget", action="store_true", help="remove this machine's profile and exit")
    p.set_defaults(run=run_tune_command)


def _show() -> int:
    from ..functional.profile import current_profile, machine_key, profile_path
    prof = current_profile()
    if prof is None:
        print(f"no profile for this machine (would be {profile_path()}); auto uses the built-in rules of "
              f"its CPU class. Machine key: {json.dumps(machine_key())}")
        return 0
    print(f"{prof.source()}\nkey: {json.dumps(prof.key)}")
    _print_choices(prof)
    return 0


def _print_choices(prof) -> None:
    from ..functional.profile import tied
    for r in prof.plain:
        win = "a tie: the built-in rule" if tied(r["ms"]) else min(("native", "sdpa"), key=lambda b: r["ms"][b])
        print(f"  {r['dtype']:9s} {r['mask']:6s} {r['mode']:6s} n={r['n']:<6d} native {r['ms']['native']:9.2f} ms"
              f"  sdpa {r['ms']['sdpa']:9.2f} ms  -> {win}")
    for r in prof.masked:
        win = min(("native", "sdpa"), key=lambda b: r["ms"][b])
        print(f"  {r['dtype']:9s} pad {r['padded']:4.0%} ({r['skippable']:4.0%} tiles empty) {r['mode']:6s} "
              f"n={r['n']:<6d} native {r['ms']['native']:9.2f} ms  sdpa {r['ms']['sdpa']:9.2f} ms  -> {win}")


def _check(args: argparse.Namespace):
    from ..bench.tune import TuneConfig
    from ..functional.backends.native import why_unavailable
    if args.show and args.forget:
        raise ValueError("--show and --forget are exclusive: give one")
    why = why_unavailable()
    if why is not None and not (args.show or args.forget):
        raise ValueError(f"the compiled kernel is not available here ({why}): auto has nothing to choose, "
                         "there is nothing to tune")
    cfg = TuneConfig()
    if args.quick:
        cfg = TuneConfig(n=[1024], padded=(0.1, 0.25, 0.5), masked_n=1024, repeats=3)
    if args.n:
        cfg.n = sorted(set(args.n))
        if min(cfg.n) < 64:
            raise ValueError(f"--n must be >= 64 (a profile of smaller requests says nothing: auto sends "
                             f"those to SDPA), got {min(cfg.n)}")
    cfg.dtypes = args.dtype or cfg.dtypes
    cfg.head_dim = args.head_dim
    cfg.repeats = args.repeats or cfg.repeats
    return cfg


def run_tune_command(args: argparse.Namespace) -> int:
    try:
        cfg = _check(args)
    except ValueError as e:
        return fail(str(e))
    if args.show:
        return _show()
    from ..functional.profile import forget_profile, profile_path, save_profile
    if args.forget:
        gone = forget_profile()
        print(f"removed {gone}" if gone else f"no profile to remove (none at {profile_path()})")
        return 0
    from tqdm import tqdm

    from ..measure.machine import BUSY_WARN, LoadMonitor, machine_info, reclaim_note
    from ..bench.tune import run_tune
    before = LoadMonitor()
    time.sleep(1.0)                                  # a second of the machine's load before any timing
    busy = before.stop()["other_cpu_fraction"]
    if busy is not None and busy > BUSY_WARN:
        print(f"attnlab: warning: other processes are using {busy:.0%} of the CPUs; timings taken now will be "
              "wrong: tune on an idle machine", file=sys.stderr)
    monitor = LoadMonitor()
    with tqdm(total=cfg.steps(), unit="pair", file=sys.stderr, dynamic_ncols=True) as bar:
        def progress(label: str) -> None:
            bar.set_postfix_str(label)
            bar.update()
        plain, masked = run_tune(cfg, progress)
    load = monitor.stop()
    busy = load["other_cpu_fraction"]
    if busy is not None and busy > BUSY_LIMIT and not args.keep_busy:
        return fail_run(f"other processes used {busy:.0%} of the CPUs during the tune (more than {BUSY_LIMIT:.0%}): "
                        "its timings are not this machine's; the profile was not saved. Rerun on an idle machine "
                        "(or pass --keep-busy to save it anyway)")
    for line in reclaim_note({"load": load}):        # the host's reclaim can split two runs of one kernel, as in bench
        print(f"attnlab: {line}", file=sys.stderr)
    meta = machine_info(getattr(args, "argv", None))
    path = save_profile(plain, masked, extra={"load": load, "command": meta["command"], "machine": meta})
    print(f"saved {path}; auto reads it from now on (`attnlab tune --show`, `--forget`)")
    from ..functional.profile import current_profile
    _print_choices(current_profile())
    return 0
