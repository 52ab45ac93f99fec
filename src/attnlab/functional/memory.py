"""Memory checked before work: a backend that must materialize something of L * S size (the reference's
scores, SDPA's dense mask, the weights of ``return_weights=True``) first estimates its bytes and, when
they exceed the device's whole memory, refuses at once with the figure and the fix -- instead of
computing for a minute and then failing in the allocator (issue #26).

The threshold is the memory the device can give now: on the CPU the kernel's MemAvailable (physical
RAM where /proc/meminfo is missing), on a GPU its total memory (torch's caching allocator reuses what
it holds, so "free" would understate it). Estimates are lower bounds -- they count only the buffers
that must exist at the same time -- so what is refused could not have run.

Example::

    check_fits_in_memory("the sdpa backend builds the dense (1, 1, L, S) mask", need, q.device,
                         "use backend='tiled' or 'native', which compute the mask per tile")
"""
from __future__ import annotations

import math
import os
from typing import Optional, Sequence

import torch

__all__ = ["device_memory", "available_ram", "human_bytes", "nbytes", "check_fits_in_memory", "check_weights_fit"]


#: below this many bytes nothing is refused, and no call pays for reading /proc/meminfo (a file read per call)
ALWAYS_FITS = 2 ** 28


def device_memory(device: torch.device) -> Optional[int]:
    """Bytes ``device`` can give now (the CPU: MemAvailable, else physical RAM; a GPU: its total memory),
    or None when unknown (meta tensors, other devices): then nothing is refused."""
    try:
        if device.type == "cuda":
            return torch.cuda.mem_get_info(device)[1]
        if device.type == "cpu":
            return available_ram() or os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (OSError, ValueError, RuntimeError):
        pass
    return None


def available_ram() -> Optional[int]:
    """Bytes of RAM a process can allocate now without swapping: /proc/meminfo's MemAvailable, lowered to a
    cgroup v2 container's headroom (which /proc/meminfo does not show); None when neither can be read.
    Physical RAM alone let a request that needs 21 GB of a 24 GiB machine with 12 GiB free compute for
    72 s and then fail in the allocator (issue #26). The one reading of it: attention's checks here, the
    trainer's size estimates and the bench's memory limit all ask this.

    >>> available_ram()          # doctest: +SKIP
    12884901888
    """
    found = []
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    found.append(int(line.split()[1]) * 1024)
    except (OSError, ValueError, IndexError):
        pass
    try:
        with open("/sys/fs/cgroup/memory.max") as f:
            limit = f.read().strip()
        if limit != "max":
            with open("/sys/fs/cgroup/memory.current") as f:
                found.append(int(limit) - int(f.read()))
    except (OSError, ValueError):
        pass
    return max(0, min(found)) if found else None


def human_bytes(b: float) -> str:
    """Bytes with a unit people read at a glance: '352 MB', '240 GB', '1.29 TB', '12.5 PB'."""
    for unit, size in (("PB", 1e15), ("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if b >= size:
            return f"{b / size:.3g} {unit}"
    return f"{b:.0f} B"


def nbytes(shape: Sequence[int], dtype: torch.dtype) -> int:
    """Bytes of a dense tensor of ``shape`` and ``dtype`` (Python ints: no overflow at any size)."""
    return math.prod(shape) * dtype.itemsize


def _gib(n: int) -> str:
    return f"{n / 2**30:,.1f}" if n < 10 * 2**30 else f"{n / 2**30:,.0f}"


def check_fits_in_memory(what: str, need: int, device: torch.device, fix: str) -> None:
    """MemoryError, before anything is allocated, when ``what`` (``need`` bytes that must exist at once)
    exceeds what ``device`` can give (``device_memory``); the message gives both figures and ``fix``.

    Skipped under torch.compile: os.sysconf / mem_get_info would break a fullgraph compile (callers that
    format sizes into ``what`` check ``torch.compiler.is_compiling()`` first: dynamo cannot format SymInts).
    """
    if torch.compiler.is_compiling() or need < ALWAYS_FITS:
        return
    have = device_memory(device)
    if have is not None and need > have:
        raise MemoryError(f"{what}: ~{_gib(need)} GiB ({need:,} bytes), more than the "
                          f"{_gib(have)} GiB ({have:,} bytes) this {device.type} device has available; {fix}")


def check_weights_fit(who: str, B: int, H: int, L: int, S: int, dtype: torch.dtype, device: torch.device,
                      copies: int = 1, blocks: tuple[int, int] = (1, 1)) -> None:
    """``return_weights=True``: the (B, H, L, S) weights in ``dtype`` (``copies`` of them alive at once
    while they are computed; L and S rounded up to whole ``blocks`` where a kernel pads them), checked
    before the forward runs."""
    if torch.compiler.is_compiling():            # no sizes formatted into strings while tracing
        return
    need = copies * nbytes((B, H, -(-L // blocks[0]) * blocks[0], -(-S // blocks[1]) * blocks[1]), dtype)
    check_fits_in_memory(
        f"{who} returns the (B, H, L, S) = ({B}, {H}, {L}, {S}) weights (return_weights=True)"
        + (f", {copies} {dtype} copies while they are computed" if copies > 1 else f" in {dtype}"),
        need, device,
        "drop return_weights=True (the output alone fits), or ask for the weights of fewer heads or a "
        "smaller batch (slice q, k, v and the mask to match)")
