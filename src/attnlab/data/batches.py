"""Train/validation split of a token stream, and random (x, y) windows for next-token training.

The split is by position: the last ``val_fraction`` of the token stream is validation (nanoGPT's
choice for shakespeare-char). Contiguous halves mean no training window ever contains validation
text, and the split depends only on the tokens, so it is the same on every run and on resume.
The price: validation is the *end* of the corpus (for ``docs``, the alphabetically last topics),
not a random sample of it.

Example::

    train_ids, val_ids = split_tokens(ids, val_fraction=0.1)           # ids: (N,) int64
    sampler = BatchSampler(train_ids, seq_len=256, batch_size=32, seed=0)
    x, y = sampler.next()                                              # (32, 256) each; y = x shifted by one
"""
from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["split_tokens", "BatchSampler"]


def split_tokens(ids: Tensor, val_fraction: float = 0.1) -> tuple[Tensor, Tensor]:
    """(train, val): the first 1 - val_fraction of ids (N,), and the rest."""
    if ids.dim() != 1:
        raise ValueError(f"ids must be a 1-D token stream, got shape {tuple(ids.shape)}")
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
    n_val = max(1, int(round(len(ids) * val_fraction)))
    return ids[:-n_val], ids[-n_val:]


class BatchSampler:
    """Random windows of seq_len + 1 tokens drawn with its own seeded ``torch.Generator``.

    ``state()`` / ``set_state()`` save and restore the generator, so a resumed run draws the same
    batches as an uninterrupted one.
    """

    def __init__(self, ids: Tensor, seq_len: int, batch_size: int, seed: int = 0):
        if len(ids) < seq_len + 1:
            raise ValueError(f"{len(ids)} tokens cannot fill one window of seq_len + 1 = {seq_len + 1}; "
                             "use more text, a smaller context (--max-len), or a smaller validation fraction")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.ids = ids.to(torch.int64)
        self.seq_len, self.batch_size = seq_len, batch_size
        self.generator = torch.Generator().manual_seed(seed)

    def next(self) -> tuple[Tensor, Tensor]:
        """x, y: int64 (batch_size, seq_len), y[:, t] = the token after x[:, t]."""
        T = self.seq_len
        starts = torch.randint(0, len(self.ids) - T, (self.batch_size,), generator=self.generator)  # (B,)
        offsets = starts[:, None] + torch.arange(T + 1)                                          # (B, T+1)
        windows = self.ids[offsets]                                                              # (B, T+1)
        return windows[:, :-1].contiguous(), windows[:, 1:].contiguous()

    def fixed_batches(self, n: int) -> list[tuple[Tensor, Tensor]]:
        """n batches drawn now (e.g. for validation: the same batches at every evaluation)."""
        return [self.next() for _ in range(n)]

    def state(self) -> Tensor:
        return self.generator.get_state()

    def set_state(self, state: Tensor) -> None:
        self.generator.set_state(state)
