"""The contestants: attnlab backends and their peers, each turned into a zero-argument ``step``.

* ``reference``, ``sdpa``, ``tiled``, ``auto``: ``attnlab.attention(..., backend=name)`` given the
  structured mask (and structured bias for alibi).
* ``torch-sdpa``: ``F.scaled_dot_product_attention`` given the equivalent dense bool mask (a
  float mask for alibi: the dense bias with -inf where masked), built once outside the timing.
* ``flex``: ``torch.compile``-d FlexAttention with a BlockMask built once outside the timing; its
  first call (compilation) is reported apart from its steady-state time.

Example::

    case = Case("window", 1024, "float32", "fwd")
    q, k, v = make_inputs(case)
    run = make_runner("tiled", case, q, k, v)
    out = run.step()                                   # (1, 8, 1024, 64)
"""
from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from ..functional import attention, available_backends, choose_backend
from ..functional.memory import available_ram
from ..functional.request import make_request
from .cases import Case, attnlab_mask, flex_mods, sdpa_kwargs

__all__ = ["PEERS", "Runner", "make_runner", "reset_flex", "input_bytes", "estimate_peak_bytes",
           "memory_skip_reason", "contestant_names", "timed_step"]

PEERS = ("torch-sdpa", "flex")
GB = 1e9


@dataclass
class Runner:
    step: Callable[[], Tensor]          # one forward (fwd) or forward + backward (fwdbwd); returns out
    notes: list[str] = field(default_factory=list)
    setup_s: Optional[float] = None     # untimed preparation, e.g. building flex's BlockMask
    picked: Optional[str] = None        # "auto": the backend it chose for this case


def contestant_names(backends: list[str], peers: bool = True, flex: bool = True) -> list[str]:
    """Peers first: torch-sdpa's output is the one every other contestant is checked against."""
    names = ["torch-sdpa"] if peers else []
    if peers and flex:
        names.append("flex")
    return names + [b for b in backends if b not in names]


def timed_step(case: Case, q: Tensor, k: Tensor, v: Tensor, fwd: Callable[[], Tensor]) -> Callable[[], Tensor]:
    """The timed step: ``fwd()`` under no_grad, or ``fwd()`` then ``out.backward(grad)``."""
    if case.mode == "fwd":
        def step():
            with torch.no_grad():
                return fwd()
        return step
    grad = torch.randn(q.shape, generator=torch.Generator().manual_seed(1)).to(q.device, q.dtype)   # CPU or GPU

    def step():
        for t in (q, k, v):
            t.grad = None                 # don't time gradient accumulation into old .grad
        out = fwd()
        out.backward(grad)
        return out.detach()
    return step


@functools.cache
def _compiled_flex():
    from torch.nn.attention.flex_attention import flex_attention
    # dynamic=False: one specialized kernel per shape, the fastest steady state; each new shape
    # or mask recompiles, and that time is reported as the contestant's compile time.
    return torch.compile(flex_attention, dynamic=False)


def reset_flex() -> None:
    """Forget every compiled flex kernel, so the next flex call compiles afresh.

    The bench calls it before each flex case: a failed compile (e.g. a backward on CPU, which
    FlexAttention does not support) leaves dynamo running flex_attention *uncompiled* from then
    on, silently 5-10x slower, and kernels compiled after other shapes ran measurably slower.
    """
    torch._dynamo.reset()
    _compiled_flex.cache_clear()


def _flex_runner(case: Case, q: Tensor, k: Tensor, v: Tensor) -> Runner:
    from torch.nn.attention.flex_attention import create_block_mask
    mask_mod, score_mod = flex_mods(case)
    t0 = time.perf_counter()
    block_mask = None if mask_mod is None else create_block_mask(
        mask_mod, case.batch, None, case.n, case.n, device="cpu")
    setup = time.perf_counter() - t0
    fa = _compiled_flex()

    def fwd():
        # Every case is a new mask_mod closure, hence a recompile; the default limit (8) would
        # silently fall back to slow eager flex partway through a full run.
        with torch._dynamo.config.patch(recompile_limit=1024, accumulated_recompile_limit=4096):
            return fa(q, k, v, score_mod=score_mod, block_mask=block_mask)
    return Runner(timed_step(case, q, k, v, fwd), setup_s=setup)


def make_runner(name: str, case: Case, q: Tensor, k: Tensor, v: Tensor) -> Runner:
    """A Runner for contestant ``name`` (an attnlab backend, "auto", or a peer) on this case."""
    if name == "torch-sdpa":
        kw = sdpa_kwargs(case)
        return Runner(timed_step(case, q, k, v, lambda: F.scaled_dot_product_attention(q, k, v, **kw)))
    if name == "flex":
        return _flex_runner(case, q, k, v)
    if name != "auto" and name not in available_backends():
        raise ValueError(f"unknown contestant {name!r}; choose from {available_backends() + ['auto', *PEERS]}")
    mask, bias = attnlab_mask(case)
    picked = choose_backend(make_request(q, k, v, mask=mask, bias=bias), "auto").name if name == "auto" else None
    return Runner(timed_step(case, q, k, v, lambda: attention(q, k, v, mask=mask, bias=bias, backend=name)),
                  [f"auto -> {picked}"] if picked else [], picked=picked)


def _quadratic_bytes(name: str, case: Case) -> float:
    """Bytes of (n, n)-sized buffers a contestant holds at its peak (0 for O(n)-memory kernels).

    Calibrated with ``measure_peak`` on CPU torch 2.13 at n = 2048 (rounded up): the reference
    keeps about 4 fp32 (B, H, n, n) buffers in the forward (5 with a bias) and 7.14 with autograd; SDPA given a mask
    runs its flash kernel (no (B, H, n, n) scores) but holds the dense mask plus a float copy of it
    (about 5 bytes per (example, query, key)); attnlab's sdpa backend also materializes the
    alibi bias and its masked copy per head.
    """
    scores = case.batch * case.heads * case.n * case.n * 4
    pairs = case.batch * case.n * case.n
    if name == "reference":
        return (5.5 if case.mode == "fwd" else 7.25) * scores
    if name in ("sdpa", "torch-sdpa") and case.mask not in ("none", "causal"):
        extra = 3.0 * scores if (name == "sdpa" and case.mask == "alibi") else 0.0
        return 5.0 * pairs + extra
    return 0.0


def _elements(case: Case) -> int:
    """Elements of one (B, H, n, D) tensor of the case."""
    return case.batch * case.heads * case.n * case.head_dim


def input_bytes(case: Case) -> int:
    """Bytes of what a case allocates before any contestant runs: q, k, v and, for fwdbwd, the
    upstream gradient (``cases.make_inputs``, ``contestants.timed_step``). Every contestant needs them."""
    elem = torch.tensor([], dtype=case.torch_dtype).element_size()
    return (3 + (case.mode == "fwdbwd")) * _elements(case) * elem


def estimate_peak_bytes(name: str, case: Case) -> int:
    """Rough peak extra memory of one step beyond its inputs (what ``measure_peak`` reports)."""
    elem = torch.tensor([], dtype=case.torch_dtype).element_size()
    linear = 8 * _elements(case) * elem       # the output, q/k/v's gradients, stats, temporaries
    return int(linear + _quadratic_bytes(name, case))


def memory_skip_reason(name: str, case: Case, limit_gb: float) -> Optional[str]:
    """Why running ``name`` on ``case`` could exhaust memory (None if it looks safe), decided before
    anything is allocated: the inputs (``input_bytes``) plus the step's own peak (``estimate_peak_bytes``).

    Refuses above ``limit_gb`` and above 90% of what the OS says is available right now.

    Example:
        memory_skip_reason("reference", Case("none", 10_000_000, "float32", "fwd"), 16.0)
        # "skipped: would need ~17,600,225 GB (inputs q, k, v 61.4 GB + the step 17,600,164 GB; limit 16 GB)"
    """
    inputs, step = input_bytes(case), estimate_peak_bytes(name, case)
    need = inputs + step
    parts = f"inputs {'q, k, v, grad' if case.mode == 'fwdbwd' else 'q, k, v'} {_gb(inputs)} + the step {_gb(step)}"
    if need > limit_gb * GB:
        return f"skipped: would need ~{_gb(need)} ({parts}; limit {limit_gb:g} GB)"
    avail = available_ram()
    if avail is not None and need > 0.9 * avail:
        return f"skipped: would need ~{_gb(need)} ({parts}), {avail / GB:.1f} GB available"
    return None


def _gb(b: float) -> str:
    """Bytes in GB, three significant digits and never an exponent: 0.0671 GB, 61.4 GB, 17,600,225 GB."""
    gb = b / GB
    return f"{gb:.3g} GB" if gb < 1000 else f"{gb:,.0f} GB"
