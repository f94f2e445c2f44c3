"""A synthetic multivariate series for forecasting, generated from a seed: no network.

Why synthetic: no installed package ships a real time series (scikit-learn's bundled sets are
tabular or images; statsmodels, which ships sunspots/co2/etc., is not installed, and scipy's
electrocardiogram is downloaded on demand). So this generator is documented instead.

The generator ("hourly" steps t = 0..length-1, channel c = 0..C-1):
    x_c(t) = trend_c * t / length                                   slow linear trend
           + a_c * sin(2 pi t / 24 + phase_c)                       daily season
           + b_c * sin(2 pi t / 168 + phase'_c)                     weekly season
           + noise_c(t),  noise_c(t) = 0.8 noise_c(t-1) + noise * N(0, 1)   AR(1) noise
    and for c >= 1 also + 0.5 * x_{c-1}(t - 3): each channel echoes its neighbour 3 steps later,
    so that the other channels help to forecast a target channel.

Split chronologically (no leakage across time): the first 1 - eval_fraction of the steps make
the train windows, the rest the eval windows. Each channel is standardised with the mean and
std of the *train* steps only. Windows slide by `stride`:
    inputs  float32 [N, input_len, C]           = x[s : s + input_len]
    targets float32 [N, horizon, len(targets)]  = x[s + input_len : s + input_len + horizon, targets]

`data:` keys (all optional, see Config): length 3000, num_channels 3, input_len 48, horizon 8,
target_channels [0], stride 1, eval_fraction 0.2, noise 0.1.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from jaxformer.config.base import check, check_positive, from_dict


@dataclass(frozen=True)
class Config:
    """The YAML `data:` keys besides `name` (train/data/__init__.py builds it strictly)."""

    length: int = 3000  # steps generated
    num_channels: int = 3
    input_len: int = 48  # L, must match model.input_len
    horizon: int = 8  # must match model.horizon
    target_channels: tuple[int, ...] = (0,)  # must match model.target_channels
    stride: int = 1
    eval_fraction: float = 0.2
    noise: float = 0.1

    def __post_init__(self) -> None:
        check_positive(self, "length", "num_channels", "input_len", "horizon", "stride")
        check(len(self.target_channels) > 0 and all(0 <= c < self.num_channels
                                                    for c in self.target_channels),
              "target_channels", f"must be channels in [0, {self.num_channels}), got "
              f"{list(self.target_channels)}")
        check(0.0 < self.eval_fraction < 1.0, "eval_fraction",
              f"must be in (0, 1), got {self.eval_fraction}")
        check(self.noise >= 0.0, "noise", f"must be >= 0, got {self.noise}")
        check(min(self.split, self.length - self.split) >= self.input_len + self.horizon, "length",
              f"{self.length} steps leave a split shorter than input_len + horizon = "
              f"{self.input_len + self.horizon}")

    @property
    def split(self) -> int:
        """First eval step: train steps are [0, split), eval steps [split, length)."""
        return int(round(self.length * (1.0 - self.eval_fraction)))


def as_config(data_cfg: Config | Mapping) -> Config:
    """A Config, or a plain `data:` mapping (its `name` key is ignored) validated into one."""
    if isinstance(data_cfg, Config):
        return data_cfg
    return from_dict(Config, {k: v for k, v in data_cfg.items() if k != "name"}, prefix="data.")


def generate(length: int, num_channels: int, seed: int, noise: float = 0.1) -> np.ndarray:
    """The raw series, float64 [length, C] (see the module docstring)."""
    rng = np.random.RandomState(seed)
    t = np.arange(length, dtype=np.float64)[:, None]  # [T, 1]
    trend = rng.uniform(-2.0, 2.0, num_channels)
    daily, weekly = rng.uniform(0.5, 1.5, num_channels), rng.uniform(0.2, 0.8, num_channels)
    ph_d, ph_w = rng.uniform(0, 2 * np.pi, num_channels), rng.uniform(0, 2 * np.pi, num_channels)
    x = (trend * t / length + daily * np.sin(2 * np.pi * t / 24 + ph_d)
         + weekly * np.sin(2 * np.pi * t / 168 + ph_w))  # [T, C]
    eps = rng.standard_normal((length, num_channels)) * noise
    ar = np.zeros_like(eps)
    for i in range(length):
        ar[i] = (0.8 * ar[i - 1] if i else 0.0) + eps[i]
    x = x + ar
    for c in range(1, num_channels):
        x[3:, c] += 0.5 * x[:-3, c - 1]
    return x


def _windows(x: np.ndarray, input_len: int, horizon: int, targets: list[int], stride: int):
    starts = np.arange(0, len(x) - input_len - horizon + 1, stride)
    inputs = np.stack([x[s: s + input_len] for s in starts]).astype(np.float32)
    out = np.stack([x[s + input_len: s + input_len + horizon][:, targets] for s in starts])
    return {"inputs": inputs, "targets": out.astype(np.float32)}


def load(data_cfg: Config | Mapping, seed: int) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """-> (train, eval): {"inputs": float32 [N, L, C], "targets": float32 [N, horizon, C_out]}."""
    cfg = as_config(data_cfg)
    targets = list(cfg.target_channels)
    x = generate(cfg.length, cfg.num_channels, seed, cfg.noise)
    mean, std = x[:cfg.split].mean(axis=0), x[:cfg.split].std(axis=0)  # train steps only
    x = (x - mean) / std
    return (_windows(x[:cfg.split], cfg.input_len, cfg.horizon, targets, cfg.stride),
            _windows(x[cfg.split:], cfg.input_len, cfg.horizon, targets, cfg.stride))
