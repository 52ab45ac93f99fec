"""The softmax's exp as the compiled kernel computes it (csrc/vecmath.h: exp2_clamped, vexp_from), in whichever
build runs here; tests/test_native_isa.py runs this file under every build this CPU runs. The conformance suites
check it only through attention's errors; here its own claims are held to: 1.9e-7 relative for the polynomial,
plus the rounding of (x - m) log2(e) (2^-24 relative, and log2(e) as a float 0.22 2^-24 more: so 1.22 |x - m|
2^-24 relative in the result); exactly 1 at the max, exactly 0 for -inf and far below the max, NaN kept, and no
value above 1 where x <= m."""
import math

import pytest
import torch

from attnlab.functional.backends import native

pytestmark = pytest.mark.skipif(native._native is None, reason="the compiled kernel is not built here")

#: the polynomial's own bound (vecmath.h) and a little room for the final product's rounding
POLY = 2.5e-7
#: per unit of |x - m|: the exponent's rounding, 2^-24, and log2(e)'s as a float, 0.224 2^-24, with a margin
PER_UNIT = 1.25 * 2.0 ** -24


def _exp(x: torch.Tensor, m: float) -> torch.Tensor:
    return native._native.exp_from(x, m)


@pytest.mark.parametrize("m", [0.0, 3.5, -40.0, 1.0e4])
def test_relative_error_over_the_normal_range(m):
    """exp(x - m) for x - m in [-87, 0] (results down to 1.6e-38, the normal floats): within the polynomial's
    bound plus the exponent's rounding, against fp64 on the same float difference."""
    d = torch.linspace(-87.0, 0.0, 160_000, dtype=torch.float64)
    x = (d + m).float()                                       # the scores
    got = _exp(x, m).double()
    diff = (x - torch.tensor(m, dtype=torch.float32)).double()    # x - m in float: exact near m (Sterbenz)
    want = torch.exp(diff)
    rel = ((got - want).abs() / want)
    bound = POLY + diff.abs() * PER_UNIT
    worst = (rel / bound).max().item()
    assert worst <= 1.0, (worst, rel.max().item())
    assert (got <= 1.0).all()


def test_the_max_gives_one_and_minus_inf_gives_zero_exactly():
    x = torch.tensor([2.0, float("-inf"), 2.0, -1.0e30] * 8)
    got = _exp(x, 2.0)
    assert got[0::4].eq(1.0).all() and got[2::4].eq(1.0).all()
    assert got[1::4].eq(0.0).all() and got[3::4].eq(0.0).all()


def test_far_below_the_max_underflows_to_zero_never_to_a_subnormal():
    """x - m below -87.34 (2^-126): exactly 0 on every build, never a subnormal, which costs a microcode assist in
    every product that reads it on the Xeon with AMX (csrc/native.h, FlushSubnormals); above it normal floats."""
    d = torch.linspace(-110.0, -87.0, 4096)
    got = _exp(d, 0.0)
    tiny = torch.finfo(torch.float32).tiny
    assert (got.eq(0.0) | got.ge(tiny)).all(), got[(got > 0) & (got < tiny)]
    assert got[d < -87.34].eq(0.0).all() and got[d > -87.33].ge(tiny).all()


def test_nan_stays_nan():
    x = torch.tensor([0.0, float("nan"), -3.0, float("nan")] * 8)
    got = _exp(x, 0.0)
    assert got[1::2].isnan().all() and not got[0::2].isnan().any()
    assert _exp(torch.zeros(32), float("nan")).isnan().all()       # a NaN max: every weight NaN


def test_a_row_of_large_logits_loses_nothing_to_the_max():
    """x - m is taken first: scores near 1e4 with a spread of a few units give the same weights as near 0."""
    spread = torch.linspace(-20.0, 0.0, 64)
    near_zero = _exp(spread, 0.0)
    far = _exp(spread + 1.0e4, 1.0e4)
    exact = torch.exp((spread + 1.0e4).double() - 1.0e4)            # the float scores' true weights
    assert ((far.double() - exact).abs() / exact).max().item() <= POLY + 20 * PER_UNIT
    assert math.isclose(far.sum().item(), near_zero.sum().item(), rel_tol=1e-4)


def test_a_wrong_argument_is_refused_by_name():
    with pytest.raises(RuntimeError, match="1-d float32"):
        _exp(torch.zeros(4, 4), 0.0)
    with pytest.raises(RuntimeError, match="1-d float32"):
        _exp(torch.zeros(4, dtype=torch.float64), 0.0)
