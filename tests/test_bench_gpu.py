"""attnlab.bench.gpu (``bench --device cuda``): its bookkeeping -- cases, skips, ratios, % of peak,
the issue's targets, the table and the JSON -- run on a CPU with a fake step and timer."""
import argparse
import json

import pytest

from attnlab.bench.cases import useful_flops, Case
from attnlab.bench.gpu import GPU_QUICK, GpuBenchConfig, evaluate_targets, format_gpu_table, from_cli, gpu_cases, \
    run_gpu_bench
from attnlab.bench.report import write_json

# Fake times (ms) per contestant: triton beats sdpa, loses a little to flex.
FAKE_MS = {"triton": 2.0, "sdpa": 3.0, "flex": 1.9}


def fake_run(cfg, fail=()):
    def make_step(name, case, q, k, v):
        assert q.shape == (case.batch, case.heads, case.n, case.head_dim) and q.requires_grad == (case.mode == "fwdbwd")
        if (name, case.mask) in fail:
            raise RuntimeError("CUDA out of memory.\nmore")
        return name
    return run_gpu_bench(cfg, make_step=make_step, timer=lambda name: FAKE_MS[name], peak_tflops=100.0,
                         device_name="fake GPU")


def test_cases_keep_tokens_per_batch_and_model_width():
    cases = gpu_cases(GpuBenchConfig(n=[1024, 32768], head_dims=[64, 128], masks=["causal"], modes=["fwd"]))
    assert [(c.n, c.head_dim, c.batch, c.heads) for c in cases] == [
        (1024, 64, 16, 32), (32768, 64, 1, 32), (1024, 128, 16, 16), (32768, 128, 1, 16)]
    with pytest.raises(ValueError, match="padding"):
        gpu_cases(GpuBenchConfig(masks=["padding"]))


def test_rows_ratios_peak_skips_and_failures():
    cfg = GpuBenchConfig(n=[64, 8192], head_dims=[128], masks=["none", "window", "alibi"], modes=["fwd"],
                         tokens=8192, flex_cases=[(8192, 128)], sdpa_max_bytes=1e9)
    report = fake_run(cfg, fail={("flex", "alibi")})
    rows = {(r["case"]["mask"], r["case"]["n"], r["contestant"]): r for r in report["results"]}
    t = rows[("window", 8192, "triton")]
    case = Case(**t["case"])
    assert t["tflops"] == pytest.approx(useful_flops(case) / 2e-3 / 1e12)
    assert t["pct_peak"] == pytest.approx(t["tflops"])                       # peak 100 TFLOP/s
    assert t["x_sdpa"] == pytest.approx(1.5) and t["x_flex"] == pytest.approx(0.95)
    assert rows[("window", 64, "flex")]["status"] == "skipped"               # flex only at (8192, 128)
    assert "x_flex" not in rows[("window", 64, "triton")]
    assert rows[("alibi", 8192, "sdpa")]["status"] == "skipped"             # 16 heads x 8192^2 x 6 B > 1 GB
    assert "GB" in rows[("alibi", 8192, "sdpa")]["notes"][0]
    flex = rows[("alibi", 8192, "flex")]
    assert flex["status"] == "failed" and flex["notes"] == ["failed: RuntimeError: CUDA out of memory."]


def test_targets_table_and_json(tmp_path):
    report = fake_run(GpuBenchConfig(**{**GPU_QUICK, "n": [8192], "head_dims": [128],
                                        "masks": ["none", "window"], "tokens": 8192}))
    targets = {(t["mask"], t["mode"], t["versus"]): t for t in report["targets"]}
    assert targets[("none", "fwd", "sdpa")]["met"] is True                   # 1.5x >= 1.0
    assert targets[("window", "fwd", "flex")]["met"] is False                # 0.95x < 1.0
    assert targets[("window", "fwdbwd", "flex")]["met"] is True              # 0.95x >= 0.9
    assert targets[("documents", "fwd", "flex")]["met"] is None              # not run
    text = format_gpu_table(report)
    assert "fake GPU: measured bf16 matmul peak 100 TFLOP/s" in text
    assert "target: triton window fwd >= 1.0x flex (bf16 d=128 n=8192): 0.95x MISSED" in text
    assert "documents fwd >= 1.0x flex (bf16 d=128 n=8192): not measured" in text
    path = write_json(report, str(tmp_path / "gpu.json"))
    assert json.loads(open(path).read())["targets"] == json.loads(json.dumps(report["targets"]))
    assert evaluate_targets([]) and all(t["met"] is None for t in evaluate_targets([]))


def test_cli_adapter_refuses_without_cuda(monkeypatch):
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    args = argparse.Namespace(quick=True, n=None, mask=None, mode=None, head_dim=None, dtype=None, flex=None,
                              argv=[], json=None)
    with pytest.raises(ValueError, match="needs a CUDA GPU"):
        from_cli(args)
