"""auto's decisions kept per kind of request (functional/auto_memo.py, issue #29): the same answer as a fresh
decision, taken once, and taken again whenever something it read has changed."""
import itertools

import pytest
import torch

import attnlab as al
from attnlab.functional import api, auto_memo, auto_rule, mask_plan, masks
from attnlab.functional import profile as profile_mod
from attnlab.functional.auto_memo import decided, signature
from attnlab.functional.backends.native import why_unavailable
from attnlab.functional.profile import save_profile
from attnlab.functional.registry import get_backend, register_backend
from attnlab.functional.request import make_request
from attnlab.functional.bias import FunctionBias
from attnlab.positional import ALiBi
from attnlab.positional.alibi import AlibiBias
from attnlab.positional.t5 import T5Bias

needs_native = pytest.mark.skipif(why_unavailable() is not None, reason="the compiled kernel is not built")


class Counting:
    """``auto_rule.pick``, counting how often it is asked."""

    def __init__(self):
        self.calls = 0

    def __call__(self, req):
        self.calls += 1
        return auto_rule.pick(req)


def _qkv(n, dtype=torch.float32, D=64, Dv=64, grad=False):
    q, k = (torch.randn(1, 4, n, D, dtype=dtype) for _ in range(2))
    v = torch.randn(1, 4, n, Dv, dtype=dtype)
    return q.requires_grad_(grad), k, v


def _requests():
    """A grid of kinds: dtype, size, mask, tensor bias, gradients, dropout, an expanded v, Dv != D."""
    for dtype, n, grad in itertools.product((torch.float32, torch.bfloat16), (64, 1024), (False, True)):
        q, k, v = _qkv(n, dtype, grad=grad)
        lengths = torch.tensor([3 * n // 4])
        band = torch.ones(n, n, dtype=torch.bool).tril().triu(-n // 8)
        for kw in (dict(), dict(causal=True), dict(mask=masks.window(n // 8)), dict(mask=masks.padding(lengths)),
                   dict(mask=band), dict(mask=~band), dict(bias=torch.zeros(1, 4, n, n, dtype=dtype)),
                   dict(dropout_p=0.1), dict(mask=masks.documents(torch.arange(n) // (n // 4)))):
            yield make_request(q, k, v, **kw)
        yield make_request(q, k, v[:, :, :1].expand(-1, -1, n, -1))                 # stride 0 along S
        yield make_request(q, k, v.transpose(-1, -2).contiguous().transpose(-1, -2))   # last stride != 1
        yield make_request(q, k, torch.randn(1, 4, n, 32, dtype=dtype))              # Dv != D


def test_a_kept_decision_is_the_fresh_one_and_is_taken_once():
    reqs = list(_requests())
    for req in reqs:
        ask = Counting()
        auto_memo.forget()                               # the grid repeats some kinds (a tensor per dtype)
        fresh = auto_rule.pick(req)
        assert decided(req, ask) == fresh and decided(req, ask) == fresh, req
        assert ask.calls == 1, req


def test_requests_of_one_kind_share_a_decision_and_other_kinds_do_not():
    ask = Counting()
    q, k, v = _qkv(1024)
    for _ in range(3):                                   # new tensors of the same kind: one decision
        decided(make_request(q.clone(), k.clone(), v.clone()), ask)
    assert ask.calls == 1
    decided(make_request(q.clone().requires_grad_(), k, v), ask)                      # gradients wanted
    decided(make_request(q.bfloat16(), k.bfloat16(), v.bfloat16()), ask)              # another dtype
    decided(make_request(q[:, :, :512], k, v), ask)                                   # another L
    decided(make_request(q, k, v, dropout_p=0.1), ask)                                 # dropout
    with torch.no_grad():                                                              # no gradients here
        decided(make_request(q.clone().requires_grad_(), k, v), ask)
    assert ask.calls == 5


def test_a_dense_mask_edited_in_place_is_decided_again():
    """Skippable tiles come from the mask's values: a mask that changes in place must not keep its decision. With a
    dense bias beside it the rule weighs them (a dense mask alone goes to the kernel whatever its share)."""
    q, k, v = _qkv(1024)
    mask = torch.ones(1024, 1024, dtype=torch.bool)
    req = make_request(q, k, v, mask=mask, bias=torch.zeros(1024, 1024))
    assert api.choose_backend(req, "auto").name == "sdpa"        # a full dense mask: SDPA applies it
    mask.zero_()
    mask[:, :64] = True                                            # now almost every tile is empty
    fresh = auto_rule.pick(req)
    assert fresh[0] != "sdpa"
    assert api.choose_backend(req, "auto").name == fresh[0]


def test_a_mask_that_died_leaves_nothing_behind_for_the_next():
    ask = Counting()
    q, k, v = _qkv(1024)
    for width in (64, 64):                                         # two windows of one width: two masks
        decided(make_request(q, k, v, mask=masks.window(width)), ask)
    assert ask.calls == 2
    kept = masks.window(64)
    decided(make_request(q, k, v, mask=kept), ask)
    decided(make_request(q, k, v, mask=kept), ask)
    assert ask.calls == 3 and mask_plan.plan_count(kept) == 1


@needs_native
def test_a_new_profile_or_none_means_a_new_decision(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNLAB_CACHE_DIR", str(tmp_path))
    profile_mod._loaded.clear()
    q, k, v = _qkv(1024, torch.bfloat16)
    req = make_request(q, k, v)
    picks = {}
    for native_ms, sdpa_ms in ((1.0, 2.0), (2.0, 1.0)):           # each profile names the other backend
        save_profile([dict(dtype="bfloat16", mask="none", mode="fwd", n=1024, D=64,
                           ms={"native": native_ms, "sdpa": sdpa_ms})], [])
        picks[native_ms] = api.choose_backend(req, "auto").name
        assert picks[native_ms] == auto_rule.pick(req)[0]
    assert picks == {1.0: "native", 2.0: "sdpa"}
    monkeypatch.setenv("ATTNLAB_PROFILE", "off")                   # no profile: the class rules again
    assert api.choose_backend(req, "auto").name == auto_rule.pick(req)[0]
    profile_mod._loaded.clear()


def test_registering_a_backend_means_a_new_decision(monkeypatch):
    from attnlab.functional import registry
    ask = Counting()
    req = make_request(*_qkv(1024))
    decided(req, ask)
    monkeypatch.setitem(registry._BACKENDS, "sdpa", registry._BACKENDS["sdpa"])
    register_backend("sdpa", unsupported=get_backend("sdpa").unsupported)(get_backend("sdpa").fn)
    decided(req, ask)
    assert ask.calls == 2


def test_function_biases_caching_off_and_forget_decide_afresh():
    ask = Counting()
    q, k, v = _qkv(1024)
    slopes = ALiBi(4).slopes
    req = make_request(q, k, v, bias=FunctionBias(lambda i, j, s: -s[:, None, None] * (i - j).abs(), slopes))
    assert signature(req) is None
    decided(req, ask), decided(req, ask)
    assert ask.calls == 2
    plain = make_request(q, k, v)
    with mask_plan.caching(False):
        decided(plain, ask), decided(plain, ask)
    assert ask.calls == 4
    decided(plain, ask)
    auto_memo.forget()
    decided(plain, ask)
    assert ask.calls == 6


def test_a_bias_that_names_what_it_reads_is_decided_once_per_kind():
    """ALiBi and T5 name what their tiles read (``kept_key``): a new bias object over the same kind of params
    (a model builds one per layer and call) reads the kept decision; another dtype or a param that requires
    grad, or T5's other settings, is another kind."""
    ask = Counting()
    q, k, v = _qkv(1024)
    alibi = ALiBi(4)
    for _ in range(3):
        decided(make_request(q, k, v, bias=alibi.bias()), ask)
    assert ask.calls == 1
    decided(make_request(q, k, v, bias=ALiBi(4).bias()), ask)              # other slopes of the same kind
    assert ask.calls == 1
    kinds = [AlibiBias(alibi.slopes.double()), AlibiBias(alibi.slopes.clone().requires_grad_()),
             T5Bias(4).bias(), T5Bias(4, max_distance=64).bias()]
    for b in kinds:
        decided(make_request(q, k, v, bias=b), ask)
    assert ask.calls == 1 + len(kinds)
    assert len({signature(make_request(q, k, v, bias=b)) for b in kinds}) == len(kinds)


def test_at_most_max_decisions_are_kept_without_a_mask(monkeypatch):
    monkeypatch.setattr(auto_memo, "MAX_DECISIONS", 4)
    ask = Counting()
    q, k, v = _qkv(64)
    for L in range(1, 11):
        decided(make_request(q[:, :, :L], k, v), ask)
    assert len(auto_memo._unmasked) == 4 and ask.calls == 10
    decided(make_request(q[:, :, :10], k, v), ask)                 # the newest is still kept
    assert ask.calls == 10


def test_attention_with_auto_runs_the_kept_decision(monkeypatch):
    q, k, v = _qkv(1024)
    want = al.attention(q, k, v, mask=masks.window(128), backend="reference")
    mask = masks.window(128)
    first = al.attention(q, k, v, mask=mask)
    monkeypatch.setattr(auto_rule, "pick", lambda req: pytest.fail("decided again"))
    second = al.attention(q, k, v, mask=mask)                     # the decision kept with the mask
    torch.testing.assert_close(first, want)
    torch.testing.assert_close(second, first, rtol=0, atol=0)
