"""Data for language models: built-in corpora (no download), tokenizers, train/validation split, batches.

Example::

    corpus = load_corpus("docs")
    tok = CharTokenizer.train(corpus.text)
    train_ids, val_ids = split_tokens(torch.tensor(tok.encode(corpus.text)), val_fraction=0.1)
    x, y = BatchSampler(train_ids, seq_len=256, batch_size=32, seed=0).next()   # (32, 256) each
"""
from .batches import BatchSampler, split_tokens
from .prepare import LMData, prepare_lm_data
from .corpora import BUILTIN_CORPORA, Corpus, load_corpus, read_text_file
from .tokenization import BPETokenizer, CharTokenizer, Tokenizer, tokenizer_from_json, train_tokenizer

__all__ = ["BUILTIN_CORPORA", "Corpus", "load_corpus", "read_text_file", "Tokenizer", "CharTokenizer",
           "BPETokenizer", "tokenizer_from_json", "train_tokenizer", "split_tokens", "BatchSampler", "LMData",
           "prepare_lm_data"]
