"""Thread control: run a block on a given number of torch threads, then restore the previous count.

Example::

    with threads(1):
        loss = model(x).sum()        # one OpenMP thread inside, the old count again after
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch

__all__ = ["threads"]


@contextmanager
def threads(n: int) -> Iterator[None]:
    """Run the block with ``n`` torch threads, then restore the previous count (also on an exception).

    Timing and small-model training use one thread: on a shared 2-core machine a second OpenMP
    thread waiting at a barrier for a descheduled sibling costs more than it gains at these sizes.

    Args:
        n: the number of torch intra-op threads inside the block.
    Example:
        with threads(1):
            torch.get_num_threads()      # 1
    """
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)
