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
    ((q4, torch.randn(2, 3, 7, 16), torch.randn(2, 3, 7, 12)), {}, ValueError, r"k has 3 heads, q has 8: q heads must be a multiple"),
    ((q4, k4, torch.randn(2, 4, 6, 12)), {}, ValueError, r"k has length S=7 but v has 6"),
    ((q4, k4, torch.randn(2, 2, 7, 12)), {}, ValueError, r"k has 4 heads and v has 2"),
    ((q4, torch.randn(3, 4, 7, 16), v4), {}, ValueError, r"batch sizes differ"),
    ((q4, k4.double(), v4), {}, TypeError, r"dtypes differ: q torch.float32, k torch.float64"),
    ((q4.long(), k4.long(), v4.long()), {}, TypeError, r"floating-point"),
    ((q4, k4, v4), dict(mask=torch.ones(5, 6, dtype=torch.bool)), ValueError, r"mask of shape \(5, 6\) does not broadcast to \(B, H, L, S\) = \(2, 8, 5, 7\)"),
    ((q4, k4, v4), dict(mask=torch.ones(5, 7)), TypeError, r"mask has dtype torch.float32.*use bias="),
    ((q4, k4, v4), dict(mask="causal"), TypeError, r"mask must be a bool tensor"),
    ((q4, k4, v4), dict(bias=torch.zeros(3, 5, 7)), ValueError, r"bias of shape \(3, 5, 7\) does not broadcast"),
    ((q4, k4, v4), dict(bias=torch.zeros(5, 7, dtype=torch.bool)), TypeError, r"bias has dtype torch.bool"),
    ((q4, k4, v4), dict(bias=torch.zeros(5, 7, dtype=torch.float64)), TypeError, r"bias has dtype torch.float64 but q has torch.float32"),
    ((q4, k4, v4), dict(dropout_p=-0.1), ValueError, r"dropout_p=-0.1 is outside \[0, 1\)"),
    ((q4, k4, v4), dict(dropout_p=1.0), ValueError, r"dropout_p=1.0"),
    ((q4, k4, v4), dict(scale="big"), TypeError, r"scale must be a finite number"),
    ((q4, k4, v4), dict(backend="flash9"), ValueError, r"unknown attention backend 'flash9'; available: \[.*'reference', .*'sdpa', .*'tiled'"),
    ((q4, k4, v4), dict(causal=1), TypeError, r"causal must be a bool"),
    ((q4, k4, v4), dict(mask=al.masks.padding([3, 4, 5])), ValueError, r"batch size 3, but q has batch size 2"),
    ((q4, k4, v4), dict(mask=al.masks.padding([7, 8])), ValueError, r"padding lengths \[7, 8\] exceed the S=7 keys"),
    ((q4, k4, v4), dict(mask=al.masks.documents(torch.zeros(6, dtype=torch.long))), ValueError, r"length 6 but there are S=7 keys"),
])
def test_bad_input_names_the_problem(args, kwargs, err, match):
    with pytest.raises(err, match=match):
        al.attention(*args, **kwargs)


def test_named_backend_that_cannot_honour_request():
    q, k, v = (torch.randn(1, 2, 4, 8, dtype=torch.bfloat16) for _ in range(3))
    with pytest.raises(ValueError, match=r"backend 'sdpa' cannot compute this request: .*Backends that can: \[.*'reference', .*'tiled'.*\]"):
        al.attention(q, k, v, bias=torch.zeros(4, 4), backend="sdpa")


def test_explain_validates_too():
    with pytest.raises(ValueError, match="q heads must be a multiple"):
        al.explain(q4, torch.randn(2, 3, 7, 16), torch.randn(2, 3, 7, 12))
