"""Checkpoints: safetensors + JSON, written atomically, verified on load, never unpickled.

A run's directory holds one sub-directory per checkpoint::

    OUT/step-000500/model.safetensors         weights (a tied tensor stored once, see "aliases")
    OUT/step-000500/train_state.safetensors   optimizer tensors, RNG states (torch, batch sampler)
    OUT/step-000500/checkpoint.json           configs, step, tokenizer JSON, optimizer hyper-parameters,
                                              SHA-256 and size of both tensor files, and of itself

Atomic: a checkpoint is written into ``OUT/.tmp-step-...`` (each file flushed and fsynced, then the
directory), renamed to ``step-NNNNNN`` in one ``os.rename``, and the parent directory is fsynced.
A crash at any point leaves either the complete new checkpoint or none of it; older checkpoints
are deleted (down to ``keep``) only after the new one is in place. The latest checkpoint is the
``step-*`` directory with the highest step; ``.tmp-*`` leftovers are ignored (and removed by the next
trainer that takes the run's lock: one writer per OUT, see ``rundir.RunLock``).

Loading reads bytes, checks sizes and hashes, and parses with ``safetensors.torch.load`` and
``json``: no pickle, no ``torch.load``. Any mismatch is a ``CheckpointError`` naming the file, and so
is a model config too large for this machine's memory (``sizes.model_params``, checked before any
tensor is read or any model built: every reader, from eval to resume, gets the check).
Checkpoints written before the config renames load as if written today: ``model_config`` and
``extra["data"]`` come back with their old keys renamed (``presets.LEGACY_KEYS``, e.g.
``n_layer`` -> ``n_layers``, ``block_size`` -> ``max_len``); the files on disk are not changed.

Example::

    path = save_checkpoint("runs/a", 500, model, tokenizer_json=tok.to_json(), model_config=cfg.to_dict(),
                           train_config=tcfg.to_dict(), optimizer=opt, rng={"torch": torch.get_rng_state()})
    ckpt = load_checkpoint("runs/a")           # the latest step-* in runs/a, or a step-* directory itself
    model.load_state_dict(ckpt.model_state)
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Union

import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save
from torch import Tensor, nn

from ..presets import LEGACY_DATA_KEYS, upgrade_keys
from .sizes import FLOAT, SizeError, check_fits, model_params

__all__ = ["CheckpointError", "Checkpoint", "save_checkpoint", "load_checkpoint", "load_gpt", "list_checkpoints",
           "resolve_checkpoint", "FORMAT"]

FORMAT = "attnlab-checkpoint-v1"
MODEL_FILE, STATE_FILE, META_FILE = "model.safetensors", "train_state.safetensors", "checkpoint.json"
_STEP_DIR = re.compile(r"^step-(\d+)$")
PathLike = Union[str, Path]


class CheckpointError(ValueError):
    """A checkpoint that cannot be used: missing, truncated, corrupted, or not an attnlab checkpoint."""


@dataclass
class Checkpoint:
    path: Path
    step: int
    model_config: dict
    train_config: dict
    tokenizer_json: str
    model_state: dict                           # name -> tensor, aliases filled in (ready for load_state_dict)
    optimizer_state: Optional[dict] = None      # torch optimizer state_dict, or None
    rng: dict = field(default_factory=dict)     # name -> uint8 tensor (torch.get_rng_state() format)
    extra: dict = field(default_factory=dict)   # JSON-ready run information (data, calibration, ...)


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _write_file(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _dedupe(state: dict[str, Tensor]) -> tuple[dict[str, Tensor], dict[str, str]]:
    """Tensors stored once: safetensors refuses two names for one memory (tied weights)."""
    first: dict[tuple, str] = {}
    unique, aliases = {}, {}
    for name, t in state.items():
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride(), t.dtype)
        if key in first:
            aliases[name] = first[key]
        else:
            first[key] = name
            unique[name] = t.detach().contiguous()
    return unique, aliases


def _split_optimizer(sd: dict) -> tuple[dict[str, Tensor], dict]:
    tensors, state_json = {}, {}
    for idx, entry in sd["state"].items():
        state_json[str(idx)] = {}
        for k, v in entry.items():
            if isinstance(v, Tensor):
                tensors[f"optimizer.{idx}.{k}"] = v.detach().contiguous()
            else:
                state_json[str(idx)][k] = v
    return tensors, {"state": state_json, "param_groups": sd["param_groups"]}


def _join_optimizer(meta: dict, tensors: dict[str, Tensor]) -> dict:
    state = {int(idx): dict(entry) for idx, entry in meta["state"].items()}
    for name, t in tensors.items():
        if name.startswith("optimizer."):
            _, idx, k = name.split(".", 2)
            state.setdefault(int(idx), {})[k] = t
    groups = [{**g, **({"betas": tuple(g["betas"])} if "betas" in g else {})} for g in meta["param_groups"]]
    return {"state": state, "param_groups": groups}


def save_checkpoint(out_dir: PathLike, step: int, model: nn.Module, *, tokenizer_json: str, model_config: dict,
                    train_config: dict, optimizer: Optional[torch.optim.Optimizer] = None,
                    rng: Optional[dict[str, Tensor]] = None, extra: Optional[dict] = None, keep: int = 2) -> Path:
    """Write ``out_dir/step-{step:06d}`` atomically and keep the ``keep`` most recent checkpoints."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    weights, aliases = _dedupe(model.state_dict())
    state_tensors, opt_meta = _split_optimizer(optimizer.state_dict()) if optimizer is not None else ({}, None)
    state_tensors.update({f"rng.{k}": v.contiguous() for k, v in (rng or {}).items()})
    blobs = {MODEL_FILE: st_save(weights), STATE_FILE: st_save(state_tensors)}
    meta = {"format": FORMAT, "step": step, "model_config": model_config, "train_config": train_config,
            "tokenizer": tokenizer_json, "aliases": aliases, "optimizer": opt_meta, "extra": extra or {},
            "files": {name: {"sha256": _sha256(b), "bytes": len(b)} for name, b in blobs.items()}}
    meta["meta_sha256"] = _sha256(json.dumps(meta, sort_keys=True).encode())
    blobs[META_FILE] = json.dumps(meta, indent=1, sort_keys=True).encode()

    final = out / f"step-{step:06d}"
    tmp = out / f".tmp-{final.name}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        for name, data in blobs.items():
            _write_file(tmp / name, data)
        _fsync_dir(tmp)
        old = None
        if final.exists():                     # the same step saved again: swap, never leave a gap of nothing
            old = out / f".old-{final.name}-{uuid.uuid4().hex[:8]}"
            os.rename(final, old)
        os.rename(tmp, final)
        _fsync_dir(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    for stale in list_checkpoints(out)[:-keep]:
        shutil.rmtree(stale, ignore_errors=True)
    return final


def list_checkpoints(out_dir: PathLike) -> list[Path]:
    """The complete checkpoints in out_dir, oldest first."""
    out = Path(out_dir)
    if not out.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in out.iterdir() if (m := _STEP_DIR.match(p.name)) and p.is_dir()]
    return [p for _, p in sorted(found)]


def resolve_checkpoint(path: PathLike) -> Path:
    """A checkpoint directory: path itself if it holds checkpoint.json, else its latest step-* directory."""
    p = Path(path)
    if (p / META_FILE).is_file():
        return p
    found = list_checkpoints(p)
    if found:
        return found[-1]
    if not p.exists():
        raise CheckpointError(f"no checkpoint at {str(p)!r}: the path does not exist")
    raise CheckpointError(f"no checkpoint in {str(p)!r}: expected {META_FILE} or step-NNNNNN/ directories "
                          "(written by `attnlab train`)")


def _fail(path: Path, problem: str, ckpt_dir: Path) -> CheckpointError:
    others = [c for c in list_checkpoints(ckpt_dir.parent) if c != ckpt_dir]
    hint = f"; an earlier checkpoint is {others[-1]}" if others else ""
    return CheckpointError(f"checkpoint file {path} is {problem}{hint}")


def _read_meta(ckpt: Path) -> dict:
    path = ckpt / META_FILE
    try:
        meta = json.loads(path.read_bytes())
    except FileNotFoundError:
        raise _fail(path, "missing", ckpt) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise _fail(path, f"not valid JSON (truncated or corrupted: {e})", ckpt) from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise _fail(path, f"not an {FORMAT} file", ckpt)
    recorded = meta.pop("meta_sha256", None)
    if recorded != _sha256(json.dumps(meta, sort_keys=True).encode()):
        raise _fail(path, "corrupted (its contents do not match the SHA-256 recorded in it)", ckpt)
    return meta


def _read_tensors(ckpt: Path, name: str, meta: dict) -> dict[str, Tensor]:
    path = ckpt / name
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise _fail(path, "missing", ckpt) from None
    want = meta["files"][name]
    if len(data) != want["bytes"]:
        raise _fail(path, f"truncated or padded: {len(data)} bytes, {want['bytes']} recorded", ckpt)
    if _sha256(data) != want["sha256"]:
        raise _fail(path, "corrupted: its SHA-256 does not match the one recorded in checkpoint.json", ckpt)
    try:
        return st_load(data)
    except Exception as e:        # safetensors' SafetensorError (not exported), or a header the JSON parser rejects
        raise _fail(path, f"not a valid safetensors file ({e}), though its SHA-256 matches: it was written "
                          "that way", ckpt) from None


def _check_size(ckpt: Path, meta: dict, train_state: bool) -> None:
    """CheckpointError before any tensor is read when the model the config describes cannot fit in memory
    (a hand-edited checkpoint.json: building it would allocate for a minute before failing)."""
    params = model_params(meta["model_config"])
    if not params:                                        # a config of no known kind: the model's own checks speak
        return
    need = FLOAT * params * (4 if train_state else 2)     # the file's tensors and the model's; + AdamW's moments
    shape = ", ".join(f"{k}={v}" for k, v in meta["model_config"].items() if isinstance(v, int) and v > 1)
    try:
        check_fits(need, what=f"the model of {ckpt / META_FILE}",
                   detail=f"{params / 1e6:,.1f}M parameters from {shape}",
                   fix="the checkpoint cannot be loaded here (was its checkpoint.json edited, or written on a "
                       "machine with far more memory?)")
    except SizeError as e:
        raise CheckpointError(str(e)) from None


def load_checkpoint(path: PathLike, *, train_state: bool = True) -> Checkpoint:
    """Read and verify a checkpoint (a step-* directory, or a run directory: its latest checkpoint).

    ``train_state=False`` reads only the weights and configs (enough to use the model, not to resume):
    train_state.safetensors may then be missing; the Checkpoint has no optimizer state and no RNG states.
    """
    ckpt = resolve_checkpoint(path)
    meta = _read_meta(ckpt)
    meta["model_config"] = upgrade_keys(meta["model_config"])              # older checkpoints' names
    _check_size(ckpt, meta, train_state)
    if isinstance(meta["extra"].get("data"), dict):
        meta["extra"]["data"] = upgrade_keys(meta["extra"]["data"], LEGACY_DATA_KEYS)
    weights = _read_tensors(ckpt, MODEL_FILE, meta)
    for alias, target in meta["aliases"].items():
        weights[alias] = weights[target]
    if not train_state:
        return Checkpoint(ckpt, meta["step"], meta["model_config"], meta["train_config"], meta["tokenizer"],
                          weights, None, {}, meta["extra"])
    state = _read_tensors(ckpt, STATE_FILE, meta)
    optimizer = _join_optimizer(meta["optimizer"], state) if meta["optimizer"] is not None else None
    rng = {k[len("rng."):]: v for k, v in state.items() if k.startswith("rng.")}
    return Checkpoint(ckpt, meta["step"], meta["model_config"], meta["train_config"], meta["tokenizer"],
                      weights, optimizer, rng, meta["extra"])


def load_gpt(path: PathLike, *, device: Union[str, torch.device] = "cpu"):
    """(GPT in eval mode, tokenizer) from a checkpoint written by the trainer, for generation.

    Example::

        model, tok = load_gpt("runs/gpt")
        ids = torch.tensor([tok.encode("The with statement")])
        text = tok.decode(model.generate(ids, 100, top_k=20, seed=0)[0].tolist())
    """
    from ..data.tokenization import tokenizer_from_json
    from ..models import GPT, GPTConfig
    ckpt = load_checkpoint(path, train_state=False)          # weights only: generation needs nothing else
    model = GPT(GPTConfig.from_dict(ckpt.model_config))
    model.load_state_dict(ckpt.model_state)
    return model.to(device).eval(), tokenizer_from_json(ckpt.tokenizer_json)
