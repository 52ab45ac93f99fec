"""Ring attention (context parallelism) over torch.distributed: exact attention on a sequence
split across P ranks, each holding O(N / P) of it (Liu, Zaharia, Abbeel 2023, arXiv:2310.01889).

Every rank keeps its own queries. The key/value blocks travel around the ring (rank r sends to
r+1 and receives from r-1 with point-to-point isend/irecv); the transfer of the next block is
started before the current one is computed, so communication overlaps compute. Each block gives
a partial output and log-sum-exp that are merged with the LSE rule (REFERENCES.md section 2):

    lse = logaddexp(lse1, lse2);   o = exp(lse1 - lse) o1 + exp(lse2 - lse) o2

The backward pass (FlashAttention-2 style) keeps only q, k, v, the output and the final LSE: a
second ring pass recomputes each block's probabilities from the LSE, adds to the local dq, and
sends dk/dv accumulators around the ring with the k/v blocks (one step behind them, so that they
also overlap compute); after P hops each accumulator is back with the rank that owns its keys.

Causal attention uses GLOBAL positions (query position >= key position; L == S only: the
bottom-right alignment for L != S is not supported in ring mode). Each rank's shard is cut into
its layout's chunks (``ring_layout``); a (query chunk, key chunk) pair whose keys all lie in the
future of all its queries is skipped, and a pair wholly in the past needs no mask. With the
``zigzag`` layout this gives every rank the same work.

Every wait is bounded by the process group's timeout (``init_process_group(timeout=...)``): a
dead or stalled peer surfaces as an error on the others after at most that long, never a hang.
Not a registry backend: it needs a process group, which the backend signature has no place for.

Example (in each of P processes, after ``dist.init_process_group``):
    q_loc, k_loc, v_loc = (shard(t, rank, P, "zigzag", dim=2) for t in (q, k, v))
    out_loc = ring_attention(q_loc, k_loc, v_loc, causal=True)      # (B, H, N / P, Dv)
    out_loc.sum().backward()                                        # exact dq, dk, dv
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Optional

import torch
import torch.distributed as dist
from torch import Tensor

from .backends import native
from .backends.reference import accum_dtype
from .masks import causal as causal_mask, dense as dense_mask
from .ring_layout import check_layout, segments, shard, unshard

# Imported now, before any process group exists: its functions take `group=group.WORLD` as a default,
# evaluated when the module loads. torch._dynamo loads it on the first call of a torch.library custom op
# (the compiled kernel is one); loaded then, it would hold the default group forever, so
# destroy_process_group could not free it, and its gloo worker threads, still releasing the tensors of
# the last collective, abort the process at exit ("terminate called without an active exception").
# `import attnlab` imports this module, so this covers every group created after that import.
if dist.is_available():
    import torch.distributed.nn.functional

__all__ = ["ring_attention", "shard", "unshard"]

# Score elements (rows x keys x heads) computed at once inside a block: bounds the O(L * S / P^2)
# temporary of one block to ~16 MB in fp32 while keeping the matmuls large.
BLOCK_ELEMENTS = 1 << 22
_TAG_KV, _TAG_DKV = 0, 8            # p2p tags: the kv ring and the dk/dv ring are in flight together


# ----------------------------------------------------------------------------- block math

def _row_chunks(q5: Tensor, lk: int):
    """Row slices of a block so that one chunk's scores stay under BLOCK_ELEMENTS."""
    B, Hkv, G, lq, _ = q5.shape
    step = max(1, BLOCK_ELEMENTS // max(1, B * Hkv * G * lk))
    return [slice(r, min(r + step, lq)) for r in range(0, lq, step)]


def _rows(allowed: Optional[Tensor], rs: slice) -> Optional[Tensor]:
    """The rows rs of a (B|1, 1, 1, lq|1, lk) mask (a row-broadcast mask is shared)."""
    return allowed if allowed is None or allowed.shape[-2] == 1 else allowed[..., rs, :]


def _scores(q5: Tensor, k: Tensor, allowed: Optional[Tensor], scale: float) -> Tensor:
    """scale * q k^T, masked with -inf: (B, Hkv, G, lq, lk), in the accumulation dtype."""
    s = (q5 @ k.unsqueeze(2).transpose(-2, -1)) * scale              # (B, Hkv, G, lq, lk)
    return s if allowed is None else s.masked_fill(~allowed, float("-inf"))


def _native_mask(kp: Optional[Tensor], diagonal: bool):
    """The block's mask as the compiled kernel takes it: key padding (dense) & causal (structured)."""
    mask = None if kp is None else dense_mask(kp.bool()[:, None, None, :])     # (B, 1, 1, lk)
    if diagonal:
        mask = causal_mask() if mask is None else mask & causal_mask()
    return mask


def _use_native(q5: Tensor) -> bool:
    return native.why_unavailable() is None and q5.device.type == "cpu" and q5.dtype in (torch.float32, torch.float64)


def _block_forward(q5: Tensor, k: Tensor, v: Tensor, allowed: Optional[Tensor], scale: float, native_mask=None):
    """Attention of one query chunk over one key block: normalized (out, lse).

    q5: (B, Hkv, G, lq, D); k: (B, Hkv, lk, D); v: (B, Hkv, lk, Dv); allowed: bool
    (B|1, 1, 1, lq|1, lk) or None. Returns out (B, Hkv, G, lq, Dv) and lse (B, Hkv, G, lq);
    rows that see no key get out 0 and lse -inf. On the CPU the compiled kernel computes the
    block in one call (``native_mask``: the same mask as a structured mask); the loop below is
    the readable fallback.
    """
    if native_mask is not False and _use_native(q5):
        out, lse = native.native_forward(q5.flatten(1, 2), k, v, mask=native_mask, scale=scale)
        return out.unflatten(1, q5.shape[1:3]), lse.unflatten(1, q5.shape[1:3])
    outs, lses = [], []
    for rs in _row_chunks(q5, k.shape[2]):
        s = _scores(q5[..., rs, :], k, _rows(allowed, rs), scale)       # (B, Hkv, G, r, lk)
        m = s.amax(dim=-1, keepdim=True)
        m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))      # empty rows: subtract 0
        p = torch.exp(s - m)
        l = p.sum(dim=-1, keepdim=True)                                 # (B, Hkv, G, r, 1)
        o = (p @ v.unsqueeze(2)) / torch.where(l > 0, l, torch.ones_like(l))
        outs.append(o)                                                  # (B, Hkv, G, r, Dv)
        lses.append((m + torch.log(l)).squeeze(-1))                     # log 0 = -inf on empty rows
    return torch.cat(outs, dim=-2), torch.cat(lses, dim=-1)


def _merge(o1: Tensor, lse1: Tensor, o2: Tensor, lse2: Tensor):
    """Merge two partial results over disjoint key sets (REFERENCES.md section 2); -inf + -inf -> (0, -inf)."""
    lse = torch.logaddexp(lse1, lse2)
    ref = torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))
    w1, w2 = torch.exp(lse1 - ref), torch.exp(lse2 - ref)               # 0 for a -inf partial
    return w1.unsqueeze(-1) * o1 + w2.unsqueeze(-1) * o2, lse


def _block_backward(q5, k, v, do5, lse_inf, delta, allowed, scale, native_mask=None):
    """Gradient contributions of one (query chunk, key block) pair from the saved LSE.

    lse_inf: (B, Hkv, G, lq) final LSE with +inf on empty rows (their P is exactly 0);
    delta: rowsum(dO * O), same shape. Returns dq5 (B, Hkv, G, lq, D), dk (B, Hkv, lk, D),
    dv (B, Hkv, lk, Dv); dk and dv are summed over the G query heads sharing a kv head.
    On the CPU the compiled kernel's backward computes the block in one call.
    """
    if native_mask is not False and _use_native(q5):
        B, Hkv, G = q5.shape[:3]
        lse = torch.where(lse_inf == float("inf"), float("-inf"), lse_inf)   # the kernel's empty-row mark
        dq, dk, dv = native.native_block_backward(q5.flatten(1, 2), k, v, do5.flatten(1, 2), lse.flatten(1, 2),
                                                  delta.flatten(1, 2), mask=native_mask, scale=scale)
        return dq.unflatten(1, (Hkv, G)), dk, dv
    dq = torch.empty_like(q5)
    dk, dv = torch.zeros_like(k), torch.zeros_like(v)
    for rs in _row_chunks(q5, k.shape[2]):
        qr, dor = q5[..., rs, :], do5[..., rs, :]
        s = _scores(qr, k, _rows(allowed, rs), scale)                  # (B, Hkv, G, r, lk)
        p = torch.exp(s - lse_inf[..., rs].unsqueeze(-1))
        dv += torch.einsum("bhgrs,bhgrd->bhsd", p, dor)
        dp = dor @ v.unsqueeze(2).transpose(-2, -1)                     # (B, Hkv, G, r, lk)
        ds = p * (dp - delta[..., rs].unsqueeze(-1))
        dq[..., rs, :] = (ds @ k.unsqueeze(2)) * scale
        dk += torch.einsum("bhgrs,bhgrd->bhsd", ds, qr) * scale
    return dq, dk, dv


# ----------------------------------------------------------------------------- ring plumbing

class _Ring:
    """This rank's place in the ring: neighbours (as global ranks) and the tensor exchange."""

    def __init__(self, group):
        self.group = group
        self.rank = dist.get_rank(group)
        self.world = dist.get_world_size(group)
        glob = (lambda r: r) if group is None else (lambda r: dist.get_global_rank(group, r))
        self.next = glob((self.rank + 1) % self.world)
        self.prev = glob((self.rank - 1) % self.world)

    def exchange(self, tensors: list[Tensor], tag: int):
        """Send ``tensors`` to the next rank and receive same-shaped ones from the previous one.

        Returns a function that waits (bounded by the group's timeout) and gives the received list.
        """
        if self.world == 1:
            return lambda: tensors
        recv = [torch.empty_like(t) for t in tensors]
        works = []
        with self.guard(f"posting sends to rank {self.next} and receives from rank {self.prev}"):
            for i, (t, r) in enumerate(zip(tensors, recv)):
                works.append(dist.irecv(r, src=self.prev, group=self.group, tag=tag + i))
                works.append(dist.isend(t, dst=self.next, group=self.group, tag=tag + i))

        def wait() -> list[Tensor]:
            with self.guard(f"exchanging blocks with ranks {self.prev} (from) and {self.next} (to)"):
                for w in works:
                    w.wait()
            return recv
        return wait

    @contextmanager
    def guard(self, what: str):
        """Re-raise a communication failure (dead peer, timeout) as an error that says where it happened."""
        try:
            yield
        except RuntimeError as e:                                      # DistBackendError is a RuntimeError
            raise RuntimeError(f"ring_attention: rank {self.rank} of {self.world} failed while {what}: {e}. "
                               "A peer died or stalled; every wait is bounded by the process group's timeout "
                               "(init_process_group(timeout=...))") from e


def _pairs(rank: int, src: int, world: int, n: int, layout: str, causal: bool):
    """The (query slice, key slice, causal?) pairs of local queries vs the block from ``src``.

    Non-causal: one pair of whole shards. Causal: every (query chunk, key chunk) pair of the layout,
    minus those whose keys all come after all their queries; ``causal?`` is False when every key
    is at or before every query (no mask needed).
    """
    if not causal:
        return [(slice(None), slice(None), False)]
    out, qo = [], 0
    for qs, qc in segments(rank, world, n, layout):
        ko = 0
        for ks, kc in segments(src, world, n, layout):
            if ks <= qs + qc - 1:                                      # some key is not in the future
                out.append((slice(qo, qo + qc), slice(ko, ko + kc), ks + kc - 1 > qs))
            ko += kc
        qo += qc
    return out


def _allowed(kp: Optional[Tensor], ks: slice, lq: int, lk: int, diagonal: bool, device) -> Optional[Tensor]:
    """The (B|1, 1, 1, lq|1, lk) mask of one pair: key padding and, on the diagonal, causality."""
    mask = None
    if kp is not None:
        mask = kp[:, ks].bool()[:, None, None, None, :]                  # (B, 1, 1, 1, lk)
    if diagonal:                                                       # equal-length aligned chunks
        tri = torch.ones(lq, lk, dtype=torch.bool, device=device).tril()  # (lq, lk)
        mask = tri if mask is None else mask & tri
    return mask


# ----------------------------------------------------------------------------- autograd

class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, kp, ring, causal, scale, layout):
        B, H, Ln, D = q.shape
        Hkv, Dv = k.shape[1], v.shape[3]
        acc = accum_dtype(q.dtype)
        q5 = q.detach().to(acc).unflatten(1, (Hkv, H // Hkv))         # (B, Hkv, G, Ln, D)
        out = q5.new_zeros(*q5.shape[:-1], Dv)                          # (B, Hkv, G, Ln, Dv)
        lse = q5.new_full(q5.shape[:-1], float("-inf"))                 # (B, Hkv, G, Ln)
        n = Ln * ring.world
        block = [k.detach().to(acc).contiguous(), v.detach().to(acc).contiguous()]
        block += [] if kp is None else [kp]
        for t in range(ring.world):
            src = (ring.rank - t) % ring.world
            pending = ring.exchange(block, _TAG_KV) if t < ring.world - 1 else None  # overlap: start next
            kb, vb = block[0], block[1]
            kpb = block[2] if kp is not None else None
            for qs, ks, diag in _pairs(ring.rank, src, ring.world, n, layout, causal):
                qc = q5[..., qs, :]
                allowed = _allowed(kpb, ks, qc.shape[-2], kb[:, :, ks].shape[2], diag, q.device)
                nm = _native_mask(None if kpb is None else kpb[:, ks], diag)
                o2, l2 = _block_forward(qc, kb[:, :, ks], vb[:, :, ks], allowed, scale, nm)
                out[..., qs, :], lse[..., qs] = _merge(out[..., qs, :], lse[..., qs], o2, l2)
            if pending is not None:
                block = pending()
        result = out.flatten(1, 2).to(q.dtype)                          # (B, H, Ln, Dv)
        ctx.save_for_backward(q, k, v, kp, result, lse)
        ctx.cfg = (ring, causal, scale, layout)
        return result

    @staticmethod
    def backward(ctx, dout):
        q, k, v, kp, out, lse = ctx.saved_tensors
        ring, causal, scale, layout = ctx.cfg
        B, H, Ln, D = q.shape
        Hkv = k.shape[1]
        acc = accum_dtype(q.dtype)
        q5 = q.to(acc).unflatten(1, (Hkv, H // Hkv))                    # (B, Hkv, G, Ln, D)
        do5 = dout.to(acc).unflatten(1, (Hkv, H // Hkv))                # (B, Hkv, G, Ln, Dv)
        delta = (do5 * out.to(acc).unflatten(1, (Hkv, H // Hkv))).sum(-1)  # (B, Hkv, G, Ln)
        lse_inf = torch.where(lse == float("-inf"), float("inf"), lse)   # empty rows: P = 0
        dq = torch.zeros_like(q5)
        n = Ln * ring.world
        block = [k.to(acc).contiguous(), v.to(acc).contiguous()] + ([] if kp is None else [kp])
        dkv_pending = None
        for t in range(ring.world):
            src = (ring.rank - t) % ring.world
            kv_pending = ring.exchange(block, _TAG_KV) if t < ring.world - 1 else None
            kb, vb = block[0], block[1]
            kpb = block[2] if kp is not None else None
            dk, dv = torch.zeros_like(kb), torch.zeros_like(vb)
            for qs, ks, diag in _pairs(ring.rank, src, ring.world, n, layout, causal):
                allowed = _allowed(kpb, ks, q5[..., qs, :].shape[-2], kb[:, :, ks].shape[2], diag, q.device)
                nm = _native_mask(None if kpb is None else kpb[:, ks], diag)
                dq_c, dk_c, dv_c = _block_backward(q5[..., qs, :], kb[:, :, ks], vb[:, :, ks], do5[..., qs, :],
                                                   lse_inf[..., qs], delta[..., qs], allowed, scale, nm)
                dq[..., qs, :] += dq_c
                dk[:, :, ks] += dk_c
                dv[:, :, ks] += dv_c
            if dkv_pending is not None:                                # this block's accumulator, from r-1
                dk_in, dv_in = dkv_pending()
                dk, dv = dk + dk_in, dv + dv_in
            # After the last step the hop to r+1 returns each accumulator to the rank owning its keys.
            dkv_pending = ring.exchange([dk, dv], _TAG_DKV)
            if kv_pending is not None:
                block = kv_pending()
        dk, dv = dkv_pending()
        return (dq.flatten(1, 2).to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None, None, None, None)


# ----------------------------------------------------------------------------- public function

def _check(q: Tensor, k: Tensor, v: Tensor, key_padding: Optional[Tensor], causal: bool, ring: _Ring) -> None:
    """Local shape checks, then one all_gather so every rank sees the same shapes (or all raise)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 4:
            raise ValueError(f"ring_attention: {name} must be 4-D (B, heads, length, dim); got shape {tuple(t.shape)}")
    B, H, Ln, D = q.shape
    Hkv, Sn = k.shape[1], k.shape[2]
    if k.shape[0] != B or v.shape[:3] != k.shape[:3] or k.shape[3] != D:
        raise ValueError(f"ring_attention: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} do not fit "
                         "(B, H, L, D), (B, Hkv, S, D), (B, Hkv, S, Dv)")
    if H % Hkv != 0:
        raise ValueError(f"k has {Hkv} heads, q has {H}: q heads must be a multiple of k heads")
    if causal and Ln != Sn:
        raise ValueError(f"ring_attention: causal needs as many query as key positions per rank (L == S); got "
                         f"L={Ln}, S={Sn}. Bottom-right aligned causal with L != S is not supported in ring mode")
    if key_padding is not None and (key_padding.dtype != torch.bool or tuple(key_padding.shape) != (B, Sn)):
        raise ValueError(f"ring_attention: key_padding must be a bool (B, S) = ({B}, {Sn}) tensor of this rank's "
                         f"keys (True = real key); got {key_padding.dtype} {tuple(key_padding.shape)}")
    if ring.world == 1:
        return
    mine = torch.tensor([B, H, Hkv, Ln, Sn, D, v.shape[3], key_padding is not None], dtype=torch.int64)
    every = [torch.empty_like(mine) for _ in range(ring.world)]
    with ring.guard("checking shapes with the other ranks"):
        dist.all_gather(every, mine, group=ring.group)                 # bounded by the group's timeout
    bad = [r for r, e in enumerate(every) if not torch.equal(e, mine)]
    if bad:
        lens = [int(e[3]) for e in every]
        raise ValueError(f"ring_attention: ranks disagree on shapes (B, H, Hkv, L, S, D, Dv, has key_padding): "
                         f"this rank {mine.tolist()}, rank {bad[0]} {every[bad[0]].tolist()}; query lengths per rank "
                         f"{lens} (N={sum(lens)}, P={ring.world}). Every rank must hold an equal shard: use "
                         f"ring_layout.shard, padding N to a multiple of the layout's chunk count")


def ring_attention(q: Tensor, k: Tensor, v: Tensor, *, group=None, causal: bool = False,
                   key_padding: Optional[Tensor] = None, scale: Optional[float] = None,
                   layout: str = "zigzag") -> Tensor:
    """Exact attention over a sequence sharded across the ranks of ``group`` (differentiable).

    Args:
        q: (B, H, Ln, D), this rank's queries; k: (B, Hkv, Sn, D); v: (B, Hkv, Sn, Dv), this rank's
            keys/values (H % Hkv == 0: query head h uses kv head h // (H / Hkv)). Every rank holds
            an equal shard, cut from the global sequence with ``shard(x, rank, P, layout, dim=2)``.
        group: the process group (None: the default group); its timeout bounds every wait.
        causal: query at global position i sees keys at global positions j <= i (needs Ln == Sn).
        key_padding: (B, Sn) bool, True = real key; this rank's shard of a (B, N) global padding,
            cut with the same layout. Rows that see no key give 0.
        scale: score scale, default D ** -0.5.
        layout: "zigzag" (balanced causal work; N % 2P == 0) or "contiguous" (N % P == 0).
    Returns:
        (B, H, Ln, Dv) in q's dtype: this rank's rows of the global attention output
        (``unshard`` of all ranks' outputs is the single-process result).
    Example:
        k_loc = shard(k, rank, world, "zigzag", dim=2)           # likewise q, v
        out = ring_attention(q_loc, k_loc, v_loc, causal=True)   # (B, H, N / P, Dv)
    """
    check_layout(layout)
    if not dist.is_available() or not dist.is_initialized():
        raise ValueError("ring_attention needs an initialized process group: call "
                         "torch.distributed.init_process_group(...) first (gloo on CPU, nccl on GPU)")
    ring = _Ring(group)
    _check(q, k, v, key_padding, causal, ring)
    if causal and layout == "zigzag":
        segments(ring.rank, ring.world, q.shape[2] * ring.world, layout)  # N % 2P == 0, else a clear ValueError
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    kp = None if key_padding is None else key_padding.to(torch.uint8).contiguous()  # bool does not travel on gloo
    return _RingAttention.apply(q, k, v, kp, ring, causal, scale, layout)
