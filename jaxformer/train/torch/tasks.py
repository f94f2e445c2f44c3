"""Torch twin of jaxformer/train/tasks.py: the same batches, the same summed losses."""
from __future__ import annotations

import torch

from jaxformer.train.tasks import (  # noqa: F401 (objective: the twin's)
    CLASSIFICATION,
    EXPERT_LOAD,
    logits_of,
    model_input,
    moe_of,
    objective,
)
from torch_ref.layers.loss import cross_entropy_sum, target_weights


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
        for moe, row in zip(layers, load, strict=True):
            moe.router.score_bias.add_(rate * torch.sign(row.mean() - row))


def lm_weights(batch: dict, tokens):
    """tasks.lm_weights (layers/loss.py target_weights)."""
    return target_weights(tokens, batch.get("loss_mask"), batch.get("segment_ids"))


def forward_loss(name: str, model, batch: dict, label_smoothing: float, pad_id: int = 0):
    if name in CLASSIFICATION:
        logits = logits_of(model(model_input(batch)))  # [B, C]
        w = torch.ones(logits.shape[:1])
        loss, correct = cross_entropy_sum(logits, batch["labels"], w, label_smoothing)
        return loss, w.sum(), {"correct": correct}
    if name == "lm":
        tokens, moe, seg = batch["tokens"], moe_of(getattr(model, "cfg", None)), batch.get("segment_ids")
        kw = {} if seg is None else {"segment_ids": seg[:, :-1]}  # packed documents
        out = model(tokens[:, :-1], return_aux=True, **kw) if moe else model(tokens[:, :-1], **kw)
        logits = logits_of(out)  # [B, T, V]
        w = lm_weights(batch, tokens)  # [B, T]
        loss, correct = cross_entropy_sum(logits, tokens[:, 1:], w, label_smoothing)
        extra = moe_terms(out.aux, moe, w.sum()) if moe else {}
        return loss, w.sum(), {"correct": correct, **extra}
    if name == "seq2seq":
        logits = logits_of(model(batch["src"], batch["tgt_in"]))  # [B, T, V]
        w = (batch["tgt_out"] != pad_id).float()
        loss, correct = cross_entropy_sum(logits, batch["tgt_out"], w, label_smoothing)
        return loss, w.sum(), {"correct": correct}
    if name == "timeseries":
        pred = model(batch["inputs"]).float()  # [B, horizon, C_out]
        err = (pred - batch["targets"]).square()
        return err.sum(), torch.tensor(float(err.numel())), {"abs_err": err.sqrt().sum()}
    raise ValueError(f"no training task for model {name!r}")
