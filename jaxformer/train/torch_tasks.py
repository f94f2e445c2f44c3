"""Torch twin of jaxformer/train/tasks.py: the same batches, the same summed losses."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from jaxformer.train.tasks import CLASSIFICATION, EXPERT_LOAD, moe_of, objective  # noqa: F401 (objective: the twin's)


def cross_entropy_sum(logits, labels, weights, label_smoothing: float):
    """torch's CrossEntropyLoss(label_smoothing, reduction='sum') over positions with weight 1."""
    flat_logits = logits.float().reshape(-1, logits.shape[-1])
    flat_labels = labels.reshape(-1).long().masked_fill(weights.reshape(-1) == 0, -100)
    loss = F.cross_entropy(flat_logits, flat_labels, ignore_index=-100, reduction="sum",
                           label_smoothing=label_smoothing)
    correct = ((logits.argmax(-1) == labels).float() * weights).sum()
    return loss, correct


def moe_terms(aux: dict, moe, count) -> dict:
    """tasks.moe_terms: one micro-batch's aux-loss sums (value x tokens) and expert load."""
    from torch_ref.layers.moe import moe_aux_losses
    losses = moe_aux_losses(aux["router_logits"], None, moe)  # router_logits [n_sparse, B, T, E]
    return {"moe_load_balance": losses["load_balance"] * count, "moe_z_loss": losses["z_loss"] * count,
            EXPERT_LOAD: aux["expert_load"]}


def update_score_bias(module, load, rate: float) -> None:
    """tasks.update_score_bias: score_bias += rate * sign(mean load - load), per sparse layer
    in depth order; load [n_sparse, E]."""
    from torch_ref.layers.moe import MoE
    layers = [m for m in module.modules() if isinstance(m, MoE)]
    assert len(layers) == load.shape[0], (len(layers), tuple(load.shape))
    with torch.no_grad():
        for moe, row in zip(layers, load):
            moe.router.score_bias.add_(rate * torch.sign(row.mean() - row))


def lm_weights(batch: dict, tokens):
    """tasks.lm_weights: the batch's loss_mask at the target positions, else all ones."""
    if "loss_mask" not in batch:
        return torch.ones(tokens[:, 1:].shape)
    return batch["loss_mask"][:, 1:].float()


def forward_loss(name: str, model, batch: dict, label_smoothing: float, pad_id: int = 0):
    if name in CLASSIFICATION:
        x = batch["ids"] if name == "classifier" else batch["images"]
        logits = model(x)  # [B, C]
        w = torch.ones(logits.shape[:1])
        loss, correct = cross_entropy_sum(logits, batch["labels"], w, label_smoothing)
        return loss, w.sum(), {"correct": correct}
    if name == "lm":
        tokens, moe = batch["tokens"], moe_of(model.cfg)
        out = model(tokens[:, :-1], return_aux=True) if moe else model(tokens[:, :-1])
        logits = out[0] if moe else out  # [B, T, V]
        w = lm_weights(batch, tokens)  # [B, T]
        loss, correct = cross_entropy_sum(logits, tokens[:, 1:], w, label_smoothing)
        extra = moe_terms(out[1], moe, w.sum()) if moe else {}
        return loss, w.sum(), {"correct": correct, **extra}
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
