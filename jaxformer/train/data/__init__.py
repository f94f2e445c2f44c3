"""Embedded datasets (every packaged config trains with no network) and your own
(`image_folder`: a folder of class folders, a `datasets` folder or Parquet files).

A dataset module defines a frozen `Config` dataclass (the YAML `data:` keys besides `name`,
validated strictly) and `load(cfg, seed) -> (train, eval)`: two dicts of numpy arrays with
the example axis first. Splits are deterministic and seeded. `DATASETS` maps `data.name` to
the module. `batch_at` makes the batch of any step a pure function of (seed, step), so the
data order resumes exactly from a checkpoint's step.
"""
from __future__ import annotations

import dataclasses
import importlib
from typing import Mapping

import numpy as np

DATASETS: dict[str, str] = {
    "stdlib_docs": "jaxformer.train.data.stdlib_docs",
    "text_source": "jaxformer.train.data.text_source",
    "dates": "jaxformer.train.data.dates",
    "digits": "jaxformer.train.data.digits",
    "series": "jaxformer.train.data.series",
    "image_folder": "jaxformer.train.data.image_folder",
}


@dataclasses.dataclass(frozen=True)
class NoOptions:
    """For dataset modules that define no Config."""


def _module(name: str):
    from jaxformer.config import ConfigError
    if name not in DATASETS:
        raise ConfigError(f"data.name: unknown dataset {name!r}; known: {sorted(DATASETS)}")
    return importlib.import_module(DATASETS[name])


def dataset_config_class(name: str) -> type:
    return getattr(_module(name), "Config", NoOptions)


def load_dataset(name: str, cfg, seed: int) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    train, evaluation = _module(name).load(cfg, seed)
    for split, arrays in (("train", train), ("eval", evaluation)):
        sizes = {k: len(v) for k, v in arrays.items()}
        if len(set(sizes.values())) != 1:
            raise ValueError(f"dataset {name} {split}: arrays differ in length {sizes}")
    return train, evaluation


def num_examples(arrays: Mapping[str, np.ndarray]) -> int:
    return len(next(iter(arrays.values())))


def batch_indices(n: int, step: int, batch_size: int, seed: int) -> np.ndarray:
    """Indices of the batch at `step`: epochs are seeded permutations of [0, n), batches are
    consecutive slices that wrap across epochs. Pure in (n, step, batch_size, seed)."""
    start = step * batch_size
    out = np.empty(batch_size, np.int64)
    filled = 0
    while filled < batch_size:
        epoch, offset = divmod(start + filled, n)
        perm = np.random.default_rng([seed, epoch]).permutation(n)
        take = min(batch_size - filled, n - offset)
        out[filled:filled + take] = perm[offset:offset + take]
        filled += take
    return out


def batch_at(arrays: Mapping[str, np.ndarray], step: int, batch_size: int, seed: int) -> dict[str, np.ndarray]:
    idx = batch_indices(num_examples(arrays), step, batch_size, seed)
    return {k: v[idx] for k, v in arrays.items()}


def eval_batches(arrays: Mapping[str, np.ndarray], batch_size: int, max_batches: int):
    """Fixed, ordered eval batches (the first max_batches * batch_size examples)."""
    n = num_examples(arrays)
    for i in range(min(max_batches, max(1, n // batch_size))):
        sl = slice(i * batch_size, (i + 1) * batch_size)
        batch = {k: v[sl] for k, v in arrays.items()}
        if num_examples(batch) == batch_size:
            yield batch
