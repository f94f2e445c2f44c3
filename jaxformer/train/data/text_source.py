"""A labelled text task from real text that ships with Python: given a snippet of bytes, say
where it comes from.

    class 0  prose of the language reference  (pydoc_data.topics)
    class 1  Python source code of stdlib modules (comments and docstrings removed)
    class 2  docstrings of the same stdlib modules, their classes and functions

Each class's text is split by position (first 90% train, last 10% eval); snippets are random
windows of seq_len - 1 bytes, prefixed by [CLS] (id 1) for first-token pooling. The texts are
CPython 3.11.7's, pinned in the package (train/data/pinned.py): the same on every Python.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from jaxformer.config.base import check, check_positive
from jaxformer.train.data import pinned, tokenizer

MODULES = pinned.MODULES
CLASSES = ("reference prose", "python code", "docstrings")


@dataclass(frozen=True)
class Config:
    seq_len: int = 64
    examples_per_class: int = 2000
    eval_fraction: float = 0.1

    def __post_init__(self):
        check_positive(self, "seq_len", "examples_per_class")
        check(self.seq_len >= 8, "seq_len", "must be >= 8")
        check(0 < self.eval_fraction < 0.5, "eval_fraction", f"must be in (0, 0.5), got {self.eval_fraction}")


def texts() -> list[str]:
    """The three classes' texts, pinned (train/data/pinned.py)."""
    return [pinned.text("pydoc_topics"), pinned.text("stdlib_code"), pinned.text("stdlib_docstrings")]


def _snippets(ids: np.ndarray, n: int, length: int, rng: np.random.Generator) -> np.ndarray:
    starts = rng.integers(0, len(ids) - length, size=n)
    return ids[starts[:, None] + np.arange(length)[None, :]]


def load(cfg: Config, seed: int):
    rng = np.random.default_rng(seed)
    n_eval = max(1, int(cfg.examples_per_class * cfg.eval_fraction))
    parts = {"train": ([], []), "eval": ([], [])}
    for label, text in enumerate(texts()):
        ids = tokenizer.encode(text)
        cut = int(len(ids) * 0.9)
        for split, seg, n in (("train", ids[:cut], cfg.examples_per_class), ("eval", ids[cut:], n_eval)):
            snip = _snippets(seg, n, cfg.seq_len - 1, rng)
            parts[split][0].append(np.concatenate([np.full((n, 1), tokenizer.BOS, np.int32), snip], 1))
            parts[split][1].append(np.full(n, label, np.int32))
    out = []
    for split in ("train", "eval"):
        ids, labels = np.concatenate(parts[split][0]), np.concatenate(parts[split][1])
        perm = rng.permutation(len(ids))  # interleave classes (eval batches see all classes)
        out.append({"ids": ids[perm].astype(np.int32), "labels": labels[perm]})
    return out[0], out[1]
