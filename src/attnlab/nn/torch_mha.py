"""``MultiheadAttention``: a drop-in for ``torch.nn.MultiheadAttention``, computed by ``attnlab.attention``.

Same constructor, forward signature, parameter names, shapes and initialization as torch 2.13's
module, so ``load_state_dict`` works both ways. Torch's masks are translated once into this
project's conventions: a bool ``attn_mask`` / ``key_padding_mask`` (True = NOT allowed) becomes
``mask = ~m`` (True = may attend); a float one becomes an additive ``bias``.
"""
from __future__ import annotations

import warnings
from typing import Optional

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn
from torch.nn.modules.linear import NonDynamicallyQuantizableLinear

from ..functional import attention, available_backends
from ..functional.dropout import keep_mask, new_seed
from ..functional.mask_plan import kept_for

__all__ = ["MultiheadAttention"]

# Backends whose dropout keep mask is the counter-based hash of (seed, b, h, i, j), so the
# post-dropout weights can be rebuilt exactly; SDPA draws from torch's own stream.
_HASH_DROPOUT_BACKENDS = ("reference", "tiled")


def _check_mask(name: str, m: Optional[Tensor], shapes: dict[tuple, str], dtype: torch.dtype) -> None:
    """Raise TypeError/ValueError unless ``m`` is None or a bool/``dtype`` tensor of one of ``shapes``."""
    if m is None:
        return
    if not isinstance(m, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor or None, got {type(m).__name__}")
    if m.dtype != torch.bool and not m.dtype.is_floating_point:
        raise TypeError(f"{name} has dtype {m.dtype}; use a bool mask (True = NOT allowed) or a float "
                        f"mask added to the scores")
    if m.dtype.is_floating_point and m.dtype != dtype:
        raise TypeError(f"{name} is a {m.dtype} float mask but the query is {dtype}: cast it with "
                        f"{name}.to({dtype})")
    if tuple(m.shape) not in shapes:
        want = " or ".join(f"{s} = {what}" for s, what in shapes.items())
        raise ValueError(f"{name} has shape {tuple(m.shape)}; expected {want}")


def _linear(x: Tensor, w: Tensor, b: Optional[Tensor]) -> Tensor:
    """``F.linear``, but a bias of another dtype is added with type promotion, as torch's module
    does (its projection of a batch-first input is a matmul plus the bias, which promotes; fused
    ``addmm`` would refuse the mix)."""
    if b is None or b.dtype == x.dtype:
        return F.linear(x, w, b)
    return F.linear(x, w) + b


def _peek_dropout_seed() -> int:
    """The seed ``attention()`` will draw next (its first draw from the default generator), without
    consuming it. A test checks the post-dropout weights rebuilt from it against the output."""
    dev = torch.get_default_device()
    devices = [dev.index if dev.index is not None else torch.cuda.current_device()] if dev.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        return new_seed()


class MultiheadAttention(nn.Module):
    """Multi-head attention with exactly the interface of ``torch.nn.MultiheadAttention`` (torch 2.13).

    ``out = concat_h(softmax(q_h k_h^T / sqrt(E / num_heads) + masks) v_h) W_out^T + b_out``

    Args (as torch's):
        embed_dim: E, width of the query and of the output. Must be divisible by ``num_heads``.
        num_heads: h; each head has width E / h.
        dropout: probability of dropping an attention weight, in training only.
        bias: biases on the input and output projections.
        add_bias_kv: learnable ``bias_k``, ``bias_v`` (1, 1, E) appended to the projected keys/values.
        add_zero_attn: append a zero key and value (after the head split); every row then has a key.
        kdim, vdim: widths of key and value inputs (None = E). If either differs from E, the
            projections are ``q_proj_weight`` (E, E), ``k_proj_weight`` (E, kdim), ``v_proj_weight``
            (E, vdim) instead of the packed ``in_proj_weight`` (3E, E).
        batch_first: inputs and output are (N, L, E) instead of (L, N, E).
        device, dtype: of the parameters.
        backend: (keyword-only, attnlab's addition) "auto" or a name from
            ``attnlab.available_backends()``. With ``need_weights=True``, "auto" runs the
            "reference" backend, whose weights carry gradients (torch's slow path materializes
            the (N, h, L, S) weights too).

    forward(query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
    average_attn_weights=True, is_causal=False):
        query (L, N, E) / (N, L, E) with batch_first / (L, E) unbatched; key (S, N, kdim), value
        (S, N, vdim) likewise. key_padding_mask (N, S) ((S,) unbatched) and attn_mask (L, S) or
        (N * h, L, S) (entry n * h + head), bool (True = NOT allowed) or float (added to the
        scores, in the query's dtype). is_causal is torch's hint: it needs attn_mask (ValueError
        without one); with no key_padding_mask and need_weights=False, attn_mask is ignored and a
        top-left causal mask (query i sees keys j <= i, over keys including bias_k and the zero
        key) is used, as torch does; otherwise attn_mask is used and the hint ignored.
    Returns:
        (attn_output, attn_weights): attn_output with the query's layout and width E;
        attn_weights (N, L, S') averaged over heads, or (N, h, L, S') with
        average_attn_weights=False ((L, S') / (h, L, S') unbatched), S' counting bias_k and the
        zero key; None when need_weights=False.

    Inside torch's Transformer layers: ``nn.TransformerEncoderLayer`` / ``TransformerEncoder`` in
    eval mode without grad (batch_first, even num_heads, ...) skip ``self_attn.forward`` and run
    torch's fused C++ layer on this module's parameters, with ``merge_masks`` (provided, torch's
    values): the attention is then torch's, as it would be for torch's own module. Call
    ``torch.backends.mha.set_fastpath_enabled(False)`` to have attnlab compute it there too.
    A bias of another dtype than the input (a half ``in_proj_bias`` with double inputs) is added
    with type promotion, as torch's module does.

    Differences from torch (deliberate):
        * A query row with no allowed key gives attention output 0 and weights 0 (so the module
          returns ``out_proj.bias`` for that row), with finite gradients; torch returns NaN.
        * In training with dropout, the returned weights are post-dropout (as torch's), rebuilt
          from the same keep mask as the output, on the "reference" and "tiled" backends. With
          any other named backend (e.g. "sdpa", whose dropout draw cannot be recovered) they are
          the pre-dropout probabilities. Only the "reference" backend's weights carry gradients.
        * Bad input raises ValueError/TypeError naming the values (torch raises AssertionError or
          RuntimeError); ``dropout`` must lie in [0, 1).
    Example:
        mha = MultiheadAttention(64, 8, batch_first=True)
        mha.load_state_dict(torch.nn.MultiheadAttention(64, 8, batch_first=True).state_dict())
        out, w = mha(x, x, x, key_padding_mask=pad)      # x: (N, L, 64), pad: (N, L) bool
    """

    def __init__(self, embed_dim, num_heads, dropout=0.0, bias=True, add_bias_kv=False, add_zero_attn=False,
                 kdim=None, vdim=None, batch_first=False, device=None, dtype=None, *, backend: str = "auto"):
        for name, val in (("embed_dim", embed_dim), ("num_heads", num_heads)):
            if isinstance(val, bool) or not isinstance(val, int) or val <= 0:
                raise ValueError(f"{name} must be a positive int, got {val!r}")
        if embed_dim % num_heads != 0:
            divisors = [d for d in range(1, embed_dim + 1) if embed_dim % d == 0]
            raise ValueError(f"embed_dim={embed_dim} is not divisible by num_heads={num_heads}; "
                             f"choose num_heads among {divisors[:12]}{' ...' if len(divisors) > 12 else ''}")
        if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout={dropout!r} must be a probability in [0, 1)")
        if backend != "auto" and backend not in available_backends():
            raise ValueError(f"unknown backend {backend!r}; choose 'auto' or one of {available_backends()}")
        factory = {"device": device, "dtype": dtype}
        super().__init__()
        self.embed_dim = embed_dim
        self.kdim = kdim if kdim is not None else embed_dim
        self.vdim = vdim if vdim is not None else embed_dim
        self._qkv_same_embed_dim = self.kdim == embed_dim and self.vdim == embed_dim
        self.num_heads = num_heads
        self.dropout = dropout
        self.batch_first = batch_first
        self.head_dim = embed_dim // num_heads
        self.backend = backend
        # Parameters are created in torch's order, so the same seed gives the same initial values.
        if self._qkv_same_embed_dim:
            self.in_proj_weight = nn.Parameter(torch.empty((3 * embed_dim, embed_dim), **factory))
            self.register_parameter("q_proj_weight", None)
            self.register_parameter("k_proj_weight", None)
            self.register_parameter("v_proj_weight", None)
        else:
            self.q_proj_weight = nn.Parameter(torch.empty((embed_dim, embed_dim), **factory))
            self.k_proj_weight = nn.Parameter(torch.empty((embed_dim, self.kdim), **factory))
            self.v_proj_weight = nn.Parameter(torch.empty((embed_dim, self.vdim), **factory))
            self.register_parameter("in_proj_weight", None)
        if bias:
            self.in_proj_bias = nn.Parameter(torch.empty(3 * embed_dim, **factory))
        else:
            self.register_parameter("in_proj_bias", None)
        # torch's exact type: quantization tooling leaves this Linear alone, as it does in torch.
        self.out_proj = NonDynamicallyQuantizableLinear(embed_dim, embed_dim, bias=bias, **factory)
        if add_bias_kv:
            self.bias_k = nn.Parameter(torch.empty((1, 1, embed_dim), **factory))
            self.bias_v = nn.Parameter(torch.empty((1, 1, embed_dim), **factory))
        else:
            self.bias_k = self.bias_v = None
        self.add_zero_attn = add_zero_attn
        self._reset_parameters()

    def _reset_parameters(self) -> None:
        """torch's init: xavier_uniform projections, zero biases, xavier_normal bias_k / bias_v."""
        if self._qkv_same_embed_dim:
            nn.init.xavier_uniform_(self.in_proj_weight)
        else:
            for w in (self.q_proj_weight, self.k_proj_weight, self.v_proj_weight):
                nn.init.xavier_uniform_(w)
        if self.in_proj_bias is not None:
            nn.init.constant_(self.in_proj_bias, 0.0)
            nn.init.constant_(self.out_proj.bias, 0.0)
        if self.bias_k is not None:
            nn.init.xavier_normal_(self.bias_k)
            nn.init.xavier_normal_(self.bias_v)

    # --- input checks -------------------------------------------------------------------------

    def _check_inputs(self, query, key, value) -> bool:
        """Validate query/key/value; return whether they are batched (3-D)."""
        for name, t in (("query", query), ("key", key), ("value", value)):
            if not isinstance(t, Tensor):
                raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
            if t.is_nested:
                raise TypeError(f"{name} is a nested tensor: attnlab's MultiheadAttention takes padded tensors; "
                                f"pad it (t.to_padded_tensor(0.0)) and pass key_padding_mask")
        if query.dim() not in (2, 3):
            raise ValueError(f"query has {query.dim()} dims {tuple(query.shape)}; expected (L, N, E) / (N, L, E) "
                             f"batched or (L, E) unbatched")
        if key.dim() != query.dim() or value.dim() != query.dim():
            raise ValueError(f"query is {query.dim()}-D but key is {key.dim()}-D and value {value.dim()}-D: "
                             f"all three must be batched (3-D) or all unbatched (2-D)")
        for name, t, width, arg in (("query", query, self.embed_dim, "embed_dim"), ("key", key, self.kdim, "kdim"),
                                    ("value", value, self.vdim, "vdim")):
            if t.shape[-1] != width:
                raise ValueError(f"{name} has width {t.shape[-1]} {tuple(t.shape)} but the module was built with "
                                 f"{arg}={width}")
        p = self.out_proj.weight
        for name, t in (("query", query), ("key", key), ("value", value)):
            if t.dtype != p.dtype:
                raise TypeError(f"{name} has dtype {t.dtype} but the parameters are {p.dtype}: cast the input or "
                                f"the module (module.to({t.dtype}))")
        seq = 0 if (query.dim() == 2 or not self.batch_first) else 1
        if key.shape[seq] != value.shape[seq]:
            raise ValueError(f"key has {key.shape[seq]} positions but value has {value.shape[seq]}: one value per key")
        if query.dim() == 3:
            n = 1 - seq
            if not query.shape[n] == key.shape[n] == value.shape[n]:
                raise ValueError(f"batch sizes differ: query {query.shape[n]}, key {key.shape[n]}, "
                                 f"value {value.shape[n]} (batch_first={self.batch_first})")
        return query.dim() == 3

    # --- forward ------------------------------------------------------------------------------

    def _project(self, query: Tensor, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(N, L, E), (N, S, kdim), (N, S, vdim) -> q (N, L, E), k (N, S, E), v (N, S, E)."""
        E = self.embed_dim
        if self._qkv_same_embed_dim:
            w_q, w_k, w_v = self.in_proj_weight.split(E)
        else:
            w_q, w_k, w_v = self.q_proj_weight, self.k_proj_weight, self.v_proj_weight
        b_q = b_k = b_v = None
        if self.in_proj_bias is not None:
            b_q, b_k, b_v = self.in_proj_bias.split(E)
        return _linear(query, w_q, b_q), _linear(key, w_k, b_k), _linear(value, w_v, b_v)

    def _masks(self, key_padding_mask, attn_mask, N: int, L: int, S: int, extra: int):
        """Torch's two masks -> (mask, bias) in attnlab's terms, padded by ``extra`` allowed keys.

        mask: bool (N|1, h|1, L, S + extra), True = may attend, or None; bias: float, same shape, or None.
        """
        h = self.num_heads
        given = []
        if key_padding_mask is not None:
            given.append((key_padding_mask, (N, 1, 1, S)))
        if attn_mask is not None:
            given.append((attn_mask, (1, 1, L, S) if attn_mask.dim() == 2 else (N, h, L, S)))   # (N|1, h|1, L, S)
        mask = bias = None
        for m, shape in given:
            if m.dtype == torch.bool:
                # kept per tensor object: a caller passing one mask tensor to every call hands attention the
                # same mask, whose plans are kept with it (masks.dense; torch's own layers pass a float mask)
                allowed = kept_for(m, ("not", shape), lambda t, shape=shape: ~t.reshape(shape), reads_values=True)
                mask = allowed if mask is None else mask & allowed
            else:
                b = m.reshape(shape)
                bias = b if bias is None else bias + b
        if extra:   # bias_k and the zero key are always allowed (torch pads its masks with 0 / False)
            mask = None if mask is None else F.pad(mask, (0, extra), value=True)
            bias = None if bias is None else F.pad(bias, (0, extra), value=0.0)
        return mask, bias

    def _check_masks(self, query: Tensor, key: Tensor, batched: bool, key_padding_mask: Optional[Tensor],
                     attn_mask: Optional[Tensor], is_causal: bool) -> tuple[int, int, int]:
        """Check the two masks against the inputs (torch's rules and warning); returns (N, L, S)."""
        h = self.num_heads
        if batched:
            n_dim, l_dim = (0, 1) if self.batch_first else (1, 0)
            N, L, S = query.shape[n_dim], query.shape[l_dim], key.shape[l_dim]
            _check_mask("key_padding_mask", key_padding_mask, {(N, S): "(N, S)"}, query.dtype)
            _check_mask("attn_mask", attn_mask, {(L, S): "(L, S)", (N * h, L, S): "(N * num_heads, L, S)"},
                        query.dtype)
        else:
            N, L, S = 1, query.shape[0], key.shape[0]
            _check_mask("key_padding_mask", key_padding_mask, {(S,): "(S,) for unbatched inputs"}, query.dtype)
            _check_mask("attn_mask", attn_mask, {(L, S): "(L, S)", (h, L, S): "(num_heads, L, S)"}, query.dtype)
        if key_padding_mask is not None and attn_mask is not None and key_padding_mask.dtype != attn_mask.dtype:
            warnings.warn("Support for mismatched key_padding_mask and attn_mask is deprecated. "
                          "Use same type for both instead.", stacklevel=3)          # torch's own warning
        if is_causal and attn_mask is None:
            raise ValueError("is_causal=True is a hint that attn_mask is causal and needs attn_mask (as in "
                             "torch); pass attn_mask=nn.Transformer.generate_square_subsequent_mask(L)")
        return N, L, S

    def _to_batch_first(self, batched: bool, *xs: Tensor) -> tuple[Tensor, ...]:
        """The caller's layout ((L, N, E), (N, L, E) or (L, E)) -> (N, L, E), for each of xs."""
        if batched and not self.batch_first:
            return tuple(x.transpose(0, 1) for x in xs)
        return xs if batched else tuple(x.unsqueeze(0) for x in xs)                  # (1, L, E)

    def _from_batch_first(self, batched: bool, out: Tensor) -> Tensor:
        """(N, L, E) -> the caller's layout: (L, N, E) unless batch_first, (L, E) for unbatched inputs."""
        if batched and not self.batch_first:
            return out.transpose(0, 1)                                               # (L, N, E)
        return out if batched else out.squeeze(0)                                    # (L, E)

    def _heads(self, query: Tensor, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Project and split into heads, with bias_k / the zero key appended: q (N, h, L, d), k, v (N, h, S', d)."""
        h, N = self.num_heads, query.shape[0]
        q, k, v = self._project(query, key, value)                                   # (N, L|S, E)
        if self.bias_k is not None:
            k = torch.cat([k, self.bias_k.expand(N, 1, -1)], dim=1)                  # (N, S + 1, E)
            v = torch.cat([v, self.bias_v.expand(N, 1, -1)], dim=1)
        q = rearrange(q, "n l (h d) -> n h l d", h=h)                                # (N, h, L, d)
        k = rearrange(k, "n s (h d) -> n h s d", h=h)                                # (N, h, S', d)
        v = rearrange(v, "n s (h d) -> n h s d", h=h)
        if self.add_zero_attn:
            k = F.pad(k, (0, 0, 0, 1))                                               # zero key at the end
            v = F.pad(v, (0, 0, 0, 1))
        return q, k, v

    def _mask_and_bias(self, key_padding_mask, attn_mask, is_causal: bool, need_weights: bool, N: int, L: int,
                       S: int, S1: int, device: torch.device) -> tuple[Optional[Tensor], bool, Optional[Tensor]]:
        """(mask, causal, bias) for ``attention``; S1 = S' keys (S plus bias_k and the zero key)."""
        if is_causal and key_padding_mask is None and not need_weights:
            # torch drops attn_mask and asks SDPA for its top-left causal mask (j <= i). When
            # L == S' that is attnlab's causal, which stays structured (the tiled kernel skips tiles).
            causal = L == S1
            mask = None if causal else torch.ones(L, S1, dtype=torch.bool, device=device).tril()   # (L, S')
            return mask, causal, None
        mask, bias = self._masks(key_padding_mask, attn_mask, N, L, S, S1 - S)
        return mask, False, bias

    def _weights_as_torch(self, weights: Tensor, seed: Optional[int], p: float, dtype: torch.dtype,
                          average: bool, batched: bool) -> Tensor:
        """attention's weights (N, h, L, S') as torch returns them: post-dropout, in the input dtype,
        averaged over heads (N, L, S') if asked, without the batch dimension for unbatched inputs."""
        if seed is not None:       # the same keep mask the output was computed with (dropout.py)
            N, h, L, S1 = weights.shape
            keep = keep_mask(seed, p, N, h, 0, L, 0, S1, device=weights.device)      # (N, h, L, S')
            weights = weights * keep / (1.0 - p)
        weights = weights.to(dtype)
        if average:
            weights = weights.mean(dim=1)                                            # (N, L, S')
        return weights if batched else weights.squeeze(0)

    def forward(self, query: Tensor, key: Tensor, value: Tensor, key_padding_mask: Optional[Tensor] = None,
                need_weights: bool = True, attn_mask: Optional[Tensor] = None, average_attn_weights: bool = True,
                is_causal: bool = False) -> tuple[Tensor, Optional[Tensor]]:
        """See the class docstring; returns (attn_output, attn_weights or None)."""
        batched = self._check_inputs(query, key, value)
        N, L, S = self._check_masks(query, key, batched, key_padding_mask, attn_mask, is_causal)
        q, k, v = self._heads(*self._to_batch_first(batched, query, key, value))    # (N, h, L, d), (N, h, S', d)
        mask, causal, bias = self._mask_and_bias(key_padding_mask, attn_mask, is_causal, need_weights,
                                                 N, L, S, k.shape[2], q.device)
        p = self.dropout if self.training else 0.0
        backend = "reference" if need_weights and self.backend == "auto" else self.backend
        seed = _peek_dropout_seed() if need_weights and p > 0.0 and backend in _HASH_DROPOUT_BACKENDS else None
        res = attention(q, k, v, mask=mask, causal=causal, bias=bias, dropout_p=p, backend=backend,
                        return_weights=need_weights)
        out, weights = res if need_weights else (res, None)                          # (N, h, L, d), (N, h, L, S')
        out = self._from_batch_first(batched, self.out_proj(rearrange(out, "n h l d -> n l (h d)")))   # as given
        if weights is not None:
            weights = self._weights_as_torch(weights, seed, p, query.dtype, average_attn_weights, batched)
        return out, weights

    # --- what torch's Transformer layers call besides forward ------------------------------------

    def merge_masks(self, attn_mask: Optional[Tensor], key_padding_mask: Optional[Tensor],
                    query: Tensor) -> tuple[Optional[Tensor], Optional[int]]:
        """torch's mask merge for its fused kernels (``TransformerEncoderLayer`` in eval without grad).

        Args:
            attn_mask: (L, L) or (N * num_heads, L, L), bool (True = NOT allowed) or additive float.
            key_padding_mask: (N, L), same conventions.
            query: (N, L, E) batch-first self-attention input (only its shape is read).
        Returns:
            (merged, mask_type): (key_padding_mask, 1) alone; with an attn_mask, both broadcast to
            (N, num_heads, L, L) and combined (``+``: logical or for bool, sum for float), type 2;
            (None, None) without masks. Same values as ``torch.nn.MultiheadAttention.merge_masks``.
        Example:
            merged, kind = mha.merge_masks(None, pad, x)        # (pad, 1)
        """
        if attn_mask is None:
            return (key_padding_mask, 1) if key_padding_mask is not None else (None, None)
        N, L = query.shape[0], query.shape[1]
        h = self.num_heads
        merged = (attn_mask.reshape(N, -1, L, L) if attn_mask.dim() == 3
                  else attn_mask.reshape(1, 1, L, L).expand(N, h, L, L))             # (N, h, L, L)
        if key_padding_mask is not None:
            merged = merged + key_padding_mask.reshape(N, 1, 1, L).expand(N, h, 1, L)
        return merged, 2

    @classmethod
    def from_torch(cls, mha: nn.MultiheadAttention, *, backend: str = "auto") -> "MultiheadAttention":
        """attnlab's module with the configuration, parameters and train/eval mode of torch's ``mha``.

        Example:
            layer = torch.nn.TransformerEncoderLayer(64, 8, batch_first=True)
            layer.self_attn = MultiheadAttention.from_torch(layer.self_attn)
        """
        if not isinstance(mha, nn.MultiheadAttention):
            raise TypeError(f"from_torch expects a torch.nn.MultiheadAttention, got {type(mha).__name__}")
        p = mha.out_proj.weight
        ours = cls(mha.embed_dim, mha.num_heads, dropout=mha.dropout, bias=mha.in_proj_bias is not None,
                   add_bias_kv=mha.bias_k is not None, add_zero_attn=mha.add_zero_attn, kdim=mha.kdim,
                   vdim=mha.vdim, batch_first=mha.batch_first, device=p.device, dtype=p.dtype, backend=backend)
        ours.load_state_dict(mha.state_dict(), strict=True)
        return ours.train(mha.training)
