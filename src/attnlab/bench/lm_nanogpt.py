"""A nanoGPT-equivalent model, the yardstick of ``attnlab bench --lm``.

Written for this benchmark from the published description of Karpathy's nanoGPT (GPT-2
architecture): token + learned position embeddings, pre-norm blocks with LayerNorm, one fused
``c_attn`` Linear producing q, k and v, heads split with ``view`` + ``transpose``, torch's
``F.scaled_dot_product_attention(is_causal=True)``, a 4C GELU MLP, a final LayerNorm and an LM
head tied to the token embedding. With the same sizes it has exactly the parameters of
``attnlab.models.GPT`` (learned positions, LayerNorm, GELU, biases, tied weights), and
``copy_from_attnlab`` loads a GPT's weights into it so the two compute the same logits.

Two switches exist only to *diagnose* a speed gap, one difference at a time (defaults = nanoGPT):

    qkv="separate"      three q/k/v Linears, as attnlab's AttentionLayer has
    attend="attnlab"    heads through ``attnlab.attention(causal=True)`` instead of SDPA

Example::

    gpt = GPT(GPTConfig.preset("micro", vocab_size=96))
    ref = NanoGPT.like(gpt.cfg)
    copy_from_attnlab(ref, gpt)
    logits = ref(idx)                                     # idx (B, T) -> (B, T, 96), == gpt(idx)
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["NanoGPT", "copy_from_attnlab", "QKV", "ATTEND"]

QKV = ("fused", "separate")
ATTEND = ("sdpa", "attnlab")


class CausalSelfAttention(nn.Module):
    def __init__(self, d_model: int, n_head: int, *, qkv: str = "fused", attend: str = "sdpa"):
        super().__init__()
        if qkv not in QKV or attend not in ATTEND:
            raise ValueError(f"qkv must be one of {QKV} and attend one of {ATTEND}, got {qkv!r}, {attend!r}")
        self.n_head, self.qkv, self.attend = n_head, qkv, attend
        if qkv == "fused":
            self.c_attn = nn.Linear(d_model, 3 * d_model)              # q, k, v in one matmul
        else:
            self.q, self.k, self.v = (nn.Linear(d_model, d_model) for _ in range(3))
        self.c_proj = nn.Linear(d_model, d_model)

    def forward(self, x: Tensor) -> Tensor:
        B, T, C = x.shape
        if self.qkv == "fused":
            q, k, v = self.c_attn(x).split(C, dim=2)                   # each (B, T, C)
        else:
            q, k, v = self.q(x), self.k(x), self.v(x)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))  # (B, H, T, D)
        if self.attend == "sdpa":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            from ..functional import attention
            y = attention(q, k, v, causal=True)                        # (B, H, T, D)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class Block(nn.Module):
    def __init__(self, d_model: int, n_head: int, **attn_kw):
        super().__init__()
        self.ln_1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, n_head, **attn_kw)
        self.ln_2 = nn.LayerNorm(d_model)
        self.c_fc = nn.Linear(d_model, 4 * d_model)
        self.mlp_proj = nn.Linear(4 * d_model, d_model)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x))))


class NanoGPT(nn.Module):
    """GPT-2 as nanoGPT builds it: ``forward(idx (B, T)) -> logits (B, T, V)``, no dropout, no cache.

    Its names (``block_size``, ``n_layer``, ``n_head``, ``wte``, ``c_proj``...) are nanoGPT's on purpose,
    so it reads side by side with the code it mirrors; attnlab's own configs say max_len, n_layers, n_heads.
    """

    def __init__(self, vocab_size: int, block_size: int, n_layer: int, n_head: int, d_model: int, **attn_kw):
        super().__init__()
        self.block_size = block_size
        self.wte = nn.Embedding(vocab_size, d_model)
        self.wpe = nn.Embedding(block_size, d_model)
        self.h = nn.ModuleList(Block(d_model, n_head, **attn_kw) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(d_model)
        self.lm_head = nn.Linear(d_model, vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight                          # weight tying
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)
                if getattr(m, "bias", None) is not None:
                    nn.init.zeros_(m.bias)
        for name, p in self.named_parameters():
            if name.endswith(("c_proj.weight", "mlp_proj.weight")):   # GPT-2's scaled residual init
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * n_layer))

    @classmethod
    def like(cls, cfg, **attn_kw) -> "NanoGPT":
        """The nanoGPT-equivalent of an ``attnlab.models.GPTConfig`` (learned, layer norm, GELU, biases, tied)."""
        if (cfg.positional, cfg.norm, cfg.mlp, cfg.bias, cfg.tie_weights, cfg.n_kv_heads) != \
                ("learned", "layer", "gelu", True, True, None):
            raise ValueError(f"NanoGPT.like needs a GPT-2-style GPTConfig (positional='learned', norm='layer', "
                             f"mlp='gelu', bias=True, tie_weights=True, n_kv_heads=None), got {cfg}")
        return cls(cfg.vocab_size, cfg.max_len, cfg.n_layers, cfg.n_heads, cfg.d_model, **attn_kw)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())              # the tied matrix counts once

    def forward(self, idx: Tensor) -> Tensor:
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))   # (B, T, C)
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))                              # (B, T, V)


@torch.no_grad()
def copy_from_attnlab(ref: NanoGPT, gpt) -> NanoGPT:
    """Load an ``attnlab.models.GPT``'s weights into ``ref`` (same sizes), so both compute the same logits."""
    ref.wte.weight.copy_(gpt.tok_emb.weight)
    ref.wpe.weight.copy_(gpt.pos_enc.table.weight)
    for blk, src in zip(ref.h, gpt.blocks, strict=True):
        a, s = blk.attn, src.self_attn
        projs = (s.q_proj, s.k_proj, s.v_proj)
        if a.qkv == "fused":
            a.c_attn.weight.copy_(torch.cat([p.weight for p in projs]))
            a.c_attn.bias.copy_(torch.cat([p.bias for p in projs]))
        else:
            for dst, p in zip((a.q, a.k, a.v), projs):
                dst.load_state_dict(p.state_dict())
        a.c_proj.load_state_dict(s.out_proj.state_dict())
        blk.ln_1.load_state_dict(src.norms[0].state_dict())
        blk.ln_2.load_state_dict(src.norms[1].state_dict())
        blk.c_fc.load_state_dict(src.mlp.up.state_dict())
        blk.mlp_proj.load_state_dict(src.mlp.down.state_dict())
    ref.ln_f.load_state_dict(gpt.norm.state_dict())
    return ref
