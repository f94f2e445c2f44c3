"""Attention masks: boolean, True = may attend, broadcastable to [B, H, T, S], combined as
booleans before they touch the scores (docs/numerics.md §4); `AttentionMask`, a mask kept as
its parts; the ALiBi bias of a block of slots. Twin: jaxformer/layers/masks.py.
"""
from __future__ import annotations

import dataclasses

import torch

from torch_ref.layers.positional import default_positions
from torch_ref.layers.scores import alibi_block  # re-exported


# ----------------------------------------------------------------------------- masks
def make_padding_mask(valid: torch.Tensor) -> torch.Tensor:
    """valid [B, S] (1/True = real token) -> [B, 1, 1, S] bool."""
    return valid.bool()[:, None, None, :]


def make_causal_mask(q_len: int, k_len: int | None = None, offset=0, device=None) -> torch.Tensor:
    """Key j is visible to query i iff j <= offset + i. -> [1, 1, T, S] bool."""
    k_len = q_len if k_len is None else k_len
    q = torch.arange(q_len, device=device)[:, None] + offset
    return (torch.arange(k_len, device=device)[None, :] <= q)[None, None]


def make_sliding_window_mask(q_len: int, k_len: int | None, window: int, offset=0,
                             device=None) -> torch.Tensor:
    """Key j visible iff 0 <= (offset+i) - j < window. -> [1, 1, T, S] bool (AttentionMask's rule)."""
    k_len = q_len if k_len is None else k_len
    return AttentionMask(default_positions(1, q_len, offset, device=device), default_positions(1, k_len, device=device),
                         causal=True, window=window).dense()


def make_segment_mask(segment_ids: torch.Tensor) -> torch.Tensor:
    """Packed documents: segment_ids [B, T] int (which document each token belongs to, 0 =
    padding) -> [B, 1, T, T] bool: query i sees key j iff both are in the same segment and
    that segment is not 0. Causality is the caller's causal mask, combined as a boolean; a
    padding query row sees nothing and outputs 0."""
    same = segment_ids[:, :, None] == segment_ids[:, None, :]  # [B, T, T]
    return (same & (segment_ids != 0)[:, None, :])[:, None]


def combine_masks(*masks: torch.Tensor | None) -> torch.Tensor | None:
    """Logical AND of the masks that are not None (None if all are)."""
    out = None
    for m in masks:
        if m is None:
            continue
        m = m.bool()
        out = m if out is None else out & m
    return out


@dataclasses.dataclass(frozen=True)
class AttentionMask:
    """The one mask record of self-attention (jaxformer/layers/masks.py AttentionMask, the same
    fields and rule), dense only in layers/dispatch.py: key j visible to query i iff k_valid[b, j],
    causal k_slot <= q_slot, window (causal q_slot - k_slot < window, else |q_slot - k_slot| <
    window), q_segments[b, i] == k_segments[b, j] != 0 and other[b?, h?, i, j]; alibi_slopes [H]
    adds -slope * |q_slot - k_slot|. A record without slots is `other` alone."""

    q_slots: torch.Tensor | None = None        # [B|1, T] int
    k_slots: torch.Tensor | None = None        # [B|1, S] int
    k_valid: torch.Tensor | None = None        # [B, S] bool
    q_segments: torch.Tensor | None = None     # [B, T] int
    k_segments: torch.Tensor | None = None     # [B, S] int
    window: int | None = None
    alibi_slopes: torch.Tensor | None = None   # [H] float32
    other: torch.Tensor | None = None          # bool, broadcastable to [B, H, T, S]
    causal: bool = False

    @classmethod
    def self_attention(cls, batch: int, length: int, *, causal: bool, key_valid=None, segment_ids=None,
                       offset=0, device=None) -> AttentionMask:
        slots = default_positions(1, length, offset, device=device)
        return cls(slots, slots, k_valid=None if key_valid is None else key_valid.bool(),
                   q_segments=segment_ids, k_segments=segment_ids, causal=causal)

    @classmethod
    def of(cls, mask, length: int, *, causal: bool, offset=0, keys: int | None = None, device=None) -> AttentionMask:
        """A stack's self-attention mask as a record (see the JAX twin)."""
        if isinstance(mask, AttentionMask):
            return dataclasses.replace(mask, causal=causal)
        if keys is None:
            record = cls.self_attention(1, length, causal=causal, offset=offset, device=device)
        else:
            record = cls(default_positions(1, length, offset, device=device), default_positions(1, keys, device=device),
                         causal=causal)
        if mask is None:
            return record
        if mask.dtype == torch.bool and mask.dim() == 4 and tuple(mask.shape[1:3]) == (1, 1):
            return dataclasses.replace(record, k_valid=mask[:, 0, 0, :])
        return dataclasses.replace(record, other=mask)

    def with_window(self, window) -> AttentionMask:
        return dataclasses.replace(self, window=window)

    def for_layer(self, local: bool, window) -> AttentionMask:
        """The mask of one layer: this one with `window` on a sliding-window layer."""
        return self.with_window(window) if local and window is not None else self

    def at_keys(self, k_slots: torch.Tensor) -> AttentionMask:
        """This mask over the keys at absolute slots k_slots [S] (-1 = empty; see the JAX twin)."""
        written = k_slots >= 0  # [S]
        idx = k_slots.clamp(0, None if self.k_slots is None else self.k_slots.shape[-1] - 1)
        k_valid = written[None] if self.k_valid is None else self.k_valid[..., idx] & written
        other = None if self.other is None else self.other.bool()[..., idx]
        return dataclasses.replace(self, k_slots=k_slots[None], k_valid=k_valid, other=other)

    @property
    def parts_only(self) -> bool:
        """Whether a kernel can take this mask as it is (no dense `other` part)."""
        return self.other is None and self.q_slots is not None

    def visible(self, q_slots, k_slots, k_valid=None, q_segments=None, k_segments=None) -> torch.Tensor:
        """The mask of the given slices of the parts -> [B|1, 1, bq, bk] bool."""
        d = q_slots[:, :, None] - k_slots[:, None, :]  # [B|1, bq, bk]
        out = d >= 0 if self.causal else torch.ones(d.shape, dtype=torch.bool, device=d.device)
        if self.window is not None:
            out = out & ((d if self.causal else d.abs()) < self.window)
        if k_valid is not None:
            out = out & k_valid[:, None, :]
        if q_segments is not None:
            out = out & (q_segments[:, :, None] == k_segments[:, None, :]) & (k_segments != 0)[:, None, :]
        return out[:, None]

    def dense(self) -> torch.Tensor | None:
        """-> [B|1, 1|H, T, S] bool, the mask the plain path takes (None: nothing is masked);
        over the default slots from make_causal_mask and make_segment_mask (the JAX twin)."""
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
            make_causal_mask(t, s, device=self.q_slots.device) if self.causal else None,
            None if self.q_segments is None else make_segment_mask(self.q_segments), self.other)

    def dense_bias(self) -> torch.Tensor | None:
        if self.alibi_slopes is None:
            return None
        return alibi_block(self.alibi_slopes, self.q_slots, self.k_slots)


def _default_slots(slots, length: int) -> bool:
    """Whether slots [1, T] are 0..T-1."""
    return tuple(slots.shape) == (1, length) and bool((slots[0] == torch.arange(length, device=slots.device)).all())
