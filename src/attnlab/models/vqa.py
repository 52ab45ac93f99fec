"""Visual question answering: the captioner's ViT + cross-attending decoder, fed a question and asked to go on.

The model is ``Captioner`` (``models.captioner``) unchanged: a ViT turns the image into patch
features, a causal text decoder reads BOS + question and predicts the answer words, its
cross-attention (queries: text tokens, keys/values: the patches) the only way the image reaches
the text (``data.vqa`` for the sequences). What this module adds:

- ``VQAConfig(blind=True)``: the text-only baseline, the *same* network whose image is replaced
  by zeros before the ViT, so it answers from the question alone (and what training learns of it);
- ``answer(images, question)``: greedy answer words after a question prompt, with their
  cross-attention over the patches (what ``attnlab show`` draws).

Example::

    model = VQAModel(VQAConfig(vocab_size=len(VOCAB), max_len=9))
    loss = model.loss(images, tgt_in, tgt_out)            # images (B, 1, 16, 16); tgt_* (B, 9), -100 on the question
    ids, w = model.answer(images[:1], question)           # question (1, Lq) = BOS ... "?"; w (1, layers, H, T, S)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor

from .captioner import Captioner, CaptionerConfig

__all__ = ["VQAConfig", "VQAModel"]


@dataclass
class VQAConfig(CaptionerConfig):
    blind: bool = False          # the text-only baseline: images are replaced by zeros before the ViT


class VQAModel(Captioner):
    """A ``Captioner`` that answers the question it is given; ``blind`` never sees the image."""

    cfg: VQAConfig

    def forward(self, images: Tensor, tgt_in: Tensor, *, capture: Optional[list] = None) -> Tensor:
        """Next-token logits (B, L, V) of BOS + question + answer tgt_in (B, L) about images (B, C, H, W)."""
        return super().forward(self._seen(images), tgt_in, capture=capture)

    def _seen(self, images: Tensor) -> Tensor:
        return torch.zeros_like(images) if self.cfg.blind else images

    @torch.no_grad()
    def answer(self, images: Tensor, question: Tensor, *, max_new_tokens: Optional[int] = None):
        """Greedy answer (B, T) after question (B, Lq) (BOS ... "?", same length in the batch), EOS then PAD.

        Returns (ids (B, T), cross-attention (B, layers, heads, T, S)): row t is the distribution over
        patches of the position that predicted answer token t. Each step re-runs the decoder on the
        whole prefix (a handful of tokens; the KV cache is the captioner's business).
        """
        cfg = self.cfg
        T = cfg.max_len - question.shape[1] + 1 if max_new_tokens is None else max_new_tokens
        if question.shape[1] < 1 or not 1 <= T <= cfg.max_len - question.shape[1] + 1:
            raise ValueError(f"a question of {question.shape[1]} tokens leaves room for at most "
                             f"{cfg.max_len - question.shape[1] + 1} answer tokens (max_len={cfg.max_len}), "
                             f"asked for {T}")
        was_training = self.training
        self.eval()
        try:
            memory = self.vit.features(self._seen(images))                   # (B, S, d_img)
            prefix, done = question, torch.zeros(len(question), dtype=torch.bool, device=question.device)
            out, cross = [], []
            for _ in range(T):
                cap: list = []
                logits = self._decode(prefix, memory, capture=cap)            # (B, L, V)
                nxt = logits[:, -1].argmax(-1)                                # (B,)
                nxt = torch.where(done, torch.full_like(nxt, cfg.pad_id), nxt)
                out.append(nxt)
                cross.append(torch.stack([c.weights[:, :, -1:] for c in cap[1::2]], dim=1))   # (B, layers, H, 1, S)
                done |= nxt == cfg.eos_id
                if bool(done.all()) or prefix.shape[1] == cfg.max_len:
                    break
                prefix = torch.cat([prefix, nxt[:, None]], dim=1)
        finally:
            self.train(was_training)
        return torch.stack(out, dim=1), torch.cat(cross, dim=3)
