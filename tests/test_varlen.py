"""Per-sequence alignment (issue #17): left padding, padded batches and packed (cu_seqlens) sequences.

The conformance oracle is written independently of attnlab's masks, after flash-attention's test
reference (``attention_ref``, ``construct_local_mask``, ``attn_bias_from_alibi`` in
tests/test_flash_attn.py): every sequence is cut out of the batch and attended on its own, with
causal / window / ALiBi aligned to *that sequence's* lengths; rows outside every sequence are 0.
"""
import pytest
import torch

from attnlab.functional import attention, masks
from attnlab.positional.alibi import AlibiBias

from helpers import FLOOR

BACKENDS = ["reference", "tiled", "sparse", "sdpa"]


def local_mask(sq, sk, window, causal):
    """flash-attention's construct_local_mask for one sequence: True = masked out."""
    left, right = window
    if causal:
        right = 0
    row = torch.arange(sq)[:, None]
    col = torch.arange(sk)[None, :]
    masked = torch.zeros(sq, sk, dtype=torch.bool)
    if right is not None:
        masked |= col > row + sk - sq + right
    if left is not None:
        masked |= col < row + sk - sq - left
    return masked


def alibi_bias(slopes, sq, sk, causal):
    """flash-attention's attn_bias_from_alibi for one sequence: (H, sq, sk)."""
    s = slopes[:, None, None]
    if causal:
        return torch.arange(-sk + 1, 1, dtype=slopes.dtype) * s
    row = torch.arange(sq)[:, None]
    col = torch.arange(sk)[None, :]
    return -s * (row + sk - sq - col).abs().to(slopes.dtype)


def sequence_ref(q, k, v, qrows, kcols, *, causal=False, window=(None, None), slopes=None, softcap=None):
    """One example's attention, sequence by sequence: q (H, L, D), k/v (H, S, D); qrows/kcols a list of
    (start, end) per sequence. Rows outside every sequence give 0."""
    out = torch.zeros(q.shape[0], q.shape[1], v.shape[-1], dtype=q.dtype)
    for (q0, q1), (k0, k1) in zip(qrows, kcols):
        sq, sk = q1 - q0, k1 - k0
        if sq == 0:
            continue
        s = torch.einsum("hid,hjd->hij", q[:, q0:q1], k[:, k0:k1]) / q.shape[-1] ** 0.5
        if softcap is not None:
            s = torch.tanh(s / softcap) * softcap
        if slopes is not None:
            s = s + alibi_bias(slopes, sq, sk, causal)
        m = local_mask(sq, sk, window, causal)
        s = s.masked_fill(m, float("-inf"))
        p = torch.softmax(s, -1).nan_to_num(0.0)                       # rows with no key: 0
        out[:, q0:q1] = p @ v[:, k0:k1]
    return out


def check(backend, q, k, v, mask, bias, want, dtype=torch.float64):
    ins = [t.to(dtype) for t in (q, k, v)]
    out = attention(*ins, mask=mask, bias=bias, backend=backend)
    tol = 1e-10 if dtype == torch.float64 else 1e-5
    assert (out.double() - want).abs().max().item() <= tol, backend


def rand(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("causal, window", [(True, (None, None)), (False, (3, 2)), (True, (4, None)),
                                            (False, (None, None))])
@pytest.mark.parametrize("alibi", [False, True])
def test_packed_varlen_equals_per_sequence_reference(backend, causal, window, alibi):
    # 3 sequences, queries shorter than keys in one of them, one with no queries; 3 trailing padded rows
    cu_q, cu_k = [0, 7, 7, 19], [0, 11, 14, 26]
    H, L, S, D = 2, 22, 28, 8
    q, k, v = rand(1, H, L, D, seed=1), rand(1, H, S, D, seed=2), rand(1, H, S, D, seed=3)
    slopes = torch.tensor([0.5, 0.25], dtype=torch.float64) if alibi else None
    m = masks.varlen(torch.tensor(cu_q), torch.tensor(cu_k), causal=causal, window=window)
    bias = masks.aligned(AlibiBias(slopes), m) if alibi else None
    seqs = list(zip(cu_q[:-1], cu_q[1:])), list(zip(cu_k[:-1], cu_k[1:]))
    want = sequence_ref(q[0], k[0], v[0], *seqs, causal=causal, window=window, slopes=slopes)[None]
    check(backend, q, k, v, m, bias, want)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("causal, window", [(True, (None, None)), (False, (2, 1))])
def test_padded_batch_equals_per_sequence_reference(backend, side, causal, window):
    lq, lk = [9, 4, 0], [12, 6, 3]
    B, H, L, S, D = 3, 2, 9, 12, 8
    q, k, v = rand(B, H, L, D, seed=4), rand(B, H, S, D, seed=5), rand(B, H, S, D, seed=6)
    slopes = torch.tensor([0.3, 0.7], dtype=torch.float64)
    m = masks.padded(torch.tensor(lq), torch.tensor(lk), side=side, causal=causal, window=window)
    bias = masks.aligned(AlibiBias(slopes), m)
    want = torch.stack([
        sequence_ref(q[b], k[b], v[b], [(0, lq[b]) if side == "right" else (L - lq[b], L)],
                     [(0, lk[b]) if side == "right" else (S - lk[b], S)], causal=causal, window=window,
                     slopes=slopes) for b in range(B)])
    check(backend, q, k, v, m, bias, want)


def flash_attention_ref(q, k, v, query_padding_mask, key_padding_mask, causal, window, slopes):
    """flash-attention's attention_ref on a right-padded batch (its tensor form, not per sequence):
    q (B, H, L, D), masks (B, L) / (B, S) bool, True = real token."""
    B, H, L, D = q.shape
    S = k.shape[2]
    s = torch.einsum("bhid,bhjd->bhij", q / D ** 0.5, k)
    sk = key_padding_mask.sum(-1).view(B, 1, 1, 1)
    sq = query_padding_mask.sum(-1).view(B, 1, 1, 1)
    row, col = torch.arange(L).view(L, 1), torch.arange(S)
    left, right = window[0], (0 if causal else window[1])
    local = torch.zeros(B, 1, L, S, dtype=torch.bool)
    if right is not None:
        local |= col > torch.minimum(row + sk - sq + right, sk)
    if left is not None:
        local |= col < row + sk - sq - left
    bias = -slopes.view(1, H, 1, 1) * (row + sk - sq - col).abs()         # non-causal ALiBi
    s = s.masked_fill(~key_padding_mask.view(B, 1, 1, S), float("-inf")).masked_fill(local, float("-inf")) + bias
    p = torch.softmax(s, -1).masked_fill(local.all(-1, keepdim=True), 0.0).nan_to_num(0.0)
    p = p.masked_fill(~query_padding_mask.view(B, 1, L, 1), 0.0)
    return p @ v


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("causal, window", [(True, (None, None)), (False, (3, 3)), (False, (None, None))])
def test_padded_right_equals_flash_attention_ref(backend, causal, window):
    lq, lk = torch.tensor([10, 3]), torch.tensor([13, 7])
    B, H, L, S, D = 2, 2, 10, 13, 4
    q, k, v = rand(B, H, L, D, seed=7), rand(B, H, S, D, seed=8), rand(B, H, S, D, seed=9)
    slopes = torch.tensor([0.4, 0.9], dtype=torch.float64)
    qpm, kpm = torch.arange(L) < lq[:, None], torch.arange(S) < lk[:, None]
    want = flash_attention_ref(q, k, v, qpm, kpm, causal, window, slopes)
    m = masks.padded(lq, lk, causal=causal, window=window)
    check(backend, q, k, v, m, masks.aligned(AlibiBias(slopes), m), want)


@pytest.mark.parametrize("backend", ["tiled", "sparse"])
def test_varlen_skips_other_sequences_tiles(backend):
    """Packed documents: tiles between different sequences are EMPTY and never computed."""
    from attnlab.functional.backends.sparse import SparseStats, sparse_attention
    from attnlab.functional.backends.tiled import TileStats, tiled_attention
    cu = torch.tensor([0, 64, 128, 256])
    m = masks.varlen(cu, causal=True)
    q = k = v = rand(1, 1, 256, 8).float()
    stats = TileStats() if backend == "tiled" else SparseStats()
    fn = tiled_attention if backend == "tiled" else sparse_attention
    fn(q, k, v, mask=m, scale=0.3, tile_q=64, tile_k=64, stats=stats)
    kinds = m.tile_kinds(256, 256, 64, 64)[0]
    # documents [0, 64), [64, 128), [128, 256): tiles (0,0), (1,1), (2,2), (3,2), (3,3) are the only work
    assert (kinds != masks.EMPTY).nonzero().tolist() == [[0, 0], [1, 1], [2, 2], [3, 2], [3, 3]]
    computed = stats.tiles_total - stats.tiles_skipped if backend == "tiled" else stats.blocks_computed
    assert computed == int((kinds != masks.EMPTY).sum())


@pytest.mark.parametrize("backend", ["reference", "tiled", "sparse"])
def test_fp32_left_padding_with_grads_matches_gold(backend):
    """fp32 forward and backward under left padding + causal: within 2x (3x for grads) the fp32 reference error."""
    from helpers import errors
    from attnlab.functional.registry import get_backend
    q, k, v = rand(2, 4, 20, 8, seed=11).float(), rand(2, 2, 20, 8, seed=12).float(), rand(2, 2, 20, 8, seed=13).float()
    m = masks.padded(torch.tensor([20, 7]), side="left", causal=True)
    fn = get_backend(backend).fn
    for name, (cand, ref) in errors(fn, q, k, v, None, m).items():
        assert cand <= (2 if name == "out" else 3) * ref + FLOOR[torch.float32], name
