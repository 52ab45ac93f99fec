"""Backends, one file each; importing this package registers them all."""
from . import reference, sdpa, sparse, tiled, native, linear, favor, triton_attn  # noqa: F401
