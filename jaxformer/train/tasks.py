"""What each model family trains on: how a batch feeds the model and how the loss is summed.
Both frameworks use the same definitions (torch twin: jaxformer/train/torch/tasks.py).

Losses are returned as (sum, count) so that gradient accumulation, pmap and mesh sharding all
divide by the *global* count: the loss of a step is the same however the batch is split.
Cross-entropy with label smoothing eps is torch's:
    (1 - eps) * nll(target) + eps * mean_over_classes(-log p).

Packed documents (data.packing: segments; the batch has `segment_ids` beside `tokens`): the
LM attends within each document only and restarts positions at each (models/lm.py), and the
target that crosses a boundary (a document's eos predicting the next document's first id) has
weight 0: the model saw nothing of the next document, so that target would train the unigram
distribution of document starts, conditioned on an unrelated text; the documents run one by one
have no such target either, so the packed loss is the sum of their losses (tests/test_packing.py).
transformers' DataCollatorWithFlattening drops the same label (its separator_id -100 on each
sequence's first label).

Mixture-of-experts LMs (model.moe) add auxiliary losses to the training objective, as HF's
MixtralForCausalLM adds router_aux_loss_coef * aux_loss to its loss:
    objective = CE + aux_loss_coef * load_balance + z_loss_coef * z_loss
Each micro-batch computes layers/moe.py's moe_aux_losses over all its rows (on a mesh the whole
global micro-batch, as on one device; under pmap the router logits are all-gathered over the
devices first, so each device adds 1/D of the same micro-batch value), and enters the sums
weighted by its token count: the step's aux term is the token-weighted mean of its micro-batch
values. z_loss is a mean over tokens, so it does not depend on the split at all; load_balance
(HF's batch statistic, a product of two means) is a per-micro-batch value, as in HF's Trainer
with gradient accumulation (pmap's micro-batch a holds rows a of every device's slice, other
rows than on one device or a mesh when grad_accum_steps > 1). Eval reports the LM loss alone.

An `lm` batch may carry `loss_mask` [B, T + 1] beside `tokens` (instruction/chat data, written
by `data prepare --format prompt_completion|chat`): the target tokens[:, i] counts only where
loss_mask[:, i] is 1, so the count, and with it the step's divisor, is the number of answer tokens in the global
batch (train and eval alike).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxformer.config.module import logits_of
from jaxformer.layers.kernels.chunked_loss import chunked_cross_entropy_sum
from jaxformer.layers.loss import cross_entropy_sum, target_weights

CLASSIFICATION = ("classifier", "vit", "swin")
TOKEN_MODELS = ("lm", "seq2seq")


MOE_METRICS = ("moe_load_balance", "moe_z_loss")  # summed x tokens; reported per token
EXPERT_LOAD = "moe_expert_load"  # [n_sparse_layers, E] routed assignments, summed over the step


def moe_of(model_cfg):
    """The model's MoEConfig, or None (dense, or a family without MoE)."""
    return getattr(getattr(model_cfg, "feedforward", None), "moe", None)


def moe_terms(aux: dict, moe, count, axis_name: str | None = None) -> dict:
    """One micro-batch's aux-loss sums {moe_load_balance, moe_z_loss: value x tokens} and its
    expert load, from LM(..., return_aux=True)'s aux. axis_name (pmap): the values are those of
    the micro-batch over all devices, each device holding 1/D of the sum; all_gather's transpose
    (a reduce-scatter) returns each device exactly its rows' share of the gradient."""
    from jaxformer.layers.moe import moe_aux_losses
    logits, n, share = aux["router_logits"], count, 1.0  # [n_sparse, B, T, E]
    if axis_name:
        logits = jax.lax.all_gather(logits, axis_name, axis=1, tiled=True)
        n, share = jax.lax.psum(count, axis_name), 1.0 / jax.lax.psum(1, axis_name)
    losses = moe_aux_losses(logits, None, moe)
    return {"moe_load_balance": losses["load_balance"] * n * share, "moe_z_loss": losses["z_loss"] * n * share,
            EXPERT_LOAD: aux["expert_load"]}


def objective(loss_sum, metrics: dict, moe):
    """The training loss sum: the task's loss plus the coefficient-weighted aux sums (MoE)."""
    if moe is None:
        return loss_sum
    return loss_sum + moe.aux_loss_coef * metrics["moe_load_balance"] + moe.z_loss_coef * metrics["moe_z_loss"]


def update_score_bias(rest, load, rate):
    """DeepSeek-V3's aux-loss-free balancing, after an optimiser step: per sparse layer (depth
    order), score_bias += rate * sign(mean load - load), load [n_sparse, E] the step's routed
    assignments over all micro-batches and devices. score_bias is a layers/moe.py Buffer: it
    lives in the non-parameter state `rest`, so no gradient, optimiser, clipping or weight
    decay ever touches it; only this rule moves it. rate may be a traced 0 (a skipped step)."""
    from jaxformer.train.sharding import _key_of
    delta = rate * jnp.sign(jnp.mean(load, axis=-1, keepdims=True) - load)  # [n_sparse, E]
    leaves, treedef = jax.tree_util.tree_flatten_with_path(rest)
    row, out = 0, []
    for path, x in leaves:
        if _key_of(path).endswith("router.score_bias"):
            n = x.shape[0] if x.ndim == 2 else 1  # a scanned stack holds [L, E]
            x = x + delta[row:row + n].reshape(x.shape).astype(x.dtype)
            row += n
        out.append(x)
    if row != load.shape[0]:
        raise ValueError(f"bias_update_rate: {row} score_bias rows for {load.shape[0]} sparse layers")
    return jax.tree_util.tree_unflatten(treedef, out)


def lm_weights(batch: dict, tokens):
    """The `lm` targets' weights (layers/loss.py target_weights): the batch's loss_mask at the
    target positions (else ones), and with segment_ids none across a document boundary and
    none in padding (segment 0)."""
    return target_weights(tokens, batch.get("loss_mask"), batch.get("segment_ids"))


def model_input(batch: dict):
    """A classification batch's input: token ids (text) or images."""
    return batch["ids"] if "ids" in batch else batch["images"]


def forward_loss(name: str, model, batch: dict, label_smoothing: float, pad_id: int = 0,
                 axis_name: str | None = None):
    """-> (loss_sum, count, {metric_sum}) for one (micro-)batch. An MoE LM adds moe_terms to
    the metrics (`objective` turns them into the training loss). `name`: the run's family
    (RunConfig.family: the model's name, or a model.module's task's family)."""
    if name in CLASSIFICATION:
        logits = logits_of(model(model_input(batch)))  # [B, C]
        w = jnp.ones(logits.shape[:1], jnp.float32)
        loss, correct = cross_entropy_sum(logits, batch["labels"], w, label_smoothing)
        return loss, jnp.sum(w), {"correct": correct}
    if name == "lm":
        tokens, moe, seg = batch["tokens"], moe_of(getattr(model, "cfg", None)), batch.get("segment_ids")
        kw = {} if seg is None else {"segment_ids": seg[:, :-1]}  # packed documents
        kw.update(_hidden(model))
        out = model(tokens[:, :-1], return_aux=True, **kw) if moe else model(tokens[:, :-1], **kw)
        w = lm_weights(batch, tokens)  # [B, T]
        loss, correct = token_loss(model, out, tokens[:, 1:], w, label_smoothing)
        extra = moe_terms(out.aux, moe, jnp.sum(w), axis_name) if moe else {}
        return loss, jnp.sum(w), {"correct": correct, **extra}
    if name == "seq2seq":
        out = model(batch["src"], batch["tgt_in"], **_hidden(model))
        w = (batch["tgt_out"] != pad_id).astype(jnp.float32)
        loss, correct = token_loss(model, out, batch["tgt_out"], w, label_smoothing)
        return loss, jnp.sum(w), {"correct": correct}
    if name == "timeseries":
        pred = model(batch["inputs"]).astype(jnp.float32)  # [B, horizon, C_out]
        err = jnp.square(pred - batch["targets"])
        return jnp.sum(err), jnp.asarray(err.size, jnp.float32), {"abs_err": jnp.sum(jnp.sqrt(err))}
    raise ValueError(f"no training task for model {name!r}")


def _hidden(model) -> dict:
    """The call's keyword for the final hidden states instead of the logits, where the model
    has an output head the chunked loss can apply (jaxformer's LM and Seq2Seq); a
    model.module gives its logits."""
    return {"return_hidden": True} if hasattr(model, "output_head") else {}


def token_loss(model, out, labels, weights, label_smoothing: float):
    """The summed token cross-entropy of a model's output -> (loss_sum, correct): from its
    hidden states through its output head, in sequence chunks where train.loss_chunk_mib asks
    (layers/kernels/chunked_loss.py: no [B, T, V] float32 logits held whole, the same loss
    within float32 rounding; else the unchunked ops), or from the logits it returned."""
    hidden = getattr(out, "hidden", None)
    if hidden is None:
        return cross_entropy_sum(logits_of(out), labels, weights, label_smoothing)  # [B, T, V]
    head, state = model.output_head()
    return chunked_cross_entropy_sum(head, state, hidden, labels, weights, label_smoothing)


def metric_zeros(name: str, model_cfg=None) -> dict:
    """forward_loss's metric sums, zero, known without tracing the model."""
    if name == "timeseries":
        return {"abs_err": jnp.zeros((), jnp.float32)}
    out = {"correct": jnp.zeros((), jnp.float32)}
    moe = moe_of(model_cfg) if name == "lm" else None
    if moe:
        out.update({k: jnp.zeros((), jnp.float32) for k in MOE_METRICS})
        out[EXPERT_LOAD] = jnp.zeros((sum(model_cfg.sparse_layers()), moe.num_experts), jnp.float32)
    return out


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
    if name == "classifier" and "ids" in batch:
        return int(batch["ids"].size)
    return int(len(next(iter(batch.values()))))


# ----------------------------------------------------------------------------- model.module
# what each task calls a model.module with (config/module.py TASK_FAMILY): its positional arguments
CALLS = {"causal_lm": ("token ids [B, T]",), "classification": ("token ids [B, T] or images [B, H, W, C]",),
         "seq2seq": ("source ids [B, S]", "target ids [B, T] (teacher forcing)")}


def check_call(cfg, model, batch: dict) -> None:
    """A model.module against its task, before anything runs: its __call__ takes the task's
    positional arguments (CALLS; any others need defaults), and, traced abstractly on `batch`
    (one train batch, [B, ...] ShapeDtypeStructs or arrays), it returns logits of the shape the
    loss needs, over enough classes for the data's targets (JAX would clamp an id past them).
    A ConfigError of one line says what does not fit."""
    import inspect

    from flax import nnx

    from jaxformer.config import ConfigError
    from jaxformer.train.config import data_classes, data_vocab
    task, spec = cfg.task, cfg.model.module
    head = f"model.module {spec} does not fit task {task}"
    args = CALLS[task]
    try:
        params = list(inspect.signature(type(model).__call__).parameters.values())[1:]
    except (TypeError, ValueError):
        params = None
    if params is not None:
        positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        required = [p for p in params if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        takes_more = any(p.kind == p.VAR_POSITIONAL for p in params)
        if len(required) > len(args) or (len(positional) < len(args) and not takes_more):
            sig = ", ".join(p.name for p in params)
            raise ConfigError(f"{head}: it is called as model({', '.join(args)}), but its __call__({sig}) "
                              + (f"needs {len(required)} arguments" if len(required) > len(args)
                                 else f"takes {len(positional)} positional argument(s)"))
    family = cfg.family
    batch = {k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in batch.items()}
    graphdef, state = nnx.split(model)

    def call(state, batch):
        m = nnx.merge(graphdef, state)
        if family == "lm":
            return logits_of(m(batch["tokens"][:, :-1]))
        if family == "seq2seq":
            return logits_of(m(batch["src"], batch["tgt_in"]))
        return logits_of(m(model_input(batch)))
    try:
        out = jax.eval_shape(call, state, batch)
    except Exception as e:  # the user's module failed on the task's inputs: one line
        first = next((ln.strip() for ln in str(e).splitlines() if ln.strip()), type(e).__name__)
        shapes = ", ".join(f"{k} {tuple(v.shape)}" for k, v in batch.items())
        raise ConfigError(f"{head}: its call on this data's batch ({shapes}) failed: {type(e).__name__}: {first}"[:600]) \
            from None
    if not hasattr(out, "shape"):
        raise ConfigError(f"{head}: it returned {type(out).__name__}, not logits (an array, or an output with .logits)")
    if family == "lm":
        want, n, what = batch["tokens"].shape[:1] + (batch["tokens"].shape[1] - 1,), data_vocab(cfg), "token ids"
    elif family == "seq2seq":
        want, n, what = batch["tgt_out"].shape, data_vocab(cfg), "target ids"
    else:
        want, n, what = batch["labels"].shape, data_classes(cfg), "classes"
    if tuple(out.shape[:-1]) != tuple(want) or not jnp.issubdtype(out.dtype, jnp.floating):
        raise ConfigError(f"{head}: it returned {out.dtype} {tuple(out.shape)}; the task needs float logits "
                          f"[{', '.join(map(str, want))}, N]")
    if n is not None and out.shape[-1] < n:
        raise ConfigError(f"{head}: its logits have {out.shape[-1]} entries, fewer than the {n} {what} of "
                          f"data {cfg.data_name}")
