"""Dense bool masks: torch's SDPA given the mask, attnlab's `sdpa` backend, the compiled kernel
(`native`) and `auto`, medians of interleaved rounds, each round a loop of calls long enough to time (sub-ms calls).

The masks, each given to attnlab as ``masks.dense(bool tensor)`` (one object across the calls, as a model passes
one mask to every layer), or with ``--given tensor`` as the bool tensor itself in every call (as PyTorch code
passes ``attn_mask``): causal key padding (3n/4 real keys, as Hugging Face models build their masks), 8 packed
documents, a random half of the pairs (no structure: every row masked key by key), and a random eighth of them
(``random 1/8``: few keys masked per word). B=1 H=8 D=64.

    python scripts/bench_dense_masks.py --n 64 128 256 512 --dtype float32 bfloat16 float16 --mode fwd fwdbwd \\
        --json docs/bench-results-avx2-small-dense.json

Run it alone on an idle machine (docs/benchmarks.md, "Issue #27: dense masks").
"""
import argparse
import statistics

import torch
import torch.nn.functional as F

from attnlab.bench.cases import DTYPES, Case
from attnlab.bench.contestants import timed_step
from attnlab.functional import attention, masks
from attnlab.measure.machine import write_script_result
from attnlab.measure.timing import time_interleaved

CONTESTANTS = ("torch-sdpa", "sdpa", "native", "auto")


def dense_masks(n: int) -> dict:
    """name -> (1, 1, n, n) bool, True = may attend."""
    g = torch.Generator().manual_seed(n)
    return {"causal&padding": (masks.causal() & masks.padding(torch.tensor([3 * n // 4]))).dense(n, n),
            "documents": masks.documents(torch.arange(n) * 8 // n).dense(n, n),
            "random": torch.rand(1, 1, n, n, generator=g) > 0.5,
            "random 1/8": torch.rand(1, 1, n, n, generator=g) > 0.125}


def looped(step, calls: int):
    """``calls`` calls of a timed step (``bench.contestants.timed_step``: the forward, or forward and backward)."""
    def run():
        for _ in range(calls):
            step()
    return run


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", nargs="+", type=int, default=[64, 128, 256, 512])
    p.add_argument("--dtype", nargs="+", default=["float32", "bfloat16", "float16"], choices=list(DTYPES))
    p.add_argument("--mode", nargs="+", default=["fwd", "fwdbwd"], choices=["fwd", "fwdbwd"])
    p.add_argument("--rounds", type=int, default=8, help="interleaved rounds (even)")
    p.add_argument("--given", choices=["mask", "tensor"], default="mask",
                   help="attnlab gets masks.dense(t) made once, or the bool tensor t itself in every call")
    p.add_argument("--json", default="bench-results/dense-masks.json")
    args = p.parse_args()
    torch.manual_seed(0)
    rows = []
    print(f"{'dtype':9} {'mode':6} {'n':>4} {'mask':15} " + " ".join(f"{c + ' ms':>13}" for c in CONTESTANTS)  # noqa: T201
          + "  native x sdpa  auto x best")
    for dtype in args.dtype:
        for mode in args.mode:
            grad = mode == "fwdbwd"
            for n in args.n:
                q, k, v = (torch.randn(1, 8, n, 64, dtype=DTYPES[dtype], requires_grad=grad) for _ in range(3))
                calls = max(2, (4000 if grad else 16000) // n)                       # ~10-40 ms a round
                for name, allowed in dense_masks(n).items():
                    m = masks.dense(allowed) if args.given == "mask" else allowed
                    fns = [lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)] + [
                        lambda b=b: attention(q, k, v, mask=m, backend=b) for b in CONTESTANTS[1:]]
                    case = Case("dense", n, dtype, mode)
                    timed = [looped(timed_step(case, q, k, v, f), calls) for f in fns]
                    for fn in timed:
                        fn()                                                         # warm-up, plans made
                    ms = [1e3 * statistics.median(t) / calls for t in time_interleaved(timed, args.rounds)]
                    rows.append(dict(dtype=dtype, mode=mode, n=n, mask=name, given=args.given,
                                     **{f"{c} ms": t for c, t in zip(CONTESTANTS, ms)}))
                    line = f"{dtype:9} {mode:6} {n:4d} {name:15} " + " ".join(f"{t:13.3f}" for t in ms)
                    print(line + f"  {ms[1] / ms[2]:13.2f}  {min(ms[1:3]) / ms[3]:11.2f}", flush=True)  # noqa: T201
    print(write_script_result(args.json, rows))  # noqa: T201


if __name__ == "__main__":
    main()
