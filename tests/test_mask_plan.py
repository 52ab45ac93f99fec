"""Plans kept with the mask (functional/mask_plan.py): reused where the mask is the same, rebuilt where it
is not, never a stale plan, and the same outputs as planning every call."""
import pytest
import torch

import attnlab as al
from attnlab.functional import mask_plan
from attnlab.functional.mask_plan import MAX_PLANS, caching, plan_count, planned
from attnlab.nn.blocks import BlockConfig, EncoderStack

masks = al.masks


def counter():
    calls = []

    def build(value="plan"):
        calls.append(value)
        return value
    return calls, build


def test_a_plan_is_built_once_per_mask_and_key():
    m = masks.padding(torch.tensor([3, 5]))
    calls, build = counter()
    assert planned(m, ("a", 8, 8), build) == planned(m, ("a", 8, 8), build) == "plan"
    assert len(calls) == 1
    planned(m, ("a", 8, 16), build)                                        # another size: built again
    planned(masks.padding(torch.tensor([3, 5])), ("a", 8, 8), build)       # another object: built again
    assert len(calls) == 3 and plan_count(m) == 2


def test_an_and_built_afresh_from_the_same_parts_shares_its_plans():
    """What a layer does with the stack's padding and its own mask: a new ``&`` each call."""
    pad, win = masks.padding(torch.tensor([6])), masks.window(2, 0)
    calls, build = counter()
    for _ in range(3):
        planned(win & pad, ("k",), build)
    assert len(calls) == 1
    planned(pad & win, ("k",), build)                                      # other order: another key
    assert len(calls) == 2 and plan_count(pad) == 2 and plan_count(win) == 0   # kept by the part with data


def test_a_tensor_edited_in_place_means_a_new_plan():
    ids = torch.tensor([0, 0, 1, 1])
    m = masks.documents(ids)
    calls, build = counter()
    planned(m, ("k",), build)
    ids[1] = 1                                                             # the mask's ids are a view of it
    planned(m, ("k",), build)
    planned(m, ("k",), build)
    assert len(calls) == 2


def test_inference_tensors_and_caching_off_are_never_kept():
    with torch.inference_mode():
        m = masks.documents(torch.tensor([0, 0, 1]))                       # no version counter to watch
    calls, build = counter()
    planned(m, ("k",), build)
    planned(m, ("k",), build)
    assert len(calls) == 2 and plan_count(m) == 0
    m = masks.causal()
    with caching(False):
        planned(m, ("off",), build)
        planned(m, ("off",), build)
    assert len(calls) == 4


def test_plans_are_bounded_and_go_with_their_parts():
    pad = masks.padding(torch.tensor([4]))
    calls, build = counter()
    for L in range(MAX_PLANS + 5):
        planned(pad, ("k", L), build)
    assert plan_count(pad) == MAX_PLANS
    planned(pad, ("k", 0), build)                                          # the oldest went first
    assert len(calls) == MAX_PLANS + 6
    window = masks.window(3, 0)
    planned(pad & window, ("and",), build)
    del window                                                             # a part that is gone...
    planned(pad, ("k", 1), build)                                          # ...its plan goes at the next build
    assert all(mask_plan._alive(kept) for kept, _ in getattr(pad, mask_plan._ATTR).values())


def test_a_plan_whose_part_died_is_not_read_for_a_new_part():
    """A recycled id must not find the dead part's plan: the entry's weak reference no longer matches."""
    pad = masks.padding(torch.tensor([4]))
    stamp = mask_plan._stamp([pad])
    kept = mask_plan._refs(stamp)
    assert mask_plan._same(kept, stamp)
    other = masks.padding(torch.tensor([4]))
    assert not mask_plan._same(kept, mask_plan._stamp([other]))


@pytest.mark.parametrize("backend", ["native", "tiled", "sparse", "auto"])
def test_every_layer_reads_the_plan_of_the_first(backend, monkeypatch):
    if backend != "auto" and backend not in al.available_backends():
        pytest.skip(f"{backend} is not available here")
    stack = EncoderStack(BlockConfig(d_model=32, n_heads=2), 6).eval()
    x = torch.randn(2, 40, 32)                                             # (B, n, C)
    ids = torch.tensor([[0] * 10 + [1] * 30, [0] * 25 + [1] * 15])
    DocumentMask = type(masks.documents(ids))
    seen = []
    for name in ("tile_kinds", "row_spans"):
        real = getattr(DocumentMask, name)
        monkeypatch.setattr(DocumentMask, name, lambda self, *a, _r=real, _n=name: seen.append(_n) or _r(self, *a))
    with torch.no_grad(), al.use_backend(backend):
        kept = stack(x, key_mask=masks.documents(ids))
        once = len(seen)
        with caching(False):
            fresh = stack(x, key_mask=masks.documents(ids))
    assert len(seen) - once == 6 * once                                    # fresh: every layer planned again
    assert once > 0 or backend == "auto"                  # auto may send so small a request to SDPA unplanned
    assert torch.equal(kept, fresh)


@pytest.mark.parametrize("backend", ["native", "tiled", "sparse"])
def test_outputs_follow_a_mask_edited_between_calls(backend):
    if backend not in al.available_backends():
        pytest.skip(f"{backend} is not available here")
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 64, 16, generator=g) for _ in range(3))
    ids = torch.tensor([0] * 20 + [1] * 44)
    m = masks.documents(ids)
    al.attention(q, k, v, mask=m, backend=backend)                        # planned
    ids[30:] = 2                                                          # the same mask object, new documents
    got = al.attention(q, k, v, mask=m, backend=backend)
    want = al.attention(q, k, v, mask=masks.documents(ids.clone()), backend="reference")
    torch.testing.assert_close(got, want)


def test_a_used_mask_still_pickles_and_copies_without_its_plans():
    import copy
    import pickle
    m = masks.causal() & masks.documents(torch.tensor([0, 0, 1, 1]))
    planned(m, ("k",), lambda: "plan")
    assert plan_count(m) == 1
    for twin in (pickle.loads(pickle.dumps(m)), copy.deepcopy(m)):          # copy.copy shares the parts
        assert plan_count(twin) == 0 and torch.equal(twin.dense(4, 4), m.dense(4, 4))


def test_the_sdpa_backend_densifies_a_mask_once_per_size():
    q, k, v = (torch.randn(1, 2, 20, 8) for _ in range(3))
    m = masks.documents(torch.tensor([0] * 8 + [1] * 12))
    a = al.attention(q, k, v, mask=m, backend="sdpa")
    assert plan_count(m) == 1
    torch.testing.assert_close(al.attention(q, k, v, mask=m, backend="sdpa"), a)
    torch.testing.assert_close(a, al.attention(q, k, v, mask=m, backend="reference"))
    assert plan_count(m) == 1


def _random_dense_problem(backend: str, g: torch.Generator, n: int, p: float):
    """q, k, v (1, 2, n, 16) and a (1, 1, n, n) bool mask masking a share ``p`` of the pairs at random (key 0 always
    allowed, so no row is empty), drawn from ``g``; skips where ``backend`` is not built here."""
    if backend != "auto" and backend not in al.available_backends():
        pytest.skip(f"{backend} is not available here")
    q, k, v = (torch.randn(1, 2, n, 16, generator=g) for _ in range(3))
    allowed = torch.rand(1, 1, n, n, generator=g) > p                  # (1, 1, n, n)
    allowed[..., 0] = True
    return q, k, v, allowed


@pytest.mark.parametrize("backend", ["native", "tiled", "sparse", "sdpa", "auto"])
def test_a_dense_mask_keeps_its_plans_across_calls(backend, monkeypatch):
    """``masks.dense(t)`` passed to every call plans once: the request keeps the mask object (moving it to q's
    device, where it already is, is the mask itself), for ``&`` with it too. An in-place edit of ``t`` is seen."""
    q, k, v, allowed = _random_dense_problem(backend, torch.Generator().manual_seed(0), n=96, p=0.3)
    m = masks.dense(allowed)
    assert m.to(q.device) is m and (masks.causal() & m).to(q.device).b is m
    DenseMask = type(m)
    seen = []
    for name in ("tile_kinds", "dense", "tile"):
        real = getattr(DenseMask, name)
        monkeypatch.setattr(DenseMask, name, lambda self, *a, _r=real, _n=name: seen.append(_n) or _r(self, *a))
    first = al.attention(q, k, v, mask=m, backend=backend)
    once = len(seen)
    al.attention(q, k, v, mask=m, backend=backend)
    again = len(seen)
    al.attention(q, k, v, mask=masks.causal() & m, backend=backend)
    both = len(seen)
    al.attention(q, k, v, mask=masks.causal() & m, backend=backend)       # a new & of the same parts shares
    if backend != "tiled":                              # the others keep their whole plan; tiled reads tiles as it runs
        assert once > 0 and again == once and len(seen) == both, seen
    assert plan_count(m) >= 1
    allowed[..., 40:] = False                                             # the user's tensor, edited in place
    got = al.attention(q, k, v, mask=m, backend=backend)
    want = al.attention(q, k, v, mask=masks.dense(allowed.clone()), backend="reference")
    torch.testing.assert_close(got, want)
    assert not torch.allclose(got, first)


@pytest.mark.parametrize("backend", ["native", "sdpa", "auto"])
def test_a_bool_tensor_passed_as_mask_plans_once(backend, monkeypatch):
    """``mask=t`` with a raw bool tensor, in every call, is one ``DenseMask`` per tensor object: planned on the
    first call only. An in-place edit, a ``set_`` to other memory, and a view are each seen (a new plan)."""
    g = torch.Generator().manual_seed(1)
    q, k, v, allowed = _random_dense_problem(backend, g, n=80, p=0.4)
    assert masks.dense(allowed) is masks.dense(allowed)
    DenseMask = type(masks.dense(allowed))
    seen = []
    real = DenseMask.dense
    monkeypatch.setattr(DenseMask, "dense", lambda self, *a: seen.append(1) or real(self, *a))
    first = al.attention(q, k, v, mask=allowed, backend=backend)
    once = len(seen)
    al.attention(q, k, v, mask=allowed, backend=backend)
    assert once > 0 and len(seen) == once, seen

    def want(t):
        return al.attention(q, k, v, mask=t.clone(), backend="reference")
    allowed[..., 30:] = False                                             # edited in place
    torch.testing.assert_close(al.attention(q, k, v, mask=allowed, backend=backend), want(allowed))
    other = torch.rand(1, 1, 80, 80, generator=g) > 0.7
    other[..., 1] = True
    allowed.set_(other)                                                   # the same object over other memory
    torch.testing.assert_close(al.attention(q, k, v, mask=allowed, backend=backend), want(other))
    assert not torch.allclose(al.attention(q, k, v, mask=allowed, backend=backend), first)
    view = other[:, :, :, :]                                              # a view: its own mask, the same values
    torch.testing.assert_close(al.attention(q, k, v, mask=view, backend=backend), want(other))


def test_a_wrapped_tensor_is_forgotten_with_the_tensor():
    """The table of wrapped tensors keeps no tensor alive: its entry goes when the caller's tensor does, and an
    id reused by a new tensor is a new mask."""
    from attnlab.functional import mask_plan as kept_module
    t = torch.ones(1, 1, 8, 8, dtype=torch.bool)
    m = masks.dense(t)
    key = (id(t), ("dense",))
    assert key in kept_module._KEPT
    del t
    assert key not in kept_module._KEPT
    assert m.allowed.all()                                                # the mask given out still holds its alias
    u = torch.zeros(1, 1, 8, 8, dtype=torch.bool)
    assert masks.dense(u) is not m and not masks.dense(u).allowed.any()


def test_a_value_read_from_a_tensor_is_kept_until_an_edit():
    """``kept_for(..., reads_values=True)``: the same value while the tensor is unchanged, a new one after an in-place
    edit; an inference tensor (no version counter) gets a new one every call."""
    from attnlab.functional.mask_plan import kept_for
    t = torch.tensor([True, False, True])
    first = kept_for(t, ("not",), torch.logical_not, reads_values=True)
    assert kept_for(t, ("not",), torch.logical_not, reads_values=True) is first
    assert kept_for(t, ("other",), torch.logical_not, reads_values=True) is not first       # per purpose
    t[1] = True
    again = kept_for(t, ("not",), torch.logical_not, reads_values=True)
    assert again is not first and not again.any()
    with torch.inference_mode():
        u = torch.tensor([True])
    assert kept_for(u, ("not",), torch.logical_not, reads_values=True) is not \
        kept_for(u, ("not",), torch.logical_not, reads_values=True)
