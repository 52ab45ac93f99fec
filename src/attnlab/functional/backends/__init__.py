"""Backends, one file each; importing this package registers them all."""
from . import reference, sdpa, tiled  # noqa: F401
