"""The decode (KV) cache of a decoder stack: its layout, its empty state, and the ring caches of
sliding-window layers (docs/numerics.md §21). transformer.py's DecoderLayer and Decoder call
these. Twin: torch_ref/layers/kv_cache.py.

A layer's cache is {"self": {"k", "v"} [B, G, L, K] (MLA: {"latent", "k_rope"}), "cross":
{"k", "v"} [B, G, S, K] (with cross-attention)}; a stack's is a list of them, or for a scanned
stack one dict of leaves stacked on a leading layer axis. A sliding-window layer's cache is a
ring of window slots when the cache is longer than the window (its decode memory is O(window)).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from jaxformer.config import TransformerConfig
from jaxformer.layers.mla import MultiHeadLatentAttention
from jaxformer.layers.positional import alibi_bias


def cache_slots(self_cache: dict) -> int:
    """The slots L of a self-attention cache: {"k", "v"} [.., G, L, K] or MLA's {"latent",
    "k_rope"} [.., 1, L, .]."""
    return next(iter(self_cache.values())).shape[-2]


def layer_cache(layer, batch: int, length: int, memory: jax.Array | None = None, dtype=jnp.float32) -> dict:
    """An empty self-attention cache of `length` slots for a DecoderLayer, plus the
    cross-attention keys and values of memory [B, S, D] (projected once)."""
    attn = layer.self_attn
    if isinstance(attn, MultiHeadLatentAttention):  # the compressed latent cache
        return {"self": attn.init_cache(batch, length, dtype)}
    shape = (batch, attn.num_kv_heads, length, attn.head_dim)  # [B, G, L, K]
    cache = {"self": {"k": jnp.zeros(shape, dtype), "v": jnp.zeros(shape, dtype)}}
    if layer.cross_attn is not None:
        if memory is None:
            raise ValueError("init_cache of a DecoderLayer with cross-attention needs `memory`")
        kv = layer.cross_attn.project_kv(memory)
        cache["cross"] = {name: jnp.swapaxes(a, 1, 2).astype(dtype) for name, a in kv.items()}  # [B, G, S, K]
    return cache


def stack_cache(stack, batch: int, length: int, memory: jax.Array | None = None,
                dtype=jnp.float32) -> list | dict:
    """Per layer of a Decoder: an empty self-attention cache of `length` slots [B, G, L, K] (a
    sliding-window layer: min(length, window) slots, a ring) and, with cross-attention, the
    keys/values of memory [B, S, D]. A list of per-layer dicts, or for a scanned stack
    (scan_layers) one dict of stacked leaves [num_layers, B, G, ., K] that the cached call
    scans over (rings only when every layer is a sliding-window one)."""
    local = stack.cfg.local_layers()
    slots = [min(length, stack.cfg.sliding_window) if is_local else length for is_local in local]
    if not stack.scan_layers:
        return [layer.init_cache(batch, n, memory, dtype) for layer, n in zip(stack.layers, slots)]
    n = slots[0] if all(local) else length
    graphdef, state = nnx.split(stack.layers)

    def one(layer_state):
        return nnx.merge(graphdef, layer_state).init_cache(batch, n, memory, dtype)
    return jax.vmap(one)(state)


def rolling_layers(cfg: TransformerConfig, cache: list | dict, scan: bool) -> tuple[bool, ...]:
    """Per layer: is its self-attention cache a ring (a sliding-window layer whose cache has
    sliding_window slots)? A scanned stack: one answer for every layer."""
    window, local = cfg.sliding_window, cfg.local_layers()
    if scan:
        ring = all(local) and cache["self"]["k"].shape[-2] == window
        return (ring,) * len(local)
    return tuple(is_local and c["self"]["k"].shape[-2] == window for is_local, c in zip(local, cache))


def cache_length(cfg: TransformerConfig, cache: list | dict, scan: bool) -> int | None:
    """L, the slots of the cache's full (not ring) layers; None when every layer's cache is a
    ring (then L is the caller's mask length)."""
    rolling = rolling_layers(cfg, cache, scan)
    if scan:
        return None if rolling[0] else cache_slots(cache["self"])
    full = [cache_slots(c["self"]) for c, ring in zip(cache, rolling) if not ring]
    return full[0] if full else None


def rolling_inputs(cfg: TransformerConfig, rel_bias, mask, t: int, cache_index):
    """-> (mask, bias) of a ring layer's keys for T new queries at slots cache_index..: with
    T = 1 the ring after the write (ring slot j then holds absolute slot p - (p - j) mod W),
    else the ring before the write followed by the T new keys. A key is visible when
    0 <= query slot - key slot < W, it holds a token (slot >= 0) and the caller's key mask over
    absolute slots (`mask`, [B?, 1, 1?, L]) lets it through. rel_bias: the stack's T5 bias
    module (or None)."""
    window = cfg.sliding_window
    p = cache_index
    ring = jnp.arange(window)
    if t == 1:
        k_slots = p - (p - ring) % window  # [W]
    else:
        k_slots = jnp.concatenate([p - 1 - (p - 1 - ring) % window, p + jnp.arange(t)])  # [W + T]
    q_slots = p + jnp.arange(t)  # [T]
    dist = q_slots[:, None] - k_slots[None, :]  # [T, S]
    visible = ((dist >= 0) & (dist < window) & (k_slots >= 0)[None, :])[None, None]  # [1, 1, T, S]
    if mask is not None:
        keys = jnp.take(mask.astype(bool), jnp.clip(k_slots, 0, mask.shape[-1] - 1), axis=-1)
        visible = jnp.logical_and(visible, keys)
    bias = None
    if cfg.position == "alibi":
        bias = alibi_bias(cfg.num_heads, q_slots[None], k_slots[None])
    elif rel_bias is not None:
        bias = rel_bias(q_slots[None], k_slots[None])
    return visible, bias
