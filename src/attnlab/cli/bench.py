"""``attnlab bench``: the kernel table by default, or one of the other benchmarks instead.

    attnlab bench --quick                         # a sample of the table, and bench-results/kernels.json
    attnlab bench --n 8192 --mask window documents --mode fwd --dtype float32
    attnlab bench --memory-scaling                # tiled vs reference peak memory up to n = 32768
    attnlab bench --complexity [--quick]          # time and memory vs n up to 256k, fitted n^alpha, PNG plots
    attnlab bench --favor-accuracy [--quick]      # FAVOR+ error vs number of random features, PNG plot
    attnlab bench --minilm [--quick]              # all-MiniLM-L6-v2 forward: attnlab backends vs transformers
    attnlab bench --hf [--quick]                  # tiny HF Llama, packed documents n=8192: attnlab vs its sdpa
    attnlab bench --lm [--quick]                  # GPT training tokens/s vs nanoGPT; KV-cache generation
    attnlab bench --ring [--quick]                # ring attention, 2 ranks x 1 thread vs one process, n=65536
    attnlab bench --device cuda [--quick]         # on a GPU: the triton kernel vs SDPA flash and FlexAttention

Progress goes to stderr (through ``logging``), the table to stdout, the report to a JSON file
(``--json``, default ``bench-results/<benchmark>.json``, checked writable before anything runs).
"""
from __future__ import annotations

import argparse
import logging
import math
import sys
import time
from dataclasses import dataclass
from typing import Callable, Optional

from ..functional import available_backends
from .util import fail, fail_run, writable_file

__all__ = ["add_bench", "BENCHMARKS", "Benchmark"]

log = logging.getLogger(__name__)

DEFAULT_KERNELS_JSON = "bench-results/kernels.json"
DEFAULT_SCALING_JSON = "bench-results/memory-scaling.json"
DEFAULT_COMPLEXITY_JSON = "bench-results/complexity.json"
DEFAULT_ACCURACY_JSON = "bench-results/favor-accuracy.json"
DEFAULT_MINILM_JSON = "bench-results/minilm.json"
DEFAULT_LM_JSON = "bench-results/lm.json"
DEFAULT_HF_JSON = "bench-results/hf.json"
DEFAULT_RING_JSON = "bench-results/ring.json"
DEFAULT_PLAN_JSON = "bench-results/plan.json"


def _bench_config(args: argparse.Namespace):
    """BenchConfig from the defaults, then the --quick preset, then the options given explicitly."""
    from ..bench import QUICK, BenchConfig
    cfg = BenchConfig(**(QUICK if args.quick else {}))
    given = {"n": args.n, "dtypes": args.dtype, "masks": args.mask, "modes": args.mode, "backends": args.backend,
             "batch": args.batch, "heads": args.heads, "head_dim": args.head_dim, "window": args.window,
             "docs": args.docs, "repeats": args.repeats, "memory_limit_gb": args.memory_limit_gb}
    for key, val in given.items():
        if val is not None:
            setattr(cfg, key, val)
    if args.backend is not None:
        cfg.reference_max_n = None        # asked for by name: run it wherever memory allows
    if args.n is not None or args.mode is not None:
        cfg.fwdbwd_max_n = None           # sizes or modes chosen explicitly: run all of them
    if args.memory is not None:
        cfg.memory = cfg.memory_sample = args.memory
    cfg.contention = args.contention
    if args.flex is not None:
        cfg.flex = args.flex
        if args.flex:
            cfg.flex_cases = None         # --flex given explicitly: every case, even with --quick
    elif args.quick:
        # one flex case, the most telling one: a sliding window at the largest n
        cfg.flex_cases = [("window" if "window" in cfg.masks else cfg.masks[-1], max(cfg.n))]
    return cfg


def _complexity(args: argparse.Namespace):
    """(report, text, json path, plot paths) of ``--complexity``: its defaults, --quick, then explicit options."""
    from ..bench.complexity import (COMPLEXITY_QUICK, ComplexityConfig, format_complexity, plot_complexity,
                                    run_complexity)
    cfg = ComplexityConfig(**(COMPLEXITY_QUICK if args.quick else {}))
    given = {"n": args.n, "batch": args.batch, "heads": args.heads, "head_dim": args.head_dim, "window": args.window,
             "repeats": args.repeats, "memory_limit_gb": args.memory_limit_gb, "memory": args.memory,
             "run_budget_s": args.run_budget_s, "dtype": (args.dtype or [None])[0]}
    for key, val in given.items():
        if val is not None:
            setattr(cfg, key, val)
    if args.n is not None:
        cfg.long_n = []                   # sizes chosen explicitly: exactly those, for every series
    if args.backend is not None:
        cfg.series = args.backend         # a subset of the series (names of SERIES)
    if args.mask is not None or args.mode is not None:
        # e.g. --backend linear --mask causal --mode fwdbwd: the series on that case; the fixed
        # head-to-head targets (their own masks and modes) are left out
        cfg.mask, cfg.mode, cfg.targets = (args.mask or [None])[0], (args.mode or ["fwd"])[0], False
    report = run_complexity(cfg, args.argv)
    path = args.json
    return report, format_complexity(report), path, _plots(lambda: plot_complexity(report, path.removesuffix(".json")))


def _favor_accuracy(args: argparse.Namespace):
    """(report, text, json path, plot paths) of ``--favor-accuracy``."""
    from ..bench.accuracy import ACCURACY_QUICK, AccuracyConfig, format_accuracy, plot_accuracy, run_favor_accuracy
    cfg = AccuracyConfig(**(ACCURACY_QUICK if args.quick else {}))
    for key, val in {"n": (args.n or [None])[0], "batch": args.batch, "heads": args.heads,
                     "head_dim": args.head_dim}.items():
        if val is not None:
            setattr(cfg, key, val)
    report = run_favor_accuracy(cfg, args.argv)
    path = args.json
    return report, format_accuracy(report), path, _plots(lambda: [plot_accuracy(report, path.removesuffix(".json")
                                                                                + ".png")])


def _plots(draw: Callable[[], list[str]]) -> list[str]:
    """The PNGs ``draw`` writes, or none (and a warning) when the disk refuses them: a benchmark's numbers
    are worth more than its pictures, and must still reach the table and the JSON."""
    try:
        return draw()
    except OSError as e:
        log.warning("warning: the plots could not be written (%s%s); the table and the JSON still are",
                    e.strerror or e, f": {e.filename}" if e.filename else "")
        return []


def _lm(args: argparse.Namespace):
    """(report, text, json path, no plots) of ``--lm``: its defaults, --quick, then --batch / --repeats."""
    from ..bench.lm import LM_QUICK, LMBenchConfig, format_lm, run_lm
    given = {k: v for k, v in {"batch": args.batch, "repeats": args.repeats}.items() if v is not None}
    report = run_lm(LMBenchConfig(**{**(LM_QUICK if args.quick else {}), **given}), args.argv)
    return report, format_lm(report), args.json, []


def _minilm(args: argparse.Namespace):
    """(report, text, json path, no plots) of ``--minilm``: its defaults, --quick, then --n/--batch/--backend/
    --repeats."""
    from ..bench.minilm import MINILM_QUICK, MiniLMBenchConfig, format_minilm, run_minilm
    cfg = MiniLMBenchConfig(**(MINILM_QUICK if args.quick else {}))
    if args.n is not None or args.batch is not None:
        cfg.cases = [(args.batch or B, L) for B, L in cfg.cases] if args.n is None else \
            [(args.batch or cfg.cases[0][0], n) for n in args.n]
    cfg.backends = args.backend or cfg.backends
    cfg.repeats = args.repeats or cfg.repeats
    report = run_minilm(cfg, args.argv)
    return report, format_minilm(report), args.json, []


def _hf(args: argparse.Namespace):
    """(report, text, json path, no plots) of ``--hf``: its defaults, --quick, then --n/--docs/--batch/--backend/
    --repeats."""
    from ..bench.hf import HF_QUICK, HFBenchConfig, format_hf, run_hf
    given = {"n": args.n, "docs": args.docs, "batch": args.batch, "backends": args.backend, "repeats": args.repeats}
    cfg = HFBenchConfig(**{**(HF_QUICK if args.quick else {}), **{k: v for k, v in given.items() if v is not None}})
    report = run_hf(cfg, args.argv)
    return report, format_hf(report), args.json, []


def _ring(args: argparse.Namespace):
    """(report, text, json path, no plots) of ``--ring``: its defaults, --quick, then --n/--batch/--heads/--head-dim/
    --dtype/--repeats/--ring-ranks/--ring-threads."""
    from ..bench.ring import RING_QUICK, RingBenchConfig, format_ring, run_ring
    if args.n is not None and len(args.n) > 1:
        raise ValueError(f"--ring times one sequence length, got --n {' '.join(map(str, args.n))}")
    if args.dtype is not None and len(args.dtype) > 1:
        raise ValueError(f"--ring times one dtype, got --dtype {' '.join(args.dtype)}")
    given = {"n": args.n and args.n[0], "batch": args.batch, "heads": args.heads, "dim": args.head_dim,
             "dtype": args.dtype and args.dtype[0], "repeats": args.repeats, "ranks": args.ring_ranks,
             "threads": args.ring_threads}
    cfg = RingBenchConfig(**{**(RING_QUICK if args.quick else {}), **{k: v for k, v in given.items() if v is not None}})
    report = run_ring(cfg, args.argv)
    return report, format_ring(report), args.json, []


def _plan(args: argparse.Namespace):
    """(report, text, json path, no plots) of ``--plan``: its defaults, --quick, then --n/--batch/--docs/--backend/
    --repeats."""
    from ..bench.plan import PLAN_QUICK, PlanBenchConfig, format_plan, run_plan
    if args.n is not None and len(args.n) > 1:
        raise ValueError(f"--plan times one sequence length, got --n {' '.join(map(str, args.n))}")
    given = {"n": args.n and args.n[0], "batch": args.batch, "docs": args.docs, "backends": args.backend,
             "repeats": args.repeats}
    cfg = PlanBenchConfig(**{**(PLAN_QUICK if args.quick else {}), **{k: v for k, v in given.items() if v is not None}})
    report = run_plan(cfg, args.argv)
    return report, format_plan(report), args.json, []


def _memory_scaling(args: argparse.Namespace):
    """(report, text, json path, no plots) of ``--memory-scaling``."""
    from ..bench import format_scaling, run_memory_scaling
    from ..bench.scaling import ScalingConfig
    cfg = ScalingConfig(dtype=(args.dtype or ["float32"])[0], batch=args.batch or 1, heads=args.heads or 8,
                        head_dim=args.head_dim or 64, memory_limit_gb=args.memory_limit_gb or 16.0)
    report = run_memory_scaling(cfg, args.argv)
    return report, format_scaling(report), args.json, []


def _gpu(args: argparse.Namespace):
    """(report, text, json path, no plots) of ``--device cuda``."""
    from ..bench.gpu import from_cli
    return from_cli(args)


def _kernels(args: argparse.Namespace):
    """(report, text, json path, no plots) of the kernel table, the default benchmark."""
    from ..bench import format_table, run_kernels
    from ..bench.kernels import nothing_fits
    cfg = _bench_config(args)
    why = nothing_fits(cfg)
    if why is not None:                           # refused before the first tensor is allocated
        raise ValueError(f"nothing would run: the smallest case, {why}; lower --n, --batch, --heads or "
                         "--head-dim, or raise --memory-limit-gb")
    report = run_kernels(cfg, args.argv)
    return report, format_table(report), args.json, []


@dataclass(frozen=True)
class Benchmark:
    """A benchmark that ``attnlab bench FLAG`` runs instead of the kernel table.

    ``run(args)`` returns (report dict, text table, JSON path, plot paths); ``help`` is FLAG's help
    (None: the flag is not a switch of its own, as ``--device cuda``).
    """
    flag: str
    run: Callable[[argparse.Namespace], tuple]
    help: Optional[str] = None


# name -> benchmark, in the order an error names them; the switches store their name in args.benchmarks
BENCHMARKS: dict[str, Benchmark] = {
    "gpu": Benchmark("--device cuda", _gpu),
    "minilm": Benchmark("--minilm", _minilm,
                        "the real all-MiniLM-L6-v2 forward (B=32 L=128 and B=8 L=256, padded) for attnlab's Encoder "
                        "on auto and every exact backend vs transformers' BertModel (sdpa); --n, --batch, --backend, "
                        f"--repeats apply; JSON: {DEFAULT_MINILM_JSON}"),
    "lm": Benchmark("--lm", _lm,
                    "GPT (micro) training tokens/s vs a nanoGPT-equivalent model, KV-cache vs recomputed greedy "
                    "generation, per-call overheads (--quick: nano, under 30 s; --batch, --repeats apply)"),
    "hf": Benchmark("--hf", _hf,
                    "a tiny random Hugging Face Llama (GQA) forward on one row of n = 8192 tokens in 8 packed "
                    "documents, attn_implementation='attnlab' vs transformers' 'sdpa' (--quick: n = 1024); --n, "
                    f"--docs, --batch, --backend, --repeats apply; JSON: {DEFAULT_HF_JSON}"),
    "ring": Benchmark("--ring", _ring,
                      "ring attention, causal forward at n = 65536 (B=1 H=8 D=64): --ring-ranks spawned processes x "
                      "--ring-threads threads (default 2 x 1) vs one process with all those threads, same inputs, "
                      "outputs compared (--quick: n = 4096); --n, --batch, --heads, --head-dim, --dtype, --repeats "
                      f"apply; JSON: {DEFAULT_RING_JSON}"),
    "plan": Benchmark("--plan", _plan,
                      "what planning a mask once saves: a 12-layer encoder forward on packed documents and a GPT "
                      "forward+backward, each with plans kept and built every call, per backend, same run "
                      "(--quick: seconds); --n, --batch, --docs, --backend (the encoder's), --repeats apply; JSON: "
                      f"{DEFAULT_PLAN_JSON}"),
    "complexity": Benchmark("--complexity", _complexity,
                            "time and peak memory vs n (1k-64k, 256k for sparse and linear) for reference, sdpa, "
                            "tiled, sparse, linear; fitted n^alpha; PNG plots; then two head-to-heads: causal "
                            "fwd+bwd of linear vs tiled at n = 65536, and the sparse window forward vs torch SDPA "
                            "with the same dense mask at n = 16384 (--quick: under a minute, small n); --backend "
                            "picks series, --mask/--mode put every series on that case (then no head-to-heads), "
                            "e.g. --backend linear --mask causal --mode fwdbwd"),
    "favor-accuracy": Benchmark("--favor-accuracy", _favor_accuracy,
                                "FAVOR+ relative error vs exact softmax for m = 16..1024 random features (several "
                                "seeds), elu+1 as a reference line; table and PNG plot"),
    "memory-scaling": Benchmark("--memory-scaling", _memory_scaling,
                                "tiled vs reference peak memory, causal fwd+bwd, n up to 32768, power-law fits and "
                                "the ratio at 32768"),
}


def _chosen(args: argparse.Namespace) -> list[str]:
    """Names of the benchmarks asked for instead of the kernel table, in ``BENCHMARKS`` order (one at most is valid)."""
    asked = set(args.benchmarks or []) | ({"gpu"} if args.device == "cuda" else set())
    return [name for name in BENCHMARKS if name in asked]


def _json_path(args: argparse.Namespace) -> str:
    """Where the report goes: --json, else ``bench-results/<name>.json`` of the benchmark chosen (kernels:
    the table), the DEFAULT_*_JSON above. ``_bench`` sets ``args.json`` to it before any benchmark runs, so
    every runner writes where this checked."""
    chosen = _chosen(args)
    return args.json if args.json is not None else f"bench-results/{chosen[0] if chosen else 'kernels'}.json"


def _bench_usage(args: argparse.Namespace) -> Optional[str]:
    """What is wrong with the options before anything runs: two benchmarks at once, a size that is not
    positive, a limit that is not a positive number, --contention with a benchmark other than the kernel
    table, or a --json path that cannot be written."""
    flags = [BENCHMARKS[name].flag for name in _chosen(args)]
    if len(flags) > 1:
        return f"{' and '.join(flags)} are separate benchmarks: give one of them per run"
    for flag, value in (("--n", args.n), ("--batch", args.batch), ("--heads", args.heads),
                        ("--head-dim", args.head_dim), ("--window", args.window), ("--docs", args.docs),
                        ("--repeats", args.repeats), ("--ring-ranks", args.ring_ranks),
                        ("--ring-threads", args.ring_threads)):
        values = value if isinstance(value, list) else [value]
        if any(v is not None and v < 1 for v in values):
            return f"{flag} must be >= 1, got {' '.join(map(str, values))}"
    for flag, value in (("--memory-limit-gb", args.memory_limit_gb), ("--run-budget-s", args.run_budget_s)):
        if value is not None and not 0 < value < math.inf:
            return f"{flag} must be a positive number, got {value:g}"
    if args.contention and flags:
        return (f"--contention times the kernel bench's cases (--n, --mask, --mode, --dtype, --backend); "
                f"it does not apply to {flags[0]}: drop one of the two")
    try:
        writable_file(_json_path(args), "--json")    # now, not after an hour of benchmarking
    except ValueError as e:
        return str(e)
    return None


def _run_bench(args: argparse.Namespace) -> int:
    problem = _bench_usage(args)
    if problem is not None:
        return fail(problem)
    try:
        return _bench(args)
    except ValueError as e:                       # bad options or a missing device: a message, not a traceback
        return fail(str(e))


def _bench(args: argparse.Namespace) -> int:
    from ..bench import write_json
    t0 = time.perf_counter()
    chosen = _chosen(args)
    run = BENCHMARKS[chosen[0]].run if chosen else _kernels
    args.json = _json_path(args)                  # the path checked before the run is the one written
    report, text, path, plots = run(args)
    report["meta"]["total_wall_s"] = time.perf_counter() - t0
    print(text, end="")                           # first: a disk that fails now must not take the results along
    try:
        write_json(report, path)
    except OSError as e:
        return fail_run(f"could not write --json {path} ({e.strerror or e}); the results are the table above")
    print(f"wrote {', '.join([path] + plots)} ({report['meta']['total_wall_s']:.0f} s)", file=sys.stderr)
    return 0


def add_bench(sub) -> None:
    from ..bench.cases import DTYPES, MASK_KINDS, MODES
    b = sub.add_parser(
        "bench", help="time attention kernels against torch SDPA and FlexAttention",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Kernel benchmark: backends x n x dtype x mask kind x mode. Median time, useful GFLOP/s,\n"
                    "% of this machine's measured GEMM peak, speed-up vs torch SDPA and flex, peak memory.",
        epilog="mask kinds:\n" + "\n".join(f"  {k:<10} {v}" for k, v in MASK_KINDS.items()))
    b.add_argument("--quick", action="store_true",
                   help="a sample (26 s on the idle 2-core AMD Zen 4 before native joined, docs/benchmarks.md): "
                        "n 1024 4096, float32 fwd, masks none causal window documents, "
                        "flex for one case")
    b.add_argument("--n", nargs="+", type=int, metavar="N",
                   help="sequence lengths (default 1024 4096 8192, fwd+bwd only up to 4096)")
    b.add_argument("--dtype", nargs="+", choices=list(DTYPES), metavar="DTYPE",
                   help=f"{', '.join(DTYPES)} (default float32 bfloat16)")
    b.add_argument("--mask", nargs="+", choices=list(MASK_KINDS), metavar="KIND",
                   help=f"{', '.join(MASK_KINDS)} (default: all; see below)")
    b.add_argument("--backend", nargs="+", choices=available_backends() + ["auto"], metavar="NAME",
                   help=f"{', '.join(available_backends() + ['auto'])}: attnlab backends (default: reference "
                        "(n <= 4096 only), sdpa, tiled, auto); "
                        "torch-sdpa and flex always run alongside")
    b.add_argument("--mode", nargs="+", choices=list(MODES), metavar="MODE",
                   help="fwd (forward, no grad) and/or fwdbwd (forward + backward) (default both)")
    b.add_argument("--heads", type=int, help="H (default 8)")
    b.add_argument("--head-dim", type=int, help="D (default 64)")
    b.add_argument("--batch", type=int, help="B (default 1)")
    b.add_argument("--window", type=int, help="W of the window mask: W past keys (default 256)")
    b.add_argument("--docs", type=int, help="documents packed per sequence (default 8)")
    b.add_argument("--repeats", type=int, help="timed runs per contestant, rounded up to even: every other "
                   "round runs the contestants in reverse order (default: 4-10, as many as fit in ~0.5 s)")
    b.add_argument("--flex", action=argparse.BooleanOptionalAction, default=None,
                   help="run torch.compile'd FlexAttention (default on; --quick: one case)")
    b.add_argument("--memory", action=argparse.BooleanOptionalAction, default=None,
                   help="peak memory of every row, each in a fresh subprocess (slower); --no-memory: none "
                        "(default: one sample case, none with --quick)")
    b.add_argument("--contention", action="store_true",
                   help="also time every contestant beside a busy process pinned to one core (started before, "
                        "killed after each case's contended runs); adds busy ms and the slowdown x busy per row")
    b.add_argument("--run-budget-s", type=float,
                   help="--complexity: skip a point whose single run is predicted above this (default 30)")
    b.add_argument("--memory-limit-gb", type=float,
                   help="skip a case (before allocating it) whose inputs plus the step are estimated above this "
                        "many GB (default 16)")
    b.add_argument("--ring-ranks", type=int, help="--ring: processes in the ring (default 2)")
    b.add_argument("--ring-threads", type=int, help="--ring: torch threads per rank (default 1)")
    b.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="cuda: the GPU benchmark instead: triton vs SDPA (flash) and FlexAttention, TFLOP/s and %% of "
                        "the bf16 matmul peak (--quick: the scripts/gpu_check.sh preset; JSON: bench-results/gpu.json)")
    b.add_argument("--json", metavar="PATH",
                   help=f"where to write the results (default {DEFAULT_KERNELS_JSON}, "
                        f"{DEFAULT_SCALING_JSON} with --memory-scaling, {DEFAULT_COMPLEXITY_JSON} with "
                        f"--complexity, {DEFAULT_ACCURACY_JSON} with --favor-accuracy, {DEFAULT_LM_JSON} "
                        f"with --lm; PNGs beside it)")
    others = b.add_argument_group("instead of the kernel table (one per run)")
    for name, bench in BENCHMARKS.items():
        if bench.help is not None:
            others.add_argument(bench.flag, dest="benchmarks", action="append_const", const=name, help=bench.help)
    b.set_defaults(run=_run_bench)
