"""Recurrent baselines with the attention modules' interface: (B, L, C) in, (B, L, C) out.

They are here to be compared with attention: a recurrent layer needs L sequential steps, each
waiting for the previous hidden state, whereas an attention layer's critical path does not grow
with L (Vaswani et al. 2017, Table 1: sequential operations O(n) vs O(1)). ``sequential_steps(L)``
states that critical path for the lab's experiment.

- ``ElmanRNN``: ``h_t = tanh(W_x x_t + W_h h_{t-1} + b)``, written out as a Python loop over t.
- ``LSTMBaseline``, ``GRUBaseline``: ``torch.nn.LSTM`` / ``torch.nn.GRU`` (batch_first), projected
  back to C when the hidden width (times 2 if bidirectional) differs from it.

Build one by name with ``make_rnn("elman" | "lstm" | "gru", dim=..., ...)``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor, nn

__all__ = ["RNNConfig", "ElmanRNN", "LSTMBaseline", "GRUBaseline", "RNNS", "make_rnn"]


@dataclass
class RNNConfig:
    dim: int = 256                    # C: width of the input and of the output
    hidden_dim: Optional[int] = None  # width of the hidden state; None = dim
    bidirectional: bool = False       # lstm/gru only: adds a right-to-left pass, so it is NOT causal

    def __post_init__(self):
        if self.dim < 1:
            raise ValueError(f"dim={self.dim} must be >= 1")
        if self.hidden_dim is not None and self.hidden_dim < 1:
            raise ValueError(f"hidden_dim={self.hidden_dim} must be >= 1, or None for hidden_dim = dim")

    @property
    def hidden(self) -> int:
        return self.dim if self.hidden_dim is None else self.hidden_dim


def _check_input(x: Tensor, dim: int, name: str) -> None:
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} takes a torch.Tensor, got {type(x).__name__}")
    if x.dim() != 3:
        raise ValueError(f"{name} got x of shape {tuple(x.shape)}; it takes (B, L, C={dim}) "
                         f"(add a batch dim with x.unsqueeze(0))")
    if x.shape[-1] != dim:
        raise ValueError(f"{name} got x of width {x.shape[-1]} {tuple(x.shape)}; it was built for C={dim}")
    if not x.dtype.is_floating_point:
        raise TypeError(f"{name} got x of dtype {x.dtype}; it needs floating-point inputs")


class _Recurrent(nn.Module):
    """What every baseline shares: the critical path of a single recurrent layer."""

    def sequential_steps(self, L: int) -> int:
        """Length of the critical path for a length-L sequence: L dependent steps.

        (A bidirectional layer runs its two directions side by side, so still L.)
        """
        if isinstance(L, bool) or not isinstance(L, int) or L < 0:
            raise ValueError(f"L={L!r} must be a non-negative int (the sequence length)")
        return L


class ElmanRNN(_Recurrent):
    """Elman RNN, one Python step per position: ``h_t = tanh(W_x x_t + W_h h_{t-1} + b)``, ``h_0 = 0``.

    The input projections ``W_x x_t + b`` do not depend on each other and are computed for all t in
    one matmul; the recurrence is the loop, so the L dependent steps are visible in the code.
    Initialised like ``torch.nn.RNN``: every weight uniform in ±1/sqrt(hidden).

    Example:
        rnn = ElmanRNN(RNNConfig(dim=32))
        y = rnn(torch.randn(4, 10, 32))      # (4, 10, 32), y[:, t] = h_t
        rnn.sequential_steps(10)             # 10
    """

    def __init__(self, cfg: RNNConfig):
        super().__init__()
        if cfg.bidirectional:
            raise ValueError("ElmanRNN is unidirectional; use make_rnn('lstm' or 'gru', bidirectional=True)")
        self.cfg = cfg
        self.w_x = nn.Linear(cfg.dim, cfg.hidden)                # W_x and b (torch.nn.RNN's b_ih + b_hh)
        self.w_h = nn.Linear(cfg.hidden, cfg.hidden, bias=False)
        self.proj = nn.Linear(cfg.hidden, cfg.dim) if cfg.hidden != cfg.dim else None
        bound = 1.0 / math.sqrt(cfg.hidden)
        for p in (self.w_x.weight, self.w_x.bias, self.w_h.weight):
            nn.init.uniform_(p, -bound, bound)

    def forward(self, x: Tensor) -> Tensor:
        """x: (B, L, C) -> (B, L, C): the hidden state after each step (projected if hidden != C)."""
        _check_input(x, self.cfg.dim, "ElmanRNN")
        B, L, _ = x.shape
        xw = self.w_x(x)                                          # (B, L, hidden)
        h = xw.new_zeros(B, self.cfg.hidden)                      # (B, hidden)
        hs = []
        for t in range(L):                                        # step t needs h_{t-1}: L sequential steps
            h = torch.tanh(xw[:, t] + self.w_h(h))                # (B, hidden)
            hs.append(h)
        out = torch.stack(hs, dim=1) if hs else xw                # (B, L, hidden)
        return out if self.proj is None else self.proj(out)       # (B, L, C)


class _TorchRecurrent(_Recurrent):
    """A ``torch.nn.LSTM`` / ``torch.nn.GRU`` layer with the (B, L, C) -> (B, L, C) interface."""

    layer_cls: type = nn.Module
    name: str = ""

    def __init__(self, cfg: RNNConfig):
        super().__init__()
        self.cfg = cfg
        self.rnn = self.layer_cls(cfg.dim, cfg.hidden, batch_first=True, bidirectional=cfg.bidirectional)
        width = cfg.hidden * (2 if cfg.bidirectional else 1)
        self.proj = nn.Linear(width, cfg.dim) if width != cfg.dim else None

    def forward(self, x: Tensor) -> Tensor:
        """x: (B, L, C) -> (B, L, C). Unidirectional (default) output t depends on x[:, :t+1] only."""
        _check_input(x, self.cfg.dim, self.name)
        out, _ = self.rnn(x)                                      # (B, L, hidden · directions)
        return out if self.proj is None else self.proj(out)       # (B, L, C)


class LSTMBaseline(_TorchRecurrent):
    """``torch.nn.LSTM`` wrapped: (B, L, C) -> (B, L, C).

    Example:
        lstm = LSTMBaseline(RNNConfig(dim=32, hidden_dim=64))
        y = lstm(torch.randn(4, 10, 32))     # (4, 10, 32): 64 hidden units projected back to 32
    """

    layer_cls = nn.LSTM
    name = "LSTMBaseline"


class GRUBaseline(_TorchRecurrent):
    """``torch.nn.GRU`` wrapped: (B, L, C) -> (B, L, C).

    Example:
        gru = GRUBaseline(RNNConfig(dim=32))
        y = gru(torch.randn(4, 10, 32))      # (4, 10, 32)
    """

    layer_cls = nn.GRU
    name = "GRUBaseline"


RNNS: dict[str, type[_Recurrent]] = {"elman": ElmanRNN, "lstm": LSTMBaseline, "gru": GRUBaseline}


def make_rnn(kind: str, **fields) -> _Recurrent:
    """Build a recurrent baseline by name; ``fields`` are ``RNNConfig`` fields.

    Example:
        rnn = make_rnn("gru", dim=64)         # GRUBaseline(RNNConfig(dim=64))
    """
    if kind not in RNNS:
        raise ValueError(f"unknown RNN kind {kind!r}; available: {sorted(RNNS)}")
    return RNNS[kind](RNNConfig(**fields))
