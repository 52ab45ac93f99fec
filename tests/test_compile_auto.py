"""``auto`` inside torch.compile(fullgraph=True): one graph, static and dynamic shapes, every CPU class's rules.

Above SMALL_PROBLEM scores a masked request once failed to compile as one graph: the profile look-up asked
torch.get_num_threads (no tensor: refused under fullgraph), the kernel's ``uses_amx`` and ``uses_tiles`` are
extension calls, a dense mask's share of empty tiles is a tensor's value, and some reasons formatted module
floats that dynamic shapes cannot format. Now auto decides in a graph from what a graph may depend on
(auto_figures.IN_GRAPH): these tests compile each kind of request with each class's rules (monkeypatched, as
test_functional does), check the results against the float64 reference, and check that the choice made
inside the graph is eager's wherever the rule does not weigh the share of empty tiles: a dense mask (SDPA in a
graph) and bf16 inference with a mask on the ``amx`` class (the kernel on AMX tiles, SDPA off them) differ.

The default run takes this machine's class; the other classes, with dynamic shapes only, are marked slow.
"""
import math
import random

import pytest
import torch

from attnlab.functional import attention, auto_rule, masks
from attnlab.functional import profile as profile_mod
from attnlab.functional.cpu import CPU_CLASSES, cpu_class
from attnlab.functional.profile import save_profile, step_choice
from attnlab.functional.request import make_request
from attnlab.positional.alibi import ALiBi

N = 640                                   # 640^2 scores > SMALL_PROBLEM: the masked rules, not the small one
D = 16


CASES = {
    "none": lambda: {},
    "causal": lambda: dict(causal=True),
    "padding": lambda: dict(mask=masks.padding(torch.tensor([N - 100]))),
    "window": lambda: dict(mask=masks.window(64, 0)),
    "documents": lambda: dict(mask=masks.documents(torch.tensor([[0] * (N // 2) + [1] * (N - N // 2)]))),
    "dense": lambda: dict(mask=masks.dense(torch.rand(N, N, generator=torch.Generator().manual_seed(3)) > 0.3)),
    "alibi": lambda: dict(bias=ALiBi(2).bias(), causal=True),
    "tensor bias": lambda: dict(bias=torch.randn(1, 1, N, N, generator=torch.Generator().manual_seed(4))),
}
def _cases():
    """(class, dynamic) pairs: this machine's class with static and dynamic shapes in the default run; the other
    classes with dynamic shapes only, marked slow (symbolic sizes are where a rule fails to trace; static
    shapes are the same rule with numbers, and this class covers them)."""
    here = cpu_class()
    return [pytest.param(c, dynamic, marks=() if c == here else pytest.mark.slow, id=f"{dynamic}-{c}")
            for c in CPU_CLASSES for dynamic in ((False, True) if c == here else (True,))]


@pytest.fixture
def recorded(monkeypatch):
    """The names auto_rule.pick returns, in order (inside a graph too: dynamo replays the appends)."""
    names = []
    real = auto_rule.pick

    def recording(req):
        name, why = real(req)
        names.append(name)
        return name, why
    monkeypatch.setattr(auto_rule, "pick", recording)
    return names


def _inputs(dtype, grad):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(1, 2, N, D, generator=g).to(dtype).requires_grad_(grad) for _ in range(3)]


def _kw(case, dtype):
    kw = CASES[case]()
    return dict(kw, bias=kw["bias"].to(dtype)) if isinstance(kw.get("bias"), torch.Tensor) else kw


def _check(kw, dtype, grad, dynamic):
    """Compile auto on the request as one graph; its output (and gradients) against the float64 reference."""
    torch._dynamo.reset()
    q, k, v = _inputs(dtype, grad)
    out = torch.compile(lambda q, k, v: attention(q, k, v, **kw), backend="aot_eager", fullgraph=True,
                        dynamic=dynamic)(q, k, v)
    wide = {n: x.double() if isinstance(x, torch.Tensor) else x for n, x in kw.items()}
    q64, k64, v64 = (x.detach().double().requires_grad_(grad) for x in (q, k, v))
    ref = attention(q64, k64, v64, backend="reference", **wide)
    tol = 2e-5 if dtype == torch.float32 else 3e-2
    assert (out.double() - ref).abs().max() <= tol
    if grad:
        dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(5))
        out.backward(dout.to(dtype))
        ref.backward(dout.double())
        for x, x64 in zip((q, k, v), (q64, k64, v64)):
            assert (x.grad.double() - x64.grad).abs().max() <= 10 * tol


@pytest.mark.parametrize("cls, dynamic", _cases())
@pytest.mark.parametrize("case", list(CASES))
def test_auto_compiles_as_one_graph_and_chooses_as_eager(cls, case, dynamic, recorded, monkeypatch):
    monkeypatch.setattr(auto_rule, "cpu_class", lambda: cls)
    for dtype, grad in ((torch.float32, True), (torch.bfloat16, False)):
        recorded.clear()
        kw = _kw(case, dtype)
        _check(kw, dtype, grad, dynamic)
        in_graph = recorded[0]
        eager, _ = auto_rule.pick(make_request(*_inputs(dtype, grad), **kw))
        if case == "dense":
            assert in_graph == "sdpa"                # IN_GRAPH_WHY["dense"], ["dense without avx512"]
        elif not (cls == "amx" and dtype == torch.bfloat16 and not grad and "mask" in kw):
            assert in_graph == eager, f"{dtype} grad={grad}: {in_graph} in the graph, {eager} eager"


#: plain requests below SMALL_PROBLEM scores, which ``attention``'s small-request shortcut decides from q.shape:
#: (dtype, L, S, causal)
SHORTCUT = [(torch.bfloat16, 1, 512, False), (torch.bfloat16, 2, 1024, False), (torch.bfloat16, 96, 96, False),
            (torch.float16, 1, 512, False), (torch.float32, 128, 128, True), (torch.float32, 300, 300, False),
            (torch.float32, 16, 1024, False), (torch.float16, 16, 32, False), (torch.bfloat16, 16, 16, False)]


@pytest.mark.parametrize("dtype, L, S, causal", SHORTCUT, ids=str)
def test_small_plain_requests_compile_as_one_graph_with_dynamic_shapes(dtype, L, S, causal, monkeypatch):
    """The shortcut's rules for the Zen 4's tiles ask the kernel whether D takes its tiles (on_tiles, a constant to
    torch.compile): with dynamic shapes D is symbolic there, and plain fp32 from 64^2 scores, bf16 from 96^2 and
    bf16 decoding over 1024 keys failed to compile as one graph until the rule made D a Python int (guarded)."""
    monkeypatch.setattr(auto_rule, "cpu_class", lambda: "avx512_bf16")
    torch._dynamo.reset()
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 2, L, D, generator=g).to(dtype)
    k, v = (torch.randn(1, 2, S, D, generator=g).to(dtype) for _ in range(2))
    out = torch.compile(lambda q, k, v: attention(q, k, v, causal=causal), backend="aot_eager", fullgraph=True,
                        dynamic=True)(q, k, v)
    ref = attention(q.double(), k.double(), v.double(), backend="reference", causal=causal)
    assert (out.double() - ref).abs().max() <= (2e-5 if dtype == torch.float32 else 3e-2)


def test_skippable_is_not_read_inside_a_graph():
    """None in a graph (the mask's contents are not read); eager, the planned share."""
    mask = masks.padding(torch.tensor([N - 100]))
    q = torch.randn(1, 2, N, D)
    req = make_request(q, q, q, mask=mask)
    assert 0.0 < auto_rule.skippable(req) < 1.0
    seen = []

    def f(x):
        seen.append(auto_rule.skippable(make_request(x, x, x, mask=mask)))
        return x + 1
    torch.compile(f, backend="eager", fullgraph=True)(q)
    assert seen == [None]


@pytest.mark.parametrize("dynamic", [False, True])
def test_a_profile_is_read_inside_a_graph(dynamic, monkeypatch, tmp_path, recorded):
    """The plain rows decide in a graph too (walked as steps on symbolic sizes); masked rows are not read
    there (they are keyed by the share of empty tiles): the class rule decides, as with no profile."""
    monkeypatch.setenv("ATTNLAB_CACHE_DIR", str(tmp_path))
    profile_mod._loaded.clear()
    built_in = auto_rule.pick(make_request(*_inputs(torch.float32, False)))[0]
    other = "native" if built_in == "sdpa" else "sdpa"
    ms = {other: 1.0, built_in: 2.0}
    padded = dict(dtype="float32", mode="fwd", n=N, D=D, ms={other: 1.0, built_in: 2.0})
    save_profile([dict(dtype="float32", mask="none", mode="fwd", n=N, D=D, ms=ms)],
                 [dict(padded, padded=s, skippable=s) for s in (0.0, 0.5, 0.99)])
    try:
        assert auto_rule.pick(make_request(*_inputs(torch.float32, False)))[0] == other      # eager
        _check({}, torch.float32, False, dynamic)
        assert recorded[-1] == other
        kw = _kw("padding", torch.float32)
        monkeypatch.setenv("ATTNLAB_PROFILE", "off")
        rule = auto_rule.pick(make_request(*_inputs(torch.float32, False), **kw))[0]
        monkeypatch.delenv("ATTNLAB_PROFILE")
        _check(kw, torch.float32, False, dynamic)
        assert recorded[-1] == rule
    finally:
        profile_mod._loaded.clear()


def test_steps_pick_the_nearest_row_on_a_log_scale():
    """step_choice over plain_steps gives what the nearest measured n (log scale) gives, ties left alone."""
    rnd = random.Random(7)
    for _ in range(200):
        ns = sorted(rnd.sample([256, 512, 768, 1024, 2048, 4096, 8192, 16384], rnd.randint(1, 5)))
        rows = [dict(dtype="float32", mask="none", mode="fwd", n=n, D=64,
                     ms={"native": rnd.choice([1.0, 1.01, 2.0]), "sdpa": rnd.choice([1.0, 2.0])}) for n in ns]
        prof = profile_mod.Profile.from_json(dict(version=profile_mod.PROFILE_VERSION, key={},
                                                  measured_at="2026-12-05T00:00", plain=rows, masked=[]), None)
        L, S = rnd.randint(1, 20000), rnd.randint(1, 20000)
        got = step_choice(prof.plain_steps("float32", False, False), L * S)
        scores = [abs(math.log(r["n"] / math.sqrt(L * S))) for r in rows]
        if len(rows) > 1 and sorted(scores)[0] == sorted(scores)[1]:
            continue                                  # exactly between two rows: either is the nearest
        r = rows[scores.index(min(scores))]
        want = None if profile_mod.tied(r["ms"]) else min(("native", "sdpa"), key=lambda b: r["ms"][b])
        assert (got[0] if got else None) == want, (ns, L, S)
        assert got is None or f"n = {r['n']}," in got[1]
