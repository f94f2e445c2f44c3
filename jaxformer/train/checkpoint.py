"""Orbax checkpoints under WORKDIR/checkpoints/: every `checkpoint_every` steps, keeping the
last K and the best by eval loss, optionally written asynchronously.

A checkpoint holds the whole train state as plain arrays: params, optimiser state, the NNX
RNG streams (dropout), the step (which is also the data position, since batches are a pure
function of the step) and a JSON record of metrics. Restore tries the newest step first; if it
is corrupted or partial it says so and falls back to the previous good one; if none is good
it raises a clear error. It never returns silent garbage: restored arrays must match the
expected tree structure, shapes and dtypes.
"""
from __future__ import annotations

import json
import logging
import os
import shutil

import jax
import numpy as np
import orbax.checkpoint as ocp

from jaxformer.fileio import write_text

log = logging.getLogger("jaxformer.checkpoint")


class CheckpointError(RuntimeError):
    pass


def _to_storable(tree):
    """Typed PRNG keys -> raw uint32 key data (orbax stores plain arrays)."""
    def f(x):
        if isinstance(x, jax.Array) and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            return jax.random.key_data(x)
        return x
    return jax.tree.map(f, tree)


def _from_storable(tree, like):
    def f(x, ref):
        if isinstance(ref, jax.Array) and jax.dtypes.issubdtype(ref.dtype, jax.dtypes.prng_key):
            return jax.random.wrap_key_data(x, impl=jax.random.key_impl(ref))
        return x
    return jax.tree.map(f, tree, like)


def _abstract(tree):
    def f(x):
        sharding = getattr(x, "sharding", None)
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)
    return jax.tree.map(f, tree)


class Checkpointer:
    def __init__(self, directory: str, *, keep: int, async_save: bool = True, primary: bool = True):
        self.directory = os.path.abspath(directory)
        self.keep = keep
        options = ocp.CheckpointManagerOptions(
            max_to_keep=None, create=True, enable_async_checkpointing=async_save)
        self.manager = ocp.CheckpointManager(self.directory, options=options)
        self.primary = primary
        self._best: tuple[float, int] | None = self._load_best()

    # ------------------------------------------------------------------ save
    def save(self, step: int, state, record: dict, eval_loss: float | None = None) -> None:
        self.manager.save(step, args=ocp.args.Composite(
            state=ocp.args.StandardSave(_to_storable(state)),
            record=ocp.args.JsonSave({**record, "step": step, "eval_loss": eval_loss})))
        if eval_loss is not None and (self._best is None or eval_loss < self._best[0]):
            self._best = (float(eval_loss), step)
            if self.primary:
                write_text(os.path.join(self.directory, "best.json"),
                           json.dumps({"eval_loss": self._best[0], "step": step}))
        self._prune()

    def _load_best(self):
        p = os.path.join(self.directory, "best.json")
        if os.path.exists(p):
            with open(p) as f:
                d = json.load(f)
            return float(d["eval_loss"]), int(d["step"])
        return None

    def _prune(self) -> None:
        """Keep the last K steps plus the best one."""
        steps = sorted(self.manager.all_steps())
        keep = set(steps[-self.keep:])
        if self._best is not None:
            keep.add(self._best[1])
        for s in steps:
            if s not in keep:
                self.manager.delete(s)

    def wait(self) -> None:
        self.manager.wait_until_finished()

    def close(self) -> None:
        self.manager.wait_until_finished()
        self.manager.close()

    # ------------------------------------------------------------------ restore
    def all_steps(self) -> list[int]:
        return sorted(self.manager.all_steps())

    def restore(self, like_state, step: int | None = None):
        """-> (state, record) of `step`, or of the newest good checkpoint (falling back past
        corrupted ones, with a warning). Raises CheckpointError if none can be restored."""
        steps = [step] if step is not None else sorted(self.manager.all_steps(), reverse=True)
        if not steps:
            raise CheckpointError(f"no checkpoint in {self.directory}")
        storable = _to_storable(like_state)
        errors = []
        for s in steps:
            try:
                out = self.manager.restore(s, args=ocp.args.Composite(
                    state=ocp.args.StandardRestore(_abstract(storable)), record=ocp.args.JsonRestore()))
                restored = out["state"]
                _check_same(storable, restored, s)
                return _from_storable(restored, like_state), dict(out["record"])
            except Exception as e:  # a corrupted/partial step: report it and try the previous one
                msg = f"checkpoint step {s} in {self.directory} is unreadable: {type(e).__name__}: {e}"
                log.warning(msg + (" -- falling back to an older checkpoint" if step is None else ""))
                errors.append(msg)
        raise CheckpointError("no restorable checkpoint:\n  " + "\n  ".join(errors))


def _check_same(expected, got, step: int) -> None:
    e_leaves, e_tree = jax.tree.flatten(expected)
    g_leaves, g_tree = jax.tree.flatten(got)
    if e_tree != g_tree:
        raise CheckpointError(f"step {step}: tree structure differs from the model's")
    for a, b in zip(e_leaves, g_leaves):
        if tuple(a.shape) != tuple(b.shape) or np.dtype(a.dtype) != np.dtype(b.dtype):
            raise CheckpointError(f"step {step}: leaf {b.shape}/{b.dtype} where {a.shape}/{a.dtype} expected")
        if np.issubdtype(np.dtype(b.dtype), np.floating) and not bool(np.isfinite(np.asarray(b)).all()):
            raise CheckpointError(f"step {step}: non-finite values in a restored array")


def remove_checkpoints(directory: str) -> None:
    if os.path.isdir(directory):
        shutil.rmtree(directory)
