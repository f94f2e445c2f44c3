"""Datasets: the embedded ones (every packaged config trains with no network) and your own:
`tokens` (a directory written by `jaxformer data prepare`) and `image_folder` (a folder of
class folders, a `datasets` folder or Parquet files).

A dataset module defines a frozen `Config` dataclass (the YAML `data:` keys besides `name`,
validated strictly) and either `load(cfg, seed) -> (train, eval)`, two dicts of numpy arrays
with the example axis first, or `sources(cfg, seed) -> (train, eval)`, random-access sources
for data that does not fit in memory (data/pipeline.py says what a source is). It may
define `tokenizer_record(cfg) -> (record, file)`: the tokenizer its ids come from, which the
trainers store with the run and its exported models. Splits are deterministic and seeded. `DATASETS` maps
`data.name` to the module. `batch_at` makes the batch of any step a pure function of (seed,
step), so the data order resumes exactly from a checkpoint's step; the trainers read the same
order through grain (data/pipeline.py).
"""
from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Mapping

import numpy as np

DATASETS: dict[str, str] = {
    "stdlib_docs": "jaxformer.train.data.stdlib_docs",
    "text_source": "jaxformer.train.data.text_source",
    "dates": "jaxformer.train.data.dates",
    "digits": "jaxformer.train.data.digits",
    "series": "jaxformer.train.data.series",
    "tokens": "jaxformer.train.data.tokens_data",
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
    """The in-memory arrays of a `load` dataset (`load_sources` reads any dataset)."""
    module = _module(name)
    if not hasattr(module, "load"):
        raise ValueError(f"dataset {name} has no in-memory arrays (it is read through load_sources)")
    train, evaluation = module.load(cfg, seed)
    for split, arrays in (("train", train), ("eval", evaluation)):
        sizes = {k: len(v) for k, v in arrays.items()}
        if len(set(sizes.values())) != 1:
            raise ValueError(f"dataset {name} {split}: arrays differ in length {sizes}")
    return train, evaluation


def load_sources(name: str, cfg, seed: int):
    """-> (train, eval) random-access sources of any dataset (arrays wrapped in ArraySource)."""
    from jaxformer.train.data.pipeline import ArraySource
    module = _module(name)
    if hasattr(module, "sources"):
        return module.sources(cfg, seed)
    train, evaluation = load_dataset(name, cfg, seed)
    return ArraySource(train, f"dataset {name} train"), ArraySource(evaluation, f"dataset {name} eval")


def tokenizer_info(name: str, cfg) -> tuple[dict | None, str | None]:
    """(the tokenizer record, a tokenizer.json path or None) of a dataset whose ids come from a
    recorded tokenizer; (None, None) for the embedded byte-level datasets."""
    module = _module(name)
    return module.tokenizer_record(cfg) if hasattr(module, "tokenizer_record") else (None, None)


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


def batch_at(data, step: int, batch_size: int, seed: int) -> dict[str, np.ndarray]:
    """The global batch of `step`; `data`: a dict of arrays or a random-access source."""
    if isinstance(data, Mapping):
        idx = batch_indices(num_examples(data), step, batch_size, seed)
        return {k: v[idx] for k, v in data.items()}
    from jaxformer.train.data.pipeline import read_rows
    return read_rows(data, batch_indices(len(data), step, batch_size, seed))


def eval_batches(arrays: Mapping[str, np.ndarray], batch_size: int, max_batches: int):
    """Fixed, ordered eval batches (the first max_batches * batch_size examples)."""
    n = num_examples(arrays)
    for i in range(min(max_batches, max(1, n // batch_size))):
        sl = slice(i * batch_size, (i + 1) * batch_size)
        batch = {k: v[sl] for k, v in arrays.items()}
        if num_examples(batch) == batch_size:
            yield batch
