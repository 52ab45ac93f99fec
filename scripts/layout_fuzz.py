"""Layout fuzz: every exact backend on transposed, sliced, expanded and oddly strided inputs.

A kernel that reads a tensor through its data pointer and assumes a layout (row stride >= row width,
unit last stride, no stride 0) can return wrong numbers without a word (issue #26: a V expanded along
the sequence, an L = 1 query whose size-1 dim has stride 1). This script draws random attention
problems, gives every tensor (q, k, v, the incoming gradient, a tensor bias, a dense mask) a layout
from ``LAYOUTS`` (identical values, different strides), and judges every exact backend against the
fp64 reference with the suite's rule (tests/helpers.py ``errors``: candidate error <= 2x (outputs) or
3x (gradients) the same-dtype reference's, plus a small floor).

This file is the one source of truth for the layout catalogue, the problem drawer and the judge;
tests/test_layouts.py imports it by path. Usage::

    .venv/bin/python scripts/layout_fuzz.py --configs 2000 --seed 0 [--backends native auto]
        [--dtypes float32 bfloat16] [--json failures.json] [--index 17]

Prints a table (ok / wrong / crash / refused per backend and dtype) and a final summary line; every
failure goes to stderr with its seed and index (``--seed S --index I`` reruns just that problem).
Exit status 1 when any answer is wrong or any backend crashed.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Callable, Optional, Sequence

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))      # the suite's error rule lives in tests/helpers.py: reuse it
import attnlab as al  # noqa: E402
from attnlab.functional import masks  # noqa: E402
from attnlab.functional.registry import all_backends  # noqa: E402
from helpers import FLOOR, errors  # noqa: E402

Fill = Callable[[Sequence[int]], torch.Tensor]       # shape -> fresh contiguous tensor of random values

# ---------------------------------------------------------------------------------------------------
# The layout catalogue: name -> build(shape, fill), a tensor of `shape` with fresh values in that layout.
# Each builds its storage with `fill` and then views it, so values are random and the layout is exact.


def _storage_order(order):
    """Dims stored outermost-first in `order` (e.g. (0, 2, 1, 3): made as (B, L, H, D), then transposed)."""
    def build(shape, fill):
        return fill([shape[d] for d in order]).permute([order.index(i) for i in range(4)])
    return build


def _expanded(dim):
    """Stride 0 along `dim` (one row repeated, as ``x[:, :1].expand(...)`` or a broadcast V)."""
    def build(shape, fill):
        return fill([1 if d == dim else n for d, n in enumerate(shape)]).expand(*shape)
    return build


def _size1_strides(stride):
    """Contiguous strides, except `stride` on every size-1 dim: is_contiguous() stays True (torch ignores
    size-1 strides) and .contiguous() changes nothing, yet a kernel that uses that stride reads garbage."""
    def build(shape, fill):
        strides, step = [0] * 4, 1
        for d in reversed(range(4)):
            strides[d] = stride if shape[d] == 1 else step
            step *= shape[d]
        return fill([step]).as_strided(shape, strides)
    return build


def _sliding(shape, fill):
    """Overlapping rows, row stride 1 < row width (``signal.unfold``): each row starts one element later."""
    n0, n1, n2, n3 = shape
    return fill([n0, n1, n2 + n3 - 1]).unfold(2, n3, 1)


LAYOUTS: dict[str, Callable[[Sequence[int], Fill], torch.Tensor]] = {
    "contiguous": _storage_order((0, 1, 2, 3)),
    "bnhd": _storage_order((0, 2, 1, 3)),             # made as (B, L, H, D), then .transpose(1, 2)
    "bhdn": _storage_order((0, 1, 3, 2)),             # last dim not unit-stride
    "perm2031": _storage_order((2, 0, 3, 1)),
    "perm3210": _storage_order((3, 2, 1, 0)),
    "channels_last": lambda shape, fill: fill(shape).contiguous(memory_format=torch.channels_last),
    "rows_sliced": lambda shape, fill: fill([*shape[:2], shape[2] + 2, shape[3]])[:, :, 1:-1],
    "cols_sliced": lambda shape, fill: fill([*shape[:3], shape[3] + 4])[..., 2:2 + shape[3]],
    "every_other_row": lambda shape, fill: fill([*shape[:2], 2 * shape[2], shape[3]])[:, :, ::2],
    # storage offset 3: the data pointer is off any vector alignment
    "offset": lambda shape, fill: fill([3 + shape[0] * shape[1] * shape[2] * shape[3]])[3:].view(*shape),
    "expand_b": _expanded(0),
    "expand_h": _expanded(1),
    "expand_n": _expanded(2),                         # the V expanded along the sequence
    "expand_last": _expanded(3),
    "expand_all": lambda shape, fill: fill([1, 1, 1, 1]).expand(*shape),   # what out.sum().backward() sends
    "size1_stride1": _size1_strides(1),               # the L = 1 query
    "size1_stride_odd": _size1_strides(12345),
    "sliding": _sliding,
}

# ---------------------------------------------------------------------------------------------------
# Problems


MASK_KINDS = ["none", "causal", "window", "dense", "padding"]


@dataclass(frozen=True)
class Config:
    """One attention problem and the layout of each tensor (a name from LAYOUTS)."""
    B: int
    H: int
    Hkv: int
    L: int
    S: int
    D: int
    Dv: int
    q: str = "contiguous"
    k: str = "contiguous"
    v: str = "contiguous"
    dout: str = "contiguous"
    mask: str = "none"                 # one of MASK_KINDS
    mask_layout: str = "contiguous"    # of the dense bool mask
    bias: Optional[str] = None         # layout of a (B, H, L, S) tensor bias; None: no bias
    grad: bool = True                  # False: outputs only (auto routes inference differently)
    seed: int = 0                      # of the values

    def __str__(self):
        extra = f" mask={self.mask}" + (f"[{self.mask_layout}]" if self.mask == "dense" else "")
        extra += f" bias={self.bias}" if self.bias else ""
        return (f"B{self.B}H{self.H}kv{self.Hkv}L{self.L}S{self.S}D{self.D}Dv{self.Dv} q={self.q} k={self.k} "
                f"v={self.v} dout={self.dout}{extra}{'' if self.grad else ' no-grad'} seed={self.seed}")


SIZES = [1, 2, 3, 5, 7, 13, 16, 17, 33, 64, 70]       # 1 first: hypothesis shrinks toward it
DIMS = [1, 2, 3, 8, 16, 17, 32, 40, 64, 80]           # multiples of 16 reach native's AVX-512 tiles


def draw_config(choose: Callable[[Sequence], object]) -> Config:
    """A random problem; ``choose(options)`` picks one option (random.Random.choice, or hypothesis)."""
    Hkv = choose([1, 2, 3])
    names = list(LAYOUTS)
    mask = choose(MASK_KINDS)
    return Config(B=choose([1, 2, 3]), H=Hkv * choose([1, 2, 3]), Hkv=Hkv, L=choose(SIZES), S=choose(SIZES),
                  D=choose(DIMS), Dv=choose(DIMS), q=choose(names), k=choose(names), v=choose(names),
                  dout=choose(names), mask=mask, mask_layout=choose(names) if mask == "dense" else "contiguous",
                  bias=choose(names) if choose([False, True]) else None, grad=choose([True, True, False]),
                  seed=choose(range(1000)))


def config_at(seed: int, index: int) -> Config:
    """Problem number `index` of run `seed`: each index has its own generator, so one reruns alone."""
    return draw_config(random.Random(f"{seed}:{index}").choice)


def build(cfg: Config, dtype: torch.dtype):
    """(q, k, v, bias or None, mask or None, dout) with the layouts of `cfg`, values in `dtype`."""
    g = torch.Generator().manual_seed(cfg.seed)
    rand = lambda shape: torch.randn(*shape, generator=g).to(dtype)
    make = lambda layout, shape, fill=rand: LAYOUTS[layout](tuple(shape), fill)
    c = cfg
    q, k = make(c.q, (c.B, c.H, c.L, c.D)), make(c.k, (c.B, c.Hkv, c.S, c.D))
    v, dout = make(c.v, (c.B, c.Hkv, c.S, c.Dv)), make(c.dout, (c.B, c.H, c.L, c.Dv))
    bias = make(c.bias, (c.B, c.H, c.L, c.S)) if c.bias else None
    if c.mask == "none":
        mask = None
    elif c.mask == "causal":
        mask = masks.causal()
    elif c.mask == "window":
        left, right = torch.randint(0, 6, (2,), generator=g).tolist()
        mask = masks.window(left, right)
    elif c.mask == "dense":
        mask = masks.dense(make(c.mask_layout, (c.B, c.H, c.L, c.S),
                                lambda shape: torch.rand(*shape, generator=g) > 0.3))
    elif c.mask == "padding":         # lengths 0..S: a length 0 leaves whole rows with nothing to attend
        mask = masks.padding(torch.randint(0, c.S + 1, (c.B,), generator=g))
    else:
        raise ValueError(f"unknown mask kind {c.mask!r}; choose from {MASK_KINDS}")
    return q, k, v, bias, mask, dout


# ---------------------------------------------------------------------------------------------------
# The judge

FACTOR = {"out": 2, "dq": 3, "dk": 3, "dv": 3, "dbias": 3}   # flash-attention's: 2x outputs, 3x grads
# How much worse than its own row-major answer a layout may make a backend's, once outside the plain rule:
# rounding moves with the order of the sums (up to 4.9x measured in 2000 problems: tiled fp32 dk at Dv = 80,
# S = 2), while the layout bugs of issue #26 were 42x to 10^7 off.
WORSE = 10
# Beyond GROSS x (reference error + floor) an answer is wrong even where the layout does not matter (an
# output off by 1% is 10^4 above it in fp32; the worst rounding of an exact kernel seen in 2000 problems
# stayed under a quarter of it: dk 2.0e-4 where the reference's error was 7.6e-6). Not for bf16: there
# FlashAttention's backward (delta = rowsum(dO * O) with O in bf16) cancels to errors the size of the
# values (tiled's dk 0.6 where the truth is exactly 0).
GROSS = {torch.float32: 100, torch.float64: 100}
VERDICTS = ["ok", "wrong", "crash", "inexact", "refused"]
FAILING = ("wrong", "crash")                                   # what makes the fuzz exit 1


def exact_backends() -> list[str]:
    """The exact backends that can run here ('triton' only with a GPU), and 'auto', which routes to them."""
    return [b.name for b in all_backends() if b.exact] + ["auto"]


def named(backend: str):
    """The public entry point with one backend: what a user's call runs (validation and routing included)."""
    return partial(al.attention, backend=backend)


def _first_line(e: Exception) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0] if text else ''}"


def judge(fn, cfg: Config, dtype: torch.dtype) -> tuple[str, str]:
    """(verdict, detail) for ``fn`` (called like ``attention``) on `cfg` in `dtype`.

    ``fn`` runs through ``helpers.errors`` on the laid-out tensors and, when that answer is outside the
    suite's plain rule, again on row-major copies of the same values. The rule for a layout: its error may
    not exceed 2x (outputs) or 3x (gradients) the same-dtype reference's, or WORSE x the backend's own
    error on the row-major copies, plus the floor. The backend's own error is in the yardstick because
    some layouts make the values degenerate (keys or values repeated along the sequence: the reference's
    dq cancels to exactly 0, a FlashAttention backward's does not), and some shapes (S = 2, Dv = 64) are
    beyond the plain rule for such kernels even row-major: neither is a layout fault.

    Verdicts. ok: within the plain rule. wrong: the layout made the answer worse; or it is GROSS-ly off
    even row-major (fp32); or NaN, a wrong shape or dtype. crash: any exception but a ValueError, or a ValueError
    for this layout when the same values row-major are accepted (a refusal must not depend on strides).
    inexact: no worse than row-major, but outside the plain rule (a precision matter, not a layout one).
    refused: a ValueError for the request itself.
    """
    q, k, v, bias, mask, dout = build(cfg, dtype)
    # row-major copies; not .contiguous(), which keeps a size-1 dim's odd stride (is_contiguous() is True)
    plain = [None if t is None else t.clone(memory_format=torch.contiguous_format) for t in (q, k, v, bias, dout)]
    contiguously = lambda: errors(fn, *plain[:4], mask, dout=plain[4], grad=cfg.grad)
    try:
        errs = errors(fn, q, k, v, bias, mask, dout=dout, grad=cfg.grad)
    except ValueError as e:
        try:
            contiguously()
        except ValueError:
            return "refused", str(e)
        except Exception:                        # contiguous fails otherwise: still a layout-dependent refusal
            pass
        return "crash", f"refused this layout, accepts the same values contiguous: {e}"
    except AssertionError as e:                  # errors() checks shape, dtype and finiteness first
        return "wrong", str(e)
    except Exception as e:                       # the fuzz counts every other failure as a crash
        return "crash", _first_line(e)
    loose = {name: (cand, ref) for name, (cand, ref) in errs.items() if not cand <= FACTOR[name] * ref + FLOOR[dtype]}
    if not loose:
        return "ok", ""
    try:                                         # only now is the backend's own contiguous error needed
        contig = contiguously()
    except Exception as e:
        return "crash", f"contiguous copies: {_first_line(e)}"
    text = lambda names: "; ".join(f"{n}: err {errs[n][0]:.2e} vs reference {errs[n][1]:.2e}, contiguous "
                                   f"{contig[n][0]:.2e}" for n in names)
    worse = [n for n, (cand, ref) in loose.items()
             if not cand <= max(FACTOR[n] * ref, WORSE * contig[n][0]) + FLOOR[dtype]]
    if worse:
        return "wrong", text(worse)
    gross = [n for n, (cand, ref) in loose.items()
             if dtype in GROSS and not contig[n][0] <= GROSS[dtype] * (ref + FLOOR[dtype])]
    return ("wrong", f"even contiguous: {text(gross)}") if gross else ("inexact", text(loose))


# ---------------------------------------------------------------------------------------------------
# The command line. Problems run in worker processes: a kernel that reads out of bounds can kill its
# process (SIGSEGV), and that must count as one crash, not end the fuzz.


TAG = "@layout-fuzz "                            # marks the worker's result lines on its stdout


def _worker(args) -> int:
    """Run the tasks (index, dtype, backend) read as JSON from stdin; one JSON line per verdict."""
    torch.set_num_threads(1)                     # the parent runs --jobs of us side by side
    for i, dname, backend in json.load(sys.stdin):
        verdict, detail = judge(named(backend), config_at(args.seed, i), getattr(torch, dname))
        print(TAG + json.dumps([i, dname, backend, verdict, detail]), flush=True)  # noqa: T201
    return 0


def _run_slot(tasks: list, args, results: list) -> None:
    """Run `tasks` in a worker; when it dies, the task it was on is a crash and a new worker goes on."""
    cmd = [sys.executable, __file__, "--worker", "--seed", str(args.seed)]
    while tasks:
        with tempfile.TemporaryFile() as err:
            proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True)
            proc.stdin.write(json.dumps(tasks))
            proc.stdin.close()
            for line in proc.stdout:
                if line.startswith(TAG):             # MKL writes its own complaints to stdout
                    results.append(json.loads(line[len(TAG):]))
                    tasks = tasks[1:]
            rc = proc.wait()
            if tasks:
                err.seek(0)
                last = [ln for ln in err.read().decode(errors="replace").splitlines() if ln.strip()][-1:]
                why = f"signal {-rc}" if rc < 0 else f"exit status {rc}"
                results.append([*tasks[0], "crash", f"the process died ({why}) {' '.join(last)}".strip()])
                tasks = tasks[1:]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--configs", type=int, default=2000, help="number of random problems")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--index", type=int, default=None, help="rerun only problem INDEX of --seed")
    p.add_argument("--backends", nargs="+", default=None, help=f"default: {exact_backends()}")
    p.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"], choices=["float32", "bfloat16", "float16", "float64"])
    p.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="worker processes")
    p.add_argument("--json", type=Path, default=None, help="write the failing problems here")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        return _worker(args)
    backends = args.backends or exact_backends()
    indices = [args.index] if args.index is not None else list(range(args.configs))
    tasks = [[i, d, b] for i in indices for d in args.dtypes for b in backends]
    results: list = []
    slots = [threading.Thread(target=_run_slot, args=(tasks[j::args.jobs], args, results)) for j in range(args.jobs)]
    for t in slots:
        t.start()
    for t in slots:
        t.join()
    counts = {(b, d): dict.fromkeys(VERDICTS, 0) for b in backends for d in args.dtypes}
    failures = []
    for i, dname, b, verdict, detail in sorted(results, key=lambda r: (r[0], r[1], backends.index(r[2]))):
        counts[b, dname][verdict] += 1
        if verdict in ("wrong", "crash", "inexact"):
            cfg = config_at(args.seed, i)
            failures.append(dict(seed=args.seed, index=i, backend=b, dtype=dname, verdict=verdict, detail=detail,
                                 description=str(cfg), config=asdict(cfg)))
            print(f"{verdict.upper()} {b} {dname} --seed {args.seed} --index {i}: {cfg}: {detail}",  # noqa: T201
                  file=sys.stderr)
    print(f"{'backend':<10} {'dtype':<9}" + "".join(f"{v:>9}" for v in VERDICTS))  # noqa: T201
    for (b, dname), c in counts.items():
        print(f"{b:<10} {dname:<9}" + "".join(f"{c[v]:>9}" for v in VERDICTS))  # noqa: T201
    total = {v: sum(c[v] for c in counts.values()) for v in VERDICTS}
    if args.json is not None:
        args.json.write_text(json.dumps(failures, indent=1))
    print(f"inexact (outside the plain rule with contiguous inputs too; not a layout fault): {total['inexact']}")  # noqa: T201
    print(f"layout fuzz: {len(indices)} configs x {len(backends)} backends x {len(args.dtypes)} dtypes: "  # noqa: T201
          f"{total['wrong']} wrong, {total['crash']} crashes, {total['refused']} refused")
    return 1 if any(total[v] for v in FAILING) else 0


if __name__ == "__main__":
    sys.exit(main())
