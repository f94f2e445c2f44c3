"""Byte-level language-modelling corpus from Python itself: the language reference text of the
stdlib module `pydoc_data.topics` (what `help()` shows), as CPython 3.11.7 has it (466,273
bytes), pinned in the package (train/data/pinned.py) so that every Python trains on the same
bytes.

Examples are windows of seq_len + 1 byte tokens (inputs are the first seq_len, targets the
last seq_len). The first (1 - eval_fraction) of the corpus is train, the rest eval, so no
window straddles the split. Deterministic; the seed only affects batch order.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from jaxformer.config.base import check, check_positive
from jaxformer.train.data import pinned, tokenizer


@dataclass(frozen=True)
class Config:
    seq_len: int = 64
    eval_fraction: float = 0.05
    stride: int | None = None  # train window stride; None = seq_len

    def __post_init__(self):
        check_positive(self, "seq_len")
        check(0 < self.eval_fraction < 0.5, "eval_fraction", f"must be in (0, 0.5), got {self.eval_fraction}")
        if self.stride is not None:
            check_positive(self, "stride")


def corpus() -> str:
    return pinned.text("pydoc_topics")


def windows(ids: np.ndarray, length: int, stride: int) -> np.ndarray:
    n = (len(ids) - length) // stride + 1
    idx = np.arange(length)[None, :] + stride * np.arange(max(n, 0))[:, None]
    return ids[idx]


def load(cfg: Config, seed: int):
    ids = tokenizer.encode(corpus())
    cut = int(len(ids) * (1 - cfg.eval_fraction))
    train = windows(ids[:cut], cfg.seq_len + 1, cfg.stride or cfg.seq_len)
    evaluation = windows(ids[cut:], cfg.seq_len + 1, cfg.seq_len + 1)
    return {"tokens": train}, {"tokens": evaluation}
