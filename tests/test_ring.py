"""Ring attention on torch.distributed (gloo, CPU): spawned local process groups of 2 and 4 ranks.

Each rank builds the same global inputs from a seed, runs the fp64 reference on the whole sequence
itself, and checks its own shard of the ring result (output and q/k/v gradients) against the
reference's shard; a failed check raises in the rank and fails the test through the parent. Every
group is joined with a deadline, so a hang fails the test instead of stalling the suite.
"""
from __future__ import annotations

import gc
import os
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from attnlab.functional import masks
from attnlab.functional.backends.reference import reference_attention
from attnlab.functional.ring import ring_attention
from attnlab.functional.ring_layout import positions, shard, unshard
from attnlab.train.distributed import free_port

GROUP_DEADLINE_S = 300.0                 # a hang guard, not a speed bound: healthy groups end in seconds


def _run_ranks(fn, world: int, *args, deadline_s: float = GROUP_DEADLINE_S) -> float:
    """Run fn(rank, world, port, *args) in ``world`` spawned processes; returns the wall time.

    A rank's exception fails the caller (mp.ProcessRaisedException, with the rank's traceback);
    ranks still running after ``deadline_s`` are killed and the test fails.
    """
    t0 = time.monotonic()
    ctx = mp.start_processes(fn, args=(world, free_port(), *args), nprocs=world, join=False,
                             start_method="spawn")
    try:
        while not ctx.join(timeout=0.5):
            if time.monotonic() - t0 > deadline_s:
                pytest.fail(f"ring group of {world} ranks still running after {deadline_s} s (hang)")
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.kill()
    return time.monotonic() - t0


def _init(rank: int, world: int, port: int, timeout_s: float) -> None:
    torch.set_num_threads(1)                       # P ranks share 2 cores
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=timeout_s))


# ----------------------------------------------------------------------------- checks run in each rank

def _global_inputs(case: dict, dtype: torch.dtype):
    g = torch.Generator().manual_seed(case["seed"])
    B, H, Hkv, N, S, D, Dv = (case[x] for x in ("B", "H", "Hkv", "N", "S", "D", "Dv"))
    q = torch.randn(B, H, N, D, generator=g, dtype=torch.float64)
    k = torch.randn(B, Hkv, S, D, generator=g, dtype=torch.float64)
    v = torch.randn(B, Hkv, S, Dv, generator=g, dtype=torch.float64)
    grad = torch.randn(B, H, N, Dv, generator=g, dtype=torch.float64)
    kp = None
    if case["padding"]:
        kp = torch.rand(B, S, generator=g) > 0.3              # random real keys ...
        kp[-1] = False                                        # ... and a batch row with none at all
    return [t.to(dtype) for t in (q, k, v, grad)] + [kp]


def _reference(q, k, v, grad, kp, causal):
    """Single-process attention on the full sequence: output and q/k/v gradients."""
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    mask = masks.causal() if causal else None
    if kp is not None:
        pad = masks.dense(kp[:, None, None, :])               # (B, 1, 1, N)
        mask = pad if mask is None else mask & pad
    out = reference_attention(q, k, v, mask=mask, scale=q.shape[-1] ** -0.5)
    out.backward(grad)
    return [out.detach(), q.grad, k.grad, v.grad]


def _ring(rank, world, q, k, v, grad, kp, causal, layout):
    """This rank's output and q/k/v gradients from ring attention."""
    loc = [shard(t, rank, world, layout, dim=2).requires_grad_() for t in (q, k, v)]
    kp_loc = None if kp is None else shard(kp, rank, world, layout, dim=1)
    out = ring_attention(*loc, causal=causal, key_padding=kp_loc, layout=layout)
    out.backward(shard(grad, rank, world, layout, dim=2))
    return [out.detach()] + [t.grad for t in loc]


def _check_case(rank: int, world: int, case: dict) -> None:
    causal, layout = case["causal"], case["layout"]
    gold = _reference(*_global_inputs(case, torch.float64), causal)
    gold = [shard(t, rank, world, layout, dim=2) for t in gold]
    got64 = _ring(rank, world, *_global_inputs(case, torch.float64), causal, layout)
    ref32 = [shard(t, rank, world, layout, dim=2) for t in _reference(*_global_inputs(case, torch.float32), causal)]
    got32 = _ring(rank, world, *_global_inputs(case, torch.float32), causal, layout)
    for name, g, a64, r32, a32 in zip(("out", "dq", "dk", "dv"), gold, got64, ref32, got32):
        assert a32.dtype == torch.float32 and torch.isfinite(a32).all(), f"{case} {name}: not finite"
        e64 = (a64 - g).abs().max().item()
        assert e64 <= 1e-10, f"{case} rank {rank} {name}: fp64 max diff {e64:.3g}"
        e_ref, e_got = (r32.double() - g).abs().max().item(), (a32.double() - g).abs().max().item()
        assert e_got <= 2 * e_ref + 1e-6, f"{case} rank {rank} {name}: fp32 err {e_got:.3g} > 2 x reference {e_ref:.3g}"
    if case["padding"]:                                   # the fully padded batch row: output 0, grads 0
        assert got32[0][-1].abs().max() == 0 and got32[1][-1].abs().max() == 0, f"{case}: padded row not 0"


def _worker_parity(rank: int, world: int, port: int, cases: list) -> None:
    _init(rank, world, port, 30)
    try:
        for case in cases:
            _check_case(rank, world, case)
        if world == 2:
            _check_errors(rank, world)
    finally:
        dist.destroy_process_group()


def _check_errors(rank: int, world: int) -> None:
    """Uneven shards and bad shapes raise clear ValueErrors on every rank (no hang, no gloo error)."""
    n_local = 5 if rank == 0 else 4                      # N = 9 over P = 2
    q = torch.randn(1, 2, n_local, 8)
    with pytest.raises(ValueError, match=r"N=9, P=2"):
        ring_attention(q, q, q)
    q = torch.randn(1, 2, 3, 8)                          # N = 6 over P = 2: zigzag needs N % 4 == 0
    with pytest.raises(ValueError, match=r"N=6 is not divisible by 4"):
        ring_attention(q, q, q, causal=True, layout="zigzag")
    with pytest.raises(ValueError, match=r"L != S is not supported"):
        ring_attention(torch.randn(1, 2, 4, 8), q, q, causal=True)


def _worker_dead_peer(rank: int, world: int, port: int, how: str) -> None:
    _init(rank, world, port, 4)
    if rank == 1 and how == "exit":
        return                                           # leaves before the ring starts
    q = torch.randn(1, 2, 8, 8, requires_grad=True)
    out = ring_attention(q, q, q, causal=True)
    if rank == 1:                                        # how == "stall": alive, but never joins the backward ring
        time.sleep(10 * GROUP_DEADLINE_S)                # never wakes up by itself: killed when rank 0 fails
    out.sum().backward()                                 # rank 0 must raise within the 4 s timeout


def _threads() -> list[str]:
    """This process's thread names (Linux /proc)."""
    tasks = "/proc/self/task"
    return sorted(open(f"{tasks}/{t}/comm").read().strip() for t in os.listdir(tasks))


def _worker_teardown(rank: int, world: int, port: int) -> None:
    before = _threads()
    _init(rank, world, port, 30)
    q = torch.randn(1, 2, 8, 8, requires_grad=True)
    ring_attention(q, q, q, causal=True).sum().backward()    # the compiled kernel's first call in this process
    dist.destroy_process_group()
    gc.collect()
    # A group something still holds keeps its gloo threads past the interpreter's end, where releasing
    # the last collective's tensors aborts the process (SIGABRT) now and then.
    assert _threads() == before, f"rank {rank}: threads {before} before the group, {_threads()} after destroying it"


# ----------------------------------------------------------------------------- tests

def _case(causal, layout, H=4, Hkv=4, padding=False, N=16, S=None, B=2, D=8, Dv=None, seed=0):
    return dict(causal=causal, layout=layout, H=H, Hkv=Hkv, padding=padding, N=N, S=S or N, B=B, D=D,
                Dv=Dv or D, seed=seed)


def test_ring_matches_reference_two_ranks():
    cases = [_case(c, lay, seed=i) for i, (c, lay) in
             enumerate([(False, "zigzag"), (True, "zigzag"), (True, "contiguous"), (False, "contiguous")])]
    cases += [_case(True, "zigzag", H=6, Hkv=2, padding=True, N=12, D=5, seed=7),      # GQA, padding, odd D
              # MQA, N/P odd, cross attention (L != S), Dv != D
              _case(False, "contiguous", H=4, Hkv=1, padding=True, N=10, S=14, B=3, Dv=3, seed=8)]
    _run_ranks(_worker_parity, 2, cases)


def test_ring_matches_reference_four_ranks():
    cases = [_case(True, "zigzag", H=4, Hkv=2, N=24, seed=1),
             _case(True, "contiguous", padding=True, N=20, seed=2),
             _case(False, "zigzag", H=2, Hkv=1, padding=True, N=16, seed=3)]
    _run_ranks(_worker_parity, 4, cases)


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="thread names come from Linux /proc")
def test_destroyed_group_leaves_no_threads():
    _run_ranks(_worker_teardown, 2)


@pytest.mark.parametrize("how, cause", [
    ("exit", r"checking shapes with the other ranks: .*Connection (closed|reset) by peer"),   # the peer's socket
    ("stall", r"exchanging blocks with ranks 1 \(from\) and 1 \(to\): .*Timed out waiting 4000ms")])  # our 4 s
def test_dead_peer_is_an_error_not_a_hang(how, cause):
    # The cause, not the speed: rank 0 names where it failed and gloo's reason; a hang hits the group's deadline.
    with pytest.raises(mp.ProcessRaisedException, match=r"ring_attention: rank 0 of 2 failed while " + cause):
        _run_ranks(_worker_dead_peer, 2, how)


@pytest.mark.parametrize("layout,world,n", [("zigzag", 4, 16), ("zigzag", 3, 6), ("contiguous", 3, 9)])
def test_shard_unshard_roundtrip(layout, world, n):
    x = torch.arange(n).view(1, 1, n, 1)
    parts = [shard(x, r, world, layout, dim=2) for r in range(world)]
    assert torch.equal(unshard(parts, layout, dim=2), x)
    for r, part in enumerate(parts):                     # the shard holds exactly its positions
        assert torch.equal(part.flatten(), positions(r, world, n, layout))


def test_zigzag_layout_from_the_paper():
    # REFERENCES.md section 3: P = 4 gives r0 {C0, C7}, r1 {C1, C6}, r2 {C2, C5}, r3 {C3, C4}.
    chunks = [shard(torch.arange(8), r, 4, "zigzag", dim=0).tolist() for r in range(4)]
    assert chunks == [[0, 7], [1, 6], [2, 5], [3, 4]]


def test_uneven_split_is_a_clear_error():
    with pytest.raises(ValueError, match=r"N=10 is not divisible by 8.*pad the sequence by 6"):
        shard(torch.zeros(1, 1, 10, 4), 0, 4, "zigzag", dim=2)
    with pytest.raises(ValueError, match="unknown ring layout"):
        shard(torch.zeros(4), 0, 2, "striped", dim=0)


def test_needs_a_process_group():
    if dist.is_initialized():
        pytest.skip("a process group is already initialized in this process")
    q = torch.randn(1, 1, 4, 8)
    with pytest.raises(ValueError, match="init_process_group"):
        ring_attention(q, q, q)
