"""Score modifiers, the one place every attention path (plain, blockwise, ring, MLA) takes
them from: the soft-cap of the scaled scores (Gemma2, docs/numerics.md §21), ALiBi's slot
distances and bias, and the softmax with attention sinks (gpt-oss, docs/numerics.md §28).
A T5 bias reaches every path as an additive `bias` (layers/positional.py). Twin:
torch_ref/layers/scores.py.
"""
from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp

from jaxformer.layers import special


@dataclass(frozen=True, eq=False)
class ScoreMods:
    """One attention call's score modifiers: config/attention.py's Scores with the layer's
    learned sink logits in place of its flag. scale: None = 1/sqrt(K); softcap: scaled scores
    -> softcap * tanh(scores / softcap) before bias and mask (Gemma2, docs/numerics.md §21);
    sinks: [H] logits, one per query head, that join every row's softmax denominator as an
    extra column with no value (gpt-oss, docs/numerics.md §28)."""
    scale: float | None = None
    softcap: float | None = None
    sinks: jax.Array | None = None


def soft_cap(scores: jax.Array, cap: float | None) -> tuple[jax.Array, jax.Array | None]:
    """cap * tanh(scores / cap), before bias and mask, and the tanh (its derivative is
    1 - tanh^2, which blockwise's backward uses); (scores, None) without a cap."""
    if cap is None:
        return scores, None
    tanh = special.tanh(scores / cap)  # not jnp.tanh: 4.6 ulp on XLA:CPU (docs/numerics.md §44)
    return tanh * cap, tanh


def slot_distance(q_slots: jax.Array, k_slots: jax.Array) -> jax.Array:
    """|q_slot - k_slot| float32: q_slots [B|1, T], k_slots [B|1, S] -> [B|1, T, S]."""
    return jnp.abs(q_slots[:, :, None] - k_slots[:, None, :]).astype(jnp.float32)


def alibi_block(slopes: jax.Array, q_slots: jax.Array, k_slots: jax.Array) -> jax.Array:
    """ALiBi over slots: slopes [H], q_slots [B|1, bq], k_slots [B|1, bk] -> [B|1, H, bq, bk]."""
    return -slopes.astype(jnp.float32)[None, :, None, None] * slot_distance(q_slots, k_slots)[:, None]


def sink_softmax(scores: jax.Array, sinks: jax.Array | None) -> jax.Array:
    """softmax over the keys of scores [B, H, T, S] float32; with sinks [H], each head's sink
    logit joins every row as one more column (max-subtracted with it), then is dropped."""
    if sinks is None:
        return jax.nn.softmax(scores, axis=-1)
    b, h, t, _ = scores.shape
    sink = jnp.broadcast_to(sinks.astype(jnp.float32).reshape(1, h, 1, 1), (b, h, t, 1))
    return jax.nn.softmax(jnp.concatenate([scores, sink], axis=-1), axis=-1)[..., :-1]
