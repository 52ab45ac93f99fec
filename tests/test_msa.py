"""The MSA Transformer (models/msa.py) and its task (tasks/msa.py, ``attnlab train msa``, ``attnlab show``):
tied row attention against a loop over rows, row-permutation equivariance, the mean-pooling ablation's
size, BERT masking, the splits the task reads, a short training run, the checkpoint and the picture."""
from __future__ import annotations

import argparse
import json
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from attnlab.data.potts import PottsConfig
from attnlab.models.msa import IGNORE, MSAConfig, MSATransformer, RowMeanPool, TiedRowAttention, param_count
from attnlab.tasks import load_model
from attnlab.tasks import msa as msa_task
from attnlab.tasks.msa import SPEC, MSATask, mask_msa
from attnlab.train import TrainConfig, Trainer

TINY_DATA = PottsConfig(length=16, depth=32, burn_in=20, thin=2, chains=32)
TINY = MSAConfig(symbols=8, max_len=16, dim=32, n_layers=2, n_heads=2, head_dim=8)


@pytest.fixture
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def tiny_task(row: str = "attention") -> MSATask:
    return MSATask(TINY_DATA, MSAConfig(**{**TINY.to_dict(), "row": row}), rows=16, families=6, eval_families=2)


# -- the model -----------------------------------------------------------------------------------------
def test_tied_attention_equals_a_loop_over_rows():
    torch.manual_seed(0)
    attn = TiedRowAttention(dim=12, n_heads=3, head_dim=5).double()
    x = torch.randn(2, 7, 9, 12, dtype=torch.float64)                    # (B, R, C, d)
    out, maps = attn(x)
    B, R, C, _ = x.shape
    split = lambda f: f(x).reshape(B, R, C, 3, 5)                        # (B, R, C, H, hd)
    q, k, v = split(attn.to_q), split(attn.to_k), split(attn.to_v)
    logits = torch.zeros(B, 3, C, C, dtype=torch.float64)
    for r in range(R):                                                   # one sum of every row's logits
        logits += torch.einsum("bihd,bjhd->bhij", q[:, r], k[:, r])
    want_maps = (logits / math.sqrt(R * 5)).softmax(-1)                  # (B, H, C, C)
    rows = [attn.to_out(torch.einsum("bhij,bjhd->bihd", want_maps, v[:, r]).reshape(B, C, 15)) for r in range(R)]
    want = torch.stack(rows, dim=1)                                      # (B, R, C, d): each row with the same map
    assert maps.shape == (B, 3, C, C)
    assert (maps - want_maps).abs().max() < 1e-12, (maps - want_maps).abs().max()
    assert (out - want).abs().max() < 1e-12, (out - want).abs().max()


def test_the_tied_map_couples_the_rows_and_the_ablation_does_not():
    torch.manual_seed(0)
    x = torch.randn(1, 5, 8, 16)
    y = x.clone()
    y[:, 0] = torch.randn(8, 16)                                         # change only row 0
    tied, pool = TiedRowAttention(16, 2, 8), RowMeanPool(16, 16)
    # row 1 reads its values through the map, and the map is every row's: row 0 moves it
    assert (tied(x)[0][:, 1:] - tied(y)[0][:, 1:]).abs().max() > 1e-3
    assert torch.equal(pool(x)[:, 1:], pool(y)[:, 1:])


def test_permuting_rows_permutes_outputs_and_keeps_the_maps():
    torch.manual_seed(0)
    model = MSATransformer(TINY).eval()
    msa = torch.randint(0, 9, (2, 6, 12))
    perm = torch.tensor([3, 0, 5, 1, 4, 2])
    cap, cap_p = [], []
    with torch.no_grad():
        out, out_p = model(msa, capture=cap), model(msa[:, perm], capture=cap_p)
    assert len(cap) == TINY.n_layers and cap[0].shape == (2, TINY.n_heads, 12, 12)
    assert (out[:, perm] - out_p).abs().max() < 1e-5, (out[:, perm] - out_p).abs().max()
    for a, b in zip(cap, cap_p):
        assert (a - b).abs().max() < 1e-5, (a - b).abs().max()
        torch.testing.assert_close(a.sum(-1), torch.ones_like(a.sum(-1)))   # each query's row sums to 1


@pytest.mark.parametrize("cfg", [MSAConfig(), TINY, MSAConfig(dim=48, n_heads=6, head_dim=12, ffn=2)],
                         ids=["default", "tiny", "wide-heads"])
def test_the_ablation_has_no_row_maps_and_the_same_size(cfg):
    full, mean = MSATransformer(cfg), MSATransformer(MSAConfig(**{**cfg.to_dict(), "row": "mean"}))
    assert param_count(full.cfg) == full.num_params() and param_count(mean.cfg) == mean.num_params()
    assert abs(mean.num_params() / full.num_params() - 1) < 0.05, (mean.num_params(), full.num_params())
    msa = torch.randint(0, cfg.symbols, (1, 4, 10))
    cap: list = []
    mean(msa, capture=cap)
    assert cap == []
    with pytest.raises(ValueError, match="no row attention"):
        mean.row_maps(msa[0])
    maps = full.row_maps(msa[0])
    assert isinstance(maps, np.ndarray) and maps.shape == (cfg.n_layers, cfg.n_heads, 10, 10)


def test_loss_scores_only_targets_and_predict_shapes():
    torch.manual_seed(0)
    model = MSATransformer(TINY)
    msa = torch.randint(0, 8, (2, 4, 10))
    targets = torch.full_like(msa, IGNORE)
    targets[0, 1, 2], targets[1, 3, 9] = 5, 0
    logits = model(msa)
    want = torch.nn.functional.cross_entropy(torch.stack([logits[0, 1, 2], logits[1, 3, 9]]), torch.tensor([5, 0]))
    torch.testing.assert_close(model.loss(msa, targets), want)
    assert model.loss(msa, torch.full_like(msa, IGNORE)).item() == 0.0
    assert model.predict(msa.numpy()).shape == (2, 4, 10, 8) and isinstance(model.predict(msa), torch.Tensor)
    with pytest.raises(ValueError, match="symbols span"):
        model(torch.full((1, 2, 3), 9))
    with pytest.raises(ValueError, match="max_len"):
        model(torch.zeros(1, 2, 17, dtype=torch.long))


# -- masking and the task's data ---------------------------------------------------------------------
def test_masking_follows_the_bert_rule():
    q = 8
    msa = torch.randint(0, q, (64, 64, 48))                                # ~200k positions
    inputs, targets = mask_msa(msa, q, torch.Generator().manual_seed(1))
    chosen = targets != IGNORE
    assert torch.equal(targets[chosen], msa[chosen]) and torch.equal(inputs[~chosen], msa[~chosen])
    assert abs(chosen.float().mean().item() - 0.15) < 0.003
    masked = (inputs[chosen] == q).float().mean().item()
    same = (inputs[chosen] == msa[chosen]).float().mean().item()
    other = ((inputs[chosen] != q) & (inputs[chosen] != msa[chosen])).float().mean().item()
    assert abs(masked - 0.8) < 0.01
    assert abs(same - (0.1 + 0.1 / q)) < 0.01                            # a random symbol can be the true one
    assert abs(other - 0.1 * (q - 1) / q) < 0.01


def test_the_task_reads_train_for_batches_and_fit_for_evaluation(monkeypatch):
    seen = []
    real = msa_task.family_set

    def recording(cfg, split, n):
        seen.append((split, n))
        return real(cfg, split, n)

    monkeypatch.setattr(msa_task, "family_set", recording)
    task = tiny_task()
    s = task.sampler(3, seed=4)
    state = s.state()
    x, y = s.next()
    assert x.shape == y.shape == (3, 16, 16) and seen == [("train", 6)]
    s.set_state(state)
    x2, y2 = s.next()
    assert torch.equal(x, x2) and torch.equal(y, y2)                      # resumable
    task.eval_batches(2, 2, seed=1)
    task.evaluate(task.build_model())
    assert {split for split, _ in seen} == {"train", "fit"} and ("fit", 2) in seen
    fams = task.msas("train")                                             # (F, M, L)
    x0 = torch.where(y[0] == IGNORE, x[0], y[0])                          # the unmasked sample
    assert any(all((fams[f] == r).all(1).any() for r in x0) for f in range(len(fams))), "rows come from a family"


class _BlockProfile(torch.nn.Module):
    """A model that predicts each residue from the frequencies of what its block shows of the column."""

    def __init__(self, q: int):
        super().__init__()
        self.q, self.unused = q, torch.nn.Parameter(torch.zeros(1))

    def forward(self, msa):
        shown = torch.nn.functional.one_hot(msa, self.q + 1)[..., :self.q].sum(1, keepdim=True) + 0.5   # (B, 1, L, q)
        return (shown / shown.sum(-1, keepdim=True)).log().expand(*msa.shape, self.q)


class _Copy(torch.nn.Module):
    """A model that bets everything on its input symbol: uniform where the input is the mask token."""

    def __init__(self, q: int):
        super().__init__()
        self.q, self.unused = q, torch.nn.Parameter(torch.zeros(1))

    def forward(self, msa):
        return 50.0 * torch.nn.functional.one_hot(msa, self.q + 1)[..., :self.q].float()


def test_the_column_baselines_are_what_they_say():
    task = tiny_task()
    # only mask-token positions are scored: a copier of the visible symbols is uniform on every one of them
    assert abs(task.evaluate(_Copy(8))["loss"] - math.log(8)) < 1e-6
    m = task.evaluate(_BlockProfile(8))
    assert abs(m["loss"] - m["block_profile_loss"]) < 1e-6 and m["accuracy"] == m["block_profile_accuracy"], m
    # the family's 32 sequences estimate the column better than the 15-odd a block of 16 shows
    assert m["profile_loss"] < m["block_profile_loss"] < math.log(8), m
    fam = torch.as_tensor(task.msas("fit")[0])                                    # (M, L)
    inputs, targets, counts = task._eval_set()[0]
    assert torch.equal(counts, torch.nn.functional.one_hot(fam, 8).sum(0))
    assert inputs.shape == (32 // 16, 16, 16) and ((targets >= 0) & (inputs == 8)).any()


def test_validate_refuses_rows_deeper_than_the_family():
    p = argparse.ArgumentParser()
    SPEC.add_arguments(p)
    args = p.parse_args(["--rows", "40", "--depth", "32"])
    with pytest.raises(ValueError, match="--rows 40 is more than"):
        SPEC.validate(args)
    args = p.parse_args(["--row", "mean", "--layers", "1", "--length", "16", "--depth", "32", "--rows", "8"])
    SPEC.validate(args)
    task = SPEC.from_args(args)
    assert SPEC.run_dir(args) == "runs/msa-mean" and task.model_cfg.row == "mean" and task.model_cfg.n_layers == 1
    ckpt = SimpleNamespace(model_config=task.model_config(), extra={"task": "msa", "data": task.info()})
    again = SPEC.from_checkpoint(ckpt)
    assert again.data == task.data and again.model_cfg == task.model_cfg and again.rows == 8


# -- training, checkpoint, picture -----------------------------------------------------------------------
@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Tiny runs of both kinds, 30 steps each, on one thread: {row: run directory}."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    runs = {}
    for row in ("attention", "mean"):
        out = tmp_path_factory.mktemp(f"msa-{row}")
        cfg = TrainConfig(steps=30, batch_size=4, lr=3e-3, min_lr=1e-3, warmup_steps=3, eval_interval=15,
                          eval_iters=2, checkpoint_interval=30, out_dir=str(out))
        Trainer(tiny_task(row), cfg, progress=False).train(plot=False)
        runs[row] = out
    torch.set_num_threads(before)
    return runs


@pytest.mark.parametrize("row", ["attention", "mean"])
def test_training_lowers_the_loss_and_the_checkpoint_round_trips(trained, row):
    records = [json.loads(line) for line in (trained[row] / "metrics.jsonl").read_text().splitlines()]
    train = [r["loss"] for r in records if "loss" in r and "val_loss" not in r]
    assert len(train) >= 20
    assert np.mean(train[-5:]) < np.mean(train[:5]) - 0.1, train
    model, task = load_model(trained[row])                                # what `attnlab eval` does
    assert task.model_cfg.row == row and task.rows == 16 and task.data == TINY_DATA
    metrics = task.evaluate(model)
    assert set(metrics) == {f"{p}{m}" for p in ("", "profile_", "block_profile_") for m in ("accuracy", "loss")}
    assert 0 < metrics["loss"] < 3 and 0 < metrics["accuracy"] <= 1 and metrics["profile_loss"] < math.log(8)
    again, _ = load_model(trained[row])
    assert task.evaluate(again) == metrics


def _show(argv):
    from attnlab.cli.show import add_show
    p = argparse.ArgumentParser(prog="attnlab")
    add_show(p.add_subparsers(dest="cmd", required=True))
    args = p.parse_args(["show", *argv])
    return args.run(args)


def test_show_draws_a_test_family_and_refuses_the_ablation(trained, tmp_path, capsys):
    out = tmp_path / "o"
    assert _show(["--checkpoint", str(trained["attention"]), "--image-index", "1", "--out", str(out)]) == 0
    (path,) = capsys.readouterr().out.split()
    assert path.endswith("-family1-layers.png") and (out / path.rsplit("/", 1)[1]).read_bytes()[:4] == b"\x89PNG"
    assert _show(["--checkpoint", str(trained["attention"]), "--layer", "1", "--out", str(out)]) == 0
    assert capsys.readouterr().out.strip().endswith("-family0-layer1.png")
    assert _show(["--checkpoint", str(trained["attention"]), "--layer", "2", "--out", str(out)]) == 2
    assert "layer 2 does not exist" in capsys.readouterr().err
    empty = tmp_path / "none"
    assert _show(["--checkpoint", str(trained["mean"]), "--out", str(empty)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("attnlab: error: ") and "no row-attention maps" in err and "Traceback" not in err
    assert not empty.exists() or not any(empty.iterdir())
