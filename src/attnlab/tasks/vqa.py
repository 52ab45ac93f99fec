"""``attnlab train vqa``: answer questions about two-digit scenes, held-out combinations (``Task``).

Training questions (``attnlab.data.vqa``) are about scenes of 300 of the 400 (a, b, layout)
combinations with train-split digit images; validation and test questions about the other 100,
with the validation / test digit images. The model (``models.vqa``) is the captioner's ViT and
cross-attending decoder; ``--blind`` trains the same network with every image replaced by zeros,
the text-only baseline. ``evaluate`` scores a fixed set of test questions:

- ``answer_accuracy``: the share answered exactly (every answer word and the EOS; teacher-forced
  argmax, which is right exactly when the greedy answer is);
- ``accuracy_relation`` / ``_exists`` / ``_where``: the same per kind of question;
- ``chance``: the accuracy of a uniform guess among each question's kind of answers, on the same questions.

Example::

    task = VQATask(default_vqa_config())
    trainer = Trainer(task, TrainConfig(**SPEC.train_defaults, out_dir="runs/vqa"))
    trainer.train()
    task.evaluate(trainer.model)            # {"answer_accuracy": ..., "chance": 0.28, ...}
"""
from __future__ import annotations

import argparse
from dataclasses import asdict
from typing import Optional

import torch
from torch import Tensor, nn

from ..data.digits import load_digits_data
from ..data.scenes import Scenes
from ..data.vqa import CHANCE, IGNORE, KINDS, MAX_LEN, QMARK, VOCAB, QuestionBatch, SceneQuestions, decode
from ..models.vqa import VQAConfig, VQAModel
from ..train.task import DrawSampler, TaskSpec
from ..train.sizes import SizeEstimate
from .captioner import default_config, scene_text_size_estimate, validate_scene_options

__all__ = ["VQATask", "SPEC", "answer_scores", "default_vqa_config"]

EVAL_QUESTIONS = 1500       # test questions per evaluate(): ~15 per held-out combination, ~500 per kind
EVAL_SEED = 4321


@torch.no_grad()
def answer_scores(model: nn.Module, batch: QuestionBatch, batch_size: int = 250) -> dict:
    """{"answer_accuracy", "accuracy_<kind>"..., "chance"} of a model on questions (module docstring)."""
    was_training = model.training
    model.eval()
    right = []
    try:
        for i in range(0, len(batch.images), batch_size):
            images, tgt_in, tgt_out = (t[i:i + batch_size] for t in (batch.images, batch.tgt_in, batch.tgt_out))
            pred = model(images, tgt_in).argmax(-1)                            # (b, L) teacher-forced
            scored = tgt_out != IGNORE                                         # the answer and its EOS
            right.append(((pred == tgt_out) | ~scored).all(dim=1))             # (b,)
    finally:
        model.train(was_training)
    ok = torch.cat(right).float()                                              # (N,)
    out = {"answer_accuracy": ok.mean().item()}
    for k, kind in enumerate(KINDS):
        mine = batch.kinds == k
        out[f"accuracy_{kind}"] = ok[mine].mean().item() if mine.any() else float("nan")
    out["chance"] = sum(CHANCE[KINDS[k]] for k in batch.kinds.tolist()) / len(batch.kinds)
    return out


def default_vqa_config(*, blind: bool = False, **sizes) -> VQAConfig:
    """The captioner's default sizes (``tasks.captioner.default_config``) with the VQA vocabulary and length."""
    base = default_config(**sizes)
    return VQAConfig(**{**asdict(base), "vit": base.vit, "vocab_size": len(VOCAB), "max_len": MAX_LEN,
                        "blind": blind})


class VQATask:
    """Scene question answering; see the module docstring."""
    name = "vqa"
    unit = "ex"
    loss_label = "cross-entropy (nats / answer token)"

    def __init__(self, cfg: VQAConfig, *, data_seed: int = 0, scene_seed: int = 0):
        if cfg.vocab_size != len(VOCAB) or cfg.max_len < MAX_LEN:
            raise ValueError(f"scene questions need vocab_size={len(VOCAB)} and max_len >= {MAX_LEN}; got "
                             f"{cfg.vocab_size}, {cfg.max_len}")
        if cfg.vit.image_size != (16, 16) or cfg.vit.channels != 1:
            raise ValueError(f"scenes are 1 x 16 x 16 images; the model's ViT has channels={cfg.vit.channels}, "
                             f"image_size={cfg.vit.image_size}: build its ViTConfig(image_size=16, channels=1)")
        self.cfg = cfg
        self.data = load_digits_data(data_seed)
        self.questions = SceneQuestions(Scenes(self.data, seed=scene_seed))

    def _norm(self, b: QuestionBatch) -> QuestionBatch:
        b.images = self.data.normalize(b.images)
        return b

    def title(self) -> str:
        return f"{'text-only (image zeroed) ' if self.cfg.blind else ''}VQA on digit scenes"

    def model_config(self) -> dict:
        return self.cfg.to_dict()

    def build_model(self) -> VQAModel:
        return VQAModel(self.cfg)

    def info(self) -> dict:
        return self.questions.info()

    def tokenizer_json(self) -> Optional[str]:
        return None

    def sampler(self, batch_size: int, seed: int) -> DrawSampler:
        def draw(g: torch.Generator, b: int):
            q = self._norm(self.questions.sample(g, b, "train"))
            return q.images, q.tgt_in, q.tgt_out                   # (b, 1, 16, 16), (b, 9), (b, 9)

        return DrawSampler(draw, batch_size, seed)

    def eval_batches(self, batch_size: int, n: int, seed: int) -> list:
        """n batches of validation questions (held-out combinations, validation digit images)."""
        g = torch.Generator().manual_seed(seed)
        return [(q.images, q.tgt_in, q.tgt_out) for q in
                (self._norm(self.questions.sample(g, batch_size, "val")) for _ in range(n))]

    def units_per_batch(self, batch_size: int) -> int:
        return batch_size

    def size_estimate(self, batch_size: int) -> SizeEstimate:
        return scene_text_size_estimate(self.cfg, batch_size)

    def val_metrics(self, val_loss: float) -> dict:
        return {}

    def test_questions(self, n: int = EVAL_QUESTIONS, *, normalize: bool = True) -> QuestionBatch:
        """The fixed test questions evaluate() scores (``normalize=False``: pixels in [0, 1])."""
        q = self.questions.sample(torch.Generator().manual_seed(EVAL_SEED), n, "test")
        return self._norm(q) if normalize else q

    def test_example(self, index: int) -> tuple[Tensor, Tensor, Tensor, str]:
        """Test question ``index``: (image (1, 16, 16) in [0, 1], model input (1, 1, 16, 16),
        question ids (1, Lq) = BOS ... "?", the true answer)."""
        if not 0 <= index < EVAL_QUESTIONS:
            raise ValueError(f"test question index {index} is out of range: evaluate() uses {EVAL_QUESTIONS} "
                             f"(0..{EVAL_QUESTIONS - 1})")
        q = self.test_questions(normalize=False)
        ids = q.tgt_in[index].tolist()
        question = torch.tensor([ids[: ids.index(QMARK) + 1]])
        image = q.images[index]
        return image, self.data.normalize(image[None]), question, decode(q.tgt_out[index])

    def evaluate(self, model: nn.Module) -> dict:
        return answer_scores(model, self.test_questions())


def _add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--blind", action="store_true",
                   help="the text-only baseline: the same model with every image replaced by zeros")
    p.add_argument("--patch", type=int, default=4, help="ViT patch size on the 16x16 canvas")
    p.add_argument("--vit-layers", type=int, default=3)
    p.add_argument("--layers", type=int, default=2, help="decoder layers")
    p.add_argument("--d-model", type=int, default=64, help="width of the ViT and of the decoder")
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--data-seed", type=int, default=0, help="seed of the digits' train/val/test split")
    p.add_argument("--scene-seed", type=int, default=0, help="seed of the held-out combinations")


def _from_args(args: argparse.Namespace) -> VQATask:
    cfg = default_vqa_config(blind=args.blind, patch=args.patch, vit_layers=args.vit_layers, layers=args.layers,
                             d_model=args.d_model, heads=args.heads)
    return VQATask(cfg, data_seed=args.data_seed, scene_seed=args.scene_seed)


def _from_checkpoint(ckpt) -> VQATask:
    info = ckpt.extra.get("data", {})
    digits = info.get("digits", {})
    task = VQATask(VQAConfig(**ckpt.model_config), data_seed=digits.get("seed", 0), scene_seed=info.get("seed", 0))
    task.data.check_info(digits)
    return task


SPEC = TaskSpec(name="vqa", help="ViT + cross-attending decoder answering questions about two-digit scenes "
                                 "(--blind: the text-only baseline, image zeroed)",
                add_arguments=_add_arguments, from_args=_from_args, from_checkpoint=_from_checkpoint,
                run_name=lambda args: "vqa-blind" if args.blind else "vqa", validate=validate_scene_options,
                # a time budget, the schedule sized to the measured step time: on the loaded shared CPU
                # ~1,000 steps fit and the answers still improved (docs/results.md); an idle one fits more
                train_defaults=dict(steps=None, batch_size=64, lr=2e-3, min_lr=1e-5, warmup_steps=100,
                                    weight_decay=0.05, eval_interval=250, eval_iters=4,
                                    checkpoint_interval=1000, time_limit_min=8.0))
