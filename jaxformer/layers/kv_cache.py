"""The decode (KV) cache: one typed record per attention layer (`KVCache`), the explicit mode
of a call (train, prefill, decode), a stack's empty cache and its length. transformer.py's
DecoderLayer and Decoder and the attention layers call these. Twin: torch_ref/layers/kv_cache.py.

A layer's cache is {"self": KVCache, "cross": KVCache (fixed; with cross-attention)}; a stack's
is a list of them, or for a scanned stack one dict of records whose leaves are stacked on a
leading layer axis. A KVCache holds its entries ({"k", "v"} [B, G, L, K], head-major; MLA:
{"latent", "k_rope"} [B, 1, L, .]), the sequence slot each entry holds (-1 = empty) and the end
index (one past the last slot written). Every write goes to slot % L: a linear cache (L at
least the sequence) and a sliding-window layer's ring of window slots (its decode memory is
O(window), docs/numerics.md §21) are one code path, and a layer's mask comes from the slots
its entries hold (AttentionMask.at_keys).
"""
from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

# the mode of a call, explicit from the stack down: no cache; a chunk of T > 1 new tokens
# through the cache; one new token
TRAIN, PREFILL, DECODE = "train", "prefill", "decode"


class Step(NamedTuple):
    """Where a cached call writes: `index`, the slot of its first new token (int scalar, may be
    traced), and its `mode` (PREFILL or DECODE). What a DecoderLayer's cached call is given."""
    index: Any
    mode: str


def mode_of(cache, t: int) -> str:
    """The mode of a stack call with `cache` (None = none) and T new tokens."""
    return TRAIN if cache is None else DECODE if t == 1 else PREFILL


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class KVCache:
    """One attention layer's cache. entries: name -> [B, n, L, X] head-major arrays; slots [L]
    int32, the sequence slot each entry holds (-1 = empty); end: int32 scalar, one past the last
    slot written. ring (static): a sliding-window layer's ring of window slots, in which a
    chunk's write can overwrite entries its own earlier queries still see (attend).
    fixed (static): keys/values of an encoder memory, projected once and only read.
    Indexing reads an entry (cache["k"]), as the dict caches did."""

    entries: dict
    slots: jax.Array
    end: jax.Array
    ring: bool = dataclasses.field(default=False, metadata=dict(static=True))
    fixed: bool = dataclasses.field(default=False, metadata=dict(static=True))

    @classmethod
    def empty(cls, entries: dict, *, ring: bool = False) -> KVCache:
        """A cache of zero entries [B, n, L, X] holding no slot yet."""
        length = next(iter(entries.values())).shape[-2]
        return cls(entries, jnp.full((length,), -1, jnp.int32), jnp.int32(0), ring=ring)

    @classmethod
    def memory(cls, entries: dict) -> KVCache:
        """A fixed cache of an encoder memory's keys/values [B, n, S, X] (slots 0..S-1)."""
        length = next(iter(entries.values())).shape[-2]
        return cls(entries, jnp.arange(length, dtype=jnp.int32), jnp.int32(length), fixed=True)

    def __getitem__(self, name: str) -> jax.Array:
        return self.entries[name]

    def __iter__(self):
        return iter(self.entries)

    def values(self):
        return self.entries.values()

    @property
    def size(self) -> int:
        """L, the entries' slot count."""
        return next(iter(self.entries.values())).shape[-2]

    def written_slots(self, index, t: int) -> tuple[jax.Array, jax.Array]:
        """(the slots that T tokens at index.. leave in the cache (the last L of them), their
        cache positions, each slot % L)."""
        m = min(t, self.size)
        slots = index + jnp.arange(t - m, t, dtype=jnp.int32)
        return slots, slots % self.size

    def write(self, new: dict, index) -> KVCache:
        """The one write path: entries new [B, n, T, X] of the tokens at slots index.. go to
        slot % L; a ring keeps the last L of them. A run that cannot wrap (a linear cache: the
        caller keeps index + T <= L; a single token) is one slice update."""
        t = next(iter(new.values())).shape[-2]
        slots, at = self.written_slots(index, t)
        if t == 1 or not self.ring:
            start = index % self.size
            entries = {name: jax.lax.dynamic_update_slice(e, new[name].astype(e.dtype), (0,) * (e.ndim - 2) + (start, 0))
                       for name, e in self.entries.items()}  # [B, n, L, X]
        else:
            entries = {name: e.at[..., at, :].set(new[name][..., t - slots.shape[0]:, :].astype(e.dtype))
                       for name, e in self.entries.items()}  # [B, n, L, X]
        return dataclasses.replace(self, entries=entries, slots=self._slots_after(index, t),
                                   end=jnp.asarray(index + t, jnp.int32))

    def _slots_after(self, index, t: int) -> jax.Array:
        """[L] int32: the slots held after T tokens at index.. are written."""
        slots, at = self.written_slots(index, t)
        if t == 1 or not self.ring:
            return jax.lax.dynamic_update_slice(self.slots, slots, (index % self.size,))
        return self.slots.at[at].set(slots)

    def attend(self, new: dict, index, mode: str) -> tuple[dict, bool, KVCache]:
        """Write the T new entries new [B, T, n, X] and give what the queries read, as (keys,
        head_major, cache): the cache after the write, head-major [B, n, L, X]; for a chunk in a
        ring (prefill: the write may overwrite entries earlier queries of the chunk still see)
        the ring before the write followed by the chunk, [B, L + T, n, X]. key_slots says
        where each read entry sits."""
        written = self.write({name: jnp.swapaxes(a, 1, 2) for name, a in new.items()}, index)
        if self.ring and mode == PREFILL:
            return ({name: jnp.concatenate([jnp.swapaxes(self.entries[name], 1, 2).astype(a.dtype), a], axis=1)
                     for name, a in new.items()}, False, written)
        return written.entries, True, written

    def key_slots(self, index, t: int, mode: str) -> jax.Array:
        """[S] int32: the slot of each entry `attend` reads for T tokens at index.. (-1 = empty)."""
        if self.ring and mode == PREFILL:
            return jnp.concatenate([self.slots, index + jnp.arange(t, dtype=jnp.int32)])
        return self._slots_after(index, t)

    def take_rows(self, rows: jax.Array, axis: int = 0) -> KVCache:
        """The entries of batch rows `rows` (axis: the batch axis, 1 for a stacked cache)."""
        return dataclasses.replace(self, entries={name: e[(slice(None),) * axis + (rows,)] for name, e in self.entries.items()})


def layer_cache(layer, batch: int, length: int, memory: jax.Array | None = None, dtype=jnp.float32,
                ring: bool = False) -> dict:
    """An empty self-attention cache of `length` slots for a DecoderLayer (ring: a
    sliding-window layer's ring), plus the cross-attention keys and values of memory [B, S, D]
    (projected once)."""
    cache = {"self": layer.self_attn.init_cache(batch, length, dtype, ring=ring)}
    if layer.cross_attn is not None:
        if memory is None:
            raise ValueError("init_cache of a DecoderLayer with cross-attention needs `memory`")
        cache["cross"] = layer.cross_attn.memory_cache(memory, dtype)
    return cache


def stack_cache(stack, batch: int, length: int, memory: jax.Array | None = None,
                dtype=jnp.float32) -> list | dict:
    """Per layer of a Decoder: an empty self-attention cache of `length` slots [B, G, L, K] (a
    sliding-window layer: min(length, window) slots, a ring when that is the window) and, with
    cross-attention, the keys/values of memory [B, S, D]. A list of per-layer dicts, or for a
    scanned stack (scan_layers) one dict of stacked leaves [num_layers, B, G, ., K] that the
    cached call scans over (rings only when every layer is a sliding-window one)."""
    local, window = stack.cfg.local_layers(), stack.cfg.attention.sliding_window
    slots = [min(length, window) if is_local else length for is_local in local]
    if not stack.scan_layers:
        return [layer.init_cache(batch, n, memory, dtype, ring=is_local and n == window)
                for layer, n, is_local in zip(stack.layers, slots, local, strict=True)]
    n = slots[0] if all(local) else length
    graphdef, state = nnx.split(stack.layers)

    def one(layer_state):
        return nnx.merge(graphdef, layer_state).init_cache(batch, n, memory, dtype, ring=all(local) and n == window)
    return jax.vmap(one)(state)


def cache_length(cache: list | dict) -> int | None:
    """L, the slots of the cache's linear (not ring) layers; None when every layer's cache is a
    ring (then L is the caller's mask length)."""
    records = [cache["self"]] if isinstance(cache, dict) else [c["self"] for c in cache]
    full = [r.size for r in records if not r.ring]
    return full[0] if full else None
