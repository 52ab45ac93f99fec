"""Attention modules: (B, L, C) in, (B, L, C) out.

Each module here is a thin layer over ``attnlab.functional.attention``: projections, head
splitting, positional schemes from ``attnlab.positional``, caches, and the
``Intermediates`` a visualizer asks for. The kernels stay in ``functional``.
"""
# One import line per module (helpers add theirs below).
from .torch_mha import MultiheadAttention
from .attention import AttentionConfig, Intermediates, MultiHeadAttention  # noqa: E402
from .kv_cache import KVCache  # noqa: E402
from .blocks import MLP, BlockConfig, Decoder, Encoder, TransformerBlock  # noqa: E402
from .axial import AxialAttention, AxialAttentionConfig, AxialIntermediates  # noqa: E402
from .rnn import RNNS, ElmanRNN, GRUBaseline, LSTMBaseline, RNNConfig, make_rnn  # noqa: E402
