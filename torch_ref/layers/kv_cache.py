"""The decode (KV) cache of a decoder stack: its layout, its empty state, and the ring caches of
sliding-window layers (docs/numerics.md §21). transformer.py's DecoderLayer and Decoder call
these. Twin: jaxformer/layers/kv_cache.py.

A layer's cache is {"self": {"k", "v"} [B, G, L, K] (MLA: {"latent", "k_rope"}), "cross":
{"k", "v"} [B, G, S, K] (with cross-attention)}; a stack's is a list of them. A sliding-window
layer's cache is a ring of window slots when the cache is longer than the window (its decode
memory is O(window)).
"""
from __future__ import annotations

import torch

from jaxformer.config import TransformerConfig
from torch_ref.layers.mla import MultiHeadLatentAttention
from torch_ref.layers.positional import alibi_bias


def cache_slots(self_cache: dict) -> int:
    """The slots L of a self-attention cache: {"k", "v"} [.., G, L, K] or MLA's {"latent",
    "k_rope"} [.., 1, L, .]."""
    return next(iter(self_cache.values())).shape[-2]


def layer_cache(layer, batch: int, length: int, memory: torch.Tensor | None = None, dtype=torch.float32) -> dict:
    """An empty self-attention cache of `length` slots for a DecoderLayer, plus the
    cross-attention keys and values of memory [B, S, D] (projected once)."""
    attn = layer.self_attn
    if isinstance(attn, MultiHeadLatentAttention):  # the compressed latent cache
        return {"self": attn.init_cache(batch, length, dtype)}
    shape = (batch, attn.num_kv_heads, length, attn.head_dim)  # [B, G, L, K]
    device = attn.q_proj.weight.device
    cache = {"self": {"k": torch.zeros(shape, dtype=dtype, device=device),
                      "v": torch.zeros(shape, dtype=dtype, device=device)}}
    if layer.cross_attn is not None:
        if memory is None:
            raise ValueError("init_cache of a DecoderLayer with cross-attention needs `memory`")
        kv = layer.cross_attn.project_kv(memory)
        cache["cross"] = {name: a.transpose(1, 2).to(dtype).contiguous() for name, a in kv.items()}  # [B, G, S, K]
    return cache


def stack_cache(stack, batch: int, length: int, memory: torch.Tensor | None = None, dtype=torch.float32) -> list:
    """Per layer of a Decoder: an empty self-attention cache of `length` slots [B, G, L, K] (a
    sliding-window layer: min(length, window) slots, a ring) and, with cross-attention, the
    keys/values of memory [B, S, D]."""
    local = stack.cfg.local_layers()
    return [layer.init_cache(batch, min(length, stack.cfg.sliding_window) if is_local else length, memory, dtype)
            for layer, is_local in zip(stack.layers, local)]


def rolling_layers(cfg: TransformerConfig, cache: list) -> tuple[bool, ...]:
    """Per layer: is its self-attention cache a ring (a sliding-window layer whose cache has
    sliding_window slots)?"""
    window = cfg.sliding_window
    return tuple(is_local and c["self"]["k"].shape[-2] == window for is_local, c in zip(cfg.local_layers(), cache))


def cache_length(cfg: TransformerConfig, cache: list) -> int | None:
    """L, the slots of the cache's full (not ring) layers; None when every layer's cache is a
    ring (then L is the caller's mask length)."""
    full = [cache_slots(c["self"]) for c, ring in zip(cache, rolling_layers(cfg, cache)) if not ring]
    return full[0] if full else None


def rolling_inputs(cfg: TransformerConfig, rel_bias, mask, t: int, cache_index, device=None):
    """-> (mask, bias) of a ring layer's keys for T new queries at slots cache_index..: with
    T = 1 the ring after the write (ring slot j then holds absolute slot p - (p - j) mod W),
    else the ring before the write followed by the T new keys. A key is visible when
    0 <= query slot - key slot < W, it holds a token (slot >= 0) and the caller's key mask over
    absolute slots (`mask`, [B?, 1, 1?, L]) lets it through. rel_bias: the stack's T5 bias
    module (or None)."""
    window = cfg.sliding_window
    p = cache_index
    ring = torch.arange(window, device=device)
    if t == 1:
        k_slots = p - (p - ring) % window  # [W]
    else:
        k_slots = torch.cat([p - 1 - (p - 1 - ring) % window, p + torch.arange(t, device=device)])  # [W + T]
    q_slots = p + torch.arange(t, device=device)  # [T]
    dist = q_slots[:, None] - k_slots[None, :]  # [T, S]
    visible = ((dist >= 0) & (dist < window) & (k_slots >= 0)[None, :])[None, None]  # [1, 1, T, S]
    if mask is not None:
        visible = visible & mask.bool()[..., k_slots.clamp(0, mask.shape[-1] - 1)]
    bias = None
    if cfg.position == "alibi":
        bias = alibi_bias(cfg.num_heads, q_slots[None], k_slots[None])
    elif rel_bias is not None:
        bias = rel_bias(q_slots[None], k_slots[None])
    return visible, bias
