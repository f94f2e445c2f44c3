"""Torch twin of jaxformer/train/tasks.py: the same batches, the same summed losses."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from jaxformer.train.tasks import CLASSIFICATION


def cross_entropy_sum(logits, labels, weights, label_smoothing: float):
    """torch's CrossEntropyLoss(label_smoothing, reduction='sum') over positions with weight 1."""
    flat_logits = logits.float().reshape(-1, logits.shape[-1])
    flat_labels = labels.reshape(-1).long().masked_fill(weights.reshape(-1) == 0, -100)
    loss = F.cross_entropy(flat_logits, flat_labels, ignore_index=-100, reduction="sum",
                           label_smoothing=label_smoothing)
    correct = ((logits.argmax(-1) == labels).float() * weights).sum()
    return loss, correct


def forward_loss(name: str, model, batch: dict, label_smoothing: float, pad_id: int = 0):
    if name in CLASSIFICATION:
        x = batch["ids"] if name == "classifier" else batch["images"]
        logits = model(x)  # [B, C]
        w = torch.ones(logits.shape[:1])
        loss, correct = cross_entropy_sum(logits, batch["labels"], w, label_smoothing)
        return loss, w.sum(), {"correct": correct}
    if name == "lm":
        tokens = batch["tokens"]
        logits = model(tokens[:, :-1])  # [B, T, V]
        w = torch.ones(tokens[:, 1:].shape)
        loss, correct = cross_entropy_sum(logits, tokens[:, 1:], w, label_smoothing)
        return loss, w.sum(), {"correct": correct}
    if name == "seq2seq":
        logits = model(batch["src"], batch["tgt_in"])  # [B, T, V]
        w = (batch["tgt_out"] != pad_id).float()
        loss, correct = cross_entropy_sum(logits, batch["tgt_out"], w, label_smoothing)
        return loss, w.sum(), {"correct": correct}
    if name == "timeseries":
        pred = model(batch["inputs"]).float()  # [B, horizon, C_out]
        err = (pred - batch["targets"]).square()
        return err.sum(), torch.tensor(float(err.numel())), {"abs_err": err.sqrt().sum()}
    raise ValueError(f"no training task for model {name!r}")
