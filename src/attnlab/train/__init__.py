"""Training any task (language models, seq2seq, ViT...): config, AdamW + warmup/cosine, the trainer,
atomic safetensors checkpoints, the run directory's lock (``rundir``) and memory estimates (``sizes``).

Example::

    from attnlab.data import prepare_lm_data
    from attnlab.models import GPTConfig
    from attnlab.tasks.lm import LMTask
    data = prepare_lm_data("docs", "char")
    cfg = TrainConfig.for_preset("micro", out_dir="runs/micro")
    Trainer(LMTask(GPTConfig.preset("micro", vocab_size=data.tokenizer.vocab_size), data), cfg).train()
    model, tok = load_gpt("runs/micro")
"""
from .checkpoint import Checkpoint, CheckpointError, list_checkpoints, load_checkpoint, load_gpt, save_checkpoint
from .config import TRAIN_PRESETS, TrainConfig
from .metrics import MetricsLog, plot_loss_curve
from .rundir import NonFiniteLoss, RunFailed, RunLock, RunLocked
from .schedule import decay_groups, lr_at, make_optimizer
from .sizes import SizeError
from .task import DrawSampler, Task, TaskSpec
from .trainer import BF16_AUTO, Trainer, use_bf16

__all__ = ["TrainConfig", "TRAIN_PRESETS", "Trainer", "BF16_AUTO", "use_bf16", "make_optimizer", "lr_at",
           "decay_groups", "save_checkpoint", "load_checkpoint", "load_gpt", "list_checkpoints", "Checkpoint",
           "CheckpointError", "MetricsLog", "plot_loss_curve", "Task", "TaskSpec", "DrawSampler", "RunLock",
           "RunLocked", "RunFailed", "NonFiniteLoss", "SizeError"]
