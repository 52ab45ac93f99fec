"""Backends, one file each; importing this package registers them all."""
from . import reference, sdpa, sparse, tiled, linear, favor, triton_attn  # noqa: F401
