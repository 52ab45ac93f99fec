"""``attnlab bench --lm``: the nanoGPT yardstick is the same model, and the quick run reports every field.

No timing is asserted (the machine may be busy): only that the numbers exist and make sense.
"""
import json
import math

import pytest
import torch

from attnlab.bench.lm import NANOGPT, LMBenchConfig
from attnlab.bench.lm_nanogpt import NanoGPT, copy_from_attnlab
from attnlab.cli import main
from attnlab.models.gpt import GPT, GPTConfig


@pytest.mark.parametrize("kw", [{}, {"qkv": "separate"}, {"attend": "attnlab"}])
def test_nanogpt_equivalent_is_the_same_model(kw):
    torch.manual_seed(0)
    gpt = GPT(GPTConfig.preset("nano", vocab_size=37, max_len=40, n_layers=3))
    ref = copy_from_attnlab(NanoGPT.like(gpt.cfg, **kw), gpt)
    assert ref.num_params() == gpt.num_params()
    idx = torch.randint(0, 37, (2, 23))                          # odd length, shorter than the block
    with torch.no_grad():
        diff = (ref(idx) - gpt(idx)).abs().max().item()
    assert diff <= 1e-5, f"max |logit diff| {diff:.2e}"
    loss = torch.nn.functional.cross_entropy(ref(idx).flatten(0, 1), idx.flatten())
    loss.backward()                                              # the tied matrix gets both gradients
    assert ref.wte.weight.grad is ref.lm_head.weight.grad


def test_nanogpt_like_rejects_configs_it_cannot_mirror():
    with pytest.raises(ValueError, match="positional='learned'"):
        NanoGPT.like(GPTConfig.preset("nano", vocab_size=10, positional="rope"))
    with pytest.raises(ValueError, match="qkv must be one of"):
        NanoGPT(10, 8, 1, 2, 8, qkv="packed")


def test_config_errors_name_the_values():
    with pytest.raises(ValueError, match="exceed the prompt"):
        LMBenchConfig(prompt=16, gen_to=[16, 64])
    with pytest.raises(ValueError, match="'batch': 0"):
        LMBenchConfig(batch=0)
    assert LMBenchConfig(preset="nano", seq_len=300, gen_to=[512]).gpt_config().max_len == 512


@pytest.fixture
def one_thread():
    """Two OpenMP threads on a busy 2-core machine can run 10x slower; the quick run then takes minutes."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def test_quick_cli_writes_every_field(tmp_path, capsys, one_thread):
    path = tmp_path / "lm.json"
    assert main(["bench", "--lm", "--quick", "--json", str(path)]) == 0
    rep = json.loads(path.read_text())
    c = rep["meta"]["config"]
    assert c["preset"] == "nano" and rep["meta"]["model"]["positional"] == "learned"

    t = rep["training"]
    names = [r["name"] for r in t["rows"]]
    assert names[0] == NANOGPT and "attnlab GPT (auto)" in names and "attnlab GPT (tiled)" in names
    assert t["params"] == GPT(GPTConfig(**{**rep["meta"]["model"]})).num_params()
    assert all(d <= 1e-5 for d in t["max_abs_logit_diff_vs_nanogpt"].values()), t["max_abs_logit_diff_vs_nanogpt"]
    losses = {r["name"]: r["last_loss"] for r in t["rows"]}
    for r in t["rows"]:
        assert len(r["times_s"]) == c["repeats"] and r["tokens_per_s"] > 0 and r["median_s"] > 0
        assert math.isclose(r["tokens_per_s"], c["batch"] * c["seq_len"] / r["median_s"])
        lo, hi = r["paired_iqr"]
        assert lo <= r["paired_speed_vs_nanogpt"] <= hi
        # same weights, batch and optimizer: every model has taken the same steps
        assert math.isclose(losses[r["name"]], losses[NANOGPT], abs_tol=1e-3), losses

    gen = rep["generation"]
    assert [g["total"] for g in gen] == c["gen_to"]
    for g in gen:
        assert g["new_tokens"] == g["total"] - c["prompt"]
        assert set(g["ms_per_token"]) == {"kv-cache", "recompute", "nanoGPT recompute"}
        assert g["same_tokens_cache_vs_recompute"] is True and g["same_tokens_cache_vs_nanogpt"] is True
        s = g["step_at_context"]
        assert s["cached_ms"] > 0 and s["full_ms"] > 0 and math.isclose(s["speedup"], s["full_ms"] / s["cached_ms"])
    assert [len(o["us_per_call"]) for o in rep["overheads"]] == [3, 2, 3, 2, 2]

    out = capsys.readouterr().out
    assert "target attnlab >= nanoGPT" in out and "greedy generation" in out
