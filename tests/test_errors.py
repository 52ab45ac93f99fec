"""Bad input gets a ValueError/TypeError that names the values and the fix."""
import pytest
import torch

import attnlab as al

q4 = torch.randn(2, 8, 5, 16)
k4 = torch.randn(2, 4, 7, 16)
v4 = torch.randn(2, 4, 7, 12)


@pytest.mark.parametrize("args, kwargs, err, match", [
    ((torch.randn(8, 5, 16), k4, v4), {}, ValueError, r"q has 3 dims .*\(B, H, L, D\)"),
    ((q4, torch.randn(4, 7, 16), v4), {}, ValueError, r"k has 3 dims"),
    ((q4.tolist(), k4, v4), {}, TypeError, r"q must be a torch.Tensor"),
    ((q4, torch.randn(2, 4, 7, 8), v4), {}, ValueError, r"q head dim is 16 but k head dim is 8"),
    ((q4, torch.randn(2, 3, 7, 16), torch.randn(2, 3, 7, 12)), {}, ValueError,
     r"k has 3 heads, q has 8: q heads must be a multiple"),
    ((q4, k4, torch.randn(2, 4, 6, 12)), {}, ValueError, r"k has length S=7 but v has 6"),
    ((q4, k4, torch.randn(2, 2, 7, 12)), {}, ValueError, r"k has 4 heads and v has 2"),
    ((q4, torch.randn(3, 4, 7, 16), v4), {}, ValueError, r"batch sizes differ"),
    ((q4, k4.double(), v4), {}, TypeError, r"dtypes differ: q torch.float32, k torch.float64"),
    ((q4.long(), k4.long(), v4.long()), {}, TypeError, r"floating-point"),
    ((q4, k4, v4), dict(mask=torch.ones(5, 6, dtype=torch.bool)), ValueError,
     r"mask of shape \(5, 6\) does not broadcast to \(B, H, L, S\) = \(2, 8, 5, 7\)"),
    ((q4, k4, v4), dict(mask=torch.ones(5, 7)), TypeError, r"mask has dtype torch.float32.*use bias="),
    ((q4, k4, v4), dict(mask="causal"), TypeError, r"mask must be a bool tensor"),
    ((q4, k4, v4), dict(bias=torch.zeros(3, 5, 7)), ValueError, r"bias of shape \(3, 5, 7\) does not broadcast"),
    ((q4, k4, v4), dict(bias=torch.zeros(5, 7, dtype=torch.bool)), TypeError, r"bias has dtype torch.bool"),
    ((q4, k4, v4), dict(bias=torch.zeros(5, 7, dtype=torch.float64)), TypeError,
     r"bias has dtype torch.float64 but q has torch.float32"),
    ((q4, k4, v4), dict(dropout_p=-0.1), ValueError, r"dropout_p=-0.1 is outside \[0, 1\)"),
    ((q4, k4, v4), dict(dropout_p=1.0), ValueError, r"dropout_p=1.0"),
    ((q4, k4, v4), dict(scale="big"), TypeError, r"scale must be a finite number"),
    ((q4, k4, v4), dict(backend="flash9"), ValueError,
     r"unknown attention backend 'flash9'; available: \[.*'reference', .*'sdpa', .*'tiled'"),
    ((q4, k4, v4), dict(causal=1), TypeError, r"causal must be a bool"),
    ((q4, k4, v4), dict(mask=al.masks.padding([3, 4, 5])), ValueError, r"batch size 3, but q has batch size 2"),
    ((q4, k4, v4), dict(mask=al.masks.padding([7, 8])), ValueError, r"padding lengths \[7, 8\] exceed the S=7 keys"),
    ((q4, k4, v4), dict(mask=al.masks.documents(torch.zeros(6, dtype=torch.long))), ValueError,
     r"length 6 but there are S=7 keys"),
])
def test_bad_input_names_the_problem(args, kwargs, err, match):
    with pytest.raises(err, match=match):
        al.attention(*args, **kwargs)


def test_named_backend_that_cannot_honour_request():
    q, k, v = (torch.randn(1, 2, 4, 8, dtype=torch.bfloat16) for _ in range(3))
    with pytest.raises(ValueError, match=r"backend 'sdpa' cannot compute this request: "
                                         r".*Backends that can: \[.*'reference', .*'tiled'.*\]"):
        al.attention(q, k, v, bias=torch.zeros(4, 4), backend="sdpa")


def test_explain_validates_too():
    with pytest.raises(ValueError, match="q heads must be a multiple"):
        al.explain(q4, torch.randn(2, 3, 7, 16), torch.randn(2, 3, 7, 12))


# -- issue #18: explain honours backend=, and the library's messages say what to do -------------------------
def test_explain_answers_for_the_named_backend():
    q = torch.randn(1, 2, 8, 16)
    lines = al.explain(q, q, q, backend="reference").splitlines()
    assert lines[1].startswith("reference (named) -> runs: textbook math")
    assert lines[2].startswith("auto -> ")                                 # what auto would do follows
    qb = q.bfloat16()
    why = al.explain(qb, qb, qb, bias=torch.zeros(8, 8), backend="sdpa").splitlines()[1]
    assert why.startswith("sdpa (named) -> cannot compute this request: SDPA needs the additive mask")
    with pytest.raises(ValueError, match="unknown attention backend 'flash9'"):
        al.explain(q, q, q, backend="flash9")


def test_explain_of_an_expanded_input_does_not_invent_a_mask():
    q = torch.randn(1, 8, 1024, 1).expand(1, 8, 1024, 64)                   # last stride 0, no mask, no bias
    text = al.explain(q, q, q)
    assert "mask or bias is involved" not in text and "needs the dense mask" not in text
    assert "math path (an input whose last dim is not contiguous" in text


def test_reference_refuses_a_terabyte_before_allocating():
    q = torch.empty(1, 8, 2 ** 20, 64)                                      # 4 MB of input, ~100 TB of scores
    with pytest.raises(MemoryError,
                       match=r"\(1, 8, 1048576, 1048576\) scores: ~[\d,]+ GiB.*backend='tiled' or 'native'"):
        al.attention(q, q, q, backend="reference")


def test_meta_tensors_give_shapes_or_a_clear_refusal():
    q = torch.empty(2, 4, 64, 16, device="meta")
    assert al.attention(q, q, q, causal=True).shape == (2, 4, 64, 16)
    dense = torch.ones(64, 64, dtype=torch.bool, device="meta")
    assert al.attention(q, q, q, mask=dense).is_meta                         # auto: the reference, shape only
    assert "meta tensors carry no data" in al.explain(q, q, q, mask=dense)
    with pytest.raises(ValueError, match="cannot run on meta tensors with a dense.*backend='auto' or 'reference'"):
        al.attention(q, q, q, mask=dense, backend="tiled")


def test_mask_and_tensor_suggests_masks_dense():
    t = torch.ones(5, 5, dtype=torch.bool)
    for combine in (lambda: al.masks.causal() & t, lambda: t & al.masks.causal()):
        with pytest.raises(TypeError, match=r"masks\.causal\(\) & masks\.dense\(bool_tensor\)"):
            combine()
    al.attention(q4[:, :, :5, :], q4[:, :, :5, :], q4[:, :, :5, :], mask=al.masks.causal() & al.masks.dense(t))


def test_multihead_attention_input_dtype():
    from attnlab.nn import AttentionConfig, AttentionLayer
    mha = AttentionLayer(AttentionConfig(d_model=16, n_heads=2))
    with pytest.raises(TypeError, match=r"x is torch.float64 but the layer's weights are torch.float32: convert"):
        mha(torch.randn(1, 3, 16, dtype=torch.float64))
    with pytest.raises(TypeError, match=r"floating-point .* got torch.int64: token ids go through an embedding"):
        mha(torch.ones(1, 3, 16, dtype=torch.long))
    assert mha.to(torch.float64)(torch.randn(1, 3, 16, dtype=torch.float64)).dtype == torch.float64


@pytest.mark.parametrize("kwargs, match", [
    (dict(positional="rotary"), r"unknown positional scheme 'rotary'; choose from \[.*'rope'"),
    (dict(backend="flash"), r"unknown attention backend 'flash'"),
    (dict(d_model=-64), r"d_model must be a positive int, got -64"),
    (dict(n_heads=0), r"n_heads must be a positive int, got 0"),
    (dict(n_kv_heads=-1), r"n_kv_heads must be a positive int"),
    (dict(scale=-1.0), r"scale must be a positive number"),
])
def test_attention_config_validates_names_and_signs_at_construction(kwargs, match):
    from attnlab.nn import AttentionConfig
    with pytest.raises(ValueError, match=match):
        AttentionConfig(**{"d_model": 64, "n_heads": 4, **kwargs})


@pytest.mark.parametrize("argv, message", [
    (["--n", "-5"], "--n must be >= 1, got -5"),
    (["--n", "1024", "0"], "--n must be >= 1, got 1024 0"),
    (["--heads", "0"], "--heads must be >= 1"),
    (["--lm", "--minilm", "--complexity"], "--minilm and --lm and --complexity are separate benchmarks"),
    (["--memory-scaling", "--favor-accuracy"], "--favor-accuracy and --memory-scaling are separate benchmarks"),
])
def test_bench_refuses_bad_options_before_running(argv, message, capsys):
    from attnlab.cli import main
    assert main(["bench", *argv]) == 2
    err = capsys.readouterr().err
    assert f"attnlab: error: {message}" in err and "Traceback" not in err


def test_ctrl_c_anywhere_in_the_cli_is_a_line_and_status_130(monkeypatch, capsys):
    from attnlab import cli

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli.bench, "_run_bench", interrupted)            # the parser is built after this
    assert cli.main(["bench", "--quick"]) == 130
    err = capsys.readouterr().err
    assert "attnlab: interrupted" in err and "Traceback" not in err
