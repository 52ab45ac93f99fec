"""Recurrent baselines: the Elman recurrence by hand and against torch.nn.RNN; causality; errors."""
from __future__ import annotations

import math

import pytest
import torch

from attnlab.nn.rnn import RNNS, ElmanRNN, GRUBaseline, LSTMBaseline, RNNConfig, make_rnn


def test_elman_equals_hand_written_recurrence():
    """B=1, L=3, C=hidden=2, with weights set by hand, recomputed in plain Python floats."""
    rnn = ElmanRNN(RNNConfig(dim=2)).double()
    Wx = [[0.5, -0.3], [0.2, 0.8]]
    Wh = [[0.1, -0.6], [0.7, 0.4]]
    b = [0.05, -0.1]
    xs = [[1.0, 2.0], [-0.5, 0.25], [3.0, -1.0]]
    with torch.no_grad():
        rnn.w_x.weight.copy_(torch.tensor(Wx, dtype=torch.float64))
        rnn.w_h.weight.copy_(torch.tensor(Wh, dtype=torch.float64))
        rnn.w_x.bias.copy_(torch.tensor(b, dtype=torch.float64))
    h, want = [0.0, 0.0], []
    for x in xs:
        h = [math.tanh(sum(Wx[r][c] * x[c] for c in range(2)) + sum(Wh[r][c] * h[c] for c in range(2)) + b[r])
             for r in range(2)]
        want.append(h)
    out = rnn(torch.tensor([xs], dtype=torch.float64))
    torch.testing.assert_close(out, torch.tensor([want], dtype=torch.float64), rtol=0, atol=1e-15)


@pytest.mark.parametrize("B, L, C", [(2, 7, 5), (1, 1, 3), (3, 13, 8)])
def test_elman_equals_torch_rnn(B, L, C):
    torch.manual_seed(0)
    ref = torch.nn.RNN(C, C, nonlinearity="tanh", batch_first=True).double()
    rnn = ElmanRNN(RNNConfig(dim=C)).double()
    with torch.no_grad():
        rnn.w_x.weight.copy_(ref.weight_ih_l0)
        rnn.w_h.weight.copy_(ref.weight_hh_l0)
        rnn.w_x.bias.copy_(ref.bias_ih_l0 + ref.bias_hh_l0)
    x = torch.randn(B, L, C, dtype=torch.float64, requires_grad=True)
    out = rnn(x)
    want, _ = ref(x)
    torch.testing.assert_close(out, want, rtol=0, atol=1e-13)
    dout = torch.randn_like(out)
    (gx,) = torch.autograd.grad(out, x, dout)
    (wx,) = torch.autograd.grad(want, x, dout)
    torch.testing.assert_close(gx, wx, rtol=0, atol=1e-12)


@pytest.mark.parametrize("kind", sorted(RNNS))
@pytest.mark.parametrize("hidden_dim", [None, 7])
def test_causal_and_shapes(kind, hidden_dim):
    torch.manual_seed(0)
    rnn = make_rnn(kind, dim=6, hidden_dim=hidden_dim).eval()
    x = torch.randn(3, 11, 6)
    y = x.clone()
    y[:, 5:] = torch.randn(3, 6, 6)                 # change only the future
    out_x, out_y = rnn(x), rnn(y)
    assert out_x.shape == (3, 11, 6)
    torch.testing.assert_close(out_x[:, :5], out_y[:, :5], rtol=0, atol=0)
    assert (out_x[:, 5:] - out_y[:, 5:]).abs().max() > 1e-3, "the changed inputs did not change the outputs"


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_bidirectional_sees_the_future_and_keeps_width(kind):
    torch.manual_seed(0)
    rnn = make_rnn(kind, dim=6, bidirectional=True)   # 2 x 6 directions -> projected back to 6
    x = torch.randn(2, 9, 6)
    y = x.clone()
    y[:, -1] += 1.0
    out_x, out_y = rnn(x), rnn(y)
    assert out_x.shape == (2, 9, 6)
    assert (out_x[:, 0] - out_y[:, 0]).abs().max() > 0, "bidirectional output 0 ignores the last input"
    assert rnn.sequential_steps(9) == 9


@pytest.mark.parametrize("kind", sorted(RNNS))
def test_gradients_and_sequential_steps(kind):
    torch.manual_seed(0)
    rnn = make_rnn(kind, dim=4, hidden_dim=5)
    x = torch.randn(2, 6, 4, requires_grad=True)
    rnn(x).pow(2).sum().backward()
    for name, p in list(rnn.named_parameters()) + [("x", x)]:
        assert p.grad is not None and p.grad.abs().max() > 0, name
    assert [rnn.sequential_steps(n) for n in (0, 1, 100)] == [0, 1, 100]


def test_empty_sequence():
    for kind in ("elman",):      # torch.nn.LSTM / GRU reject L = 0 themselves
        out = make_rnn(kind, dim=4)(torch.randn(2, 0, 4))
        assert out.shape == (2, 0, 4)


def test_wrappers_are_torch_layers():
    cfg = RNNConfig(dim=8, hidden_dim=16)
    assert isinstance(LSTMBaseline(cfg).rnn, torch.nn.LSTM)
    assert isinstance(GRUBaseline(cfg).rnn, torch.nn.GRU)
    assert LSTMBaseline(RNNConfig(dim=8)).proj is None          # same width: no projection


@pytest.mark.parametrize("kind", sorted(RNNS))
def test_bad_input_errors(kind):
    rnn = make_rnn(kind, dim=4)
    with pytest.raises(ValueError, match=r"width 5 .* built for C=4"):
        rnn(torch.randn(2, 3, 5))
    with pytest.raises(ValueError, match=r"shape \(3, 4\).*\(B, L, C=4\)"):
        rnn(torch.randn(3, 4))
    with pytest.raises(ValueError, match=r"shape \(1, 2, 3, 4\)"):
        rnn(torch.randn(1, 2, 3, 4))
    with pytest.raises(TypeError, match="floating-point"):
        rnn(torch.ones(2, 3, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="non-negative int"):
        rnn.sequential_steps(-1)


def test_bad_config_errors():
    with pytest.raises(ValueError, match="unknown RNN kind 'transformer'.*'elman', 'gru', 'lstm'"):
        make_rnn("transformer", dim=4)
    with pytest.raises(ValueError, match="ElmanRNN is unidirectional"):
        make_rnn("elman", dim=4, bidirectional=True)
    with pytest.raises(ValueError, match="hidden_dim=0"):
        RNNConfig(dim=4, hidden_dim=0)
    with pytest.raises(TypeError):
        make_rnn("gru", dim=4, layers=2)       # not an RNNConfig field
