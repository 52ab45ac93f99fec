"""The models the theory names, one readable file each, built from ``attnlab.nn``."""
from .gpt import GPT, PRESETS, GPTConfig
from .sampling import sample_next

__all__ = ["GPT", "GPTConfig", "PRESETS", "sample_next"]
from .encoder import ENCODER_PRESETS, Encoder, EncoderConfig
__all__ += ["Encoder", "EncoderConfig", "ENCODER_PRESETS"]
from .seq2seq import SEQ2SEQ_PRESETS, Seq2Seq, Seq2SeqConfig  # noqa: E402
__all__ += ["Seq2Seq", "Seq2SeqConfig", "SEQ2SEQ_PRESETS"]
from .vit import VIT_PRESETS, ViT, ViTConfig, attention_rollout, patchify, unpatchify  # noqa: E402
from .captioner import Captioner, CaptionerConfig  # noqa: E402
from .evoformer import Evoformer, EvoformerConfig  # noqa: E402
__all__ += ["ViT", "ViTConfig", "VIT_PRESETS", "attention_rollout", "patchify", "unpatchify", "Captioner",
            "CaptionerConfig", "Evoformer", "EvoformerConfig"]
from .msa import MSAConfig, MSATransformer  # noqa: E402
__all__ += ["MSATransformer", "MSAConfig"]
