"""attnlab.lab.inspect: attention maps by model name, with the positional / scale / backend knobs."""
from __future__ import annotations

import math

import pytest
import torch

from attnlab.data.tokenization import CharTokenizer
from attnlab.lab import inspect
from attnlab.lab.inspect import (InputTooLongError, ModelLoadError, UnknownModelError, attention_entropy,
                                 attention_maps, backend_choices, list_models, registered_model, register_model)
from attnlab.models import GPT, GPTConfig

TOY = "toy-encoder"
A, B = "the dog bit the man", "the man bit the dog"
SWAP = [0, 4, 2, 3, 1]                 # B's token t is A's token SWAP[t]


needs_minilm = pytest.mark.skipif(not any(e["name"] == "minilm" and e["available"] for e in list_models()),
                                  reason="the 'pretrained' extra (MiniLM files) is missing")


def permute(w: torch.Tensor, p: list[int]) -> torch.Tensor:
    """P W P^T on the last two dims."""
    return w[..., p, :][..., :, p]


def test_toy_maps_shape_and_rows():
    m = attention_maps(TOY, A)
    assert m.tokens == ["the", "dog", "bit", "the", "man"]
    assert m.weights.shape == (2, 4, 5, 5) and m.layers == [0, 1] and m.heads == [0, 1, 2, 3]
    torch.testing.assert_close(m.weights.sum(-1), torch.ones(2, 4, 5))
    one = attention_maps(TOY, A, layer=1, head=2)
    assert one.weights.shape == (1, 1, 5, 5)
    torch.testing.assert_close(one.weights[0, 0], m.weights[1, 2])


def test_without_positions_order_is_invisible():
    """No PE: swapping two words permutes the attention matrix exactly; with PE it does not."""
    a = attention_maps(TOY, A, positional=False).weights
    b = attention_maps(TOY, B, positional=False).weights
    err = (permute(a, SWAP) - b).abs().max().item()
    assert err < 1e-5, f"without PE the maps should be permutations of each other, max diff {err}"
    a_pe, b_pe = attention_maps(TOY, A).weights, attention_maps(TOY, B).weights
    gap = (permute(a_pe, SWAP) - b_pe).abs().max().item()
    assert gap > 0.05, f"with PE the word order should change the maps, max diff only {gap}"


def test_layer0_matches_a_manual_computation():
    """Layer 0's weights = softmax(factor * q k^T / sqrt(d)) from the toy's own parameters, with and without PE."""
    model = registered_model(TOY).model
    ids = torch.tensor([registered_model(TOY).tokenize(A)[1]])                            # (1, 5)
    attn = model.layers[0].self_attn
    H, D = attn.cfg.n_heads, attn.cfg.head_dim
    for positional, factor in [(True, 1.0), (True, 3.0), (False, 0.5)]:
        x = model.word_embeddings(ids) + model.token_type_embeddings.weight[0]    # (1, 5, C)
        if positional:
            x = x + model.position_embeddings.weight[:5]
        x = model.embed_norm(x)
        q = (x @ attn.q_proj.weight.T + attn.q_proj.bias).view(1, 5, H, D).transpose(1, 2)   # (1, H, 5, D)
        k = (x @ attn.k_proj.weight.T + attn.k_proj.bias).view(1, 5, H, D).transpose(1, 2)
        want = torch.softmax(q.double() @ k.double().transpose(-1, -2) * factor / math.sqrt(D), -1)
        got = attention_maps(TOY, A, layer=0, positional=positional, scale_factor=factor).weights[0]
        torch.testing.assert_close(got.double(), want[0], atol=1e-5, rtol=0)


def test_scale_factor_saturates_the_softmax():
    ent = {f: attention_entropy(attention_maps(TOY, A, scale_factor=f).weights).mean().item()
           for f in (0.25, 1.0, 8.0)}
    assert ent[0.25] > ent[1.0] > ent[8.0], ent
    assert ent[0.25] > 0.9 * math.log(5) and ent[8.0] < 0.5 * math.log(5), ent


def test_entropy_of_uniform_and_one_hot_rows():
    w = torch.tensor([[0.25, 0.25, 0.25, 0.25], [0.0, 1.0, 0.0, 0.0]])
    torch.testing.assert_close(attention_entropy(w), torch.tensor([math.log(4), 0.0], dtype=torch.float64))


@pytest.mark.parametrize("backend", ["sdpa", "tiled", "sparse", "auto"])
def test_exact_backends_agree(backend):
    m = attention_maps(TOY, A, backend=backend)
    ref = attention_maps(TOY, A, backend="reference")
    assert ref.agreement is None
    err = (m.weights - ref.weights).abs().max().item()
    assert m.agreement is not None and m.agreement < 1e-5 and err < 1e-5, (m.agreement, err)
    assert abs(m.agreement - err) < 1e-6       # the reported number is the difference against the reference


def test_approximate_backend_reports_its_error():
    m = attention_maps(TOY, "the quick brown fox jumps over the lazy dog", backend="linear")
    assert m.agreement > 1e-3
    assert {"name": "linear", "exact": False} in backend_choices()


def test_knobs_are_restored_after_the_call():
    attn = registered_model(TOY).model.layers[0].self_attn
    before = (attn.cfg, attn.scale)
    attention_maps(TOY, A, scale_factor=4.0, backend="tiled", positional=False)
    with pytest.raises(InputTooLongError):
        attention_maps(TOY, A, scale_factor=4.0, max_tokens=2)
    assert (attn.cfg, attn.scale) == before


@pytest.mark.parametrize("kwargs, match", [
    (dict(name="nope"), "not a registered model"),
    (dict(text=""), "empty"),
    (dict(text="   "), "empty"),
    (dict(layer=2), r"layer 2 does not exist.*2 layers"),
    (dict(head=-1), r"head -1 does not exist"),
    (dict(head=1.5), r"head 1.5 does not exist"),
    (dict(scale_factor=0), "scale_factor"),
    (dict(scale_factor=float("nan")), "scale_factor"),
    (dict(backend="flashy"), "unknown attention backend"),
    (dict(max_tokens=4), r"5 tokens .* over the cap of 4"),
])
def test_errors(kwargs, match):
    args = dict(name=TOY, text=A) | kwargs
    with pytest.raises(ValueError, match=match):
        attention_maps(args.pop("name"), args.pop("text"), **args)


def test_error_types():
    with pytest.raises(UnknownModelError):
        attention_maps("../../etc/passwd", A)
    with pytest.raises(InputTooLongError):
        attention_maps(TOY, "word " * 200)


def test_registered_gpt_is_causal_and_positions_switch_off():
    tok = CharTokenizer.train("abcdefgh ")
    torch.manual_seed(0)
    register_model("test-gpt", lambda: (GPT(GPTConfig.preset("nano", vocab_size=tok.vocab_size,
                                                              positional="rope")), tok), description="a test")
    entry = [e for e in list_models() if e["name"] == "test-gpt"][0]
    assert entry["available"] and entry["description"] == "a test"
    m = attention_maps("test-gpt", "abc dea")
    assert m.tokens == list("abc dea") and m.weights.shape == (2, 4, 7, 7)
    assert torch.all(m.weights.triu(1) == 0), "a causal model attends to no future token"
    off = attention_maps("test-gpt", "abc dea", positional=False)
    assert (off.weights - m.weights).abs().max() > 1e-4, "RoPE off should change the maps"
    assert registered_model("test-gpt").attn_layers[0].positional is not None, "RoPE is restored after the call"
    assert [e for e in list_models() if e["name"] == "test-gpt"][0]["layers"] == 2


def _tiny_gpt_checkpoint(path):
    from attnlab.train.checkpoint import save_checkpoint
    tok = CharTokenizer.train("hello world")
    cfg = GPTConfig(vocab_size=tok.vocab_size, max_len=16, n_layers=3, n_heads=2, d_model=16)
    torch.manual_seed(0)
    save_checkpoint(path, 1, GPT(cfg), tokenizer_json=tok.to_json(), model_config=cfg.to_dict(), train_config={})


def test_gpt_demo_appears_when_the_demo_checkpoint_exists(tmp_path, monkeypatch):
    monkeypatch.setattr(inspect, "DEMO_GPT", tmp_path / "runs/demo/gpt")
    monkeypatch.setattr(inspect, "_LOADED", {})
    demo = lambda: [e for e in list_models() if e["name"] == "gpt-demo"][0]
    assert not demo()["available"]
    with pytest.raises(UnknownModelError, match="not available here"):
        attention_maps("gpt-demo", "hello")
    _tiny_gpt_checkpoint(inspect.DEMO_GPT)
    assert demo()["available"]
    m = attention_maps("gpt-demo", "hello", layer=2)
    assert m.tokens == list("hello") and m.weights.shape == (1, 2, 5, 5)
    assert demo()["layers"] == 3 and demo()["heads"] == 2


def test_a_broken_checkpoint_is_a_load_error(tmp_path, monkeypatch):
    monkeypatch.setattr(inspect, "DEMO_GPT", tmp_path / "gpt")
    monkeypatch.setattr(inspect, "_LOADED", {})
    (tmp_path / "gpt").mkdir()                                  # the directory exists, the checkpoint does not
    with pytest.raises(ModelLoadError, match="'gpt-demo' could not be loaded"):
        attention_maps("gpt-demo", "hello")


def test_register_model_rejects_path_like_names():
    with pytest.raises(ValueError, match="model names"):
        register_model("runs/x", lambda: None)


def test_models_listed():
    names = {e["name"]: e for e in list_models()}
    assert names[TOY] == dict(name=TOY, description=names[TOY]["description"], layers=2, heads=4, available=True)
    assert "gpt-demo" in names and "minilm" in names


@needs_minilm
def test_minilm_order_blind_without_positions():
    """MiniLM without its position embeddings: [CLS] a b c [SEP] -> permuted words give permuted maps."""
    a = attention_maps("minilm", "dog bites man", positional=False)
    b = attention_maps("minilm", "man bites dog", positional=False)
    assert a.tokens[0] == "[CLS]" and a.tokens[-1] == "[SEP]" and a.weights.shape == (6, 12, 5, 5)
    p = [0, 3, 2, 1, 4]
    assert (permute(a.weights, p) - b.weights).abs().max() < 1e-4
    with_pe = attention_maps("minilm", "man bites dog")
    assert (permute(a.weights, p) - with_pe.weights).abs().max() > 1e-2
    assert a.agreement < 1e-5
    # the cached model's own tokenizer still truncates (inspection uses a private copy)
    assert registered_model("minilm").model.tokenizer.tok.truncation is not None
