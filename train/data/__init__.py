"""Embedded datasets: every config trains with no network.

Each dataset module exposes `load(data_cfg: dict, seed: int) -> (train, eval)`, two dicts of
numpy arrays with the example axis first. `DATASETS` maps a `data.name` to its module.
"""
from __future__ import annotations

import importlib

DATASETS: dict[str, str] = {
    "digits": "train.data.digits",
    "series": "train.data.series",
}


def load_dataset(name: str, data_cfg: dict, seed: int):
    if name not in DATASETS:
        raise ValueError(f"data.name: unknown dataset {name!r}; known: {sorted(DATASETS)}")
    return importlib.import_module(DATASETS[name]).load(data_cfg, seed)
