"""Token losses: smoothed cross-entropy summed over weighted targets, and the weights of an LM's
targets (instruction/chat loss masks, packed-document boundaries). Twin: torch_ref/layers/loss.py.

Losses are sums with a count beside them (jaxformer/train/tasks.py divides by the global count).
Cross-entropy with label smoothing eps is torch's:
    (1 - eps) * nll(target) + eps * mean_over_classes(-log p).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp


def cross_entropy_sum(logits, labels, weights, label_smoothing: float):
    """Summed smoothed cross-entropy over positions with weight 1; -> (loss_sum, correct).
    logits [..., V], labels [...] int, weights [...] of 0/1."""
    loss = _smoothed_nll_sum(float(label_smoothing), logits.astype(jnp.float32), labels, weights)
    correct = (jnp.argmax(logits, axis=-1) == labels).astype(jnp.float32)
    return loss, jnp.sum(correct * weights)


def _smoothed_nll(logits, labels, label_smoothing: float):
    """Per position: (1 - eps) * -log p(label) + eps * mean over classes of -log p, and log p.
    logits [..., V] float32 -> ([...], [..., V])."""
    logp = jax.nn.log_softmax(logits, axis=-1)
    nll = -jnp.take_along_axis(logp, labels[..., None], axis=-1)[..., 0]
    if label_smoothing:
        nll = (1.0 - label_smoothing) * nll + label_smoothing * -jnp.mean(logp, axis=-1)
    return nll, logp


# The loss's own backward: autodiff of log_softmax and of the label lookup builds the one-hot
# scatter and the softmax from values all known in the forward pass, and XLA computes them
# there and holds them to the backward pass (4 [..., V] arrays at a training step's peak).
# This one keeps log p only (the logits are not needed after it) and forms
# d loss / d logits = g * w * (softmax - (1 - eps) one_hot - eps / V) in one pass when the
# cotangent arrives (docs/numerics.md §38).
@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _smoothed_nll_sum(label_smoothing: float, logits, labels, weights):
    return jnp.sum(_smoothed_nll(logits, labels, label_smoothing)[0] * weights)


def _smoothed_nll_sum_fwd(label_smoothing, logits, labels, weights):
    nll, logp = _smoothed_nll(logits, labels, label_smoothing)
    return jnp.sum(nll * weights), (logp, labels, weights)


def _smoothed_nll_sum_bwd(label_smoothing, res, g):
    logp, labels, weights = res
    v = logp.shape[-1]
    one_hot = (jnp.arange(v, dtype=labels.dtype) == labels[..., None]).astype(jnp.float32)
    target = (1.0 - label_smoothing) * one_hot + label_smoothing / v
    d_logits = (g * weights)[..., None] * (jnp.exp(logp) - target)
    return d_logits, None, None


_smoothed_nll_sum.defvjp(_smoothed_nll_sum_fwd, _smoothed_nll_sum_bwd)


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
