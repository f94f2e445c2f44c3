"""Learning-rate schedules (one formula for both frameworks), the optax optimiser, and the
torch one built to match it step for step.

Alignment (docs/numerics.md §11, §12):
- optax evaluates the schedule at the update count *before* the update; torch's LambdaLR
  sets lr = base * f(last_epoch) after each `scheduler.step()`. Starting both at step 0, the
  update of step k uses f(k) in both.
- Clipping uses torch's formula in both: g * min(1, max_norm / (norm + 1e-6)). optax's own
  clip_by_global_norm has no eps, so we do not use it.
"""
from __future__ import annotations

import math

import numpy as np


def lr_multiplier(step, cfg, xp=np):
    """Multiplier of cfg.lr at optimiser step `step` (0-based). `xp` is numpy or jax.numpy.

    warmup_cosine: linear warmup step / warmup, then cosine decay to
        min_lr_ratio at cfg.steps.
    inverse_sqrt:  Vaswani et al. (2017) eq. 3, normalised to 1 at the end of warmup:
        min(s^-0.5, s * w^-1.5) * sqrt(w) with s = step + 1.
    constant:      1.
    """
    step = xp.asarray(step, dtype=xp.float32)
    w = float(cfg.warmup_steps)
    if cfg.schedule == "constant":
        return xp.ones_like(step)
    if cfg.schedule == "inverse_sqrt":
        s = step + 1.0
        if w == 0:
            return 1.0 / xp.sqrt(s)
        return xp.minimum(1.0 / xp.sqrt(s), s * w ** -1.5) * math.sqrt(w)
    # warmup_cosine
    warm = step / max(1.0, w)
    progress = xp.clip((step - w) / max(1.0, cfg.steps - w), 0.0, 1.0)
    cos = cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1.0 + xp.cos(math.pi * progress))
    return xp.where(step < w, warm, cos)


def decay_mask(params, cfg, scan_prefixes=()):
    """True where weight decay applies: everything, or only params with >= 2 dims per layer
    (a scanned stack's leading layer axis does not count, so scan == loop == torch)."""
    import jax

    from jaxformer.train.sharding import _key_of
    if cfg.decay_norms_and_biases:
        return jax.tree.map(lambda _: True, params)
    prefixes = tuple(".".join(map(str, p)) + "." for p in scan_prefixes)

    def f(path, p):
        stacked = any(_key_of(path).startswith(pre) for pre in prefixes)
        return p.ndim - int(stacked) >= 2
    return jax.tree_util.tree_map_with_path(f, params)


def clip_by_global_norm_torch(max_norm: float):
    """optax transform: g * min(1, max_norm / (||g|| + 1e-6)), exactly torch's clip_grad_norm_."""
    import jax
    import jax.numpy as jnp
    import optax

    def update(updates, state, params=None):
        norm = optax.tree.norm(updates)
        coef = jnp.minimum(1.0, max_norm / (norm + 1e-6))
        return jax.tree.map(lambda g: g * coef.astype(g.dtype), updates), state

    return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


def make_optax(cfg, params, scan_prefixes=()):
    """AdamW with decoupled weight decay, torch-style clipping and the configured schedule."""
    import jax.numpy as jnp
    import optax

    def schedule(count):
        return cfg.lr * lr_multiplier(count, cfg, jnp)

    parts = []
    if cfg.grad_clip > 0:
        parts.append(clip_by_global_norm_torch(cfg.grad_clip))
    parts.append(optax.adamw(schedule, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps, weight_decay=cfg.weight_decay,
                             mask=decay_mask(params, cfg, scan_prefixes)))
    return optax.chain(*parts), schedule


def make_torch_optimizer(cfg, module):
    """torch.optim.AdamW (two groups when 1-D params are exempt) and a LambdaLR on the same formula."""
    import torch
    decay, no_decay = [], []
    for p in module.parameters():
        if p.requires_grad:
            (decay if cfg.decay_norms_and_biases or p.dim() >= 2 else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}]
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0})
    opt = torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.b1, cfg.b2), eps=cfg.eps, foreach=False)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: float(lr_multiplier(step, cfg)))
    return opt, sched
