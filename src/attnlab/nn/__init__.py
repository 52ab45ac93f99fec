"""Attention modules: (B, L, C) in, (B, L, C) out.

Each module here is a thin layer over ``attnlab.functional.attention``: projections, head
splitting, positional schemes from ``attnlab.positional``, caches, and the
``Intermediates`` a visualizer asks for. The kernels stay in ``functional``.
"""
# One import line per module, and its names in __all__.
from .torch_mha import MultiheadAttention
from .attention import AttentionConfig, Intermediates, AttentionLayer
from .kv_cache import KVCache
from .blocks import MLP, BlockConfig, DecoderStack, EncoderStack, TransformerBlock
from .axial import AxialAttention, AxialAttentionConfig, AxialIntermediates
from .backend import set_backend
from ..deprecation import renamed
from .rnn import RNNS, ElmanRNN, GRUBaseline, LSTMBaseline, RNNConfig, make_rnn

__all__ = ["MultiheadAttention", "AttentionConfig", "Intermediates", "AttentionLayer", "KVCache", "MLP",
           "BlockConfig", "DecoderStack", "EncoderStack", "TransformerBlock", "AxialAttention", "AxialAttentionConfig",
           "AxialIntermediates", "set_backend", "RNNS", "ElmanRNN", "GRUBaseline", "LSTMBaseline", "RNNConfig",
           "make_rnn"]

# Renamed in issue #29 (one name per concept): the old names still work, with a DeprecationWarning.
__getattr__ = renamed(globals(), {"MultiHeadAttention": "AttentionLayer", "Encoder": "EncoderStack",
                                  "Decoder": "DecoderStack"}, __name__)
