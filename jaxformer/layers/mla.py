"""Multi-head latent attention (DeepSeek-V2, Liu et al. 2024; DeepSeek-V3), as transformers
5.x's DeepseekV3Attention computes it. Twin: torch_ref/layers/mla.py.

    1) queries   q = q_b_proj(q_a_layernorm(q_a_proj(x)))   (or q_proj(x))   [B, T, H, N + R]
    2) compress  [c | k_r] = kv_a_proj_with_mqa(x); c = kv_a_layernorm(c)    [B, T, C], [B, T, R]
    3) rotate    the rope parts q_r [B, T, H, R] and the one shared key k_r (decoupled RoPE)
    4) expand    [k_nope | v] = kv_b_proj(c) per head; k = [k_nope | k_r]     [B, S, H, N + R], [B, S, H, V]
    5) attend    softmax(q k^T * scale) v, then o_proj                         [B, T, D]

Letters: C kv_lora_rank, N qk_nope_head_dim, R qk_rope_head_dim, V v_head_dim (MLAConfig).
scale = qk_head_dim ** -0.5 times YaRN's mscale(factor, mscale_all_dim) ** 2 (tables.mla_softmax_scale).

KV cache: {"latent": [B, 1, L, C], "k_rope": [B, 1, L, R]}, the normalised latent and the
rotated rope key of each token (HF caches the same two, as one-head 4-D tensors), not the
per-head keys and values: C + R numbers per token and layer instead of H * (N + R + V)
(docs/numerics.md §27). A step of T > 1 new tokens (the prompt) expands every cached latent
with kv_b_proj and attends as above. A one-token step absorbs kv_b_proj instead (DeepSeek-V2
§2.1.2): q_nope is mapped into the latent space through kv_b_proj's key rows and the weighted
latent back out through its value rows, so a decode step reads the cache once and never forms
[L, H, N + V] keys and values; the sums are the same up to fp32 rounding order (§27).

HF DeepseekV3Config -> ours (for the importer):
    hidden_size -> d_model; num_attention_heads -> num_heads (num_key_value_heads must equal it)
    q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim -> MLAConfig's
    rope_interleave -> MLAConfig.rope_interleave; (the latent norms' eps: 1e-6, latent_norm_eps)
    attention_bias -> attn_qkv_bias (q_a_proj, kv_a_proj_with_mqa) and attn_out_bias (o_proj)
    attention_dropout -> attn_dropout; max_position_embeddings -> max_len
    rope_parameters.rope_theta -> rope_base; rope_type "yarn" -> RopeScaling(rope_type="yarn",
        factor, original_max_len=original_max_position_embeddings, beta_fast, beta_slow,
        mscale, mscale_all_dim, attention_factor, truncate); the rope tables use R as head_dim
        (HF sets head_dim = qk_rope_head_dim)
HF weights (model.layers.{i}.self_attn.*) -> ours (decoder.layers.{i}.self_attn.*): the same
names, torch Linear weight [out, in] <-> our kernel [in, out], RMSNorm weight <-> scale:
    q_proj | q_a_proj, q_a_layernorm, q_b_proj; kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj, o_proj
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from jaxformer import lowering, tables
from jaxformer.config.attention import Rope, Scores
from jaxformer.config.moe import MLAConfig
from jaxformer.layers.dispatch import dense_mask, dot_product_attention
from jaxformer.layers.kernels import quant
from jaxformer.layers.kv_cache import KVCache
from jaxformer.layers.linear import Linear
from jaxformer.layers.norm import RMSNorm
from jaxformer.layers.positional import RotaryEmbedding, default_positions
from jaxformer.layers.scores import ScoreMods, soft_cap


def deinterleave(x: jax.Array) -> jax.Array:
    """[..., R] pairs (x0, x1), (x2, x3).. -> [x0, x2, .. | x1, x3, ..]: rotate-half RoPE on the
    result equals HF's apply_rotary_pos_emb_interleave bit for bit (the same products and sums)."""
    return jnp.concatenate([x[..., 0::2], x[..., 1::2]], axis=-1)


def kernel_in_out(linear: Linear) -> jax.Array:
    """A Linear's weight as [in, out] whatever its decode form: a reduced-precision copy
    (quant.QuantizedWeight [out, in]) or the transposed kernels of lowering.transposed_kernels."""
    w = linear.kernel.get_value()
    if isinstance(w, quant.QuantizedWeight):
        return jnp.swapaxes(w.dequantized(), -1, -2)
    return jnp.swapaxes(w, -1, -2) if lowering.active().transposed_kernels else w


class MultiHeadLatentAttention(nnx.Module):
    """Multi-head latent attention (self-attention only; module docstring).

    Args:
        d_model: D.  num_heads: H.  mla: the MLAConfig (ranks and head widths).
        rope: the rope part's RoPE, a config.Rope (max_len, base, scaling; rotary_dim unused).
        bias: biases on q_a_proj and kv_a_proj_with_mqa (HF attention_bias); q_proj, q_b_proj
            and kv_b_proj never have one.  out_bias: the o_proj bias; None = bias.
        attn_dropout: dropout on the attention weights.  dropout: dropout on the output.
        scores: a config.Scores (scale, softcap; no sinks): the base score scale (None =
            qk_head_dim ** -0.5; YaRN's mscale_all_dim still applies) and attention logit
            soft-capping (see dispatch.dot_product_attention).
    Shapes: x [B, T, D], mask bool broadcastable to [B, H, T, S], bias float likewise,
    positions [B, T] -> [B, T, D] (and weights [B, H, T, S] with return_weights).
    With cache (init_cache) and cache_index (int scalar, may be traced), the T new tokens are
    written into slots cache_index.. and the call returns (out, new_cache); `mask` must hide
    the unwritten slots (as MultiHeadAttention's cache).
    """

    def __init__(self, d_model: int, num_heads: int, mla: MLAConfig, *, rope: Rope, bias: bool = False,
                 out_bias: bool | None = None, attn_dropout: float = 0.0, dropout: float = 0.0,
                 scores: Scores = Scores(), rngs: nnx.Rngs):  # noqa: B008 (a frozen dataclass)
        if scores.sinks:
            raise ValueError("multi-head latent attention takes no attention sinks")
        h, n, r, v, c = num_heads, mla.qk_nope_head_dim, mla.qk_rope_head_dim, mla.v_head_dim, mla.kv_lora_rank
        self.num_heads, self.mla, self.softcap = num_heads, mla, scores.softcap
        self.scale = tables.mla_softmax_scale(mla.qk_head_dim, rope.scaling, scores.scale)
        if mla.q_lora_rank is None:
            self.q_proj = Linear(d_model, h * (n + r), use_bias=False, axes=("embed", "heads"), rngs=rngs)
            self.q_a_proj = self.q_a_layernorm = self.q_b_proj = None
        else:
            self.q_proj = None
            self.q_a_proj = Linear(d_model, mla.q_lora_rank, use_bias=bias, axes=("embed", None), rngs=rngs)
            self.q_a_layernorm = RMSNorm(mla.q_lora_rank, eps=mla.latent_norm_eps, rngs=rngs)
            self.q_b_proj = Linear(mla.q_lora_rank, h * (n + r), use_bias=False, axes=(None, "heads"), rngs=rngs)
        self.kv_a_proj_with_mqa = Linear(d_model, c + r, use_bias=bias, axes=("embed", None), rngs=rngs)
        self.kv_a_layernorm = RMSNorm(c, eps=mla.latent_norm_eps, rngs=rngs)
        self.kv_b_proj = Linear(c, h * (n + v), use_bias=False, axes=(None, "heads"), rngs=rngs)
        self.o_proj = Linear(h * v, d_model, use_bias=bias if out_bias is None else out_bias,
                             axes=("heads", "embed"), rngs=rngs)
        self.rope = RotaryEmbedding(r, rope.max_len, rope.base, rope.scaling)
        self.attn_dropout = nnx.Dropout(attn_dropout, rngs=rngs)
        self.dropout = nnx.Dropout(dropout, rngs=rngs)

    def rotate(self, x: jax.Array, positions: jax.Array) -> jax.Array:
        """RoPE on a rope part [B, T, ., R] (rope_interleave: pairs de-interleaved first)."""
        return self.rope(deinterleave(x) if self.mla.rope_interleave else x, positions)

    def init_cache(self, batch: int, length: int, dtype=jnp.float32, *, ring: bool = False) -> KVCache:
        """An empty latent cache of `length` slots: latent [B, 1, L, C], k_rope [B, 1, L, R]."""
        if ring:
            raise ValueError("multi-head latent attention has no sliding-window ring cache")
        return KVCache.empty({"latent": jnp.zeros((batch, 1, length, self.mla.kv_lora_rank), dtype),
                              "k_rope": jnp.zeros((batch, 1, length, self.mla.qk_rope_head_dim), dtype)})

    def __call__(self, x: jax.Array, *, mask: jax.Array | None = None, bias: jax.Array | None = None,
                 positions: jax.Array | None = None, return_weights: bool = False,
                 cache: KVCache | None = None, cache_index=None, mode: str | None = None):
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
        q = q.reshape(b, t, h, n + r)  # [B, T, H, N + R]
        q_nope, q_rope = q[..., :n], q[..., n:]  # [B, T, H, N], [B, T, H, R]
        # 2) compress: the normalised latent and the one rope key shared by all heads
        kv = self.kv_a_proj_with_mqa(x)  # [B, T, C + R]
        latent = self.kv_a_layernorm(kv[..., :c])  # [B, T, C]
        k_rope = kv[..., c:][:, :, None, :]  # [B, T, 1, R]
        # 3) rotate
        positions = default_positions(b, t) if positions is None else positions
        q_rope, k_rope = self.rotate(q_rope, positions), self.rotate(k_rope, positions)
        # 3b) write the latent and the rotated rope key into their cache slots
        if cache is not None:
            cache = cache.write({"latent": latent[:, None], "k_rope": jnp.swapaxes(k_rope, 1, 2)},
                                cache_index)  # [B, 1, L, C], [B, 1, L, R]
            latent, k_rope = cache["latent"][:, 0].astype(x.dtype), jnp.swapaxes(cache["k_rope"], 1, 2).astype(x.dtype)
            if t == 1:
                out = self.absorbed(q_nope, q_rope, latent, k_rope[:, :, 0], *dense_mask(mask, bias))  # [B, 1, H, V]
                return self.dropout(self.o_proj(out.reshape(b, t, h * v))), cache
        # 4) expand the latent into per-head keys and values
        s = latent.shape[1]
        kv = self.kv_b_proj(latent).reshape(b, s, h, n + v)  # [B, S, H, N + V]
        k = jnp.concatenate([kv[..., :n], jnp.broadcast_to(k_rope, (b, s, h, r))], axis=-1)  # [B, S, H, N + R]
        # 5) attend, merge heads, project out
        out = dot_product_attention(jnp.concatenate([q_nope, q_rope], axis=-1), k, kv[..., n:], mask=mask,
                                    bias=bias, scores=ScoreMods(self.scale, self.softcap),
                                    return_weights=return_weights, dropout=self.attn_dropout)
        out, weights = out if return_weights else (out, None)
        out = self.dropout(self.o_proj(out.reshape(b, t, h * v)))
        if cache is not None:
            return out, cache
        return (out, weights) if return_weights else out

    def absorbed(self, q_nope, q_rope, latent, k_rope, mask, bias) -> jax.Array:
        """Attention over the latent cache with kv_b_proj absorbed (module docstring).
        q_nope [B, T, H, N], q_rope [B, T, H, R], latent [B, S, C], k_rope [B, S, R] -> [B, T, H, V].
        Masking as dot_product_attention's explicit path: a row with no visible key is 0."""
        h, n = self.num_heads, self.mla.qk_nope_head_dim
        w = kernel_in_out(self.kv_b_proj).reshape(self.mla.kv_lora_rank, h, -1).astype(q_nope.dtype)  # [C, H, N + V]
        q_latent = jnp.einsum("bthn,chn->bthc", q_nope, w[..., :n])  # [B, T, H, C]
        scores = (jnp.einsum("bthc,bsc->bhts", q_latent, latent)
                  + jnp.einsum("bthr,bsr->bhts", q_rope, k_rope)).astype(jnp.float32) * self.scale  # [B, H, T, S]
        scores, _ = soft_cap(scores, self.softcap)
        if bias is not None:
            scores = scores + bias.astype(jnp.float32)
        if mask is not None:
            scores = jnp.where(mask, scores, jnp.finfo(jnp.float32).min)
        weights = jax.nn.softmax(scores, axis=-1)
        if mask is not None:
            weights = jnp.where(mask, weights, 0.0)  # fully masked rows -> 0
        weights = self.attn_dropout(weights.astype(latent.dtype))
        out_latent = jnp.einsum("bhts,bsc->bthc", weights, latent)  # [B, T, H, C]
        return jnp.einsum("bthc,chv->bthv", out_latent, w[..., n:])  # [B, T, H, V]
