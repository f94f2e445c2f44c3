"""What each model family trains on: how a batch feeds the model and how the loss is summed.
Both frameworks use the same definitions (torch twin: jaxformer/train/torch_tasks.py).

Losses are returned as (sum, count) so that gradient accumulation, pmap and mesh sharding all
divide by the *global* count: the loss of a step is the same however the batch is split.
Cross-entropy with label smoothing eps is torch's:
    (1 - eps) * nll(target) + eps * mean_over_classes(-log p).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

CLASSIFICATION = ("classifier", "vit", "swin")
TOKEN_MODELS = ("lm", "seq2seq")


def cross_entropy_sum(logits, labels, weights, label_smoothing: float):
    """Summed smoothed cross-entropy over positions with weight 1; -> (loss_sum, correct)."""
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    nll = -jnp.take_along_axis(logp, labels[..., None], axis=-1)[..., 0]
    loss = nll
    if label_smoothing:
        loss = (1.0 - label_smoothing) * nll + label_smoothing * -jnp.mean(logp, axis=-1)
    correct = (jnp.argmax(logits, axis=-1) == labels).astype(jnp.float32)
    return jnp.sum(loss * weights), jnp.sum(correct * weights)


def forward_loss(name: str, model, batch: dict, label_smoothing: float, pad_id: int = 0):
    """-> (loss_sum, count, {metric_sum}) for one (micro-)batch."""
    if name in CLASSIFICATION:
        x = batch["ids"] if name == "classifier" else batch["images"]
        logits = model(x)  # [B, C]
        w = jnp.ones(logits.shape[:1], jnp.float32)
        loss, correct = cross_entropy_sum(logits, batch["labels"], w, label_smoothing)
        return loss, jnp.sum(w), {"correct": correct}
    if name == "lm":
        tokens = batch["tokens"]
        logits = model(tokens[:, :-1])  # [B, T, V]
        w = jnp.ones(tokens[:, 1:].shape, jnp.float32)
        loss, correct = cross_entropy_sum(logits, tokens[:, 1:], w, label_smoothing)
        return loss, jnp.sum(w), {"correct": correct}
    if name == "seq2seq":
        logits = model(batch["src"], batch["tgt_in"])  # [B, T, V]
        w = (batch["tgt_out"] != pad_id).astype(jnp.float32)
        loss, correct = cross_entropy_sum(logits, batch["tgt_out"], w, label_smoothing)
        return loss, jnp.sum(w), {"correct": correct}
    if name == "timeseries":
        pred = model(batch["inputs"]).astype(jnp.float32)  # [B, horizon, C_out]
        err = jnp.square(pred - batch["targets"])
        return jnp.sum(err), jnp.asarray(err.size, jnp.float32), {"abs_err": jnp.sum(jnp.sqrt(err))}
    raise ValueError(f"no training task for model {name!r}")


def metric_keys(name: str) -> tuple[str, ...]:
    """The keys of forward_loss's metric sums, known without tracing the model."""
    return ("abs_err",) if name == "timeseries" else ("correct",)


def eval_metrics(name: str, sums: dict) -> dict:
    """Turn summed eval terms into reported metrics."""
    import math
    loss = sums["loss"] / max(sums["count"], 1.0)
    out = {"eval_loss": loss}
    if name in CLASSIFICATION:
        out["eval_accuracy"] = sums["correct"] / max(sums["count"], 1.0)
    elif name in TOKEN_MODELS:
        out["eval_token_accuracy"] = sums["correct"] / max(sums["count"], 1.0)
        out["eval_perplexity"] = math.exp(min(loss, 50.0))
    elif name == "timeseries":
        out["eval_mae"] = sums["abs_err"] / max(sums["count"], 1.0)
    return out


def tokens_in(name: str, batch: dict) -> int:
    """Items per batch for the throughput readout (tokens for text, samples otherwise)."""
    if name == "lm":
        return int(batch["tokens"][:, 1:].size)
    if name == "seq2seq":
        return int(batch["src"].size + batch["tgt_in"].size)
    if name == "classifier":
        return int(batch["ids"].size)
    return int(len(next(iter(batch.values()))))
