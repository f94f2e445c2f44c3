"""A cheap training-trajectory parity check (tests/test_train.py::test_trajectory_parity in 4
steps on a tiny classifier) and the porting bugs of the training loop that only it can catch.

Those bugs patch jaxformer.train (JAX side only), which ranks above jaxformer.parity, so they
live here, beside the two trainers they compare, and join jaxformer.parity.mutations' catalogue
in `jaxformer parity --self-test`.
"""
from __future__ import annotations

import tempfile

import numpy as np

from jaxformer.parity.mutations import Mutation, Outcome, patched

# 3 classes: label-smoothing bugs move the target distribution by eps / K, visible at small K
MODEL = {"name": "classifier", "vocab_size": 259, "max_len": 32, "num_classes": 3, "norm_position": "post",
         "d_model": 32, "num_heads": 4, "d_ff": 64, "num_layers": 2, "dropout": 0.0}
DATA = {"name": "text_source", "seq_len": 32, "examples_per_class": 64}
# weight decay 0.1 so decay on a norm scale of 1 moves it by lr * 0.1 per step (~3e-4), past RTOL
TRAIN = {"steps": 4, "batch_size": 8, "grad_accum_steps": 2, "lr": 3e-3, "schedule": "warmup_cosine",
         "warmup_steps": 2, "grad_clip": 1.0, "label_smoothing": 0.1, "eval_every": 4, "eval_batches": 1,
         "checkpoint_every": 4, "async_checkpoint": False, "weight_decay": 0.1}
# Per-step loss, lr and gradient norm: |d| <= RTOL * max(1, |torch|); final params: max |d| <= RTOL
# (the bounds of tests/test_train.py; honest runs sit near 1e-7, docs/numerics.md §19)
RTOL = 1e-4


def trajectory_check(patch=None) -> Outcome:
    """Train torch and JAX from the same weights for TRAIN['steps'] steps (under `patch()`, a
    context manager that mutates the JAX side) and compare losses, rates, gradient norms and
    final parameters. Returns an Outcome: caught = some figure is past its bound."""
    from jaxformer.convert import load_torch_state_dict
    from jaxformer.models import build_model as jbuild
    from jaxformer.train.config import config_from_dict
    from jaxformer.train.jax_trainer import JaxTrainer, params_numpy
    from jaxformer.train.torch.trainer import TorchTrainer
    from torch_ref.models import build_model as tbuild

    cfg = config_from_dict({"model": dict(MODEL), "data": dict(DATA), "train": dict(TRAIN)})
    tmod = tbuild(cfg.model_name, cfg.model, seed=3)
    with tempfile.TemporaryDirectory() as tmp, (patch() if patch else _nothing()):
        jmod = jbuild(cfg.model_name, cfg.model, seed=0)
        load_torch_state_dict(jmod, tmod.state_dict())
        jt = JaxTrainer(cfg, f"{tmp}/jax", model=jmod, progress=False)
        tt = TorchTrainer(cfg, f"{tmp}/torch", module=tmod, progress=False)
        jh, th = jt.run(), tt.run()
        jp = params_numpy(jt.state)
    tp = {k: v.detach().numpy() for k, v in tt.module.state_dict().items()}
    ratios = {}
    for key in ("loss", "lr", "grad_norm"):
        ratios[key] = max(abs(a[key] - b[key]) / (RTOL * max(1.0, abs(b[key]))) for a, b in zip(jh, th, strict=False))
    ratios["params"] = max(float(np.abs(jp[k] - tp[k]).max()) for k in tp) / RTOL
    worst = max(ratios, key=ratios.get)
    return Outcome("trajectory", ratios[worst] > 1, ratios[worst],
                   {"trajectory": ", ".join(f"{k} {v:.3g}x" for k, v in ratios.items())})


class _nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def run_trajectory_mutation(m: Mutation) -> Outcome:
    o = trajectory_check(m.patch)
    return Outcome(m.name, o.caught, o.worst_ratio, o.detail)


# ----------------------------------------------------------------------------- training bugs
def _decay_everything():
    import jax

    from jaxformer.train import optim
    return patched(optim, "decay_mask", lambda params, cfg, scan_prefixes=(): jax.tree.map(lambda _: True, params))


def _smoothing_k_minus_1():
    import jax
    import jax.numpy as jnp

    from jaxformer.train import tasks

    def cross_entropy_sum(logits, labels, weights, label_smoothing):
        logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
        k = logits.shape[-1]
        nll = -jnp.take_along_axis(logp, labels[..., None], axis=-1)[..., 0]
        others = (-jnp.sum(logp, axis=-1) - nll) / (k - 1)  # eps spread over the K-1 wrong classes
        loss = (1.0 - label_smoothing) * nll + label_smoothing * others
        correct = (jnp.argmax(logits, axis=-1) == labels).astype(jnp.float32)
        return jnp.sum(loss * weights), jnp.sum(correct * weights)
    return patched(tasks, "cross_entropy_sum", cross_entropy_sum)


def _warmup_off_by_one():
    from jaxformer.train import optim
    original = optim.lr_multiplier

    def lr_multiplier(step, cfg, xp=np):
        return original(step + 1 if xp is not np else step, cfg, xp)  # optax side counts from 1
    return patched(optim, "lr_multiplier", lr_multiplier)


def _accumulation_sums():
    from jaxformer.train import tasks
    original = tasks.forward_loss

    def forward_loss(name, model, batch, label_smoothing, pad_id=0):
        loss, count, metrics = original(name, model, batch, label_smoothing, pad_id)
        # each micro-batch divided by its own count and the results summed: count / A
        return loss, count / TRAIN["grad_accum_steps"], metrics
    return patched(tasks, "forward_loss", forward_loss)


TRAIN_MUTATIONS = {m.name: m for m in [
    Mutation("weight_decay_on_biases", "AdamW decays biases and norm scales too", _decay_everything,
             trajectory=True),
    Mutation("label_smoothing_k_minus_1", "label smoothing spread over the K-1 wrong classes",
             _smoothing_k_minus_1, trajectory=True),
    Mutation("warmup_off_by_one", "the optax schedule counts steps from 1", _warmup_off_by_one, trajectory=True),
    Mutation("accumulation_sums", "gradient accumulation sums micro-batch means instead of averaging",
             _accumulation_sums, trajectory=True),
]}
