"""``attnlab bench --device cuda``: the triton backend against torch SDPA and FlexAttention on a GPU.

For mask kinds none / causal / window / documents / alibi, n = 1k ... 64k, head dims 64 and 128,
forward and forward + backward, every contestant gets the same bf16 inputs and reports its median
time, useful TFLOP/s (``cases.useful_flops``: only the pairs the mask allows) and % of this GPU's
measured bf16 matmul peak. As in the FlashAttention benchmarks the batch holds a fixed number of
tokens (B = tokens // n) and H = model_dim // d, so every row does the same work per token.

Contestants:

    triton   attnlab.attention(..., backend="triton") with the structured mask; ALiBi as the
             positional ``AlibiBias`` (computed in-kernel)
    sdpa     torch SDPA: for none / causal its flash kernel (forced), for the other kinds the dense
             mask or bias it needs (built untimed; skipped where it would not fit, ``sdpa_max_bytes``)
    flex     torch.compile(flex_attention) with a BlockMask built untimed; compiling is not timed

Only the table / JSON / targets logic runs on a CPU (``tests/test_bench_gpu.py`` injects a fake
step and timer); ``scripts/gpu_check.sh`` runs the quick preset on a GPU.

Example::

    report = run_gpu_bench(GpuBenchConfig(**GPU_QUICK))
    table = format_gpu_table(report)                # what `attnlab bench --device cuda` prints
"""
from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field
from typing import Callable, Optional

import torch
import torch.nn.functional as F

from ..measure.machine import machine_info
from ..positional.alibi import alibi_slopes
from .cases import MASK_KINDS, Case, attnlab_mask, document_ids, flex_mods, sdpa_kwargs, useful_flops
from .contestants import timed_step

__all__ = ["GpuBenchConfig", "GPU_QUICK", "GPU_KINDS", "CONTESTANTS", "gpu_cases", "run_gpu_bench",
           "evaluate_targets", "format_gpu_table", "from_cli", "DEFAULT_GPU_JSON"]

log = logging.getLogger(__name__)

GPU_KINDS = ["none", "causal", "window", "documents", "alibi"]
CONTESTANTS = ["triton", "sdpa", "flex"]
DEFAULT_GPU_JSON = "bench-results/gpu.json"
# The targets (H200 class, bf16, d = 128, n = 8192): (mask, mode, versus, at least).
TARGETS = [("none", "fwd", "sdpa", 1.0), ("window", "fwd", "flex", 1.0), ("documents", "fwd", "flex", 1.0),
           ("none", "fwdbwd", "sdpa", 0.9), ("window", "fwdbwd", "flex", 0.9), ("documents", "fwdbwd", "flex", 0.9)]
TARGET_CASE = dict(n=8192, head_dim=128, dtype="bfloat16")


@dataclass
class GpuBenchConfig:
    n: list[int] = field(default_factory=lambda: [1024, 2048, 4096, 8192, 16384, 32768, 65536])
    head_dims: list[int] = field(default_factory=lambda: [64, 128])
    masks: list[str] = field(default_factory=lambda: list(GPU_KINDS))
    modes: list[str] = field(default_factory=lambda: ["fwd", "fwdbwd"])
    dtype: str = "bfloat16"
    tokens: int = 16384          # per batch: B = max(1, tokens // n), constant work per token
    model_dim: int = 2048        # H = model_dim // d
    window: int = 256            # W of the "window" kind
    docs: int = 8                # documents per sequence of the "documents" kind
    contestants: list[str] = field(default_factory=lambda: list(CONTESTANTS))
    flex_cases: Optional[list[tuple[int, int]]] = None    # (n, d) where flex runs; None = all (compiles per case)
    flex_masks: Optional[list[str]] = None                 # mask kinds where flex runs; None = all
    sdpa_max_bytes: float = 16e9  # skip SDPA where its dense mask / bias (and float copy) would exceed this
    rep_ms: int = 100            # timing budget per row (triton.testing.do_bench)


# scripts/gpu_check.sh: a few minutes with compilation; flex only where the issue sets its targets.
GPU_QUICK = dict(n=[1024, 8192], flex_cases=[(8192, 128)], flex_masks=["window", "documents"], rep_ms=50)


def gpu_cases(cfg: GpuBenchConfig) -> list[Case]:
    """Every (mode, d, mask, n) problem, as ``bench.cases.Case`` (self-attention, L = S = n)."""
    for m in cfg.masks:
        if m not in GPU_KINDS:
            raise ValueError(f"unknown GPU mask kind {m!r}; choose from {GPU_KINDS}")
    return [Case(mask, n, cfg.dtype, mode, max(1, cfg.tokens // n), cfg.model_dim // d, d, cfg.window, cfg.docs)
            for mode in cfg.modes for d in cfg.head_dims for mask in cfg.masks for n in cfg.n]


def _sdpa_bytes(case: Case) -> float:
    """Dense mask (bool) plus SDPA's additive copy; ALiBi: a float bias per head."""
    if case.mask in ("none", "causal"):
        return 0.0
    per_pair = case.heads * (4 + 2) if case.mask == "alibi" else 1 + 2
    return float(case.n) ** 2 * per_pair


def _skip_reason(name: str, case: Case, cfg: GpuBenchConfig) -> Optional[str]:
    if name == "sdpa" and _sdpa_bytes(case) > cfg.sdpa_max_bytes:
        return f"skipped: SDPA's dense mask would need ~{_sdpa_bytes(case) / 1e9:.0f} GB"
    if name == "flex" and cfg.flex_cases is not None and (case.n, case.head_dim) not in map(tuple, cfg.flex_cases):
        return "skipped: flex runs only for (n, d) in " + str([tuple(c) for c in cfg.flex_cases])
    if name == "flex" and cfg.flex_masks is not None and case.mask not in cfg.flex_masks:
        return f"skipped: flex runs only for masks {cfg.flex_masks}"
    return None


def _flex_mods(case: Case, device):
    """(mask_mod, score_mod) of ``cases.flex_mods`` with their tensors on ``device`` (compiled flex
    cannot index CPU tensors from a GPU kernel)."""
    if case.mask == "documents":
        ids = document_ids(case).to(device)
        return (lambda b, h, q, kv: ids[q] == ids[kv]), None
    mask_mod, score_mod = flex_mods(case)
    if case.mask == "alibi":
        slopes = alibi_slopes(case.heads).float().to(device)

        def score_mod(score, b, h, q_idx, kv_idx):
            return score - slopes[h] * (q_idx - kv_idx).abs()
    return mask_mod, score_mod


def _make_step(name: str, case: Case, q, k, v) -> Callable[[], object]:
    """One timed call (forward, or forward + backward) of contestant ``name`` on CUDA tensors."""
    from ..functional import attention
    if name == "triton":
        mask, bias = attnlab_mask(case)
        if case.mask == "alibi":
            from ..positional.alibi import AlibiBias
            bias = AlibiBias(alibi_slopes(case.heads).float().to(q.device))
        fwd = lambda: attention(q, k, v, mask=mask, bias=bias, backend="triton")
    elif name == "sdpa":
        from torch.nn.attention import SDPBackend, sdpa_kernel
        kw = {key: (val.to(q.device, q.dtype if val.is_floating_point() else val.dtype)
                    if isinstance(val, torch.Tensor) else val) for key, val in sdpa_kwargs(case).items()}
        flash = case.mask in ("none", "causal")

        def fwd():
            if not flash:                                    # a dense mask: SDPA picks its kernel
                return F.scaled_dot_product_attention(q, k, v, **kw)
            with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
                return F.scaled_dot_product_attention(q, k, v, **kw)
    elif name == "flex":
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
        mask_mod, score_mod = _flex_mods(case, q.device)
        block = None if mask_mod is None else create_block_mask(mask_mod, case.batch, None, case.n, case.n,
                                                                 device=q.device)
        compiled = torch.compile(flex_attention, dynamic=False)

        def fwd():
            # Every case is a new mask_mod closure, hence a recompile: lift dynamo's limit of 8, past
            # which flex would silently run uncompiled (as bench.contestants does).
            with torch._dynamo.config.patch(recompile_limit=1024, accumulated_recompile_limit=4096):
                return compiled(q, k, v, score_mod=score_mod, block_mask=block)
    else:
        raise ValueError(f"unknown GPU contestant {name!r}; choose from {CONTESTANTS}")
    return timed_step(case, q, k, v, fwd)


def _cuda_timer(rep_ms: int) -> Callable[[Callable[[], object]], float]:
    from triton.testing import do_bench
    return lambda fn: do_bench(fn, warmup=25, rep=rep_ms, return_mode="median")          # ms, CUDA events


def _bf16_peak_tflops(timer) -> float:
    """Measured dense bf16 matmul throughput (8192^3, the best of the timer's runs) in TFLOP/s."""
    a, b = (torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    return 2 * 8192 ** 3 / timer(lambda: a @ b) / 1e9


def run_gpu_bench(cfg: GpuBenchConfig, argv: Optional[list[str]] = None, *, make_step=None, timer=None,
                  peak_tflops: Optional[float] = None, device_name: Optional[str] = None) -> dict:
    """Time every contestant on every case; returns {"meta", "results", "targets"} (the JSON file).

    make_step(name, case, q, k, v) -> step, timer(step) -> ms and peak_tflops replace the CUDA
    pieces (tests run the bookkeeping on a CPU with them). A contestant that fails on a case is a
    row with status "failed", not a crash.
    """
    fake = make_step is not None
    if not fake and not torch.cuda.is_available():
        raise ValueError("bench --device cuda needs a CUDA GPU (torch.cuda.is_available() is False); "
                         "run `attnlab bench` for the CPU benchmark")
    make_step = make_step or _make_step
    timer = timer or _cuda_timer(cfg.rep_ms)
    device = "cpu" if fake else "cuda"
    peak = peak_tflops if peak_tflops is not None else _bf16_peak_tflops(timer)
    rows = []
    for case in gpu_cases(cfg):
        g = torch.Generator().manual_seed(0)
        shape = (case.batch, case.heads, case.n, case.head_dim)
        q, k, v = (torch.randn(shape, generator=g).to(device=device, dtype=case.torch_dtype)
                   .requires_grad_(case.mode == "fwdbwd") for _ in range(3))
        for name in cfg.contestants:
            row = dict(case=case.to_dict(), contestant=name, status="ok", notes=[])
            rows.append(row)
            skip = _skip_reason(name, case, cfg)
            if skip:
                row.update(status="skipped", notes=[skip])
                continue
            try:
                ms = timer(make_step(name, case, q, k, v))
            except Exception as e:      # e.g. an out-of-memory or an unsupported shape: a result
                row.update(status="failed", notes=[f"failed: {type(e).__name__}: {str(e).splitlines()[0][:160]}"])
                continue
            tflops = useful_flops(case) / (ms * 1e-3) / 1e12
            row.update(median_ms=ms, tflops=tflops, pct_peak=100 * tflops / peak)
            log.info("  %-34s %-7s %9.3f ms %7.1f TFLOP/s", case.label(), name, ms, tflops)
        _add_ratios(rows[-len(cfg.contestants):])
    meta = machine_info(argv)
    meta.update(config=asdict(cfg), device=device_name or (torch.cuda.get_device_name() if not fake else "fake"),
                bf16_peak_tflops=peak, mask_kinds={k: MASK_KINDS[k] for k in cfg.masks},
                flops="useful FLOPs only: 4*B*H*D per allowed (query, key) pair for fwd, x3.5 for fwd+bwd")
    return {"meta": meta, "results": rows, "targets": evaluate_targets(rows)}


def _add_ratios(rows: list[dict]) -> None:
    """x sdpa = time(sdpa) / time(row), x flex likewise: above 1 means the row is faster."""
    t = {r["contestant"]: r["median_ms"] for r in rows if r["status"] == "ok"}
    for r in rows:
        for peer in ("sdpa", "flex"):
            if r["status"] == "ok" and peer in t and r["contestant"] != peer:
                r[f"x_{peer}"] = t[peer] / r["median_ms"]


def evaluate_targets(rows: list[dict]) -> list[dict]:
    """The issue's targets for the triton rows at TARGET_CASE: ratio, goal and whether it is met."""
    out = []
    for mask, mode, peer, goal in TARGETS:
        want = dict(TARGET_CASE, mask=mask, mode=mode)
        row = next((r for r in rows if r["contestant"] == "triton"
                    and all(r["case"].get(key) == val for key, val in want.items())), None)
        ratio = None if row is None else row.get(f"x_{peer}")
        out.append(dict(mask=mask, mode=mode, versus=peer, goal=goal, ratio=ratio,
                        met=None if ratio is None else ratio >= goal))
    return out


def _cells(r: dict) -> list[str]:
    c = r["case"]
    num = lambda key, fmt: "" if r.get(key) is None else format(r[key], fmt)
    return [f"{c['mask']} {c['n']} d{c['head_dim']} {c['mode']}", r["contestant"], f"{c['batch']}x{c['heads']}",
            num("median_ms", ".3f"), num("tflops", ".1f"), num("pct_peak", ".1f"), num("x_sdpa", ".2f"),
            num("x_flex", ".2f"), "; ".join(r["notes"])]


def format_gpu_table(report: dict) -> str:
    """Aligned plain text: one row per (case, contestant), then the peak, the targets and a legend."""
    head = ["case (mask n d mode)", "contestant", "B x H", "ms", "TFLOP/s", "% peak", "x sdpa", "x flex", "notes"]
    cells = [_cells(r) for r in report["results"]]
    widths = [max([len(h)] + [len(c[i]) for c in cells]) for i, h in enumerate(head)]
    line = lambda cs: "  ".join(x.ljust(w) if i in (0, 1, 8) else x.rjust(w)
                                for i, (x, w) in enumerate(zip(cs, widths))).rstrip()
    out, prev = [line(head), line(["-" * w for w in widths])], None
    for c in cells:
        if prev is not None and c[0] != prev:
            out.append("")
        out.append(line(c if c[0] != prev else [""] + c[1:]))
        prev = c[0]
    meta = report["meta"]
    out += ["", f"{meta['device']}: measured bf16 matmul peak {meta['bf16_peak_tflops']:.0f} TFLOP/s; "
                f"torch {meta['torch']}; {meta['flops']}",
            "x sdpa / x flex = their time / the row's time (> 1: the row is faster); sdpa is its flash kernel for "
            "none/causal and the dense-mask path otherwise"]
    for t in report["targets"]:
        verdict = "not measured" if t["met"] is None else ("met" if t["met"] else "MISSED")
        ratio = "" if t["ratio"] is None else f"{t['ratio']:.2f}x "
        out.append(f"target: triton {t['mask']} {t['mode']} >= {t['goal']}x {t['versus']} "
                   f"(bf16 d=128 n=8192): {ratio}{verdict}")
    return "\n".join(out) + "\n"


def from_cli(args) -> tuple[dict, str, str, list]:
    """(report, text, json path, no plots) for ``attnlab bench --device cuda``: its defaults, --quick,
    then --n, --mask, --mode, --head-dim, --dtype, --flex/--no-flex given explicitly."""
    cfg = GpuBenchConfig(**(GPU_QUICK if args.quick else {}))
    given = {"n": args.n, "masks": args.mask, "modes": args.mode,
             "head_dims": [args.head_dim] if args.head_dim else None, "dtype": (args.dtype or [None])[0]}
    for key, val in given.items():
        if val is not None:
            setattr(cfg, key, val)
    if args.flex is not None:
        cfg.flex_cases = cfg.flex_masks = None
        if not args.flex:
            cfg.contestants = [c for c in cfg.contestants if c != "flex"]
    report = run_gpu_bench(cfg, args.argv)
    return report, format_gpu_table(report), args.json or DEFAULT_GPU_JSON, []
