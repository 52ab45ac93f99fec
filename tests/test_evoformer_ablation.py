"""Evoformer ablations remove what they name: its parameters, and every path from the input it carried."""
from __future__ import annotations

import argparse
import json
from types import SimpleNamespace

import pytest
import torch

from attnlab.models.evoformer import ABLATIONS, Evoformer, EvoformerConfig, OuterProductMean
from attnlab.nn.axial import AxialAttention, AxialAttentionConfig
from attnlab.tasks.evoformer import SPEC

TINY = dict(vocab=8, max_rows=6, max_cols=12, n_blocks=2, msa_dim=12, pair_dim=6, n_heads=3, head_dim=4,
            opm_dim=3, transition=2, max_relpos=4)


def model(*ablate, **kw):
    """A tiny double-precision model whose zero-initialised layers are randomised (else every update is 0)."""
    torch.manual_seed(0)
    m = Evoformer(EvoformerConfig(**{**TINY, **kw}, ablate=ablate)).double()
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.endswith("to_gate.weight") or not p.any():
                p.normal_(std=0.3)
    return m


def n_params(module) -> int:
    return sum(p.numel() for p in module.parameters())


def msa(seed=0, B=2, R=5, C=12):
    return torch.randint(0, TINY["vocab"], (B, R, C), generator=torch.Generator().manual_seed(seed))


def test_each_ablation_removes_exactly_its_parameters():
    full = n_params(model())
    attn = dict(dim=TINY["msa_dim"], n_heads=TINY["n_heads"], head_dim=TINY["head_dim"])
    row = n_params(AxialAttention(AxialAttentionConfig(axis="row", pair_dim=TINY["pair_dim"], **attn)))
    row_unbiased = n_params(AxialAttention(AxialAttentionConfig(axis="row", **attn)))
    col = n_params(AxialAttention(AxialAttentionConfig(axis="col", **attn)))
    opm = n_params(OuterProductMean(TINY["msa_dim"], TINY["pair_dim"], TINY["opm_dim"]))
    per_block = {"row-attention": row, "column-attention": col, "pair-bias": row - row_unbiased,
                 "outer-product-mean": opm}
    assert set(per_block) == set(ABLATIONS)
    # the pair bias is a LayerNorm over z and one Linear(d_z -> heads, no bias)
    assert per_block["pair-bias"] == 2 * TINY["pair_dim"] + TINY["pair_dim"] * TINY["n_heads"]
    for name, size in per_block.items():
        assert n_params(model(name)) == full - TINY["n_blocks"] * size, name
    both = n_params(model("row-attention", "outer-product-mean"))
    assert both == full - TINY["n_blocks"] * (row + opm)
    m = model("row-attention", "pair-bias")                 # the bias goes with the attention it steers
    assert n_params(m) == full - TINY["n_blocks"] * row
    assert all(b.row_attn is None and b.opm is not None for b in m.blocks)


def test_without_row_attention_a_pair_reads_only_its_own_two_columns():
    x = msa()
    y = x.clone()
    y[:, :, 7] = (y[:, :, 7] + 1) % TINY["vocab"]          # change column 7 only
    others = [k for k in range(12) if k != 7]
    ii, jj = torch.meshgrid(torch.tensor(others), torch.tensor(others), indexing="ij")
    cut = model("row-attention")
    torch.testing.assert_close(cut(y)[:, ii, jj], cut(x)[:, ii, jj], rtol=1e-12, atol=1e-12)
    full = model()                                          # the check can fail: row attention mixes columns
    assert (full(y)[:, ii, jj] - full(x)[:, ii, jj]).abs().max() > 1e-4


def block_io(*ablate, seed=0):
    """A block of the model with these ablations, and inputs m (B, R, C, d_m), z (B, C, C, d_z)."""
    blk = model(*ablate).blocks[0]
    g = torch.Generator().manual_seed(seed)
    m = torch.randn(2, 5, 12, TINY["msa_dim"], generator=g, dtype=torch.float64)
    z = torch.randn(2, 12, 12, TINY["pair_dim"], generator=g, dtype=torch.float64)
    return blk, m, z


def test_without_column_attention_and_pair_bias_a_row_stays_alone():
    for ablate, alone in ((("column-attention", "pair-bias"), True), (("pair-bias",), False),
                          (("column-attention",), False)):   # the pair bias (OPM of all rows) also mixes rows
        blk, m, z = block_io(*ablate)
        m2 = m.clone()
        m2[:, 3] += torch.randn_like(m2[:, 3])              # change row 3 only (not by a constant: LayerNorm)
        out, out2 = blk(m, z)[0], blk(m2, z)[0]
        rest = [0, 1, 2, 4]
        diff = (out2[:, rest] - out[:, rest]).abs().max()
        assert (diff < 1e-12) if alone else (diff > 1e-4), (ablate, diff)


def test_without_pair_bias_the_msa_update_ignores_z():
    for ablate, reads_z in ((("pair-bias",), False), ((), True)):
        blk, m, z = block_io(*ablate)
        out = blk(m, z)[0]
        out2 = blk(m, z + torch.randn_like(z))[0]
        assert ((out2 - out).abs().max() > 1e-4) == reads_z, ablate


def test_without_outer_product_mean_the_logits_ignore_the_msa():
    cut, full = model("outer-product-mean"), model()
    torch.testing.assert_close(cut(msa(1)), cut(msa(2)), rtol=0, atol=0)
    assert (full(msa(1)) - full(msa(2))).abs().max() > 1e-4


def test_capture_lists_only_the_attentions_left():
    cap: list = []
    model("row-attention")(msa(), capture=cap)
    assert len(cap) == TINY["n_blocks"] and all(c.pair_bias is None and c.weights.shape[-1] == 5 for c in cap)
    cap = []
    model("pair-bias")(msa(), capture=cap)
    assert len(cap) == 2 * TINY["n_blocks"] and cap[0].pair_bias is None and cap[0].weights.shape[-1] == 12


def test_ablation_config_errors_and_canonical_order():
    assert EvoformerConfig(ablate=["pair-bias", "row-attention"]).ablate == ("row-attention", "pair-bias")
    with pytest.raises(ValueError, match="unknown ablation"):
        EvoformerConfig(ablate=("row",))
    with pytest.raises(ValueError, match="flat"):
        EvoformerConfig(kind="flat", ablate=("pair-bias",))
    assert EvoformerConfig(ablate=("pair-bias",)).with_kind("flat").ablate == ()


def test_cli_flag_run_name_and_checkpoint_round_trip():
    p = argparse.ArgumentParser()
    SPEC.add_arguments(p)
    args = p.parse_args(["--coupling", "tagged", "--ablate", "pair-bias", "row-attention", "--cols", "14"])
    assert SPEC.run_dir(args) == "runs/evoformer-tagged-axial-no-row-attention-no-pair-bias"
    task = SPEC.from_args(args)
    assert task.model_cfg.ablate == ("row-attention", "pair-bias") and task.model_cfg.vocab == 8
    ckpt = SimpleNamespace(model_config=json.loads(json.dumps(task.model_config())),   # the list a JSON file holds
                           extra={"task": "evoformer", "data": json.loads(json.dumps(task.info()))})
    again = SPEC.from_checkpoint(ckpt)
    assert again.model_cfg == task.model_cfg and again.data == task.data
    again.build_model().load_state_dict(task.build_model().state_dict())
    with pytest.raises(ValueError, match="--ablate"):
        SPEC.from_args(p.parse_args(["--model", "flat", "--ablate", "pair-bias"]))
    with pytest.raises(SystemExit):
        p.parse_args(["--ablate", "attention"])


def test_show_draws_contacts_and_row_attention(tmp_path):
    from attnlab.cli import main
    from attnlab.tasks.evoformer import EvoformerTask
    from attnlab.data.pairs import PairTaskConfig
    from attnlab.train import Trainer, TrainConfig
    data = PairTaskConfig(rows=5, cols=12, min_pairs=1, max_pairs=3, min_sep=3, coupling="tagged")
    for ablate, files in (((), ["contacts", "block0-rows", "block1-rows"]), (("row-attention",), ["contacts"])):
        cfg = EvoformerConfig(**{**TINY, "vocab": data.n_symbols}, ablate=ablate)
        run = tmp_path / f"run{len(ablate)}"
        Trainer(EvoformerTask(data, cfg, eval_samples=8),
                TrainConfig(steps=2, batch_size=4, eval_interval=2, eval_iters=1, checkpoint_interval=2,
                            out_dir=str(run)), progress=False).train(plot=False)
        out = tmp_path / f"show{len(ablate)}"
        assert main(["show", "--checkpoint", str(run), "--image-index", "3", "--out", str(out)]) == 0
        assert sorted(p.name for p in out.iterdir()) == sorted(f"ckpt-{run.name}-sample3-{f}.png" for f in files)
    assert main(["show", "--checkpoint", str(run), "--image-index", "8", "--out", str(out)]) == 2
