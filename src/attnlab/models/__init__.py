"""The models the theory names, one readable file each, built from ``attnlab.nn``."""
from .gpt import GPT, PRESETS, GPTConfig
from .sampling import sample_next

__all__ = ["GPT", "GPTConfig", "PRESETS", "sample_next"]
from .encoder import ENCODER_PRESETS, Encoder, EncoderConfig  # noqa: E402
__all__ += ["Encoder", "EncoderConfig", "ENCODER_PRESETS"]
