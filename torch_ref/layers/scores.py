"""Score modifiers, the one place every attention path (plain, blockwise, ring, MLA) takes
them from: the soft-cap of the scaled scores (Gemma2, docs/numerics.md §21), ALiBi's slot
distances and bias, and the softmax with attention sinks (gpt-oss, docs/numerics.md §28).
A T5 bias reaches every path as an additive `bias` (layers/positional.py). Twin:
jaxformer/layers/scores.py.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True, eq=False)
class ScoreMods:
    """One attention call's score modifiers: config/attention.py's Scores with the layer's
    learned sink logits in place of its flag. scale: None = 1/sqrt(K); softcap: scaled scores
    -> softcap * tanh(scores / softcap) before bias and mask (Gemma2, docs/numerics.md §21);
    sinks: [H] logits, one per query head, that join every row's softmax denominator as an
    extra column with no value (gpt-oss, docs/numerics.md §28)."""
    scale: float | None = None
    softcap: float | None = None
    sinks: torch.Tensor | None = None


def soft_cap(scores: torch.Tensor, cap: float | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """cap * tanh(scores / cap), before bias and mask, and the tanh (its derivative is
    1 - tanh^2, which blockwise's backward uses); (scores, None) without a cap."""
    if cap is None:
        return scores, None
    tanh = torch.tanh(scores / cap)
    return tanh * cap, tanh


def slot_distance(q_slots: torch.Tensor, k_slots: torch.Tensor) -> torch.Tensor:
    """|q_slot - k_slot| float32: q_slots [B|1, T], k_slots [B|1, S] -> [B|1, T, S]."""
    return (q_slots[:, :, None] - k_slots[:, None, :]).abs().float()


def alibi_block(slopes: torch.Tensor, q_slots: torch.Tensor, k_slots: torch.Tensor) -> torch.Tensor:
    """ALiBi over slots: slopes [H], q_slots [B|1, bq], k_slots [B|1, bk] -> [B|1, H, bq, bk]."""
    return -slopes.float()[None, :, None, None] * slot_distance(q_slots, k_slots)[:, None]


def sink_softmax(scores: torch.Tensor, sinks: torch.Tensor | None) -> torch.Tensor:
    """softmax over the keys of scores [B, H, T, S] float32; with sinks [H], each head's sink
    logit joins every row as one more column (max-subtracted with it), then is dropped."""
    if sinks is None:
        return torch.softmax(scores, dim=-1)
    b, h, t, _ = scores.shape
    sink = sinks.float().reshape(1, h, 1, 1).expand(b, h, t, 1)
    return torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]
