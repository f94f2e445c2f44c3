"""Token losses: smoothed cross-entropy summed over weighted targets, and the weights of an LM's
targets (instruction/chat loss masks, packed-document boundaries). Twin: torch_ref/layers/loss.py.

Losses are sums with a count beside them (jaxformer/train/tasks.py divides by the global count).
Cross-entropy with label smoothing eps is torch's:
    (1 - eps) * nll(target) + eps * mean_over_classes(-log p).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp


def cross_entropy_sum(logits, labels, weights, label_smoothing: float):
    """Summed smoothed cross-entropy over positions with weight 1; -> (loss_sum, correct).
    logits [..., V], labels [...] int, weights [...] of 0/1."""
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    nll = -jnp.take_along_axis(logp, labels[..., None], axis=-1)[..., 0]
    loss = nll
    if label_smoothing:
        loss = (1.0 - label_smoothing) * nll + label_smoothing * -jnp.mean(logp, axis=-1)
    correct = (jnp.argmax(logits, axis=-1) == labels).astype(jnp.float32)
    return jnp.sum(loss * weights), jnp.sum(correct * weights)


def target_weights(tokens, loss_mask=None, segment_ids=None):
    """Weights [B, T] of the targets tokens[:, 1:] of tokens [B, T + 1]: loss_mask [B, T + 1]
    at the target positions (answers only; None = every target), and with segment_ids
    [B, T + 1] none across a document boundary and none in padding (segment 0)."""
    w = (jnp.ones(tokens[:, 1:].shape, jnp.float32) if loss_mask is None
         else loss_mask[:, 1:].astype(jnp.float32))
    if segment_ids is not None:
        seg = segment_ids
        w = w * ((seg[:, 1:] == seg[:, :-1]) & (seg[:, 1:] != 0)).astype(jnp.float32)
    return w


def masked_token_loss(logits, tokens, loss_mask=None, segment_ids=None, *, label_smoothing: float = 0.0):
    """An LM's summed loss over its weighted targets: logits [B, T, V] for tokens [B, T + 1]
    -> (loss_sum, count). The parity registry's loss-mask case."""
    w = target_weights(tokens, loss_mask, segment_ids)
    loss, _ = cross_entropy_sum(logits, tokens[:, 1:], w, label_smoothing)
    return loss, jnp.sum(w)
