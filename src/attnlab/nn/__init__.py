"""Attention modules: (B, L, C) in, (B, L, C) out.

Each module here is a thin layer over ``attnlab.functional.attention``: projections, head
splitting, positional schemes from ``attnlab.positional``, caches, and the
``Intermediates`` a visualizer asks for. The kernels stay in ``functional``.
"""
# One import line per module, and its names in __all__.
from .torch_mha import MultiheadAttention
from .attention import AttentionConfig, Intermediates, MultiHeadAttention
from .kv_cache import KVCache
from .blocks import MLP, BlockConfig, Decoder, Encoder, TransformerBlock
from .axial import AxialAttention, AxialAttentionConfig, AxialIntermediates
from .backend import set_backend
from .rnn import RNNS, ElmanRNN, GRUBaseline, LSTMBaseline, RNNConfig, make_rnn

__all__ = ["MultiheadAttention", "AttentionConfig", "Intermediates", "MultiHeadAttention", "KVCache", "MLP",
           "BlockConfig", "Decoder", "Encoder", "TransformerBlock", "AxialAttention", "AxialAttentionConfig",
           "AxialIntermediates", "set_backend", "RNNS", "ElmanRNN", "GRUBaseline", "LSTMBaseline", "RNNConfig",
           "make_rnn"]
