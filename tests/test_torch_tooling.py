"""Every exact backend under torch's own tools (issue #17): torch.compile, torch.func and batched gradcheck.

* every exact backend compiles as one graph (fullgraph=True) wherever the reference does -- every
  mask family, tensor and structured biases, softcap, L != S -- and gives the eager results,
  forward and backward. (tiled and sparse schedule their tiles in Python from the mask's values
  in eager mode; while compiling they plan from the shapes alone, see ``tiled_plan.make_plan``);
* torch.func.grad / vmap / jacrev and gradcheck(check_batched_grad=True) go through the kernels'
  setup_context and vmap rules (``backends.func_rules``).

The default run compiles with the ``aot_eager`` backend (dynamo + AOTAutograd, where the reported
internal errors were); the inductor sweep is marked slow.
"""
import pytest
import torch

from attnlab.functional import FunctionBias, attention, masks
from attnlab.functional.backends import sparse
from attnlab.functional.backends.reference import reference_attention
from attnlab.functional.backends.sparse import SparseStats
from attnlab.functional.backends.tiled import TileStats, tiled_attention

EXACT = ["reference", "sdpa", "tiled", "sparse", "native"]
FULLGRAPH = set(EXACT)

# Every mask family the reference compiles as one graph (L = 5, S = 7, B = 2).
MASKS = {
    "none": lambda: None,
    "causal": masks.causal,
    "window": lambda: masks.window(2, 1),
    "padding": lambda: masks.padding(torch.tensor([7, 4])),
    "documents": lambda: masks.documents(torch.tensor([[0] * 3 + [1] * 4, [0] * 6 + [1]])),
    "padded_left": lambda: masks.padded(torch.tensor([5, 2]), torch.tensor([7, 3]), side="left", causal=True),
    "dense": lambda: masks.dense(rand(2, 1, 5, 7, seed=9) > 0),
}


def rand(*shape, seed=0, dtype=torch.float64):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def inputs(dtype=torch.float64, B=2, H=2, Hkv=1, L=5, S=7, D=3, Dv=2):
    q, k, v = rand(B, H, L, D, seed=1, dtype=dtype), rand(B, Hkv, S, D, seed=2, dtype=dtype), \
        rand(B, Hkv, S, Dv, seed=3, dtype=dtype)
    bias = rand(B, H, L, S, seed=4, dtype=dtype)
    return [t.requires_grad_() for t in (q, k, v, bias)]


def request(backend, S=7):
    """A request with an L != S causal mask, per-example padding, a bias tensor and (where the backend
    can) softcap: every per-example and per-tile path of the kernels."""
    kw = dict(mask=masks.causal() & masks.padding(torch.tensor([S, S - 3])), backend=backend)
    if backend != "sdpa":
        kw["softcap"] = 2.5
    return kw


def run_and_grads(fn, q, k, v, bias):
    out = fn(q, k, v, bias)
    return [out] + list(torch.autograd.grad((out * out).sum(), (q, k, v, bias)))


@pytest.mark.parametrize("backend", EXACT)
def test_compile_equals_eager(backend):
    torch._dynamo.reset()
    kw = request(backend)
    q, k, v, bias = inputs(torch.float32)
    fn = lambda q, k, v, b: attention(q, k, v, bias=b, **kw)
    compiled = torch.compile(fn, backend="aot_eager", fullgraph=backend in FULLGRAPH)
    for name, a, b in zip(["out", "dq", "dk", "dv", "dbias"], run_and_grads(compiled, q, k, v, bias),
                          run_and_grads(fn, q, k, v, bias)):
        assert torch.allclose(a, b, atol=1e-5), f"{name}: {(a - b).abs().max().item():.2e}"


@pytest.mark.parametrize("backend", EXACT)
def test_func_grad_vmap_jacrev(backend):
    kw = request(backend)
    q, k, v, bias = (t.detach() for t in inputs())
    fn = lambda q, k, v, b: attention(q, k, v, bias=b, **kw)
    ref = lambda q, k, v, b: attention(q, k, v, bias=b, **{**kw, "backend": "reference"})
    # grad
    g = torch.func.grad(lambda *a: (fn(*a) ** 2).sum(), argnums=(0, 1, 2, 3))(q, k, v, bias)
    g_ref = torch.func.grad(lambda *a: (ref(*a) ** 2).sum(), argnums=(0, 1, 2, 3))(q, k, v, bias)
    for a, b in zip(g, g_ref):
        assert torch.allclose(a, b, atol=1e-10)
    # vmap over a stack of query sets (k, v, bias shared) and over everything
    qs = torch.stack([q, 2 * q, -q])
    batched = torch.func.vmap(fn, in_dims=(0, None, None, None))(qs, k, v, bias)
    assert torch.allclose(batched, torch.stack([ref(x, k, v, bias) for x in qs]), atol=1e-10)
    ks = torch.stack([k, k.flip(2)])
    both = torch.func.vmap(fn)(qs[:2], ks, torch.stack([v, v]), torch.stack([bias, bias]))
    assert torch.allclose(both, torch.stack([ref(qs[i], ks[i], v, bias) for i in range(2)]), atol=1e-10)
    # jacrev: vmap over the backward
    J = torch.func.jacrev(fn, argnums=(0, 1, 2, 3))(q, k, v, bias)
    J_ref = torch.func.jacrev(ref, argnums=(0, 1, 2, 3))(q, k, v, bias)
    for a, b in zip(J, J_ref):
        assert torch.allclose(a, b, atol=1e-10)


@pytest.mark.parametrize("backend,mask", [(b, m) for b in EXACT for m in MASKS])
def test_fullgraph_every_mask(backend, mask):
    """One graph (no graph break, no data-dependent guard) for every mask family, with a bias tensor."""
    torch._dynamo.reset()
    m = MASKS[mask]()
    q, k, v, bias = inputs(torch.float32)
    fn = lambda q, k, v, b: attention(q, k, v, mask=m, bias=b, backend=backend)
    compiled = torch.compile(fn, backend="aot_eager", fullgraph=True)
    for name, a, b in zip(["out", "dq", "dk", "dv", "dbias"], run_and_grads(compiled, q, k, v, bias),
                          run_and_grads(fn, q, k, v, bias)):
        assert torch.allclose(a, b, atol=1e-5), f"{name}: {(a - b).abs().max().item():.2e}"


@pytest.mark.parametrize("backend", ["reference", "tiled", "sparse"])
def test_fullgraph_structured_bias(backend):
    """A per-example FunctionBias whose slopes get gradients, compiled as one graph."""
    torch._dynamo.reset()
    q, k, v, _ = inputs(torch.float32)
    slopes = rand(2, 2, seed=5, dtype=torch.float32).abs().requires_grad_()
    m = masks.padding(torch.tensor([7, 4]))
    fn = lambda q, k, v, s: attention(q, k, v, mask=m, backend=backend,
                                      bias=FunctionBias(lambda i, j, s: -s[:, :, None, None] * (i - j).abs(), s))
    compiled = torch.compile(fn, backend="aot_eager", fullgraph=True)
    for name, a, b in zip(["out", "dq", "dk", "dv", "dslopes"], run_and_grads(compiled, q, k, v, slopes),
                          run_and_grads(fn, q, k, v, slopes)):
        assert torch.allclose(a, b, atol=1e-5), f"{name}: {(a - b).abs().max().item():.2e}"


def _kernel(backend):
    return {"tiled": tiled_attention, "sparse": sparse.sparse_attention}[backend]


BIG_MASKS = {   # L = 37, S = 45: several row tiles and key spans at 8 x 8 tiles
    "causal": masks.causal,
    "window": lambda: masks.window(5, 3),
    "causal&padding": lambda: masks.causal() & masks.padding(torch.tensor([45, 20])),
    "documents": lambda: masks.documents(torch.arange(45).repeat(2, 1) // torch.tensor([[11], [30]])),
    "padded_left": lambda: masks.padded(torch.tensor([37, 9]), torch.tensor([45, 17]), side="left", causal=True),
    "dense": lambda: masks.dense(rand(2, 1, 37, 45, seed=9) > 0.8),
}


@pytest.mark.parametrize("mask", BIG_MASKS)
@pytest.mark.parametrize("backend", ["tiled", "sparse"])
def test_compile_time_schedule_is_exact_on_many_tiles(backend, mask, monkeypatch):
    """The shapes-only schedule that tiled and sparse take while compiling, run eagerly (is_compiling
    patched) on a problem of many tiles and chunks: equal to the reference, forward and backward,
    with a bias tensor, including rows that see no key at all."""
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    monkeypatch.setattr(sparse, "CHUNK_SCORES", 2 * 2 * 8 * 48 * 2)   # two query blocks per chunk
    q, k, v, bias = inputs(L=37, S=45, D=4, Dv=3)
    m = BIG_MASKS[mask]()
    stats = {"tiled": TileStats, "sparse": SparseStats}[backend]()
    fn = lambda q, k, v, b: _kernel(backend)(q, k, v, mask=m, bias=b, scale=0.5, tile_q=8, tile_k=8, stats=stats)
    ref = lambda q, k, v, b: reference_attention(q, k, v, mask=m, bias=b, scale=0.5)
    for name, a, b in zip(["out", "dq", "dk", "dv", "dbias"], run_and_grads(fn, q, k, v, bias),
                          run_and_grads(ref, q, k, v, bias)):
        assert torch.allclose(a, b, atol=1e-10), f"{name}: {(a - b).abs().max().item():.2e}"
    if backend == "tiled":     # the shapes-only schedule: every tile visited and masked
        assert stats.tiles_skipped == 0 and stats.tiles_masked == stats.tiles_total > 0
    else:
        assert stats.blocks_computed == stats.blocks_masked == stats.blocks_total > 0


@pytest.mark.parametrize("bias_kind", ["tensor", pytest.param("function", marks=pytest.mark.slow)])  # ~25 s
@pytest.mark.parametrize("backend", ["tiled", "sparse"])
def test_fullgraph_on_many_tiles(backend, bias_kind):
    """Compiled as one graph with 16 x 16 tiles (3 row tiles of 3 spans each), with a bias tensor or
    a structured bias whose parameters get gradients."""
    torch._dynamo.reset()
    q, k, v, bias = inputs(torch.float32, L=37, S=45, D=4, Dv=3)
    if bias_kind == "function":
        bias = rand(2, 2, seed=5, dtype=torch.float32).abs().requires_grad_()     # ALiBi-like slopes
    as_bias = (lambda b: b) if bias_kind == "tensor" else (
        lambda s: FunctionBias(lambda i, j, s: -s[:, :, None, None] * (i - j).abs(), s))
    m = masks.causal() & masks.padding(torch.tensor([45, 20]))
    fn = lambda q, k, v, b: _kernel(backend)(q, k, v, mask=m, scale=0.5, tile_q=16, tile_k=16, bias=as_bias(b))
    compiled = torch.compile(fn, backend="aot_eager", fullgraph=True)
    for name, a, b in zip(["out", "dq", "dk", "dv", "dbias"], run_and_grads(compiled, q, k, v, bias),
                          run_and_grads(fn, q, k, v, bias)):
        assert torch.allclose(a, b, atol=1e-5), f"{name}: {(a - b).abs().max().item():.2e}"


SLOW_SPARSE = pytest.param("sparse", marks=pytest.mark.slow)   # ~1 min of small calls on 2 busy cores


@pytest.mark.parametrize("backend", ["reference", "tiled", "native", SLOW_SPARSE])
def test_batched_gradcheck(backend):
    q, k, v, bias = inputs(L=4, S=5)
    kw = request(backend, S=5)
    fn = lambda q, k, v, b: attention(q, k, v, bias=b, **kw)
    assert torch.autograd.gradcheck(fn, (q, k, v, bias), check_batched_grad=True)


@pytest.mark.parametrize("backend", ["tiled", SLOW_SPARSE])
def test_batched_gradcheck_structured_bias(backend):
    """A per-example ALiBi-like FunctionBias (its slopes get gradients) with per-example padding."""
    q, k, v, _ = inputs(L=4, S=5)
    slopes = rand(2, 2, seed=5).abs().requires_grad_()
    m = masks.padding(torch.tensor([5, 3]))
    fn = lambda q, k, v, s: attention(q, k, v, mask=m, backend=backend,
                                      bias=FunctionBias(lambda i, j, s: -s[:, :, None, None] * (i - j).abs(), s))
    assert torch.autograd.gradcheck(fn, (q, k, v, slopes), check_batched_grad=True)


@pytest.mark.parametrize("backend", ["tiled", "sparse"])
def test_double_backward_is_refused_clearly(backend):
    q, k, v, bias = inputs()
    out = attention(q, k, v, bias=bias, backend=backend)
    (dq,) = torch.autograd.grad(out.sum(), q, create_graph=True)
    with pytest.raises(RuntimeError, match="double backward"):
        dq.sum().backward()


@pytest.mark.slow
@pytest.mark.parametrize("backend", EXACT)
@pytest.mark.parametrize("mask", ["none", "window", "documents", "padded_left"])
def test_inductor_compile_sweep(backend, mask):
    torch._dynamo.reset()
    m = {"none": None, "window": masks.window(2, 1),
         "documents": masks.documents(torch.tensor([[0] * 3 + [1] * 4, [0] * 6 + [1]])),
         "padded_left": masks.padded(torch.tensor([5, 2]), torch.tensor([7, 3]), side="left", causal=True)}[mask]
    q, k, v, bias = inputs(torch.float32)
    fn = lambda q, k, v, b: attention(q, k, v, mask=m, bias=b, backend=backend)
    compiled = torch.compile(fn, fullgraph=backend in FULLGRAPH)
    for a, b in zip(run_and_grads(compiled, q, k, v, bias), run_and_grads(fn, q, k, v, bias)):
        assert torch.allclose(a, b, atol=1e-5)
