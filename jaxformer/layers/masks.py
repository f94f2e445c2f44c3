"""Attention masks: boolean, True = may attend, broadcastable to [B, H, T, S], combined as
booleans before they touch the scores (docs/numerics.md §4); `AttentionMask`, a mask kept as
its parts (the blockwise, ring and kernel paths build each block's mask from them); the ALiBi
bias of a block of slots. Twin: torch_ref/layers/masks.py.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from jaxformer.layers.positional import default_positions
from jaxformer.layers.scores import alibi_block  # noqa: F401  (re-exported)


# ----------------------------------------------------------------------------- masks
def make_padding_mask(valid: jax.Array) -> jax.Array:
    """valid [B, S] (1/True = real token) -> [B, 1, 1, S] bool."""
    return valid.astype(bool)[:, None, None, :]


def make_causal_mask(q_len: int, k_len: int | None = None, offset=0) -> jax.Array:
    """Query i sits at absolute position offset + i; key j is visible iff j <= offset + i.
    -> [1, 1, T, S] bool."""
    k_len = q_len if k_len is None else k_len
    q = jnp.arange(q_len)[:, None] + offset
    return (jnp.arange(k_len)[None, :] <= q)[None, None]


def make_sliding_window_mask(q_len: int, k_len: int | None, window: int, offset=0) -> jax.Array:
    """Causal sliding window (Longformer / Mistral): key j visible iff 0 <= (offset+i) - j < window.
    -> [1, 1, T, S] bool."""
    k_len = q_len if k_len is None else k_len
    dist = (jnp.arange(q_len)[:, None] + offset) - jnp.arange(k_len)[None, :]
    return ((dist >= 0) & (dist < window))[None, None]


def make_segment_mask(segment_ids: jax.Array) -> jax.Array:
    """Packed documents: segment_ids [B, T] int (which document each token belongs to, 0 =
    padding) -> [B, 1, T, T] bool: query i sees key j iff both are in the same segment and
    that segment is not 0. Causality is the caller's causal mask, combined as a boolean; a
    padding query row sees nothing and outputs 0."""
    same = segment_ids[:, :, None] == segment_ids[:, None, :]  # [B, T, T]
    return (same & (segment_ids != 0)[:, None, :])[:, None]


def combine_masks(*masks: jax.Array | None) -> jax.Array | None:
    """Logical AND of the masks that are not None (None if all are)."""
    out = None
    for m in masks:
        if m is None:
            continue
        m = m.astype(bool)
        out = m if out is None else jnp.logical_and(out, m)
    return out


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class AttentionMask:
    """A self-attention mask kept as its parts, O(T + S) memory, for the blockwise and ring
    paths (jaxformer/layers/kernels/blockwise.py): they build each [bq, bk] block of it on the fly and
    never hold the [B, 1, T, S] boolean the plain path takes (`dense()` makes that one).

    Query i sits at slot q_slots[b, i] and key j at slot k_slots[b, j] (absolute sequence
    slots, not RoPE positions: packed documents restart their positions, not their slots; a
    ring shard holds the slots of its part of the sequence). Key j is visible to query i iff
      * k_valid[b, j] (padding; None = all keys real),
      * causal: k_slot <= q_slot,
      * window (an int32 scalar, may be traced; None = no window): with causal
        q_slot - k_slot < window (Mistral's causal window, make_sliding_window_mask), without
        |q_slot - k_slot| < window (the bidirectional band),
      * q_segments[b, i] == k_segments[b, j] != 0 (packed documents, make_segment_mask).
    alibi_slopes [H] (None = none): ALiBi's bias -slope_h * |q_slot - k_slot| is added to the
    scores of each block (slot distance equals position distance wherever a key is visible).
    Leading dims of size 1 broadcast over the batch.
    """

    q_slots: jax.Array                      # [B|1, T] int32
    k_slots: jax.Array                      # [B|1, S] int32
    k_valid: jax.Array | None = None        # [B, S] bool
    q_segments: jax.Array | None = None     # [B, T] int
    k_segments: jax.Array | None = None     # [B, S] int
    window: jax.Array | None = None         # int32 scalar
    alibi_slopes: jax.Array | None = None   # [H] float32
    causal: bool = dataclasses.field(default=False, metadata=dict(static=True))

    @classmethod
    def self_attention(cls, batch: int, length: int, *, causal: bool, key_valid=None, segment_ids=None,
                       offset=0) -> AttentionMask:
        """Self-attention over `length` tokens at slots offset.. (key_valid [B, T], segment_ids [B, T])."""
        # a static offset gives numpy slots, known at trace time: a kernel that takes the mask as
        # a static pattern (Pallas' splash, layers/kernels/blockwise.py) can then see it is the default one
        slots = (np.arange(length, dtype=np.int32)[None] + np.int32(offset) if isinstance(offset, int)
                 else default_positions(1, length, offset))
        return cls(slots, slots, k_valid=None if key_valid is None else key_valid.astype(bool),
                   q_segments=segment_ids, k_segments=segment_ids, causal=causal)

    def with_window(self, window) -> AttentionMask:
        return dataclasses.replace(self, window=None if window is None else jnp.asarray(window, jnp.int32))

    def visible(self, q_slots, k_slots, k_valid=None, q_segments=None, k_segments=None) -> jax.Array:
        """The mask of the given slices of this one's parts ([B|1, bq], [B|1, bk], ...)
        -> [B|1, 1, bq, bk] bool. Pass the slices of a block; `dense()` passes everything."""
        d = q_slots[:, :, None] - k_slots[:, None, :]  # [B|1, bq, bk]
        out = d >= 0 if self.causal else jnp.ones(d.shape, bool)
        if self.window is not None:
            out = out & ((d if self.causal else jnp.abs(d)) < self.window)
        if k_valid is not None:
            out = out & k_valid[:, None, :]
        if q_segments is not None:
            out = out & (q_segments[:, :, None] == k_segments[:, None, :]) & (k_segments != 0)[:, None, :]
        return out[:, None]

    def dense(self) -> jax.Array:
        """-> [B|1, 1, T, S] bool, the mask the plain path takes."""
        return self.visible(self.q_slots, self.k_slots, self.k_valid, self.q_segments, self.k_segments)

    def dense_bias(self) -> jax.Array | None:
        """ALiBi's [1|B, H, T, S] bias (None without slopes), for the plain path."""
        if self.alibi_slopes is None:
            return None
        return alibi_block(self.alibi_slopes, self.q_slots, self.k_slots)
