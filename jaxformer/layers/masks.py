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
from jaxformer.layers.scores import alibi_block  # re-exported


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
    -> [1, 1, T, S] bool (AttentionMask's rule)."""
    k_len = q_len if k_len is None else k_len
    return AttentionMask(default_positions(1, q_len, offset), default_positions(1, k_len), causal=True,
                         window=jnp.asarray(window, jnp.int32)).dense()


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
    """The one mask record of self-attention: its parts, O(T + S) memory, travel down the stack
    and become dense (or a kernel's mask object) only in layers/dispatch.py. The blockwise, ring
    and splash paths build each [bq, bk] block of it on the fly and never hold the [B, 1, T, S]
    boolean the plain path takes (`dense()` makes that one).

    Query i sits at slot q_slots[b, i] and key j at slot k_slots[b, j] (absolute sequence
    slots, not RoPE positions: packed documents restart their positions, not their slots; a
    ring shard holds the slots of its part of the sequence; a KV cache's keys sit at the slots
    its entries hold, `at_keys`). Key j is visible to query i iff
      * k_valid[b, j] (padding, or an empty cache entry; None = all keys real),
      * causal: k_slot <= q_slot,
      * window (an int32 scalar, may be traced; None = no window): with causal
        q_slot - k_slot < window (Mistral's causal window), without |q_slot - k_slot| < window
        (the bidirectional band); a layer takes it with `for_layer`,
      * q_segments[b, i] == k_segments[b, j] != 0 (packed documents, make_segment_mask),
      * other[b?, h?, i, j]: any other boolean mask a caller gave (a record holding one is
        computed densely).
    alibi_slopes [H] (None = none): ALiBi's bias -slope_h * |q_slot - k_slot| is added to the
    scores (slot distance equals position distance wherever a key is visible).
    Leading dims of size 1 broadcast over the batch. A record without slots is `other` alone.
    """

    q_slots: jax.Array | None = None        # [B|1, T] int32
    k_slots: jax.Array | None = None        # [B|1, S] int32
    k_valid: jax.Array | None = None        # [B, S] bool
    q_segments: jax.Array | None = None     # [B, T] int
    k_segments: jax.Array | None = None     # [B, S] int
    window: jax.Array | None = None         # int32 scalar
    alibi_slopes: jax.Array | None = None   # [H] float32
    other: jax.Array | None = None          # bool, broadcastable to [B, H, T, S]
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

    @classmethod
    def of(cls, mask, length: int, *, causal: bool, offset=0, keys: int | None = None) -> AttentionMask:
        """A stack's self-attention mask as a record: `mask` a record (its causality set to the
        stack's), None, a key padding mask [B, 1, 1, S] or any other boolean mask (kept as
        `other`), for `length` queries at slots offset.. over keys at slots 0..keys - 1
        (None = the queries' own slots)."""
        if isinstance(mask, AttentionMask):
            return dataclasses.replace(mask, causal=causal)
        if keys is None:
            record = cls.self_attention(1, length, causal=causal, offset=offset)
        else:
            record = cls(default_positions(1, length, offset), default_positions(1, keys), causal=causal)
        if mask is None:
            return record
        if mask.dtype == jnp.bool_ and mask.ndim == 4 and mask.shape[1:3] == (1, 1):
            return dataclasses.replace(record, k_valid=mask[:, 0, 0, :])
        return dataclasses.replace(record, other=mask)

    def with_window(self, window) -> AttentionMask:
        return dataclasses.replace(self, window=None if window is None else jnp.asarray(window, jnp.int32))

    def for_layer(self, local, window) -> AttentionMask:
        """The mask of one layer: this one with `window` on a sliding-window layer. local: a
        Python bool, or a traced one inside the scan over stacked mixed layers (then the full
        layers get a window no distance reaches)."""
        if local is False or window is None:
            return self
        if local is True:
            return self.with_window(window)
        return dataclasses.replace(self, window=jnp.where(local, jnp.int32(window), jnp.iinfo(jnp.int32).max))

    def at_keys(self, k_slots: jax.Array) -> AttentionMask:
        """This mask over the keys at absolute slots k_slots [S] int32 (a KV cache's entries;
        -1 = empty, never visible) instead of its own keys, which must sit at slots 0..L-1:
        k_valid and `other` are read at those slots."""
        written = k_slots >= 0  # [S]
        idx = jnp.clip(k_slots, 0, None if self.k_slots is None else self.k_slots.shape[-1] - 1)
        k_valid = written[None] if self.k_valid is None else jnp.take(self.k_valid, idx, axis=-1) & written
        other = None if self.other is None else jnp.take(self.other.astype(bool), idx, axis=-1)
        return dataclasses.replace(self, k_slots=k_slots[None], k_valid=k_valid, other=other)

    @property
    def parts_only(self) -> bool:
        """Whether a kernel can take this mask as it is (no dense `other` part)."""
        return self.other is None and self.q_slots is not None

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

    def dense(self) -> jax.Array | None:
        """-> [B|1, 1|H, T, S] bool, the mask the plain path takes (None: nothing is masked).
        Over the default slots (0..T-1 against themselves, known at trace time) the causal and
        segment parts come from make_causal_mask and make_segment_mask, the builders the
        parity self-test's mutations patch (jaxformer/parity/mutations.py)."""
        if self.q_slots is None:
            return self.other
        t, s = self.q_slots.shape[-1], self.k_slots.shape[-1]
        if not (_default_slots(self.q_slots, t) and self.k_slots is self.q_slots and self.k_segments is self.q_segments):
            return combine_masks(self.visible(self.q_slots, self.k_slots, self.k_valid, self.q_segments,
                                              self.k_segments), self.other)
        rest = dataclasses.replace(self, causal=False)  # padding and window; with causal: 0 <= d < window
        return combine_masks(
            rest.visible(self.q_slots, self.k_slots, self.k_valid) if self.window is not None or self.k_valid is not None
            else None,
            make_causal_mask(t, s) if self.causal else None,
            None if self.q_segments is None else make_segment_mask(self.q_segments), self.other)

    def dense_bias(self) -> jax.Array | None:
        """ALiBi's [1|B, H, T, S] bias (None without slopes), for the plain path."""
        if self.alibi_slopes is None:
            return None
        return alibi_block(self.alibi_slopes, self.q_slots, self.k_slots)


def _default_slots(slots, length: int) -> bool:
    """Whether slots [1, T] are 0..T-1, known at trace time (numpy)."""
    return isinstance(slots, np.ndarray) and slots.shape == (1, length) and bool(np.all(slots[0] == np.arange(length)))
