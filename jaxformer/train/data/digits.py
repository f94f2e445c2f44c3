"""scikit-learn's handwritten digits (UCI optdigits test set: 1,797 8x8 grey images, 10
classes, pixel values 0..16), shipped inside the scikit-learn package: no network.

Images are upsampled by pixel repetition (nearest neighbour, exact) to image_size x image_size
so that patches of 4 or 8 pixels make sense, scaled to [0, 1], then standardised with the
mean and std of the *train* split only. Channels-last float32 [N, H, W, C].

`data:` keys (all optional, see Config): image_size 16 (a multiple of 8), num_channels 1
(3 repeats the grey channel), eval_fraction 0.2 (stratified: that fraction of every class goes
to eval), normalize true (standardise with train-split statistics).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from jaxformer.config.base import check, from_dict


@dataclass(frozen=True)
class Config:
    """The YAML `data:` keys besides `name` (train/data/__init__.py builds it strictly)."""

    image_size: int = 16  # a positive multiple of 8
    num_channels: int = 1  # 1 = grey; 3 repeats the grey channel
    eval_fraction: float = 0.2
    normalize: bool = True

    def __post_init__(self) -> None:
        check(self.image_size > 0 and self.image_size % 8 == 0, "image_size",
              f"must be a positive multiple of 8, got {self.image_size}")
        check(self.num_channels in (1, 3), "num_channels", f"must be 1 or 3, got {self.num_channels}")
        check(0.0 < self.eval_fraction < 1.0, "eval_fraction",
              f"must be in (0, 1), got {self.eval_fraction}")


def as_config(data_cfg: Config | Mapping) -> Config:
    """A Config, or a plain `data:` mapping (its `name` key is ignored) validated into one."""
    if isinstance(data_cfg, Config):
        return data_cfg
    return from_dict(Config, {k: v for k, v in data_cfg.items() if k != "name"}, prefix="data.")


def load(data_cfg: Config | Mapping, seed: int) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """-> (train, eval): {"images": float32 [N, H, W, C], "labels": int32 [N]}."""
    from sklearn.datasets import load_digits

    cfg = as_config(data_cfg)
    size, channels, eval_fraction = cfg.image_size, cfg.num_channels, cfg.eval_fraction

    digits = load_digits()
    images = digits.images.astype(np.float32) / 16.0  # [1797, 8, 8] in [0, 1]
    labels = digits.target.astype(np.int32)
    r = size // 8
    images = np.repeat(np.repeat(images, r, axis=1), r, axis=2)[..., None]  # [N, H, W, 1]
    if channels == 3:
        images = np.repeat(images, 3, axis=-1)

    # stratified, seeded split: shuffle each class, send round(fraction * n_c) to eval
    rng = np.random.RandomState(seed)
    eval_idx = []
    for c in range(10):
        idx = np.flatnonzero(labels == c)
        rng.shuffle(idx)
        eval_idx.append(idx[: int(round(eval_fraction * len(idx)))])
    is_eval = np.zeros(len(labels), bool)
    is_eval[np.concatenate(eval_idx)] = True
    train_idx = rng.permutation(np.flatnonzero(~is_eval))
    eval_idx = np.flatnonzero(is_eval)

    train = {"images": images[train_idx], "labels": labels[train_idx]}
    evals = {"images": images[eval_idx], "labels": labels[eval_idx]}
    if cfg.normalize:
        mean = train["images"].mean(dtype=np.float64)
        std = train["images"].std(dtype=np.float64)
        for split in (train, evals):
            split["images"] = ((split["images"] - mean) / std).astype(np.float32)
    return train, evals
