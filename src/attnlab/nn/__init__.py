"""Attention modules: (B, L, C) in, (B, L, C) out.

Each module here is a thin layer over ``attnlab.functional.attention``: projections, head
splitting with einops, positional schemes from ``attnlab.positional``, caches, and the
``Intermediates`` a visualizer asks for. The kernels stay in ``functional``.
"""
# One import line per module (helpers add theirs below).
