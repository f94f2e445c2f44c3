"""`data.name: tokens`: a text LM trains from a tokens directory (train/data/tokens.py, written
by `jaxformer data prepare`).

Examples are windows of seq_len + 1 ids over a split's stream, in which documents follow each
other, each ended by the eos id: sequences are packed across documents, and the model learns
where one ends. The key is `tokens` (inputs the first seq_len, targets the last seq_len), as in
stdlib_docs, so the `lm` task trains on either.

data.packing says what a window's documents see of each other:
  segments (default): the window also carries `segment_ids` [seq_len + 1] int32 (1 for the
      window's first document, +1 after each eos; the eos ends its document). The `lm` task
      then masks attention across documents, restarts positions at each one, and drops the
      target that crosses a boundary (an eos input predicting the next document's first id):
      jaxformer/train/tasks.py forward_loss.
  concat: no segment ids; every token attends to the whole window, documents included.
Train windows start every seq_len ids (each id is a target once); eval windows every
seq_len + 1 (disjoint). The shards are memory-mapped and
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
from jaxformer.train.data.tokens import TokensDir, TokenSplit

PACKING = ("segments", "concat")


def segment_ids(tokens: np.ndarray, eos_id: int) -> np.ndarray:
    """tokens [..., L] -> [..., L] int32: 1 for the first document, +1 after each eos id."""
    after_eos = np.cumsum(tokens[..., :-1] == eos_id, axis=-1, dtype=np.int32)
    return np.concatenate([np.zeros_like(after_eos[..., :1]), after_eos], axis=-1) + 1


@dataclass(frozen=True)
class Config:
    path: str = ""  # the tokens directory
    seq_len: int = 128
    packing: str = "segments"  # segments | concat (the module docstring)

    def __post_init__(self):
        check(bool(self.path), "path", "must name a tokens directory (`jaxformer data prepare --out DIR`)")
        check_positive(self, "seq_len")
        check(self.packing in PACKING, "packing", f"must be one of {PACKING}, got {self.packing!r}")


class Windows:
    """Windows of `length` ids every `stride` ids of a split, as a random-access source;
    eos_id given: with their segment ids (data.packing: segments)."""

    def __init__(self, split: TokenSplit, length: int, stride: int, eos_id: int | None = None):
        self.split, self.length, self.stride, self.eos_id = split, length, stride, eos_id
        self.n = max(0, (split.num_tokens - length) // stride + 1)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, np.ndarray]:
        if not 0 <= i < self.n:  # numpy would wrap a negative index, the reader not at all
            raise IndexError(f"window {i} outside [0, {self.n}) of the {self.split.name} split")
        out = {"tokens": self.split.read(i * self.stride, self.length)}
        if self.eos_id is not None:
            out["segment_ids"] = segment_ids(out["tokens"], self.eos_id)
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
    eos = d.eos_id if cfg.packing == "segments" else None
    return (Windows(d.split("train"), cfg.seq_len + 1, cfg.seq_len, eos),
            Windows(d.split("eval"), cfg.seq_len + 1, cfg.seq_len + 1, eos))


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
