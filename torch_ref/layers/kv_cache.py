"""The decode (KV) cache: one typed record per attention layer (`KVCache`), the explicit mode
of a call (train, prefill, decode), a stack's empty cache and its length. Twin:
jaxformer/layers/kv_cache.py (the same record, fields and rule; torch writes in place).

A layer's cache is {"self": KVCache, "cross": KVCache (fixed; with cross-attention)}; a stack's
is a list of them. Every write goes to slot % L: a linear cache and a sliding-window layer's
ring of window slots (docs/numerics.md §21) are one code path, and a layer's mask comes from
the slots its entries hold (AttentionMask.at_keys).
"""
from __future__ import annotations

from typing import Any, NamedTuple

import torch

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


class KVCache:
    """One attention layer's cache (see the JAX twin). entries: name -> [B, n, L, X] head-major
    tensors; slots [L] long, the sequence slot each entry holds (-1 = empty); end: one past the
    last slot written; ring: a sliding-window layer's ring; fixed: an encoder memory's keys and
    values, only read. Indexing reads an entry (cache["k"])."""

    def __init__(self, entries: dict, slots: torch.Tensor, end: int, *, ring: bool = False, fixed: bool = False):
        self.entries, self.slots, self.end, self.ring, self.fixed = entries, slots, end, ring, fixed

    @classmethod
    def empty(cls, entries: dict, *, ring: bool = False) -> KVCache:
        """A cache of zero entries [B, n, L, X] holding no slot yet."""
        first = next(iter(entries.values()))
        return cls(entries, torch.full((first.shape[-2],), -1, dtype=torch.long, device=first.device), 0, ring=ring)

    @classmethod
    def memory(cls, entries: dict) -> KVCache:
        """A fixed cache of an encoder memory's keys/values [B, n, S, X] (slots 0..S-1)."""
        first = next(iter(entries.values()))
        return cls(entries, torch.arange(first.shape[-2], device=first.device), first.shape[-2], fixed=True)

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.entries[name]

    def __iter__(self):
        return iter(self.entries)

    def values(self):
        return self.entries.values()

    @property
    def size(self) -> int:
        """L, the entries' slot count."""
        return next(iter(self.entries.values())).shape[-2]

    def written_slots(self, index, t: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(the slots that T tokens at index.. leave in the cache (the last L of them), their
        cache positions, each slot % L)."""
        m = min(t, self.size)
        slots = index + torch.arange(t - m, t, device=self.slots.device)
        return slots, slots % self.size

    def write(self, new: dict, index) -> KVCache:
        """The one write path, in place: entries new [B, n, T, X] of the tokens at slots index..
        go to slot % L; a ring keeps the last L of them."""
        t = next(iter(new.values())).shape[-2]
        slots, at = self.written_slots(index, t)
        for name, e in self.entries.items():
            e[..., at, :] = new[name][..., t - slots.shape[0]:, :].to(e.dtype)  # [B, n, L, X]
        self.slots[at] = slots
        self.end = index + t
        return self

    def attend(self, new: dict, index, mode: str) -> tuple[dict, KVCache]:
        """Write the T new entries new [B, T, n, X] and give what the queries read, as (keys
        [B, S, n, X], cache): the cache after the write; for a chunk in a ring (prefill) the ring
        before the write followed by the chunk, [B, L + T, n, X]. key_slots says where each read
        entry sits."""
        before = None
        if self.ring and mode == PREFILL:  # copied before the write overwrites it
            before = {name: torch.cat([self.entries[name].transpose(1, 2).to(a.dtype), a], dim=1)
                      for name, a in new.items()}
        self.write({name: a.transpose(1, 2) for name, a in new.items()}, index)
        return (before if before is not None else {name: e.transpose(1, 2) for name, e in self.entries.items()}), self

    def key_slots(self, index, t: int, mode: str) -> torch.Tensor:
        """[S]: the slot of each entry `attend` reads for T tokens at index.. (-1 = empty)."""
        if self.ring and mode == PREFILL:
            return torch.cat([self.slots, index + torch.arange(t, device=self.slots.device)])
        slots, at = self.written_slots(index, t)
        after = self.slots.clone()
        after[at] = slots
        return after

    def take_rows(self, rows: torch.Tensor) -> KVCache:
        """The entries of batch rows `rows`."""
        return KVCache({name: e[rows] for name, e in self.entries.items()}, self.slots.clone(), self.end,
                       ring=self.ring, fixed=self.fixed)


def layer_cache(layer, batch: int, length: int, memory: torch.Tensor | None = None, dtype=torch.float32,
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


def stack_cache(stack, batch: int, length: int, memory: torch.Tensor | None = None, dtype=torch.float32) -> list:
    """Per layer of a Decoder: an empty self-attention cache of `length` slots [B, G, L, K] (a
    sliding-window layer: min(length, window) slots, a ring when that is the window) and, with
    cross-attention, the keys/values of memory [B, S, D]."""
    local, window = stack.cfg.local_layers(), stack.cfg.attention.sliding_window
    slots = [min(length, window) if is_local else length for is_local in local]
    return [layer.init_cache(batch, n, memory, dtype, ring=is_local and n == window)
            for layer, n, is_local in zip(stack.layers, slots, local, strict=True)]


def cache_length(cache: list) -> int | None:
    """L, the slots of the cache's linear (not ring) layers; None when every layer's cache is a
    ring (then L is the caller's mask length)."""
    full = [c["self"].size for c in cache if not c["self"].ring]
    return full[0] if full else None
