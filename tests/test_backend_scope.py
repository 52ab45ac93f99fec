"""One way to choose a backend (issue #29): ``use_backend`` (a scope) and ``nn.set_backend`` (a pin)."""
import threading
import warnings

import pytest
import torch

import attnlab
from attnlab.functional import api, current_backend, explain, use_backend
from attnlab.models.encoder import Encoder, EncoderConfig
from attnlab.models.gpt import GPT, GPTConfig
from attnlab.nn import MultiheadAttention, AttentionLayer, set_backend


@pytest.fixture
def picked(monkeypatch):
    """The backend name every attention call asked choose_backend for."""
    names = []
    real = api.choose_backend

    def spy(req, backend):
        names.append(backend)
        return real(req, backend)
    monkeypatch.setattr(api, "choose_backend", spy)
    return names


def _qkv(n=32):
    return (torch.randn(1, 2, n, 8) for _ in range(3))


def test_a_scope_replaces_auto_but_not_a_named_backend(picked):
    q, k, v = _qkv()
    with attnlab.use_backend("reference"):
        out = attnlab.attention(q, k, v, causal=True)
        attnlab.attention(q, k, v, causal=True, backend="sdpa")
    assert picked == ["reference", "sdpa"]
    torch.testing.assert_close(out, attnlab.attention(q, k, v, causal=True, backend="reference"))


def test_scopes_nest_and_restore_even_on_an_error(picked):
    q, k, v = _qkv()
    with use_backend("reference"):
        with use_backend("tiled"):
            assert current_backend() == "tiled"
            attnlab.attention(q, k, v)
        attnlab.attention(q, k, v)
        with pytest.raises(RuntimeError):
            with use_backend("auto"):
                assert current_backend() == "auto"
                raise RuntimeError("boom")
        assert current_backend() == "reference"
    assert current_backend() == "auto"
    assert picked == ["tiled", "reference"]


def test_a_scope_is_per_thread():
    seen = []
    with use_backend("reference"):
        t = threading.Thread(target=lambda: seen.append(current_backend()))
        t.start()
        t.join()
    assert seen == ["auto"]


def test_an_unknown_name_fails_at_entry():
    ran = []
    with pytest.raises(ValueError, match="unknown attention backend 'natve'"):
        with use_backend("natve"):
            ran.append(1)
    assert ran == [] and current_backend() == "auto"


def test_explain_names_the_scope():
    q, k, v = _qkv()
    with use_backend("reference"):
        assert "reference (use_backend scope) -> runs" in explain(q, k, v)


def test_a_model_runs_under_the_scope(picked):
    model = GPT(GPTConfig(vocab_size=11, n_layers=2, n_heads=2, d_model=16, max_len=32)).eval()
    x = torch.randint(0, 11, (1, 20))
    with torch.no_grad(), use_backend("reference"):
        model(x)
    assert picked == ["reference", "reference"]


def _backends(model):
    found = []
    for m in model.modules():
        if isinstance(m, AttentionLayer):
            found.append(m.cfg.backend)
        elif isinstance(m, MultiheadAttention):
            found.append(m.backend)
    return found


def test_set_backend_pins_every_layer_and_checks_the_name_first(picked):
    model = GPT(GPTConfig(vocab_size=11, n_layers=3, n_heads=2, d_model=16, max_len=32))
    assert set_backend(model, "tiled") is model
    assert _backends(model) == ["tiled"] * 3 and model.cfg.backend == "tiled"
    with pytest.raises(ValueError, match="unknown attention backend"):
        set_backend(model, "nope")
    assert _backends(model) == ["tiled"] * 3
    with torch.no_grad(), use_backend("reference"):        # a pin wins over a scope
        model.eval()(torch.randint(0, 11, (1, 20)))
    assert picked == ["tiled"] * 3
    mha = torch.nn.Sequential(MultiheadAttention(16, 2, batch_first=True))
    assert _backends(set_backend(mha, "reference")) == ["reference"]


def test_the_old_methods_still_work_and_warn():
    model = GPT(GPTConfig(vocab_size=11, n_layers=2, n_heads=2, d_model=16, max_len=32))
    with pytest.warns(DeprecationWarning, match="attnlab.nn.set_backend"):
        assert model.with_backend("reference") is model
    assert _backends(model) == ["reference"] * 2
    enc = Encoder(EncoderConfig(vocab_size=20, d_model=16, n_heads=2, n_layers=2, d_ff=32, max_len=32))
    with pytest.warns(DeprecationWarning, match="Encoder.set_backend"):
        enc.set_backend("tiled")
    assert _backends(enc) == ["tiled"] * 2
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ValueError):
            set_backend(enc, "bogus")
