"""The input pipeline of both trainers, through grain: random-access sources -> per-step batches
in a fixed order -> prefetch on threads -> (JAX) placement on the devices in the background.

Sources. A dataset module gives `sources(cfg, seed) -> (train, eval)`: objects with `__len__`
and a deterministic `__getitem__(i) -> {key: array}` for one example (tokens_data.py reads
windows of memory-mapped shards), or `load(cfg, seed)` with in-memory arrays, which
`ArraySource` wraps as such a source. A source may also have `read_batch(indices)` (stacked
rows in one call); `read_rows` uses it when present.

Order. The batch of step s is `batch_indices(n, s, B, seed)` (data/__init__.py): epochs are
seeded numpy permutations, batches consecutive slices across them. The pipeline is a grain
`MapDataset` over step numbers whose map reads that step's rows, so the order is exactly
`batch_at`'s, a pure function of (seed, step), and the iterator's state is the next step. grain's
own `shuffle` (a Feistel index shuffle, O(1) memory) would give another order, and with it other
trajectories and other README figures; a numpy permutation costs 8 bytes per example (8 MB for
a million windows), kept for the two newest epochs.

Processes. With several processes (mesh mode, multi-host), process p reads only its rows of the
global batch: the batch is laid out [A, B/A] (accumulation micro-batches), and each micro-batch
is split in P equal consecutive slices, p's being its p-th (what the mesh's batch sharding puts
on p's devices; `process_rows`). So P processes read disjoint rows that together are the
one-process batch.

Prefetch. `to_iter_dataset(ReadOptions)` reads READ_BUFFER steps ahead on READ_THREADS threads
(in order). The JAX trainer adds a device stage: a thread that turns the next host batch into
device arrays (`place`) while the current step runs, DEVICE_BUFFER batches ahead. That is
grain's `experimental.device_put`, whose `device` argument goes to `jax.device_put`; a
multi-process mesh needs `jax.make_array_from_process_local_data` from each process's slice
instead, so the two stages are composed here from grain's `ThreadPrefetchIterDataset`.

Checkpoints. The iterator's state ({"next_index": step}) is saved in the orbax checkpoint with
grain's handler (train/checkpoint.py), one file per process. Since the state is the step, a
resume under another process count, or from a checkpoint without it, positions the pipeline
at the checkpoint's step, which gives the same batches.
"""
from __future__ import annotations

import threading
from collections.abc import Callable, Mapping

import grain
import numpy as np
from grain.experimental import ThreadPrefetchIterDataset

READ_THREADS = 4  # threads reading steps ahead (each reads one whole batch)
READ_BUFFER = 8  # steps read ahead on the host
DEVICE_BUFFER = 2  # batches placed on the devices ahead of the step that uses them


class ArraySource:
    """In-memory arrays with the example axis first, as a random-access source."""

    def __init__(self, arrays: Mapping[str, np.ndarray], name: str = "dataset"):
        self.arrays = dict(arrays)
        sizes = {k: len(v) for k, v in self.arrays.items()}
        if len(set(sizes.values())) != 1:
            raise ValueError(f"{name}: arrays differ in length {sizes}")
        self.n = next(iter(sizes.values()))

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, np.ndarray]:
        return {k: v[i] for k, v in self.arrays.items()}

    def read_batch(self, idx: np.ndarray) -> dict[str, np.ndarray]:
        return {k: v[idx] for k, v in self.arrays.items()}


def read_rows(source, idx: np.ndarray) -> dict[str, np.ndarray]:
    """The examples `idx` of `source`, stacked: {key: [len(idx), ...]}."""
    if hasattr(source, "read_batch"):
        return source.read_batch(idx)
    rows = [source[int(i)] for i in idx]
    return {k: np.stack([r[k] for r in rows]) for k in rows[0]}


def process_rows(batch_size: int, accum: int, index: int = 0, count: int = 1) -> np.ndarray:
    """Rows of the global batch [B] that process `index` of `count` reads, in the order its
    local batch holds them: for each micro-batch a, rows a*m + index*m/count ... (m = B/accum)."""
    m = batch_size // accum
    if m % count:
        raise ValueError(f"train.batch_size / grad_accum_steps = {m} is not divisible by the {count} processes")
    per = m // count
    return (np.arange(accum)[:, None] * m + index * per + np.arange(per)[None, :]).reshape(-1)


class StepRows:
    """step -> this process's rows of that step's global batch, read from the source.
    Thread-safe (grain calls it from READ_THREADS threads)."""

    def __init__(self, source, batch_size: int, seed: int, rows: np.ndarray):
        self.source, self.batch_size, self.seed, self.rows = source, batch_size, seed, rows
        self.n = len(source)
        if self.n == 0:
            raise ValueError("the train split has no examples")
        self._perms: dict[int, np.ndarray] = {}
        self._lock = threading.Lock()

    def _perm(self, epoch: int) -> np.ndarray:
        with self._lock:
            p = self._perms.get(epoch)
            if p is None:  # the same permutation as batch_indices draws
                p = np.random.default_rng([self.seed, epoch]).permutation(self.n)
                self._perms[epoch] = p
                for old in sorted(self._perms)[:-2]:
                    del self._perms[old]
            return p

    def indices(self, step: int) -> np.ndarray:
        epoch, offset = np.divmod(step * self.batch_size + self.rows, self.n)
        out = np.empty(len(self.rows), np.int64)
        for e in np.unique(epoch):
            at = epoch == e
            out[at] = self._perm(int(e))[offset[at]]
        return out

    def __call__(self, step: int) -> dict[str, np.ndarray]:
        return read_rows(self.source, self.indices(int(step)))


def train_dataset(source, *, batch_size: int, seed: int, steps: int, rows: np.ndarray,
                  place: Callable | None = None) -> grain.IterDataset:
    """Steps 0 .. steps-1 as local host batches (or `place(batch)` of them, computed on a
    background thread). Iterate it, and position the iterator with `start_at`."""
    ds = grain.MapDataset.range(steps).map(StepRows(source, batch_size, seed, rows))
    it = ds.to_iter_dataset(grain.ReadOptions(num_threads=READ_THREADS, prefetch_buffer_size=READ_BUFFER))
    if place is not None:
        it = ThreadPrefetchIterDataset(it.map(place), prefetch_buffer_size=DEVICE_BUFFER)
    return it


def start_at(iterator, step: int, saved_state: dict | None = None) -> None:
    """Position a fresh train iterator at `step`: from a checkpoint's saved pipeline state when
    there is one (checked against the step), else from the step itself."""
    if saved_state is not None:
        iterator.set_state(saved_state)
        got = grain.experimental.get_next_index(iterator)
        if got != step:
            raise ValueError(f"the checkpoint's input pipeline state is at step {got}, its train state "
                             f"at step {step}; the checkpoint is inconsistent")
    elif step:
        grain.experimental.set_next_index(iterator, step)


def check_state(state) -> dict:
    """A checkpoint's pipeline state as `start_at` reads it: an object whose next_index is the
    step to read next (a count); ValueError naming the field otherwise."""
    if not isinstance(state, dict):
        raise ValueError(f"the pipeline state must be a JSON object, not {type(state).__name__}")
    n = state.get("next_index")
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        raise ValueError(f"the pipeline state's next_index must be a step count, got {n!r}"[:300])
    return state


class SavedState(grain.DatasetIterator):
    """Receives a checkpoint's pipeline state (grain's orbax handler restores into an
    iterator) before the trainer builds the real pipeline, whose threads start only when the
    run does."""

    def __init__(self):
        super().__init__()
        self.state: dict | None = None

    def __next__(self):
        raise StopIteration

    def get_state(self) -> dict:
        return self.state or {}

    def set_state(self, state: dict) -> None:
        self.state = check_state(state)


def eval_batches(source, batch_size: int, max_batches: int, rows: np.ndarray | None = None):
    """Fixed, ordered eval batches: the first max_batches * batch_size examples, in whole
    batches; `rows` (process_rows with accum 1): this process's rows of each. Read ahead on
    grain's threads; the iterator is closed when the generator ends."""
    n = len(source)
    count = min(max_batches, max(1, n // batch_size)) if n >= batch_size else 0
    rows = np.arange(batch_size) if rows is None else rows
    if not count:
        return
    ds = grain.MapDataset.range(count).map(lambda i: read_rows(source, int(i) * batch_size + rows))
    it = iter(ds.to_iter_dataset(grain.ReadOptions(num_threads=min(READ_THREADS, count),
                                                   prefetch_buffer_size=min(READ_BUFFER, count))))
    try:
        yield from it
    finally:
        it.close()
