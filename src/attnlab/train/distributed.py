"""Data-parallel training glue: process group from torchrun's environment, DDP, batch sharding, rank 0 writes.

Launch ``attnlab train gpt`` under ``torchrun --nproc_per_node=P`` (or several nodes, see the README).
``init_distributed()`` reads torchrun's variables (``WORLD_SIZE``, ``RANK``, ``LOCAL_RANK``,
``MASTER_ADDR``/``MASTER_PORT``); with ``WORLD_SIZE`` unset or 1 it returns a single-process
context and nothing changes. Otherwise:

- **batch**: ``TrainConfig.batch_size`` is the *global* batch. Every rank runs the same seeded
  ``BatchSampler`` and draws the whole global batch (B, T), then keeps rows
  ``[rank * B/P, (rank + 1) * B/P)``; so P ranks see exactly the batches one process would, and the
  run does not change with P (B must be divisible by P). Validation batches are sharded the same way
  and the per-rank means are averaged (equal shards, so this is the global mean) on every rank.
- **gradients**: the GPT's loss runs through ``DistributedDataParallel``, which averages gradients
  over ranks: the mean of P shard means = the global-batch mean, so clipping and AdamW see the same
  gradient as a single process (up to float rounding of the reduction).
- **writes**: only rank 0 writes checkpoints, ``metrics.jsonl``, the plot and the progress bar.
  Every rank keeps its own dropout RNG (rank r > 0 is reseeded from ``seed`` and r); a checkpoint
  stores all of them, so a resume with the same P is exact.
- **agreement**: stop decisions (time limit, Ctrl-C) and a time-budgeted step count are taken
  together (any rank stopping stops all; rank 0's budget), so no rank waits for a collective the
  others skipped. Data, tokenizer and configs are compared across ranks at start.
- **failure**: every collective has ``timeout_s`` (default 300 s; ``--dist-timeout``). A rank that
  dies breaks its peers' connections at once; one that hangs makes the others fail after the timeout.
  Either way each survivor raises ``DistributedError`` naming its rank, instead of hanging.

Example::

    dist = init_distributed()                     # DistContext(rank=0, world_size=1) outside torchrun
    trainer = Trainer(task, cfg, dist=dist)
    trainer.train()
    dist.shutdown()
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import socket
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from datetime import timedelta
from typing import Callable, Optional

import torch
import torch.distributed as tdist
from torch import Tensor, nn

__all__ = ["DistContext", "DistributedError", "init_distributed", "free_port", "DEFAULT_TIMEOUT_S", "QuietLog"]

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 300.0      # longest wait in a collective: covers rank 0's checkpoint write of our model sizes


class DistributedError(RuntimeError):
    """A distributed run failed on this rank (usually: another rank died, hung or timed out)."""


class _LossForward(nn.Module):
    """Routes ``model.loss(x, y)`` through ``forward`` so that DDP's hooks see it."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, x: Tensor, y: Tensor) -> Tensor:
        return self.model.loss(x, y)


class QuietLog:
    """A MetricsLog stand-in for ranks > 0: they write nothing."""

    def write(self, record: dict) -> None:
        pass

    def records(self) -> list[dict]:
        return []


@dataclass(frozen=True)
class DistContext:
    """Where this process sits in the run: ``rank`` of ``world_size`` (1: an ordinary single process)."""

    rank: int = 0
    world_size: int = 1
    timeout_s: float = DEFAULT_TIMEOUT_S

    @classmethod
    def current(cls) -> "DistContext":
        """The default process group's rank and size, or a single process if none is initialised."""
        if tdist.is_available() and tdist.is_initialized():
            return cls(tdist.get_rank(), tdist.get_world_size())
        return cls()

    @property
    def active(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    # ------------------------------------------------------------ data and model
    def check_batch(self, batch_size: int) -> None:
        if batch_size % self.world_size:
            raise ValueError(f"batch_size {batch_size} (the global batch) is not divisible by the {self.world_size} "
                             f"processes; use a multiple of {self.world_size}, e.g. "
                             f"{max(1, round(batch_size / self.world_size)) * self.world_size}")

    def shard(self, t: Tensor) -> Tensor:
        """This rank's rows of a global batch: (B, ...) -> (B / world_size, ...)."""
        b = t.shape[0] // self.world_size
        return t[self.rank * b:(self.rank + 1) * b]                         # (B/P, ...)

    def loss_fn(self, model: nn.Module) -> Callable[[Tensor, Tensor], Tensor]:
        """``(x, y) -> loss`` for training: model.loss itself, or through DistributedDataParallel."""
        if not self.active:
            return model.loss
        device = next(model.parameters()).device
        device_ids = [device.index] if device.type == "cuda" else None
        return nn.parallel.DistributedDataParallel(_LossForward(model), device_ids=device_ids)

    @staticmethod
    def no_sync(loss_fn):
        """Skip the gradient all-reduce (for all but the last micro-batch of an accumulated step)."""
        return loss_fn.no_sync() if isinstance(loss_fn, nn.parallel.DistributedDataParallel) else nullcontext()

    # ------------------------------------------------------------ agreement
    def mean(self, value: float) -> float:
        """The mean of a float over ranks (the same on every rank)."""
        if not self.active:
            return value
        t = torch.tensor([value], dtype=torch.float64)
        tdist.all_reduce(t)
        return t.item() / self.world_size

    def gather(self, obj) -> list:
        """Every rank's obj (picklable), in rank order, on every rank."""
        if not self.active:
            return [obj]
        out = [None] * self.world_size
        tdist.all_gather_object(out, obj)
        return out

    def first_stop(self, why: Optional[str]) -> Optional[str]:
        """A stop reason if any rank has one (the lowest rank's), so all ranks stop at the same step."""
        if not self.active:
            return why
        reasons = [(r, w) for r, w in enumerate(self.gather(why)) if w]
        if not reasons:
            return None
        r, w = reasons[0]
        return w if r == self.rank else f"rank {r}: {w}"

    def from_main(self, obj):
        """Rank 0's obj on every rank."""
        return self.gather(obj)[0] if self.active else obj

    def check_same(self, what: dict) -> None:
        """ValueError if ranks differ in any entry of ``what`` (JSON-ready values: data, code, seed...)."""
        if not self.active:
            return
        digests = {k: hashlib.sha256(json.dumps(v, sort_keys=True, default=str).encode()).hexdigest()
                   for k, v in what.items()}
        for r, theirs in enumerate(self.gather(digests)):
            differ = sorted(k for k in digests if theirs[k] != digests[k])
            if differ:
                raise ValueError(f"rank {r} and rank {self.rank} have different {', '.join(differ)}: every node "
                                 "needs the same data, code, tokenizer and arguments (and the same seed)")

    # ------------------------------------------------------------ dropout RNG
    def seed_rank_rng(self, seed: int) -> None:
        """Rank r > 0 gets its own torch RNG stream (different dropout masks per shard); rank 0 keeps seed's."""
        if self.rank > 0:
            torch.manual_seed(_rank_seed(seed, self.rank, 0))

    def rng_states(self) -> dict[str, Tensor]:
        """Collective: every rank's torch RNG state, keyed for a checkpoint ("torch", "torch.rank1", ...)."""
        states = self.gather(torch.get_rng_state())
        return {("torch" if r == 0 else f"torch.rank{r}"): s for r, s in enumerate(states)}

    def restore_rng(self, rng: dict[str, Tensor], seed: int, step: int) -> None:
        """Set this rank's torch RNG from a checkpoint; a rank the checkpoint lacks is reseeded (inexact)."""
        key = "torch" if self.rank == 0 else f"torch.rank{self.rank}"
        if key in rng:
            torch.set_rng_state(rng[key])
        else:
            log.warning("the checkpoint has no RNG state for rank %d (saved with fewer processes): its dropout "
                        "masks are reseeded, so this resume is not bit-exact", self.rank)
            torch.manual_seed(_rank_seed(seed, self.rank, step))

    # ------------------------------------------------------------ failure and teardown
    @contextmanager
    def failures(self):
        """Turn a RuntimeError in a distributed run into a DistributedError that says what probably happened."""
        try:
            yield
        except RuntimeError as e:
            if not self.active or isinstance(e, DistributedError):
                raise
            raise DistributedError(
                f"rank {self.rank} of {self.world_size} failed: {e}\nIn a distributed run this usually means another "
                f"rank died or hung (collectives time out after {self.timeout_s:g} s); check the other ranks' "
                "output for the first error") from e

    def shutdown(self, *, synchronize: bool = False) -> None:
        """Leave the process group (a no-op when not in one, or already left).

        ``synchronize`` (the success path): first wait for every rank, so no rank tears gloo down
        while a peer is still in its last collective -- that aborts the peer ("terminate called
        without an active exception", seen under load). The wait is bounded by the group's timeout.
        """
        if self.active and tdist.is_initialized():
            if synchronize:
                with self.failures():
                    tdist.barrier()
            tdist.destroy_process_group()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago: the rendezvous port for ranks spawned on this
    machine (``tcp://127.0.0.1:PORT`` or ``MASTER_PORT``), and for a local test server."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_seed(seed: int, rank: int, step: int) -> int:
    return (seed * 1_000_003 + rank * 7_919 + step) % (2 ** 63)


def init_distributed(device: str = "cpu", timeout_s: float = DEFAULT_TIMEOUT_S) -> DistContext:
    """Join the process group torchrun describes in the environment (gloo on CPU, nccl on CUDA).

    Without torchrun (WORLD_SIZE unset or 1) this returns ``DistContext()`` and starts nothing.

    Args:
        device: where the model trains: "cpu" uses gloo, "cuda" nccl (and binds LOCAL_RANK's GPU).
        timeout_s: the longest any collective (and the rendezvous) may wait before raising.
    """
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistContext(timeout_s=timeout_s)
    missing = [k for k in ("RANK", "MASTER_ADDR", "MASTER_PORT") if k not in os.environ]
    if missing:
        raise ValueError(f"WORLD_SIZE={world} but {', '.join(missing)} not set: launch with torchrun "
                         "(torchrun --nproc_per_node=N -m attnlab train gpt ...)")
    if timeout_s <= 0:
        raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
    backend = "nccl" if torch.device(device).type == "cuda" else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    if not tdist.is_initialized():
        tdist.init_process_group(backend, timeout=timedelta(seconds=timeout_s))
    ctx = DistContext(tdist.get_rank(), tdist.get_world_size(), timeout_s)
    if ctx.is_main:
        log.info("process group: %d ranks (%s, collective timeout %g s)", ctx.world_size, backend, timeout_s)
    return ctx
