"""Orbax checkpoints under WORKDIR/checkpoints/: every `checkpoint_every` steps, keeping the
last K and the best by eval loss (orbax's own LatestN + BestN preservation policies; each
checkpoint carries its eval loss as orbax metrics), optionally written asynchronously.

A save that orbax refuses (it returns False, e.g. for a step at or below the newest saved one)
is an error, never a silent skip. A failed save (full disk, unwritable folder) leaves no partial
step behind: orbax writes a step under a temporary name and renames it when complete, and
`save` removes the temporary folder of a failed write.

A checkpoint holds the whole train state as plain arrays: params, optimiser state, the NNX
RNG streams (dropout), the step, a JSON record of metrics, and the input pipeline's grain
iterator state (item `data`, one file per process, grain's own orbax handler), which is the
data position; batches are also a pure function of the step, which the trainer checks it against. Restore tries the newest step first; if it
is corrupted or partial it says so and falls back to the previous good one; if none is good
it raises a clear error. It never returns silent garbage: restored arrays must match the
expected tree structure, shapes and dtypes.
"""
from __future__ import annotations

import logging
import os
import re
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

log = logging.getLogger("jaxformer.checkpoint")


class CheckpointError(ValueError):
    """A checkpoint that cannot be restored or saved (the CLI reports it in one line)."""


_OS_ERROR = re.compile(r"Failed to write .*?: ([^\[]+?) \[os_error_code='(\d+)'\]")


def _concise(e: BaseException, what: str) -> BaseException:
    """tensorstore reports a failed write (full disk, file too large, read-only) as a ValueError
    whose message is a page of paths; turn it into an OSError that says what and why."""
    m = _OS_ERROR.search(str(e))
    if m:
        err = OSError(f"cannot write {what}: {os.strerror(int(m.group(2)))} (nothing partial is kept)")
        err.errno = int(m.group(2))
        return err
    return e


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


def _eval_loss(metrics) -> float:
    """BestN's ranking key: the eval loss (lower is better); a NaN ranks last."""
    v = float(metrics.get("eval_loss", float("inf")))
    return v if np.isfinite(v) else float("inf")


class Checkpointer:
    def __init__(self, directory: str, *, keep: int, async_save: bool = True, primary: bool = True,
                 read_only: bool = False):
        """read_only: for restoring (resume, `jaxformer eval`): creates, cleans and deletes nothing."""
        from orbax.checkpoint import checkpoint_managers as cm
        self.directory = os.path.abspath(directory)
        self.keep = keep
        policy = cm.AnyPreservationPolicy([
            cm.LatestN(n=keep),
            cm.BestN(get_metric_fn=_eval_loss, reverse=True, n=1, keep_checkpoints_without_metrics=False),
        ])
        options = ocp.CheckpointManagerOptions(
            preservation_policy=policy, best_fn=_eval_loss, best_mode="min", create=not read_only,
            enable_async_checkpointing=async_save and not read_only,
            cleanup_tmp_directories=not read_only)  # not orbax's read_only, which logs warnings
        self.manager = ocp.CheckpointManager(self.directory, options=options)
        self.primary = primary and not read_only

    # ------------------------------------------------------------------ save
    def save(self, step: int, state, record: dict, eval_loss: float | None = None, data=None) -> None:
        """Save `state` at `step` with its eval loss (every trainer checkpoint step evaluates
        first, so BestN can rank every step), and `data`, a grain iterator, when given. Raises
        CheckpointError if orbax refuses."""
        metrics = {"eval_loss": float(eval_loss)} if eval_loss is not None else None
        items = {}
        if data is not None:
            import grain
            items["data"] = grain.checkpoint.CheckpointSave(data)
        try:
            saved = self.manager.save(step, metrics=metrics, args=ocp.args.Composite(
                state=ocp.args.StandardSave(_to_storable(state)),
                record=ocp.args.JsonSave({**record, "step": step, "eval_loss": eval_loss}), **items))
            if not saved:
                raise CheckpointError(
                    f"orbax refused to save step {step} in {self.directory} "
                    f"(saved steps: {self.all_steps()}); a step at or below the newest is never overwritten")
        except BaseException as e:
            self._fail(e, f"checkpoint step {step} in {self.directory}")

    def best_step(self) -> int | None:
        return self.manager.best_step()

    def _fail(self, e: BaseException, what: str):
        """A failed write: remove its partial folders, then raise the concise form of `e`
        (or `e` itself when it has none)."""
        self._remove_partial()
        err = _concise(e, what)
        if err is e:
            raise e
        raise err from e

    def _remove_partial(self) -> None:
        """Remove the temporary folders of a failed or interrupted write (process 0)."""
        if not self.primary or not os.path.isdir(self.directory):
            return
        for name in os.listdir(self.directory):
            if ".orbax-checkpoint-tmp" in name:
                shutil.rmtree(os.path.join(self.directory, name), ignore_errors=True)

    def wait(self) -> None:
        """Wait for an asynchronous save; its write errors surface here."""
        try:
            self.manager.wait_until_finished()
        except BaseException as e:
            self._fail(e, f"a checkpoint in {self.directory}")

    def close(self) -> None:
        try:
            self.wait()
        finally:
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

    def restore_data(self, step: int, iterator) -> bool:
        """Restore the grain iterator state of `step` into `iterator`. False when the step has
        none for this process (a checkpoint written without it, or by another number of
        processes: grain keeps one file per process index and count)."""
        import grain
        # the file name grain's CheckpointHandler gives each process's state
        name = f"process_{jax.process_index()}-of-{jax.process_count()}.json"
        if not os.path.isfile(os.path.join(self.directory, str(step), "data", name)):
            return False
        self.manager.restore(step, args=ocp.args.Composite(data=grain.checkpoint.CheckpointRestore(iterator)))
        return True


def _check_same(expected, got, step: int) -> None:
    e_leaves, e_tree = jax.tree.flatten(expected)
    g_leaves, g_tree = jax.tree.flatten(got)
    if e_tree != g_tree:
        raise CheckpointError(f"step {step}: tree structure differs from the model's")
    for a, b in zip(e_leaves, g_leaves):
        if tuple(a.shape) != tuple(b.shape) or np.dtype(a.dtype) != np.dtype(b.dtype):
            raise CheckpointError(f"step {step}: leaf {b.shape}/{b.dtype} where {a.shape}/{a.dtype} expected")
        # checked where the shards are: a restored array is never gathered onto one host
        if np.issubdtype(np.dtype(b.dtype), np.floating) and not bool(jnp.isfinite(b).all()):
            raise CheckpointError(f"step {step}: non-finite values in a restored array")
