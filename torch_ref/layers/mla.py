"""Multi-head latent attention (DeepSeek-V2/V3), as transformers 5.x's DeepseekV3Attention
computes it. Twin: jaxformer/layers/mla.py (its docstring has the steps, the cache layout, the
decode form and the HF config / weight names)."""
from __future__ import annotations

import torch
from torch import nn

from jaxformer import tables
from jaxformer.config.attention import Rope, Scores
from jaxformer.config.moe import MLAConfig
from torch_ref.layers.dispatch import dense_mask, dot_product_attention
from torch_ref.layers.kernels import quant
from torch_ref.layers.kv_cache import KVCache
from torch_ref.layers.norm import RMSNorm
from torch_ref.layers.positional import RotaryEmbedding, default_positions
from torch_ref.layers.scores import ScoreMods, soft_cap


def deinterleave(x: torch.Tensor) -> torch.Tensor:
    """[..., R] pairs (x0, x1), (x2, x3).. -> [x0, x2, .. | x1, x3, ..]: rotate-half RoPE on the
    result equals HF's apply_rotary_pos_emb_interleave bit for bit (the same products and sums)."""
    return torch.cat([x[..., 0::2], x[..., 1::2]], dim=-1)


def weight_out_in(linear: nn.Module) -> torch.Tensor:
    """A Linear's weight as [out, in] whatever its decode form (a quant.QuantizedLinear)."""
    w = linear.weight
    return w.dequantized() if isinstance(w, quant.QuantizedWeight) else w


class MultiHeadLatentAttention(nn.Module):
    """Multi-head latent attention (self-attention only). See the JAX twin for the arguments.
    Shapes: x [B, T, D], mask bool broadcastable to [B, H, T, S], positions [B, T] -> [B, T, D].
    With cache (init_cache) and cache_index (int), the T new tokens are written into slots
    cache_index.. (in place here; JAX returns an updated copy) and the call returns (out, cache)."""

    def __init__(self, d_model: int, num_heads: int, mla: MLAConfig, *, rope: Rope, bias: bool = False,
                 out_bias: bool | None = None, attn_dropout: float = 0.0, dropout: float = 0.0,
                 scores: Scores = Scores()):  # noqa: B008 (a frozen dataclass)
        super().__init__()
        if scores.sinks:
            raise ValueError("multi-head latent attention takes no attention sinks")
        h, n, r, v, c = num_heads, mla.qk_nope_head_dim, mla.qk_rope_head_dim, mla.v_head_dim, mla.kv_lora_rank
        self.num_heads, self.mla, self.softcap = num_heads, mla, scores.softcap
        self.scale = tables.mla_softmax_scale(mla.qk_head_dim, rope.scaling, scores.scale)
        if mla.q_lora_rank is None:
            self.q_proj = nn.Linear(d_model, h * (n + r), bias=False)
            self.q_a_proj = self.q_a_layernorm = self.q_b_proj = None
        else:
            self.q_proj = None
            self.q_a_proj = nn.Linear(d_model, mla.q_lora_rank, bias=bias)
            self.q_a_layernorm = RMSNorm(mla.q_lora_rank, eps=mla.latent_norm_eps)
            self.q_b_proj = nn.Linear(mla.q_lora_rank, h * (n + r), bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(d_model, c + r, bias=bias)
        self.kv_a_layernorm = RMSNorm(c, eps=mla.latent_norm_eps)
        self.kv_b_proj = nn.Linear(c, h * (n + v), bias=False)
        self.o_proj = nn.Linear(h * v, d_model, bias=bias if out_bias is None else out_bias)
        self.rope = RotaryEmbedding(r, rope.max_len, rope.base, rope.scaling)
        self.attn_dropout = nn.Dropout(attn_dropout)
        self.dropout = nn.Dropout(dropout)

    def rotate(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """RoPE on a rope part [B, T, ., R] (rope_interleave: pairs de-interleaved first)."""
        return self.rope(deinterleave(x) if self.mla.rope_interleave else x, positions)

    def init_cache(self, batch: int, length: int, dtype=torch.float32, *, ring: bool = False) -> KVCache:
        """An empty latent cache of `length` slots: latent [B, 1, L, C], k_rope [B, 1, L, R]."""
        if ring:
            raise ValueError("multi-head latent attention has no sliding-window ring cache")
        device = self.kv_b_proj.weight.device
        return KVCache.empty({"latent": torch.zeros((batch, 1, length, self.mla.kv_lora_rank), dtype=dtype, device=device),
                              "k_rope": torch.zeros((batch, 1, length, self.mla.qk_rope_head_dim), dtype=dtype,
                                                    device=device)})

    def forward(self, x: torch.Tensor, *, mask=None, bias=None, positions=None,
                return_weights: bool = False, cache: KVCache | None = None, cache_index=None,
                mode: str | None = None):
        b, t, _ = x.shape
        h, n, r, v, c = (self.num_heads, self.mla.qk_nope_head_dim, self.mla.qk_rope_head_dim,
                         self.mla.v_head_dim, self.mla.kv_lora_rank)
        if cache is not None and cache.ring:
            raise ValueError("multi-head latent attention has no sliding-window ring cache")
        if cache is not None and cache_index is None:
            raise ValueError("an MLA cache needs cache_index (MLA is self-attention only)")
        if cache is not None and return_weights:
            raise ValueError("return_weights is not supported together with a KV cache")
        # 1) queries, split into the position-free and the rope part
        q = self.q_proj(x) if self.q_proj is not None else self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
        q = q.view(b, t, h, n + r)  # [B, T, H, N + R]
        q_nope, q_rope = q[..., :n], q[..., n:]  # [B, T, H, N], [B, T, H, R]
        # 2) compress: the normalised latent and the one rope key shared by all heads
        kv = self.kv_a_proj_with_mqa(x)  # [B, T, C + R]
        latent = self.kv_a_layernorm(kv[..., :c])  # [B, T, C]
        k_rope = kv[..., c:][:, :, None, :]  # [B, T, 1, R]
        # 3) rotate
        positions = default_positions(b, t, device=x.device) if positions is None else positions
        q_rope, k_rope = self.rotate(q_rope, positions), self.rotate(k_rope, positions)
        # 3b) write the latent and the rotated rope key into their cache slots
        if cache is not None:
            cache = cache.write({"latent": latent[:, None], "k_rope": k_rope.transpose(1, 2)},
                                cache_index)  # [B, 1, L, C], [B, 1, L, R], in place
            latent, k_rope = cache["latent"][:, 0].to(x.dtype), cache["k_rope"].transpose(1, 2).to(x.dtype)
            if t == 1:
                out = self.absorbed(q_nope, q_rope, latent, k_rope[:, :, 0], *dense_mask(mask, bias))  # [B, 1, H, V]
                return self.dropout(self.o_proj(out.reshape(b, t, h * v))), cache
        # 4) expand the latent into per-head keys and values
        s = latent.shape[1]
        kv = self.kv_b_proj(latent).view(b, s, h, n + v)  # [B, S, H, N + V]
        k = torch.cat([kv[..., :n], k_rope.expand(b, s, h, r)], dim=-1)  # [B, S, H, N + R]
        # 5) attend, merge heads, project out
        out = dot_product_attention(torch.cat([q_nope, q_rope], dim=-1), k, kv[..., n:], mask=mask,
                                    bias=bias, scores=ScoreMods(self.scale, self.softcap),
                                    return_weights=return_weights, dropout=self.attn_dropout)
        out, weights = out if return_weights else (out, None)
        out = self.dropout(self.o_proj(out.reshape(b, t, h * v)))
        if cache is not None:
            return out, cache
        return (out, weights) if return_weights else out

    def absorbed(self, q_nope, q_rope, latent, k_rope, mask, bias) -> torch.Tensor:
        """Attention over the latent cache with kv_b_proj absorbed (see the JAX twin).
        q_nope [B, T, H, N], q_rope [B, T, H, R], latent [B, S, C], k_rope [B, S, R] -> [B, T, H, V].
        Masking as dot_product_attention's explicit path: a row with no visible key is 0."""
        h, n = self.num_heads, self.mla.qk_nope_head_dim
        w = weight_out_in(self.kv_b_proj).reshape(h, -1, self.mla.kv_lora_rank).permute(2, 0, 1).to(q_nope.dtype)  # [C, H, N + V]
        q_latent = torch.einsum("bthn,chn->bthc", q_nope, w[..., :n])  # [B, T, H, C]
        scores = (torch.einsum("bthc,bsc->bhts", q_latent, latent)
                  + torch.einsum("bthr,bsr->bhts", q_rope, k_rope)).float() * self.scale  # [B, H, T, S]
        scores, _ = soft_cap(scores, self.softcap)
        if bias is not None:
            scores = scores + bias.float()
        if mask is not None:
            scores = scores.masked_fill(~mask, torch.finfo(torch.float32).min)
        weights = torch.softmax(scores, dim=-1)
        if mask is not None:
            weights = weights.masked_fill(~mask, 0.0)  # fully masked rows -> 0
        weights = self.attn_dropout(weights.to(latent.dtype))
        out_latent = torch.einsum("bhts,bsc->bthc", weights, latent)  # [B, T, H, C]
        return torch.einsum("bthc,chv->bthv", out_latent, w[..., n:])  # [B, T, H, V]
