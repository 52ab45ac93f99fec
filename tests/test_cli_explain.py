"""``attnlab explain``: auto's route for a shape, from flags; the same text as explain() on real tensors."""
from __future__ import annotations

import pytest
import torch

import attnlab
from attnlab import masks
from attnlab.cli import main
from attnlab.positional.alibi import AlibiBias, alibi_slopes


def _explain(capsys, *argv) -> tuple[int, str, str]:
    rc = main(["explain", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


# (flags, what attnlab.explain is given for the same request on contiguous tensors)
CASES = [
    ([], dict()),
    (["--L", "300", "--S", "700", "--mask", "causal", "--dtype", "bfloat16"], dict(mask=masks.causal())),
    (["--L", "1", "--S", "2048", "--heads", "8", "--kv-heads", "2", "--mask", "window", "--window", "64", "--grad"],
     dict(mask=masks.window(64, 0))),
    (["--L", "1024", "--mask", "documents", "--docs", "4", "--bias", "alibi", "--dtype", "float16"],
     dict(mask=masks.documents(torch.arange(1024) * 4 // 1024), bias=AlibiBias(alibi_slopes(8)))),
    (["--L", "640", "--batch", "2", "--mask", "padding", "--lengths", "100", "600", "--grad"],
     dict(mask=masks.padding(torch.tensor([100, 600])))),
    (["--L", "1024", "--mask", "bigbird", "--block", "32", "--backend", "tiled"],
     dict(mask=masks.bigbird(32, 3), backend="tiled")),
    (["--L", "700", "--mask", "dense", "--dtype", "float64"], dict(mask=masks.causal().dense(700, 700))),
    (["--L", "512", "--bias", "tensor", "--head-dim", "40", "--value-dim", "24"], dict(bias="tensor")),
]


@pytest.mark.parametrize("argv, kwargs", CASES, ids=[" ".join(a) or "defaults" for a, _ in CASES])
def test_prints_what_explain_says_for_real_tensors(capsys, argv, kwargs):
    from attnlab.cli import build_parser
    a = build_parser().parse_args(["explain", *argv])
    S = a.S or a.L
    dtype, Hkv, Dv = getattr(torch, a.dtype), a.kv_heads or a.heads, a.value_dim or a.head_dim
    q = torch.randn(a.batch, a.heads, a.L, a.head_dim, dtype=dtype, requires_grad=a.grad)
    k = torch.randn(a.batch, Hkv, S, a.head_dim, dtype=dtype, requires_grad=a.grad)
    v = torch.randn(a.batch, Hkv, S, Dv, dtype=dtype, requires_grad=a.grad)
    if kwargs.get("bias") == "tensor":
        kwargs = {**kwargs, "bias": torch.zeros(1, a.heads, a.L, S, dtype=dtype)}
    rc, out, err = _explain(capsys, *argv)
    assert rc == 0 and err == "", err
    assert out == attnlab.explain(q, k, v, **kwargs) + "\n"          # the expanded inputs take the same route


def test_inputs_are_expanded_not_allocated(monkeypatch, capsys):
    seen = {}

    def spy(q, k, v, **kw):
        seen.update(q=q, k=k, v=v, **kw)
        return "explained"
    monkeypatch.setattr(attnlab.functional, "explain", spy)
    rc, out, _ = _explain(capsys, "--L", "10000000", "--heads", "16", "--kv-heads", "4", "--grad")
    assert rc == 0 and out == "explained\n"
    q, k = seen["q"], seen["k"]
    assert q.shape == (1, 16, 10_000_000, 64) and k.shape == (1, 4, 10_000_000, 64)
    assert q.untyped_storage().nbytes() == 64 * 4 and q.stride(-1) == 1    # one row of 64 floats, not 40 GB
    assert q.requires_grad and k.untyped_storage().nbytes() == 64 * 4
    assert seen["mask"] is None and seen["bias"] is None and seen["backend"] == "auto"


@pytest.mark.parametrize("argv, message", [
    (["--L", "0"], "--L must be >= 1, got 0"),
    (["--S", "-4"], "--S must be >= 1"),
    (["--head-dim", "0"], "--head-dim must be >= 1"),
    (["--heads", "8", "--kv-heads", "3"], "--heads 8 is not a multiple of --kv-heads 3"),
    (["--dropout", "1"], "--dropout must be in [0, 1)"),
    (["--dropout", "nan"], "--dropout must be in [0, 1)"),
    (["--mask", "causal", "--window", "8"], "--window is not used by --mask causal (it is for --mask window"),
    (["--mask", "window", "--window", "-1"], "--window must be >= 0"),
    (["--mask", "global", "--window", "7"], "--window must be even"),
    (["--mask", "strided", "--block", "0"], "--block must be >= 1"),
    (["--mask", "fixed", "--block", "4", "--summary", "5"], "--summary 5 exceeds --block 4"),
    (["--mask", "documents", "--L", "4", "--docs", "9"], "--docs 9 is more documents than the --S 4 keys"),
    (["--mask", "padding", "--lengths", "2000"], "--lengths must be in 0..S = 1024"),
    (["--mask", "padding", "--batch", "3", "--lengths", "1", "2"], "--lengths takes one length for every example"),
    (["--mask", "dense", "--L", "100000"], "--mask dense at --L 100000 --S 100000 needs 10,000,000,000"),
    (["--mask", "window", "--L", "10000000", "--dtype", "bfloat16"], "give a smaller --L or --S"),
])
def test_bad_values_are_one_line_naming_the_flag(capsys, argv, message):
    rc, out, err = _explain(capsys, *argv)
    assert rc == 2 and out == "" and err.startswith("attnlab: error: ") and message in err, err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_help_lists_every_mask_and_bias(capsys):
    from attnlab.cli.explain import BIASES, MASKS
    with pytest.raises(SystemExit):
        main(["explain", "--help"])
    out = capsys.readouterr().out
    assert all(f"  {name} " in out for name in [*MASKS, *BIASES])
    assert MASKS.keys() >= {"none", "causal", "window", "padding", "documents", "strided", "fixed", "dilated",
                            "global", "bigbird", "dense"}


def test_attnlab_help_lists_every_command_and_every_task(capsys):
    from attnlab.tasks import task_names
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert "explain" in out and all(name in out for name in task_names()), out
    assert {"vqa", "code"} <= set(task_names())


def test_every_command_prints_its_help(capsys):
    """argparse %-formats help texts: a bare '%' in one (e.g. "25% of the CPUs") was a traceback."""
    import argparse

    from attnlab.cli import build_parser
    commands = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)][0].choices
    assert "tune" in commands
    for name in commands:
        with pytest.raises(SystemExit) as e:
            main([name, "--help"])
        assert e.value.code == 0 and f"usage: attnlab {name}" in capsys.readouterr().out, name
