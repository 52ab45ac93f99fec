"""Decoding-shaped attention: few queries (L) against many keys (S), the case `attnlab bench` (L = S = n) does not
time. The sdpa backend, the compiled kernel and auto, medians of interleaved rounds, as ratios against the sdpa
backend in the same run, with and without a key-padding mask (3/4 of the keys). B=1, inference; H=8 D=64 unless
--heads, --kv-heads (GQA: fewer kv heads than query heads) and --head-dim say otherwise.

    python scripts/bench_decode.py --dtype float16 --q-len 1 4 16 64 --k-len 1024 4096 16384 --rounds 10 \\
        --json docs/bench-results-avx2-decode-fp16-long.json

Run it alone on an idle machine (docs/benchmarks.md, "Issue #27: small requests").
"""
import argparse
import statistics

import torch

from attnlab.bench.cases import DTYPES
from attnlab.functional import attention, masks
from attnlab.measure.machine import write_script_result
from attnlab.measure.timing import time_interleaved

BACKENDS = ("sdpa", "native", "auto")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dtype", nargs="+", default=["float32", "bfloat16", "float16"], choices=list(DTYPES))
    p.add_argument("--q-len", nargs="+", type=int, default=[1, 16])
    p.add_argument("--k-len", nargs="+", type=int, default=[64, 256, 1024, 4096])
    p.add_argument("--heads", type=int, default=8, help="query heads H")
    p.add_argument("--kv-heads", type=int, default=None, help="kv heads (default H; fewer: GQA, 1: MQA)")
    p.add_argument("--head-dim", type=int, default=64, help="D = Dv")
    p.add_argument("--layers", type=int, default=1,
                   help="each timed call runs the step over this many layers' K and V (distinct tensors), as a "
                        "model's decoding step does: with more than one, K and V come from memory, not the cache; "
                        "times are per layer")
    p.add_argument("--rounds", type=int, default=16, help="interleaved rounds (even)")
    p.add_argument("--json", default="bench-results/decode.json")
    args = p.parse_args()
    H, D = args.heads, args.head_dim
    Hkv = args.kv_heads or H
    if H % Hkv:
        p.error(f"--heads {H} is not a multiple of --kv-heads {Hkv}")
    torch.manual_seed(0)
    rows = []
    header = f"{'dtype':9} {'L':>3} {'S':>6} {'mask':8} " + " ".join(f"{b + ' ms':>10}" for b in BACKENDS)
    print(header + "  native x sdpa  auto x sdpa")  # noqa: T201
    for dtype in args.dtype:
        for L in args.q_len:
            for S in args.k_len:
                q = torch.randn(1, H, L, D, dtype=DTYPES[dtype])                          # (B, H, L, D)
                kvs = [[torch.randn(1, Hkv, S, D, dtype=DTYPES[dtype]) for _ in range(2)]  # (B, Hkv, S, D)
                       for _ in range(args.layers)]
                for kind, mask in (("none", None), ("padding", masks.padding([3 * S // 4]))):
                    fns = [lambda b=b: [attention(q, k, v, mask=mask, backend=b) for k, v in kvs] for b in BACKENDS]
                    for fn in fns:
                        fn()                                                              # warm-up
                    ms = [1e3 * statistics.median(t) / args.layers for t in time_interleaved(fns, args.rounds)]
                    row = dict(dtype=dtype, H=H, Hkv=Hkv, D=D, layers=args.layers, L=L, S=S, mask=kind,
                               **{f"{b}_ms": m for b, m in zip(BACKENDS, ms)})
                    rows.append(row)
                    line = f"{dtype:9} {L:3d} {S:6d} {kind:8} " + " ".join(f"{m:10.3f}" for m in ms)
                    print(line + f"  {ms[0] / ms[1]:13.2f}  {ms[0] / ms[2]:11.2f}", flush=True)  # noqa: T201
    print(write_script_result(args.json, rows))  # noqa: T201


if __name__ == "__main__":
    main()
