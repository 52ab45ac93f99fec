"""attnlab.data: built-in corpora, path corpora and their errors, tokenizers, split, batch sampler."""
from __future__ import annotations

import pytest
import torch

from attnlab.data import (BatchSampler, BPETokenizer, CharTokenizer, load_corpus, prepare_lm_data, split_tokens,
                          tokenizer_from_json, train_tokenizer)
from attnlab.data.corpora import STDLIB_MAX_BYTES, _stdlib_files
from attnlab.data.tokenization import IncrementalDecoder

TEXT = "The quick brown fox jumps over the lazy dog.\nPack my box with five dozen liquor jugs!\n" * 20


def test_builtin_corpora_are_deterministic_and_non_empty():
    docs = load_corpus("docs")
    assert docs.text == load_corpus("docs").text and len(docs.text) > 100_000
    assert docs.info["topics"] > 10 and "with" in docs.text
    code = load_corpus("stdlib")
    assert code.text == load_corpus("stdlib").text and "def " in code.text
    files, root = _stdlib_files(STDLIB_MAX_BYTES)
    rel = [p.relative_to(root).as_posix() for p in files]
    assert rel == sorted(rel) and len(rel) == code.info["files"] > 50
    assert not any(part in ("test", "tests", "site-packages") for r in rel for part in r.split("/")[:-1])
    assert sum(p.stat().st_size for p in files) <= STDLIB_MAX_BYTES


def test_path_corpus_file_and_directory(tmp_path):
    (tmp_path / "b.txt").write_text("second")
    (tmp_path / "a.txt").write_text("first")
    (tmp_path / ".hidden").write_text("never")
    assert load_corpus(str(tmp_path)).text == "first\n\nsecond"
    assert load_corpus(str(tmp_path / "b.txt")).text == "second"


def test_path_corpus_errors_name_the_problem(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        load_corpus(str(tmp_path / "missing.txt"))
    (tmp_path / "blank.txt").write_text("  \n")
    with pytest.raises(ValueError, match="empty"):
        load_corpus(str(tmp_path / "blank.txt"))
    bad = tmp_path / "latin1.txt"
    bad.write_bytes("caf".encode() + b"\xe9 au lait")
    with pytest.raises(ValueError, match=r"latin1\.txt is not UTF-8 text: byte 3 \(0xe9\)"):
        load_corpus(str(bad))
    (tmp_path / "empty_dir").mkdir()
    with pytest.raises(ValueError, match="no \\(non-hidden\\) files"):
        load_corpus(str(tmp_path / "empty_dir"))


def test_char_tokenizer_round_trip_vocab_and_errors():
    tok = CharTokenizer.train(TEXT)
    assert tok.chars == sorted(set(TEXT))
    ids = tok.encode("lazy fox")
    assert tok.decode(ids) == "lazy fox" and max(ids) < tok.vocab_size
    same = tokenizer_from_json(tok.to_json())
    assert isinstance(same, CharTokenizer) and same.encode(TEXT) == tok.encode(TEXT)
    with pytest.raises(ValueError, match=r"does not know 'Z', 'é'.*--tokenizer bpe"):
        tok.encode("Zé fox")
    with pytest.raises(ValueError, match="empty"):
        CharTokenizer.train("")


def test_bpe_tokenizer_round_trips_any_text_and_trains_deterministically():
    tok = train_tokenizer("bpe", TEXT, vocab_size=300)
    assert isinstance(tok, BPETokenizer) and 256 < tok.vocab_size <= 300
    for s in [TEXT, "unseen: 日本語 ✓ é\t\r\n  end", ""]:
        assert tok.decode(tok.encode(s)) == s
    assert len(tok.encode(TEXT)) < len(TEXT) / 2                         # merges compress the training text
    assert train_tokenizer("bpe", TEXT, vocab_size=300).to_json() == tok.to_json()
    again = tokenizer_from_json(tok.to_json())
    assert again.encode(TEXT) == tok.encode(TEXT)
    with pytest.raises(ValueError, match="vocab_size >= 256"):
        BPETokenizer.train(TEXT, vocab_size=100)
    with pytest.raises(ValueError, match="unknown tokenizer 'word'"):
        train_tokenizer("word", TEXT)
    with pytest.raises(ValueError, match="not a saved attnlab tokenizer"):
        tokenizer_from_json("{not json")


@pytest.mark.parametrize("kind", ["char", "bpe"])
def test_incremental_decoder_streams_whole_characters(kind):
    text = "naïve café — 日本 " * 3
    tok = train_tokenizer(kind, text + TEXT, vocab_size=280)
    ids = tok.encode(text)
    dec = IncrementalDecoder(tok)
    pieces = [dec.push(i) for i in ids] + [dec.flush()]
    assert "".join(pieces) == text and not any("\ufffd" in p for p in pieces)
    if kind == "char":
        assert len([p for p in pieces if p]) == len(ids)                 # one piece per token


def test_split_is_deterministic_and_contiguous():
    ids = torch.arange(1000)
    train, val = split_tokens(ids, 0.1)
    assert len(val) == 100 and torch.equal(torch.cat([train, val]), ids)
    t2, v2 = split_tokens(ids, 0.1)
    assert torch.equal(train, t2) and torch.equal(val, v2)
    with pytest.raises(ValueError, match="val_fraction"):
        split_tokens(ids, 1.0)


def test_batch_sampler_windows_seed_and_state():
    ids = torch.arange(500) * 3                                         # distinct values: windows identifiable
    a = BatchSampler(ids, seq_len=17, batch_size=5, seed=4)
    x, y = a.next()
    assert x.shape == y.shape == (5, 17) and x.dtype == y.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1]) and torch.equal(y[:, -1], x[:, -1] + 3)
    b = BatchSampler(ids, seq_len=17, batch_size=5, seed=4)
    assert torch.equal(b.next()[0], x)
    state = a.state()
    nxt = a.next()[0]
    a.set_state(state)
    assert torch.equal(a.next()[0], nxt) and not torch.equal(nxt, x)
    with pytest.raises(ValueError, match="cannot fill one window"):
        BatchSampler(ids[:10], seq_len=17, batch_size=2)


def test_prepare_lm_data_records_the_corpus_and_checks_it(tmp_path):
    f = tmp_path / "t.txt"
    f.write_text(TEXT)
    data = prepare_lm_data(str(f), "char", val_fraction=0.2)
    assert len(data.train_ids) + len(data.val_ids) == len(TEXT) == data.info["tokens"]
    assert data.val_chars_per_token == 1.0
    bpe = prepare_lm_data(str(f), "bpe", vocab_size=300)
    assert bpe.val_chars_per_token > 1.0
    with pytest.raises(ValueError, match="not the text this run was trained on"):
        prepare_lm_data(str(f), data.tokenizer, expect_sha256="0" * 64)
