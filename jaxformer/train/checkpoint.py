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
is corrupted or partial, or its record names another step (a copied or renamed folder), it says so
and falls back to the previous good one; if none is good
it raises a clear error. It never returns silent garbage: restored arrays must match the
expected tree structure, shapes and dtypes.
"""
from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import time

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

log = logging.getLogger("jaxformer.checkpoint")


class CheckpointError(ValueError):
    """A checkpoint that cannot be restored or saved (the CLI reports it in one line)."""


# the innermost OS error of a tensorstore status: "...: File too large [os_error_code='27']".
# The words before it vary with the step that failed ("Failed to write 2 bytes to file 3",
# "Failed writing", "Error opening \"zarr\" driver: Error writing ..."), so only the code is read.
_OS_ERROR = re.compile(r"\[os_error_code='?(\d+)'?\]")


def _concise(e: BaseException, what: str) -> BaseException:
    """tensorstore reports a failed write (full disk, file too large, read-only) as a ValueError
    whose message is a page of paths; turn it into an OSError that says what and why (read from
    the OS error code, the last one in the message where there are several)."""
    codes = _OS_ERROR.findall(str(e))
    if codes:
        code = int(codes[-1])
        err = OSError(f"cannot write {what}: {os.strerror(code)} (nothing partial is kept)")
        err.errno = code
        return err
    return e


METADATA_FILE = "_CHECKPOINT_METADATA"  # orbax writes it into a step before committing it


def committed_steps(directory: str) -> list[int]:
    """The committed steps of a checkpoints folder, without opening a manager: a folder named by
    its step number (not a link) holding orbax's step metadata. An empty junk folder, a link (a
    loop included) or a partial write is never a step."""
    if not os.path.isdir(directory):
        return []
    return sorted(int(n) for n in os.listdir(directory) if n.isdigit() and _committed(os.path.join(directory, n)))


def _committed(path: str) -> bool:
    return not os.path.islink(path) and os.path.isdir(path) and os.path.isfile(os.path.join(path, METADATA_FILE))


def _first_line(e: BaseException, limit: int = 200) -> str:
    text = (str(e).strip().splitlines() or [""])[0]
    text = text if len(text) <= limit else text[:limit] + "..."
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


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
        self.primary = primary and not read_only
        self._remove_partial()  # a killed run's temporary folders and uncommitted step folders
        self.manager = ocp.CheckpointManager(self.directory, options=options)

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
        (or `e` itself when it has none). Orbax's background writers of the failed save are let
        finish first: a folder removed while one still writes into it would be left behind."""
        with contextlib.suppress(BaseException):  # the same failure again; `e` is what is raised
            self.manager.wait_until_finished()
        self._remove_partial()
        err = _concise(e, what)
        if err is e:
            raise e
        raise err from e

    def _remove_partial(self) -> None:
        """Remove the temporary folders of a failed or interrupted write, and step-named entries
        that are not committed steps (an empty folder, a link): orbax would count them as the
        newest step (process 0, writers only)."""
        if not self.primary or not os.path.isdir(self.directory):
            return
        clean = 0  # consecutive passes that found nothing: a straggling writer thread can
        for attempt in range(20):  # recreate a folder mid-removal or just after it
            left = False
            for name in os.listdir(self.directory):
                path = os.path.join(self.directory, name)
                if ".orbax-checkpoint-tmp" in name or (name.isdigit() and not _committed(path)):
                    if os.path.islink(path):
                        os.remove(path)
                    else:
                        shutil.rmtree(path, ignore_errors=True)
                    left = left or os.path.lexists(path)
            clean = 0 if left else clean + 1
            if clean == 2:
                return
            time.sleep(0.05 * (attempt + 1))

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
        """The committed steps (committed_steps: never a junk folder or a link)."""
        return [s for s in sorted(self.manager.all_steps()) if _committed(os.path.join(self.directory, str(s)))]

    def restore(self, like_state, step: int | None = None):
        """-> (state, record) of `step`, or of the newest good checkpoint (falling back past
        corrupted ones, with a warning). Raises CheckpointError if none can be restored."""
        steps = [step] if step is not None else self.all_steps()[::-1]
        if not steps:
            raise CheckpointError(f"no checkpoint in {self.directory}")
        storable = _to_storable(like_state)
        errors: list[tuple[int, str]] = []
        for s in steps:
            try:
                out = self.manager.restore(s, args=ocp.args.Composite(
                    state=ocp.args.StandardRestore(_abstract(storable)), record=ocp.args.JsonRestore()))
                restored = out["state"]
                _check_same(storable, restored, s)
                record = out["record"]
                if not isinstance(record, dict) or not isinstance(record.get("step"), int):
                    raise CheckpointError(f"its record is not an object with an integer step: {record!r}"[:200])
                if record["step"] != s:  # a copied or renamed step folder: its state is another step's
                    raise CheckpointError(f"its record names step {record['step']}, not {s}")
            except Exception as e:  # a corrupted/partial step: report it and try the previous one
                errors.append((s, _first_line(e)))
                continue
            for bad, why in errors:  # one line per step skipped, only when an older one restored
                log.warning(f"checkpoint step {bad} in {self.directory} is unreadable ({why}); "
                            f"resumed from step {s}")
            return _from_storable(restored, like_state), dict(record)
        bad = ", ".join(str(s) for s, _ in errors)
        raise CheckpointError(f"no restorable checkpoint in {self.directory}: step(s) {bad} unreadable "
                              f"(step {errors[0][0]}: {errors[0][1]})")

    def restore_data(self, step: int, iterator) -> bool:
        """Restore the grain iterator state of `step` into `iterator`. False when the step has
        none for this process (a checkpoint written without it, or by another number of
        processes: grain keeps one file per process index and count)."""
        import grain
        # the file name grain's CheckpointHandler gives each process's state
        name = f"process_{jax.process_index()}-of-{jax.process_count()}.json"
        path = os.path.join(self.directory, str(step), "data", name)
        if not os.path.isfile(path):
            return False
        try:
            self.manager.restore(step, args=ocp.args.Composite(data=grain.checkpoint.CheckpointRestore(iterator)))
        except Exception as e:  # a garbage data state: named, with its step
            raise CheckpointError(f"checkpoint step {step}: the data position {path} is unreadable "
                                  f"({_first_line(e)})") from None
        return True


def _check_same(expected, got, step: int) -> None:
    e_leaves, e_tree = jax.tree.flatten(expected)
    g_leaves, g_tree = jax.tree.flatten(got)
    if e_tree != g_tree:
        raise CheckpointError(f"step {step}: tree structure differs from the model's")
    for a, b in zip(e_leaves, g_leaves, strict=True):
        if tuple(a.shape) != tuple(b.shape) or np.dtype(a.dtype) != np.dtype(b.dtype):
            raise CheckpointError(f"step {step}: leaf {b.shape}/{b.dtype} where {a.shape}/{a.dtype} expected")
        # checked where the shards are: a restored array is never gathered onto one host
        if np.issubdtype(np.dtype(b.dtype), np.floating) and not bool(jnp.isfinite(b).all()):
            raise CheckpointError(f"step {step}: non-finite values in a restored array")
