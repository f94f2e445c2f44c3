"""Token losses: smoothed cross-entropy summed over weighted targets, and the weights of an LM's
targets (instruction/chat loss masks, packed-document boundaries). Twin: jaxformer/layers/loss.py."""
from __future__ import annotations

import torch
import torch.nn.functional as F


def cross_entropy_sum(logits, labels, weights, label_smoothing: float):
    """torch's CrossEntropyLoss(label_smoothing, reduction='sum') over positions with weight 1.
    Its backward forms softmax - target from the saved log-softmax, as the JAX twin's own
    backward does (docs/numerics.md §38)."""
    flat_logits = logits.float().reshape(-1, logits.shape[-1])
    flat_labels = labels.reshape(-1).long().masked_fill(weights.reshape(-1) == 0, -100)
    loss = F.cross_entropy(flat_logits, flat_labels, ignore_index=-100, reduction="sum",
                           label_smoothing=label_smoothing)
    correct = ((logits.argmax(-1) == labels).float() * weights).sum()
    return loss, correct


def target_weights(tokens, loss_mask=None, segment_ids=None):
    """Weights [B, T] of the targets tokens[:, 1:] of tokens [B, T + 1] (loss.target_weights)."""
    w = torch.ones(tokens[:, 1:].shape) if loss_mask is None else loss_mask[:, 1:].float()
    if segment_ids is not None:
        seg = segment_ids
        w = w * ((seg[:, 1:] == seg[:, :-1]) & (seg[:, 1:] != 0)).float()
    return w


def masked_token_loss(logits, tokens, loss_mask=None, segment_ids=None, *, label_smoothing: float = 0.0):
    """An LM's summed loss over its weighted targets: logits [B, T, V] -> (loss_sum, count)."""
    w = target_weights(tokens, loss_mask, segment_ids)
    loss, _ = cross_entropy_sum(logits, tokens[:, 1:], w, label_smoothing)
    return loss, w.sum()
