"""`data.name: tokens`: a text LM trains from a tokens directory (train/data/tokens.py, written
by `jaxformer data prepare`).

Examples are windows of seq_len + 1 ids over a split's stream, in which documents follow each
other with the eos id between them: sequences are packed across documents, and the model learns
where one ends. The key is `tokens` (inputs the first seq_len, targets the last seq_len), as in
stdlib_docs, so the `lm` task trains on either. Train windows start every seq_len ids (each id
is a target once); eval windows every seq_len + 1 (disjoint). The shards are memory-mapped and
a window is read when its batch is, so the data need not fit in memory. A directory with a loss
mask (instruction/chat data) adds its key `loss_mask` (uint8, [seq_len + 1], aligned with
`tokens`): the `lm` task counts target i + 1 only where loss_mask[i + 1] is 1 (train/tasks.py).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from jaxformer.config import ConfigError
from jaxformer.config.base import check, check_positive
from jaxformer.train.data.tokens import TokenSplit, TokensDir


@dataclass(frozen=True)
class Config:
    path: str = ""  # the tokens directory
    seq_len: int = 128

    def __post_init__(self):
        check(bool(self.path), "path", "must name a tokens directory (`jaxformer data prepare --out DIR`)")
        check_positive(self, "seq_len")


class Windows:
    """Windows of `length` ids every `stride` ids of a split, as a random-access source."""

    def __init__(self, split: TokenSplit, length: int, stride: int):
        self.split, self.length, self.stride = split, length, stride
        self.n = max(0, (split.num_tokens - length) // stride + 1)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, np.ndarray]:
        if not 0 <= i < self.n:  # numpy would wrap a negative index, the reader not at all
            raise IndexError(f"window {i} outside [0, {self.n}) of the {self.split.name} split")
        out = {"tokens": self.split.read(i * self.stride, self.length)}
        if self.split.masks is not None:
            out["loss_mask"] = self.split.read_mask(i * self.stride, self.length)
        return out


def open_dir(cfg: Config) -> TokensDir:
    """The directory with both splits opened (every shard checked); errors name the file."""
    d = TokensDir(cfg.path)
    for name in ("train", "eval"):
        split = d.split(name)
        if split.num_tokens < cfg.seq_len + 1:
            raise ConfigError(f"tokens dataset {cfg.path}: the {name} split holds {split.num_tokens} "
                              f"ids, fewer than data.seq_len + 1 = {cfg.seq_len + 1} (one window)")
    return d


def sources(cfg: Config, seed: int):
    d = open_dir(cfg)
    return (Windows(d.split("train"), cfg.seq_len + 1, cfg.seq_len),
            Windows(d.split("eval"), cfg.seq_len + 1, cfg.seq_len + 1))


def tokenizer_record(cfg: Config) -> tuple[dict, str | None]:
    """(meta.json's tokenizer record with the ids' vocab size and specials, the directory's
    tokenizer file or None)."""
    d = TokensDir(cfg.path)
    record = {**d.tokenizer, "vocab_size": d.vocab_size, "eos_id": d.eos_id, "bos_id": d.bos_id}
    name = d.tokenizer.get("file")
    path = os.path.join(cfg.path, name) if name else None
    if path and not os.path.isfile(path):
        raise ConfigError(f"tokens dataset {cfg.path}: its tokenizer file {name} is missing")
    return record, path
