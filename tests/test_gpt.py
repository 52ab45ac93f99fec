"""GPT: never peeks, KV-cache generation == recomputation, sampling rules, attention capture, errors."""
from __future__ import annotations

import pytest
import torch

from attnlab.models import GPT, GPTConfig, sample_next

SCHEMES = ["learned", "sinusoidal", "rope", "alibi"]


def tiny(positional="learned", **kw) -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig.preset("nano", vocab_size=40, max_len=24, positional=positional, **kw)).eval()


@pytest.mark.parametrize("positional", SCHEMES)
def test_gpt_never_peeks(positional):
    m = tiny(positional)
    idx = torch.randint(0, 40, (2, 20))
    other = idx.clone()
    other[:, 12:] = (other[:, 12:] + 7) % 40
    with torch.no_grad():
        a, b = m(idx), m(other)
    assert torch.allclose(a[:, :12], b[:, :12], atol=1e-6)
    assert not torch.allclose(a[:, 12:], b[:, 12:], atol=1e-3)


@pytest.mark.parametrize("backend", ["reference", "sdpa", "tiled"])
@pytest.mark.parametrize("positional", SCHEMES)
def test_greedy_generation_with_cache_equals_recomputation(positional, backend):
    m = tiny(positional, backend=backend, n_kv_heads=2)
    idx = torch.randint(0, 40, (2, 6))
    # 30 new tokens overflow max_len=24: both paths must crop the context the same way
    cached = m.generate(idx, 30, temperature=0, use_cache=True)
    recomputed = m.generate(idx, 30, temperature=0, use_cache=False)
    assert torch.equal(cached, recomputed)
    assert cached.shape == (2, 36)


def test_seeded_sampling_is_reproducible_and_streams():
    m = tiny("rope")
    idx = torch.zeros(1, 1, dtype=torch.long)
    a = m.generate(idx, 20, temperature=1.0, top_k=5, seed=3)
    assert torch.equal(a, m.generate(idx, 20, temperature=1.0, top_k=5, seed=3))
    stream = m.generate_tokens(idx, 3, seed=3, top_k=5)
    assert [int(next(stream)[0]) for _ in range(3)] == a[0, 1:4].tolist()


def test_sampling_rules():
    g = torch.Generator().manual_seed(0)
    logits = torch.tensor([[0.0, 1.0, 3.0, 2.0]])
    assert sample_next(logits, temperature=0).item() == 2
    picks = {sample_next(logits, top_k=2, generator=g).item() for _ in range(200)}
    assert picks == {2, 3}
    probs = torch.softmax(logits, -1)[0]                             # ~ [.03, .09, .64, .24]
    picks = {sample_next(logits, top_p=0.8, generator=g).item() for _ in range(300)}
    assert picks == {2, 3} and probs[2] < 0.8 <= probs[2] + probs[3]
    assert {sample_next(logits, top_p=0.5, generator=g).item() for _ in range(50)} == {2}
    with pytest.raises(ValueError, match="top_p"):
        sample_next(logits, top_p=0.0)
    with pytest.raises(ValueError, match="temperature"):
        sample_next(logits, temperature=-1)


def test_capture_gives_per_layer_per_head_weights():
    m = tiny("alibi")
    caught: list = []
    with torch.no_grad():
        m(torch.randint(0, 40, (1, 9)), capture=caught)
    assert len(caught) == 2 and caught[0].weights.shape == (1, 4, 9, 9)
    assert torch.all(caught[1].weights.triu(1) == 0)


def test_weight_tying_and_presets():
    m = tiny()
    assert m.lm_head.weight is m.tok_emb.weight
    assert GPT(GPTConfig(vocab_size=10, tie_weights=False)).lm_head.weight is not None
    with pytest.raises(ValueError, match="unknown GPT preset 'huge'"):
        GPTConfig.preset("huge", vocab_size=10)
    with pytest.raises(ValueError, match="positional must be"):
        GPTConfig(vocab_size=10, positional="t5")


def test_bad_tokens_and_lengths():
    m = tiny()
    with pytest.raises(ValueError, match=r"token ids must be in \[0, 40\)"):
        m(torch.tensor([[3, 40]]))
    with pytest.raises(ValueError, match="exceed max_len=24"):
        m(torch.zeros(1, 25, dtype=torch.long))
    with pytest.raises(TypeError, match="int64"):
        m(torch.zeros(1, 5))


def test_long_prompt_is_cropped_with_a_warning(caplog):
    m = tiny()
    with caplog.at_level("WARNING"):
        out = m.generate(torch.randint(0, 40, (1, 30)), 2, temperature=0)
    assert "longer than the context" in caplog.text and out.shape == (1, 32)   # the whole prompt, then 2


def test_training_step_lowers_the_loss():
    torch.manual_seed(0)
    m = GPT(GPTConfig.preset("nano", vocab_size=16, max_len=16)).train()
    idx = torch.randint(0, 16, (4, 17))
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    first = m.loss(idx[:, :-1], idx[:, 1:])
    for _ in range(20):
        loss = m.loss(idx[:, :-1], idx[:, 1:])
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss < 0.7 * first


def test_generate_never_touches_the_global_rng():
    m = tiny("learned")
    idx = torch.zeros(1, 1, dtype=torch.long)
    torch.manual_seed(1234)
    state = torch.get_rng_state()
    expected = torch.rand(3)                                          # what comes next without generate
    torch.set_rng_state(state)
    unseeded = m.generate(idx, 15, top_k=10)                          # no seed: a private copy of the state
    m.generate(idx, 15, top_k=10, seed=7)
    assert torch.equal(torch.get_rng_state(), state)                  # neither advanced nor reseeded
    assert torch.equal(torch.rand(3), expected)
    torch.set_rng_state(state)
    assert torch.equal(m.generate(idx, 15, top_k=10), unseeded)       # reproducible under torch.manual_seed


def test_generate_checks_arguments_before_the_first_token():
    m = tiny()
    idx = torch.zeros(1, 1, dtype=torch.long)
    for kwargs, match in [(dict(temperature=-1.0), "temperature"), (dict(top_k=0), "top_k"),
                          (dict(top_p=0.0), "top_p"), (dict(temperature=float("nan")), "temperature")]:
        with pytest.raises(ValueError, match=match):
            m.generate_tokens(idx, 5, **kwargs)                         # raised on the call, not on next()
    with pytest.raises(ValueError, match="max_new_tokens"):
        m.generate_tokens(idx, -5)


def test_full_context_warns_once(caplog):
    m = tiny()                                                        # max_len 24
    with caplog.at_level("WARNING", logger="attnlab"):
        m.generate(torch.zeros(1, 4, dtype=torch.long), 60, temperature=0)
    assert sum("context (24 tokens) is full" in r.getMessage() for r in caplog.records) == 1
