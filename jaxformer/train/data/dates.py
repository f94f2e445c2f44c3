"""A generated translation task: date normalisation. The source is a date written in one of
many human formats ("Friday, March 5, 2021", "5th of mar 2021", "03/05/21", ...), the target
its ISO form "2021-03-05". Byte-level tokens (tokenizer.py): source padded with 0; the
decoder input is [BOS] + target, the decoder output target + [EOS], padded with 0 (ignored).

Train and eval dates are disjoint: each calendar day is assigned to one split by a seeded hash.
"""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

import numpy as np

from jaxformer.config.base import check, check_positive
from jaxformer.train.data import tokenizer

MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September",
          "October", "November", "December")
DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")


def _ordinal(n: int) -> str:
    suffix = "th" if 11 <= n % 100 <= 13 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


FORMATS = (
    lambda d: f"{MONTHS[d.month - 1]} {d.day}, {d.year}",
    lambda d: f"{d.day} {MONTHS[d.month - 1][:3]} {d.year}",
    lambda d: f"{DAYS[d.weekday()]}, {MONTHS[d.month - 1]} {d.day}, {d.year}",
    lambda d: f"{_ordinal(d.day)} of {MONTHS[d.month - 1].lower()} {d.year}",
    lambda d: f"{d.month:02d}/{d.day:02d}/{d.year % 100:02d}",
    lambda d: f"{d.year}/{d.month}/{d.day}",
    lambda d: f"{MONTHS[d.month - 1][:3].upper()} {d.day:02d} {d.year}",
    lambda d: f"{d.day}.{d.month}.{d.year}",
    lambda d: f"{DAYS[d.weekday()][:3]} {d.day} {MONTHS[d.month - 1]} {d.year}",
)


@dataclass(frozen=True)
class Config:
    src_len: int = 32
    tgt_len: int = 12  # "YYYY-MM-DD" + BOS/EOS
    train_examples: int = 20000
    eval_examples: int = 512
    first_year: int = 1950
    last_year: int = 2049

    def __post_init__(self):
        check_positive(self, "src_len", "tgt_len", "train_examples", "eval_examples")
        check(self.tgt_len >= 11, "tgt_len", "must be >= 11 (10 characters + BOS/EOS)")
        check(self.src_len >= 30, "src_len", "must be >= 30 to hold the longest format")
        check(self.first_year <= self.last_year, "last_year", "must be >= first_year")


def _example(d: dt.date, fmt: int, cfg: Config):
    src = tokenizer.pad_to(tokenizer.encode(FORMATS[fmt](d)), cfg.src_len)
    tgt = tokenizer.encode(d.isoformat())
    tgt_in = tokenizer.pad_to(np.concatenate([[tokenizer.BOS], tgt]).astype(np.int32), cfg.tgt_len)
    tgt_out = tokenizer.pad_to(np.concatenate([tgt, [tokenizer.EOS]]).astype(np.int32), cfg.tgt_len)
    return src, tgt_in, tgt_out


def load(cfg: Config, seed: int):
    rng = np.random.default_rng(seed)
    start = dt.date(cfg.first_year, 1, 1).toordinal()
    days = np.arange(start, dt.date(cfg.last_year, 12, 31).toordinal() + 1)
    is_eval = np.random.default_rng([seed, 7]).random(len(days)) < 0.1
    out = []
    for split_days, n in ((days[~is_eval], cfg.train_examples), (days[is_eval], cfg.eval_examples)):
        picks = rng.choice(split_days, size=n)
        fmts = rng.integers(0, len(FORMATS), size=n)
        ex = [_example(dt.date.fromordinal(int(o)), int(f), cfg) for o, f in zip(picks, fmts, strict=True)]
        out.append({"src": np.stack([e[0] for e in ex]), "tgt_in": np.stack([e[1] for e in ex]),
                    "tgt_out": np.stack([e[2] for e in ex])})
    return out[0], out[1]
