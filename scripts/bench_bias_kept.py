"""ALiBi with its table, check and auto's decision kept across calls (functional/bias.py, ``kept``) against the same
calls built afresh (what every call did before: ``AlibiBias.kept_key`` returning None), for the compiled kernel and
auto, with torch's SDPA given the dense bias as the peer in the same run. Medians of interleaved rounds. B=1 H=8
D=64, causal, a new ``ALiBi.bias()`` object per call over the module's slopes, as a model makes one per layer.

    python scripts/bench_bias_kept.py --n 64 128 256 512 1024 --dtype float32 bfloat16 float16 --mode fwd fwdbwd \\
        --json docs/bench-results-avx2-bias-kept.json

Run it alone on an idle machine (docs/benchmarks.md, "Issue #27: kept bias tables").
"""
import argparse
import contextlib
import statistics

import torch
import torch.nn.functional as F

from attnlab.bench.cases import DTYPES, Case
from attnlab.bench.contestants import timed_step
from attnlab.functional import attention
from attnlab.measure.machine import write_script_result
from attnlab.measure.timing import time_interleaved
from attnlab.positional.alibi import ALiBi, AlibiBias

CONTESTANTS = ("torch-sdpa", "native kept", "native afresh", "auto kept", "auto afresh")


@contextlib.contextmanager
def keeping(on: bool):
    """Within the body, AlibiBias names what its tiles read (kept) or not (built afresh, as before)."""
    real = AlibiBias.kept_key
    if not on:
        AlibiBias.kept_key = lambda self: None
    try:
        yield
    finally:
        AlibiBias.kept_key = real


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", nargs="+", type=int, default=[64, 128, 256, 512, 1024])
    p.add_argument("--dtype", nargs="+", default=["float32", "bfloat16", "float16"], choices=list(DTYPES))
    p.add_argument("--mode", nargs="+", default=["fwd", "fwdbwd"], choices=["fwd", "fwdbwd"])
    p.add_argument("--rounds", type=int, default=12, help="interleaved rounds (even)")
    p.add_argument("--json", default="bench-results/bias-kept.json")
    args = p.parse_args()
    torch.manual_seed(0)
    alibi = ALiBi(8)
    rows = []
    print(f"{'dtype':9} {'mode':6} {'n':>5} " + " ".join(f"{c + ' ms':>16}" for c in CONTESTANTS)  # noqa: T201
          + "  kept/afresh native, auto  native x torch")
    for dtype in args.dtype:
        for mode in args.mode:
            grad = mode == "fwdbwd"
            for n in args.n:
                q, k, v = (torch.randn(1, 8, n, 64, dtype=DTYPES[dtype], requires_grad=grad) for _ in range(3))
                dense = alibi.bias().dense(n, n)                                     # (1, 8, n, n) fp32
                dense = dense.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
                dense = dense.to(DTYPES[dtype])                                      # SDPA takes q's dtype

                def ours(backend, on):
                    def call():
                        with keeping(on):
                            return attention(q, k, v, bias=alibi.bias(), causal=True, backend=backend)
                    return call
                fns = [lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=dense),
                       ours("native", True), ours("native", False), ours("auto", True), ours("auto", False)]
                case = Case("alibi", n, dtype, mode)
                timed = [timed_step(case, q, k, v, f) for f in fns]            # the bench's own timed step
                for fn in timed:
                    fn()                                                             # warm-up
                ms = [1e3 * statistics.median(t) for t in time_interleaved(timed, args.rounds)]
                rows.append(dict(dtype=dtype, mode=mode, n=n, **{f"{c} ms": m for c, m in zip(CONTESTANTS, ms)}))
                line = f"{dtype:9} {mode:6} {n:5d} " + " ".join(f"{m:16.3f}" for m in ms)
                print(line + f"  {ms[2] / ms[1]:10.2f} {ms[4] / ms[3]:5.2f}  {ms[0] / ms[1]:14.2f}",  # noqa: T201
                      flush=True)
    print(write_script_result(args.json, rows))  # noqa: T201


if __name__ == "__main__":
    main()
