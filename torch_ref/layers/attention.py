"""Multi-head attention (self, cross, GQA) and the key projection. Twin:
jaxformer/layers/attention.py. The attention itself is layers/dispatch.py's
`dot_product_attention` (re-exported here), the masks layers/masks.py. Masks are boolean, True =
may attend; a row with no visible key outputs exactly 0 (with attention sinks too: the sink
takes all its weight)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from jaxformer.config.attention import Dropouts, Projections, QKNorm, Rope, Scores
from torch_ref.layers import kv_cache
from torch_ref.layers.dispatch import dot_product_attention  # re-exported
from torch_ref.layers.kv_cache import KVCache
from torch_ref.layers.masks import (  # noqa: F401 (re-exported)
    AttentionMask,
    alibi_block,
    combine_masks,
    make_causal_mask,
    make_padding_mask,
    make_segment_mask,
    make_sliding_window_mask,
)
from torch_ref.layers.norm import make_norm
from torch_ref.layers.positional import RotaryEmbedding, default_positions
from torch_ref.layers.scores import ScoreMods  # re-exported


def key_projection(linear: nn.Linear, x: torch.Tensor, *, rotated: bool = False) -> torch.Tensor:
    """x @ W_k + b_k, with the gradient of b_k cut where that is exact: softmax cancels q . b_k,
    so its true gradient is 0 and Adam would turn its rounding noise into lr-sized steps.
    rotated: the keys are rotated per position afterwards (RoPE), q . R_s b_k varies across
    keys and the bias keeps its gradient (docs/numerics.md §15). See the JAX twin."""
    if linear.bias is None or rotated or not isinstance(linear, nn.Linear):  # or a decode-only QuantizedLinear
        return linear(x)
    return F.linear(x, linear.weight) + linear.bias.detach()


class MultiHeadAttention(nn.Module):
    """Multi-head attention with separate q/k/v/o projections, GQA and optional RoPE.
    projections, dropouts, rope, qk_norm, scores: the config records Projections, Dropouts, Rope,
    QKNorm, Scores (see the JAX twin): the q/k/v and o_proj biases, the dropout on the attention
    weights and on the output, rotary positions (rotary_dim: GPT-NeoX, docs/numerics.md §35),
    q/k norms per head or over all heads (OLMo 2), and the score scale, soft-capping and sinks
    (a learned per-head logit `sinks` [H] in every softmax denominator, gpt-oss).
    torch.nn.MultiheadAttention's own options (kdim / vdim, add_bias_kv, add_zero_attn) are the
    JAX twin's interop subclass; its torch reference is nn.MultiheadAttention itself.
    Shapes: x [B, T, D], kv [B, S, D] (None = self-attention), value [B, S, D] (None = kv)
    -> [B, T, D].

    KV cache (incremental decoding): `cache` a kv_cache.KVCache ({"k", "v"} head-major
    [B, G, L, K]), `mode` kv_cache.PREFILL or DECODE (None = from T):
      * a self-attention cache (init_cache) with cache_index (int): the new keys/values (RoPE'd
        at `positions`) are written at slots cache_index.. (each at slot % L, in place here;
        JAX returns an updated copy) and the queries read the cache (KVCache.attend); `mask`
        covers the keys read (AttentionMask.at_keys of KVCache.key_slots).
      * a fixed cache (memory_cache): cross-attention keys/values projected once from the
        encoder memory; `kv` is then not used.
    With a cache the call returns (out, new_cache)."""

    def __init__(self, d_model: int, num_heads: int, *, num_kv_heads: int | None = None,
                 head_dim: int | None = None, projections: Projections = Projections(),  # noqa: B008 (a frozen dataclass)
                 dropouts: Dropouts = Dropouts(), rope: Rope | None = None, qk_norm: QKNorm | None = None,  # noqa: B008 (a frozen dataclass)
                 scores: Scores = Scores()):  # noqa: B008 (a frozen dataclass)
        super().__init__()
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        if head_dim is None:
            if d_model % num_heads:
                raise ValueError(f"d_model={d_model} is not divisible by num_heads={num_heads}")
            head_dim = d_model // num_heads
        if num_heads % num_kv_heads:
            raise ValueError(f"num_heads={num_heads} is not a multiple of num_kv_heads={num_kv_heads}")
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.scale, self.softcap = scores.scale, scores.softcap
        bias = projections.bias
        self.q_proj = nn.Linear(d_model, num_heads * head_dim, bias=bias)
        self.k_proj = nn.Linear(d_model, num_kv_heads * head_dim, bias=bias)
        self.v_proj = nn.Linear(d_model, num_kv_heads * head_dim, bias=bias)
        # one learned logit per query head in every softmax denominator (gpt-oss), [H]
        self.sinks = nn.Parameter(0.02 * torch.randn(num_heads)) if scores.sinks else None
        self.o_proj = nn.Linear(num_heads * head_dim, d_model, bias=projections.resolved_out_bias)
        # norms of q and k before RoPE: per head (Qwen3), weights [K]; or over all heads at
        # once (qk_norm.full, OLMo 2), weights [H * K] and [G * K]
        self.qk_norm_full = qk_norm is not None and qk_norm.full
        q_width, k_width = (num_heads * head_dim, num_kv_heads * head_dim) if self.qk_norm_full else (head_dim, head_dim)
        self.q_norm, self.k_norm = ((make_norm(qk_norm.kind, q_width, eps=qk_norm.eps, bias=False),
                                     make_norm(qk_norm.kind, k_width, eps=qk_norm.eps, bias=False))
                                    if qk_norm else (None, None))
        self.rope = (RotaryEmbedding(head_dim, rope.max_len, rope.base, rope.scaling, rope.rotary_dim)
                     if rope else None)
        self.attn_dropout = nn.Dropout(dropouts.attn)
        self.dropout = nn.Dropout(dropouts.out)

    def project_kv(self, kv: torch.Tensor, value: torch.Tensor | None = None) -> dict:
        """Keys of kv [B, S, D] and values of value [B, S, D] (None = kv) -> {"k", "v"}:
        [B, S, G, K] (no RoPE)."""
        b, s, _ = kv.shape
        # step 2 of forward rotates these keys; a k_norm is not linear in b_k either
        rotated = self.rope is not None or self.k_norm is not None
        k = self.split_heads(key_projection(self.k_proj, kv, rotated=rotated), self.k_norm,
                             self.num_kv_heads)  # [B, S, G, K]
        value = kv if value is None else value
        return {"k": k, "v": self.v_proj(value).view(b, s, self.num_kv_heads, self.head_dim)}  # [B, S, G, K]

    def split_heads(self, x, norm, heads: int):
        """x [B, S, n * K] -> [B, S, n, K] (n = heads), normed by `norm` (None = none) over
        the full width before the split (qk_norm_full) or per head after it."""
        b, s, _ = x.shape
        if norm is not None and self.qk_norm_full:
            x = norm(x)
        x = x.view(b, s, heads, self.head_dim)  # [B, S, n, K]
        return x if norm is None or self.qk_norm_full else norm(x)

    def init_cache(self, batch: int, length: int, dtype=torch.float32, *, ring: bool = False) -> KVCache:
        """An empty self-attention cache of `length` slots, {"k", "v"} [B, G, L, K] (ring: a
        sliding-window layer's ring of window slots)."""
        shape = (batch, self.num_kv_heads, length, self.head_dim)  # [B, G, L, K]
        device = self.q_proj.weight.device
        return KVCache.empty({"k": torch.zeros(shape, dtype=dtype, device=device),
                              "v": torch.zeros(shape, dtype=dtype, device=device)}, ring=ring)

    def memory_cache(self, memory: torch.Tensor, dtype=torch.float32) -> KVCache:
        """The fixed cache of memory [B, S, D]'s keys/values, projected once: [B, G, S, K]."""
        return KVCache.memory({name: a.transpose(1, 2).to(dtype).contiguous()
                               for name, a in self.project_kv(memory).items()})

    def rotate(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """RoPE on q or k [B, T, n, K] (a variant that rotates otherwise overrides this)."""
        return self.rope(x, positions)

    def attend(self, q, k, v, mask, bias, *, return_weights: bool, mode: str):
        """Step 3: q [B, T, H, K] over k, v [B, S, G, K] -> (out [B, T, H, K], weights or None);
        a variant of the attention itself (layers/diff_attention.py) overrides this."""
        scores = ScoreMods(self.scale, self.softcap, self.sinks)
        out = dot_product_attention(q, k, v, mask=mask, bias=bias, scores=scores, return_weights=return_weights,
                                    dropout=self.attn_dropout, mode=mode)
        return out if return_weights else (out, None)

    def forward(self, x: torch.Tensor, kv: torch.Tensor | None = None, *, mask=None, bias=None,
                positions=None, return_weights: bool = False, cache: KVCache | None = None,
                cache_index=None, value: torch.Tensor | None = None, mode: str | None = None):
        b, t, _ = x.shape
        if cache is not None and return_weights:
            raise ValueError("return_weights is not supported together with a KV cache")
        mode = kv_cache.mode_of(cache, t) if mode is None else mode
        read_only = cache is not None and cache.fixed
        if cache is not None and not read_only and cache_index is None:
            raise ValueError("a self-attention cache needs cache_index (the slot of the first new token)")
        # 1) project and split heads
        q = self.split_heads(self.q_proj(x), self.q_norm, self.num_heads)  # [B, T, H, K]
        if read_only:
            k, v = cache["k"].transpose(1, 2), cache["v"].transpose(1, 2)  # [B, S, G, K] views, projected once
        else:
            kv_heads = self.project_kv(x if kv is None else kv, value)
            k, v = kv_heads["k"], kv_heads["v"]  # [B, S, G, K]
        # 2) rotate q and k (self-attention only)
        if self.rope is not None:
            positions = default_positions(b, t, device=x.device) if positions is None else positions
            q = self.rotate(q, positions)
            if not read_only:
                k = self.rotate(k, positions)
        # 2b) write the new keys/values into the cache and read the keys the queries see
        if cache is not None and not read_only:
            keys, cache = cache.attend({"k": k, "v": v}, cache_index, mode)
            k, v = keys["k"], keys["v"]  # [B, L, G, K] views or [B, L + T, G, K]
        # 3) attend
        out, weights = self.attend(q, k.to(q.dtype), v.to(q.dtype), mask, bias, return_weights=return_weights,
                                   mode=mode)
        # 4) merge heads and project out
        out = self.dropout(self.o_proj(out.reshape(b, t, self.num_heads * self.head_dim)))
        if cache is not None:
            return out, cache
        return (out, weights) if return_weights else out
