"""The triton backend: the exact-backend conformance suite, and what is particular to its kernels.

On a machine without CUDA the kernels run in Triton's CPU interpreter (TRITON_INTERPRET=1, set
here only while these tests run) on tiny shapes and 16 x 16 tiles, so that every path -- several
query and key tiles, ragged edges, EMPTY / PARTIAL / FULL tiles -- is exercised; with CUDA the
same tests run the compiled kernels on the GPU (``scripts/gpu_check.sh``). Skipped without triton.
"""
import os
import subprocess
import sys
from functools import partial

import pytest
import torch

pytest.importorskip("triton", reason="the triton backend needs the gpu extra: pip install 'attnlab[gpu]'")

import attnlab as al
from attnlab.functional import masks
from attnlab.functional.backends import triton_attn as T
from attnlab.functional.backends import triton_attn_plan as P
from attnlab.functional.backends.reference import reference_attention
from attnlab.functional.backends.tiled_plan import TileStats
from attnlab.functional.request import make_request
from attnlab.positional.alibi import ALiBi, AlibiBias
from attnlab.positional.t5 import T5Bias, T5BucketBias
from helpers import CASES, FLOOR, MASK_KINDS, Case, check_dropout_equals_reference, errors, make_inputs, make_mask

ON_GPU = torch.cuda.is_available()
DEVICE = "cuda" if ON_GPU else "cpu"

if not ON_GPU:
    # Triton decides "interpreted or compiled" when a kernel is decorated, i.e. when the kernel
    # modules are imported: import them now under the interpreter, then restore the variable so
    # the other test modules still see a CPU-only machine (no triton backend).
    _saved = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    from attnlab.functional.backends import triton_attn_bwd, triton_attn_kernels  # noqa: F401
    if _saved is None:
        del os.environ["TRITON_INTERPRET"]
    else:
        os.environ["TRITON_INTERPRET"] = _saved


@pytest.fixture(autouse=True)
def _interpreter(monkeypatch):
    if not ON_GPU:
        monkeypatch.setenv("TRITON_INTERPRET", "1")


def on_device(**tiles):
    """triton_attention on DEVICE, taking and returning CPU tensors (differentiably)."""
    def fn(q, k, v, *, mask=None, bias=None, **kw):
        dev = lambda t: t.to(DEVICE) if isinstance(t, torch.Tensor) else t
        out = T.triton_attention(dev(q), dev(k), dev(v), mask=mask.to(DEVICE) if mask is not None else None,
                                 bias=dev(bias), **tiles, **kw)
        return (out[0].cpu(), out[1].cpu()) if isinstance(out, tuple) else out.cpu()
    return fn


SMALL = on_device(block_m=16, block_n=16)
# Small awkward shapes (helpers.CASES at full size are in the slow test): MQA with L < S and
# Dv != D; GQA with L > S, D = 24 (padded to 32 in the kernel) and a bias broadcast over the batch
# (atomic gradient); a decode step; non-contiguous inputs with a bias.
MQA, GQA, DECODE, NONCONTIG = (Case(1, 2, 1, 19, 37, 16, 24), Case(2, 4, 2, 33, 17, 24, 24, bias=True),
                               Case(1, 2, 2, 1, 20, 16, 16), Case(2, 2, 1, 21, 21, 16, 16, noncontig=True, bias=True))
FAST = ([(MQA, torch.float32, kind) for kind in MASK_KINDS]
        + [(NONCONTIG, torch.bfloat16, kind) for kind in MASK_KINDS]
        + [(DECODE, dt, kind) for dt in (torch.float32, torch.float16) for kind in ("causal", "padding")]
        + [(GQA, torch.float32, kind) for kind in ("window", "documents")])


def check(fn, case: Case, dtype, kind: str, seed: int = 0):
    q, k, v, bias = make_inputs(case, dtype, seed)
    for name, (cand, ref) in errors(fn, q, k, v, bias, make_mask(kind, case.B, case.H, case.L, case.S, seed)).items():
        factor = 2 if name == "out" else 3
        assert cand <= factor * ref + FLOOR[dtype], f"{case} {dtype} {kind} {name}: {cand:.2e} vs reference {ref:.2e}"


@pytest.mark.parametrize("case, dtype, kind", FAST, ids=lambda x: str(x).replace("torch.", ""))
def test_matches_reference(case, dtype, kind):
    """out, dq, dk, dv (and dbias) within 2x / 3x of the same-dtype reference's error vs fp64."""
    check(SMALL, case, dtype, kind)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", CASES, ids=str)
def test_matches_reference_on_every_conformance_case(case, dtype):
    for kind in ("causal", "dense", "documents", "fully_masked"):
        check(SMALL, case, dtype, kind)


@pytest.mark.parametrize("mask", [masks.strided(4), masks.bigbird(8, 1), masks.block_sparse(
    torch.tensor([[1, 0, 1], [0, 1, 1], [1, 1, 0]], dtype=torch.bool), 12) & masks.causal(),
    masks.global_window(4, [3, 30])], ids=["strided", "bigbird", "block_sparse&causal", "global_window"])
def test_block_layouts_and_pattern_masks(mask):
    """Block layouts are read in-kernel; other patterns go through host-built tile bitmaps."""
    q, k, v, _ = make_inputs(Case(1, 2, 1, 33, 33, 16, 16), torch.float32)
    for name, (cand, ref) in errors(SMALL, q, k, v, None, mask).items():
        assert cand <= (2 if name == "out" else 3) * ref + 1e-6, f"{mask!r} {name}: {cand:.2e} vs {ref:.2e}"


def test_fully_masked_rows_give_zero_and_finite_grads():
    q, k, v = (torch.randn(1, 2, 20, 16, requires_grad=True) for _ in range(3))
    allowed = torch.rand(1, 2, 20, 20) > 0.5
    allowed[:, :, 3] = False
    out = SMALL(q, k, v, mask=masks.dense(allowed), scale=0.25)
    assert (out[:, :, 3] == 0).all()
    out.sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v)) and (q.grad[:, :, 3] == 0).all()


def _grads_vs_gold(bias_fn, params, mask, dtype=torch.float32, **kw):
    """Errors of triton and of the same-dtype reference against fp64, for out and every gradient."""
    g = torch.Generator().manual_seed(0)
    q0, k0, v0 = torch.randn(2, 4, 21, 16, generator=g), torch.randn(2, 2, 35, 16, generator=g), \
        torch.randn(2, 2, 35, 16, generator=g)
    dout = torch.randn(2, 4, 21, 16, generator=g)

    def run(fn, dt):
        ps = [p.detach().to(torch.float64 if dt == torch.float64 else p.dtype).requires_grad_() for p in params]
        q, k, v = (t.to(dt).requires_grad_() for t in (q0, k0, v0))
        out = fn(q, k, v, mask=mask, bias=bias_fn(*ps), scale=0.3)
        return [out, *torch.autograd.grad(out, [q, k, v, *ps], dout.to(out.dtype))]
    gold, ref = run(reference_attention, torch.float64), run(reference_attention, dtype)
    cand = run(partial(SMALL, **kw), dtype)
    return [((c.double() - g_).abs().max().item(), (r.double() - g_).abs().max().item())
            for g_, r, c in zip(gold, ref, cand)]


@pytest.mark.parametrize("shape", [(2, 4, 21, 35), (1, 4, 21, 35), (2, 1, 1, 35), (1, 1, 21, 35)])
@pytest.mark.parametrize("deterministic", [False, True])
def test_bias_tensor_gradients(shape, deterministic):
    """Full bias: one store per entry; broadcast: atomics, or a (B, H, L, S) buffer if deterministic."""
    b0 = torch.randn(*shape, generator=torch.Generator().manual_seed(1))
    errs = _grads_vs_gold(lambda b: b, [b0], masks.causal(), deterministic=deterministic)
    for name, (cand, ref) in zip(["out", "dq", "dk", "dv", "dbias"], errs):
        assert cand <= (2 if name == "out" else 3) * ref + 1e-6, f"{shape} {name}: {cand:.2e} vs {ref:.2e}"


@pytest.mark.parametrize("mask", [masks.padding(torch.tensor([35, 12]), side="left"),
                                  masks.causal() & masks.padding(torch.tensor([20, 35]), side="left"),
                                  masks.padded(torch.tensor([21, 9]), torch.tensor([35, 12]), causal=True)],
                         ids=["left", "causal&left", "padded"])
def test_per_example_masks_with_a_per_example_bias(mask):
    """Issue #17: left padding / per-sequence masks (host bitmaps whose rows broadcast) and a (B, H, L, S)
    bias with gradient, each example its own schedule."""
    b0 = torch.randn(2, 4, 21, 35, generator=torch.Generator().manual_seed(2))
    errs = _grads_vs_gold(lambda b: b, [b0], mask)
    for name, (cand, ref) in zip(["out", "dq", "dk", "dv", "dbias"], errs):
        assert cand <= (2 if name == "out" else 3) * ref + 1e-6, f"{mask!r} {name}: {cand:.2e} vs {ref:.2e}"


@pytest.mark.parametrize("which", ["alibi", "alibi-grad", "t5-grad"])
def test_relative_biases(which):
    """ALiBi in-kernel (fixed slopes) or as a per-offset table (trainable slopes); T5 with its table's grad."""
    if which == "alibi":
        params, make, mask = [], (lambda: ALiBi(4).bias()), masks.window(5, 3)
    elif which == "alibi-grad":
        params, make, mask = [ALiBi(4).slopes.clone()], AlibiBias, masks.causal()
    else:
        t5 = T5Bias(4, num_buckets=8, max_distance=16)
        params, make, mask = [t5.table.weight.detach()], (lambda w: T5BucketBias(w, True, 16)), None
    for name, (cand, ref) in zip(["out", "dq", "dk", "dv", "dparam"], _grads_vs_gold(make, params, mask)):
        assert cand <= (2 if name == "out" else 3) * ref + 1e-6, f"{which} {name}: {cand:.2e} vs {ref:.2e}"


def test_dropout_equals_reference_for_a_seed():
    q, k, v = (torch.randn(2, 2, 21, 16, dtype=torch.float64).float().requires_grad_() for _ in range(3))
    check_dropout_equals_reference(SMALL, q, k, v, mask=masks.causal(), scale=0.3, dropout_p=0.3, dropout_seed=11)


def test_empty_tiles_are_never_read():
    """NaN keys and values in tiles the mask leaves EMPTY do not reach the output: they are skipped."""
    q, k, v = (torch.randn(2, 2, 40, 16) for _ in range(3))
    mask = masks.padding([32, 16])                      # keys 32.. (example 0) and 16.. (example 1): whole tiles
    poisoned_k, poisoned_v = k.clone(), v.clone()
    for b, n in enumerate([32, 16]):
        poisoned_k[b, :, n:], poisoned_v[b, :, n:] = float("nan"), float("nan")
    stats = TileStats()
    out = on_device(block_m=16, block_n=16, stats=stats)(q, poisoned_k, poisoned_v, mask=mask, scale=0.25)
    torch.testing.assert_close(out, reference_attention(q, k, v, mask=mask, scale=0.25))
    assert stats.tiles_skipped == 3 * 1 + 3 * 2 and stats.tiles_masked == 0


def test_tile_tables_are_runs_of_each_nonempty_tile_once_in_rows_and_columns():
    kinds = masks.window(20, 0).tile_kinds(70, 70, 16, 16)                    # (1, 5, 5)
    plan = P.make_tile_plan(kinds, 70, 70, 1, 16, 16, None, "cpu")

    def tiles(ptr, runs, n):
        return {(i, t, flag) for i in range(n) for t0, t1, flag, slot in runs[ptr[i]:ptr[i + 1]].tolist()
                for t in range(t0, t1)}
    rows = tiles(plan.row_ptr, plan.row_runs, plan.nq)
    cols = {(qt, kt, flag) for kt, qt, flag in tiles(plan.col_ptr, plan.col_runs, plan.nk)}
    want = {(qt, kt, 1 if kinds[0, qt, kt] == masks.PARTIAL or kt == 4 else 2)     # 70 % 16: last keys ragged
            for qt, kt in (kinds[0] != masks.EMPTY).nonzero().tolist()}
    assert rows == cols == want
    assert len(plan.row_runs) < len(want) and (plan.row_runs[:, 3] == -1).all()     # merged runs, no bitmaps


def test_relative_table_and_diagonal_sums():
    alibi = ALiBi(3).bias()
    for L, S in ((5, 9), (9, 5), (1, 4)):
        table = P.relative_table(alibi, L, S)                                   # (1, 3, L + S - 1)
        i, j = torch.arange(L)[:, None], torch.arange(S)[None, :]
        torch.testing.assert_close(table[..., j - i + L - 1], alibi.dense(L, S))
        g = torch.randn(2, 3, L, S, dtype=torch.float64)
        want = torch.stack([g.diagonal(d, -2, -1).sum(-1) for d in range(-(L - 1), S)], -1)
        torch.testing.assert_close(P.diagonal_sums(g), want)


def test_return_weights_are_exact():
    q, k, v = (torch.randn(2, 2, 19, 16) for _ in range(3))
    mask = masks.causal() & masks.padding(torch.tensor([19, 7]))
    out, w = SMALL(q, k, v, mask=mask, scale=0.25, return_weights=True)
    ref, want = reference_attention(q, k, v, mask=mask, scale=0.25, return_weights=True)
    torch.testing.assert_close(w, want)
    torch.testing.assert_close(out, ref)


@pytest.mark.skipif(ON_GPU, reason="CPU-only behaviour")
def test_unavailable_without_cuda_or_interpreter(monkeypatch):
    q = torch.randn(1, 2, 8, 16)
    monkeypatch.delenv("TRITON_INTERPRET")
    assert "triton" not in al.available_backends()
    assert "auto -> triton" not in al.explain(q, q, q, mask=masks.window(2, 0))
    with pytest.raises(ValueError, match="triton.*no CUDA device.*TRITON_INTERPRET=1"):
        al.attention(q, q, q, backend="triton")
    monkeypatch.setattr(T, "_triton_installed", lambda: False)
    assert "not installed (pip install 'attnlab[gpu]')" in T.triton_unavailable()


def test_auto_never_picks_it_on_cpu_and_named_requests_run():
    q, k, v = (torch.randn(1, 2, 24, 16) for _ in range(3))
    assert "auto -> triton" not in al.explain(q, q, q, mask=masks.window(4, 0))
    assert T.prefer_triton(make_request(q, k, v, mask=masks.window(4, 0))) is None
    if not ON_GPU:
        out = al.attention(q, k, v, mask=masks.window(4, 0), backend="triton")
        torch.testing.assert_close(out, al.attention(q, k, v, mask=masks.window(4, 0), backend="reference"))
    q64 = q.double().to(DEVICE)
    with pytest.raises(ValueError, match="float64"):
        al.attention(q64, q64, q64, backend="triton")


# Compiles every launch of a forward + backward pass for sm_90 (Triton's bundled ptxas; no GPU
# needed) by replacing JITFunction.run, and prints one line per kernel: label name regs stack smem.
COMPILE_FOR_SM90 = r'''
import os, subprocess, sys, tempfile, torch, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.runtime.jit import JITFunction
TY = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16", torch.int64: "i64",
      torch.int32: "i32", torch.uint8: "u8"}
BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
label = ""

def compile_launch(self, *args, grid, warmup=False, **kw):
    opts = {k: kw.pop(k) for k in ("num_warps", "num_stages")}
    sig, attrs, consts = {}, {}, dict(kw)
    for i, (name, a) in enumerate(zip(self.arg_names, args)):   # mimic the JIT's specialization
        if isinstance(a, torch.Tensor):
            sig[name], attrs[(i,)] = "*" + TY[a.dtype], [["tt.divisibility", 16]]
        elif isinstance(a, float):
            sig[name] = "fp32"
        elif a == 1:
            sig[name], consts[name] = "constexpr", 1
        else:
            sig[name] = "i32" if -2**31 <= a < 2**31 else "i64"
            if a % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
    sig.update({k: "constexpr" for k in kw})
    k = triton.compile(ASTSource(self, sig, consts, attrs), target=GPUTarget("cuda", 90, 32), options=opts)
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(k.asm["cubin"]); f.flush()
        res = subprocess.run([BIN, "-res-usage", f.name], capture_output=True, text=True).stdout
    use = dict(x.split(":") for x in next(l for l in res.splitlines() if "REG:" in l).split())
    print(label, self.__name__, use["REG"], use["STACK"], k.metadata.shared, flush=True)

JITFunction.run = compile_launch
torch.cuda.is_available = lambda: True
from attnlab.functional import masks
from attnlab.functional.backends import triton_attn as T
T.triton_unavailable = lambda device=None: None
for label, D, mask, bias, p in [("plain64", 64, masks.causal(), None, 0.0),
                                ("plain128", 128, masks.causal(), None, 0.0),
                                ("all128", 128, masks.causal() & masks.documents(torch.arange(320) // 100),
                                 torch.randn(1, 4, 320, 320, requires_grad=True), 0.1)]:
    q = torch.randn(2, 4, 320, D, dtype=torch.bfloat16, requires_grad=True)
    k, v = (torch.randn(2, 2, 320, D, dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
    T.triton_attention(q, k, v, mask=mask, bias=bias, scale=0.1, dropout_p=p, dropout_seed=1).sum().backward()
'''


@pytest.mark.slow
def test_kernels_compile_for_sm90_without_register_spills():
    """The compiled path, checked without a GPU: forward, dk/dv and dq build for Hopper, and the
    default tiles of the bf16 causal kernels (the benchmark's) use no local-memory spills."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, "-c", COMPILE_FOR_SM90], capture_output=True, text=True, env=env,
                         timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    rows = [line.split() for line in run.stdout.splitlines()]
    assert len(rows) == 9, run.stdout
    spills = [r for r in rows if r[0].startswith("plain") and int(r[3]) > 0]
    assert not spills, f"register spills (label kernel regs stack smem): {spills}"
    assert all(int(r[4]) <= 227 * 1024 for r in rows), rows             # fits an H100/H200 SM
