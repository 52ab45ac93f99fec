"""``attnlab bench --ring``: ring attention over P local ranks against one process, same inputs.

Ring attention (``attnlab.functional.ring``) exists to spread one long sequence over P machines.
On one machine it can only be judged against the plain alternative: the same attention in one
process that has all the cores. This bench runs both on the same global (B, H, n, D) inputs:

* one process with ``ranks * threads`` torch threads calls ``attention(q, k, v, causal=True)``
  (``auto``'s pick, named in the report);
* ``ranks`` spawned processes with ``threads`` threads each (pinned to distinct cores where there
  are enough) join a gloo group, take their zigzag shards and call ``ring_attention``. A round's
  time is the slowest rank's, between two barriers.

The forward pass runs under ``torch.no_grad``, ``repeats`` times after one warm-up; each side
reports its median. ``x_one_process`` = the single process's median / the ring's median (the
ring's throughput relative to one process; 1.0 = no cost for splitting). The ranks' outputs are
gathered and compared with the single process's output, so a fast but wrong ring shows up.

Example::

    rep = run_ring(RingBenchConfig(n=8192, repeats=2))
    text = format_ring(rep)
"""
from __future__ import annotations

import logging
import os
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass
from datetime import timedelta
from typing import Optional

import torch

from ..measure.machine import LoadMonitor, machine_info, run_warnings
from ..train.distributed import free_port
from .lm_report import _table

__all__ = ["RingBenchConfig", "RING_QUICK", "run_ring", "format_ring"]

log = logging.getLogger(__name__)


@dataclass
class RingBenchConfig:
    n: int = 65536                 # global sequence length (every rank holds n / ranks queries and keys)
    ranks: int = 2                 # P, spawned local processes in one gloo group
    threads: int = 1               # torch threads per rank; the single process gets ranks * threads
    batch: int = 1
    heads: int = 8
    dim: int = 64
    dtype: str = "float32"
    repeats: int = 3               # timed rounds per side, after one warm-up round
    timeout_s: float = 1800.0      # the process group's bound on every wait (a dead rank is an error)
    seed: int = 0


# A smoke run: a few seconds.
RING_QUICK = dict(n=4096, repeats=2)


def _inputs(cfg: RingBenchConfig):
    g = torch.Generator().manual_seed(cfg.seed)
    shape = (cfg.batch, cfg.heads, cfg.n, cfg.dim)
    return tuple(torch.randn(shape, generator=g).to(getattr(torch, cfg.dtype)) for _ in range(3))


def _check(cfg: RingBenchConfig) -> None:
    from ..functional.ring_layout import check_divisible
    if cfg.ranks < 2:
        raise ValueError(f"--ring-ranks {cfg.ranks}: a ring needs at least 2 ranks")
    if cfg.threads < 1 or cfg.repeats < 1:
        raise ValueError(f"--threads {cfg.threads} and --repeats {cfg.repeats} must be >= 1")
    check_divisible(cfg.n, cfg.ranks, "zigzag")


def _rank(rank: int, world: int, port: int, cfg: RingBenchConfig, out_dir: str) -> None:
    """One rank: join the group, time ``repeats`` ring forwards, save its times and output shard."""
    import torch.distributed as dist

    from ..functional.ring import ring_attention, shard
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if len(cores) >= world * cfg.threads:      # one core set per rank, as on separate machines
        os.sched_setaffinity(0, cores[rank * cfg.threads:(rank + 1) * cfg.threads])
    torch.set_num_threads(cfg.threads)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=cfg.timeout_s))
    try:
        q, k, v = (shard(t, rank, world, "zigzag", dim=2) for t in _inputs(cfg))   # (B, H, n / P, D)
        times = []
        with torch.no_grad():
            for r in range(cfg.repeats + 1):           # round 0 warms up
                dist.barrier()
                t0 = time.perf_counter()
                out = ring_attention(q, k, v, causal=True, layout="zigzag")
                dist.barrier()                         # the round ends when the slowest rank is done
                if r:
                    times.append(time.perf_counter() - t0)
        torch.save({"times": times, "out": out}, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def _run_ranks(cfg: RingBenchConfig) -> tuple[list[list[float]], list[torch.Tensor]]:
    import torch.multiprocessing as mp
    with tempfile.TemporaryDirectory(prefix="attnlab-ring-") as out_dir:
        mp.start_processes(_rank, args=(cfg.ranks, free_port(), cfg, out_dir), nprocs=cfg.ranks,
                           join=True, start_method="spawn")
        saved = [torch.load(os.path.join(out_dir, f"rank{r}.pt")) for r in range(cfg.ranks)]
    return [s["times"] for s in saved], [s["out"] for s in saved]


def _one_process(cfg: RingBenchConfig) -> tuple[list[float], torch.Tensor, str]:
    from ..functional.api import attention
    from ..functional.auto_rule import pick
    from ..functional.request import make_request
    q, k, v = _inputs(cfg)
    threads = torch.get_num_threads()
    torch.set_num_threads(cfg.ranks * cfg.threads)
    try:
        picked = pick(make_request(q, k, v, causal=True))[0]
        times = []
        with torch.no_grad():
            for r in range(cfg.repeats + 1):
                t0 = time.perf_counter()
                out = attention(q, k, v, causal=True)
                if r:
                    times.append(time.perf_counter() - t0)
    finally:
        torch.set_num_threads(threads)
    return times, out, picked


def run_ring(cfg: RingBenchConfig, argv: Optional[list[str]] = None) -> dict:
    """Time one process (all threads) and the ring (P ranks) on the same causal forward; compare outputs."""
    from ..functional.ring import _use_native, unshard
    _check(cfg)
    meta = machine_info(argv)
    meta["config"] = asdict(cfg)
    monitor = LoadMonitor()
    log.info("  one process, %d threads: causal forward n=%d x %d rounds", cfg.ranks * cfg.threads, cfg.n,
             cfg.repeats + 1)
    one_times, one_out, picked = _one_process(cfg)
    log.info("  ring of %d ranks x %d threads: %d rounds", cfg.ranks, cfg.threads, cfg.repeats + 1)
    rank_times, shards = _run_ranks(cfg)
    meta["load"] = monitor.stop()
    ring_times = [max(ts) for ts in zip(*rank_times)]             # a round lasts as long as its slowest rank
    ring_out = unshard(shards, "zigzag", dim=2)
    one_ms, ring_ms = 1e3 * statistics.median(one_times), 1e3 * statistics.median(ring_times)
    return {"meta": meta, "one_process": {"backend": picked, "threads": cfg.ranks * cfg.threads,
                                          "median_ms": one_ms, "times_ms": [1e3 * t for t in one_times]},
            "ring": {"ranks": cfg.ranks, "threads_per_rank": cfg.threads, "layout": "zigzag",
                     "block_kernel": "native" if _use_native(shards[0].unsqueeze(2)) else "pytorch",
                     "median_ms": ring_ms, "times_ms": [1e3 * t for t in ring_times],
                     "rank_times_ms": [[1e3 * t for t in ts] for ts in rank_times]},
            "x_one_process": one_ms / ring_ms,
            "max_abs_diff": (ring_out.double() - one_out.double()).abs().max().item()}


def format_ring(report: dict) -> str:
    """Both sides' medians, the ring's throughput relative to one process, and the output difference."""
    c, one, ring = report["meta"]["config"], report["one_process"], report["ring"]
    rows = [[f"one process ({one['backend']})", f"{one['threads']}", f"{one['median_ms']:.1f}", "1.00"],
            [f"ring, {ring['ranks']} ranks ({ring['block_kernel']} blocks)",
             f"{ring['ranks']} x {ring['threads_per_rank']}", f"{ring['median_ms']:.1f}",
             f"{report['x_one_process']:.2f}"]]
    out = [f"causal forward, B={c['batch']} H={c['heads']} n={c['n']} D={c['dim']} {c['dtype']}"]
    out += _table(["contestant", "threads", "median ms", "x one process"], rows)
    meta = report["meta"]
    out.append(f"max |ring - one process| = {report['max_abs_diff']:.1e}; medians of {c['repeats']} rounds after a "
               f"warm-up, on {meta['cpu_model']}, torch {meta['torch']}")
    out.append("x one process = one process's median / the ring's median (> 1: the ring is faster)")
    out += run_warnings(meta)
    return "\n".join(out) + "\n"
