"""TCN + Transformer forecaster: a Conv1d+ReLU stack, then a Transformer encoder, with a
forecasting head. Temporal convolutions after Bai et al. 2018 ("An Empirical Evaluation of
Generic Convolutional and Recurrent Networks for Sequence Modeling"); the encoder is Vaswani
et al. 2017. Twin: torch_ref/models/timeseries.py.

Series are [B, L, C] (L steps, C channels), channels last in both trees. Every conv pads
explicitly (docs/numerics.md §5): causal = ((k-1)*d, 0), same = (total // 2, rest), so every
conv keeps the length L. The head reads the last step (or the mean over steps) and predicts
[B, horizon, C_out] for the configured target channels.

Two choices differ from the common PyTorch TCNTransformer recipe, on purpose: feeding
[B, L, D] to nn.TransformerEncoder without batch_first=True makes attention mix the *batch*
axis, so here attention runs over time; padding k // 2 on both sides lengthens the series by
one for an even k, so padding="same" here splits (k-1)*d asymmetrically and keeps L. The
encoder defaults are nn.TransformerEncoder's (Post-LN, ReLU, eps 1e-5, no final norm).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from jaxformer.config.vision import TimeSeriesConfig
from jaxformer.layers.conv import Conv1d
from jaxformer.layers.linear import Linear
from jaxformer.layers.positional import absolute_positions, default_positions
from jaxformer.layers.transformer import Encoder
from jaxformer.models.common import check_values


def check_series(shape: tuple, num_channels: int, receptive_field: int, max_len: int) -> None:
    """Raise ValueError unless shape is [B, L, num_channels] with receptive_field <= L <= max_len."""
    if len(shape) != 3:
        raise ValueError(f"series must be [B, L, C] (channels last), got shape {tuple(shape)}")
    _, length, c = shape
    if c != num_channels:
        raise ValueError(f"series has {c} channels (last axis), config num_channels={num_channels}; "
                         f"series are [B, L, C], got shape {tuple(shape)}")
    if length < receptive_field:
        raise ValueError(f"series length {length} is shorter than the receptive field "
                         f"{receptive_field} of the conv stack (kernel_size, dilations, conv_layers)")
    if length > max_len:
        raise ValueError(f"series length {length} exceeds input_len={max_len}")


class TCNTransformer(nnx.Module):
    """Conv1d stack -> (+ positions) -> encoder -> pooled state -> Linear -> forecast.

    Args:
        cfg: TimeSeriesConfig.
    Shapes: series [B, L, C] -> [B, horizon, C_out]. With return_intermediates, also
    {"conv_layers.i": [B, L, D], "embeddings": [B, L, D], "encoder.layers.i": [B, L, D],
    "pooled": [B, D]} (and "encoder.final_norm" when the stack has one).
    """

    def __init__(self, cfg: TimeSeriesConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        self.conv_layers = nnx.List([
            Conv1d(cfg.num_channels if i == 0 else cfg.d_model, cfg.d_model, cfg.kernel_size,
                   padding=[cfg.conv_padding(i)], dilation=cfg.dilation(i), rngs=rngs)
            for i in range(cfg.conv_layers)])
        self.embed_positions = absolute_positions(cfg.position, cfg.input_len, cfg.d_model, rngs=rngs)
        self.dropout = nnx.Dropout(cfg.dropout, rngs=rngs)
        self.encoder = Encoder(cfg.encoder_config(), rngs=rngs)
        self.head = Linear(cfg.d_model, cfg.horizon * cfg.num_targets, axes=("embed", None), rngs=rngs)

    def __call__(self, series: jax.Array, *, return_intermediates: bool = False,
                 return_attention: bool = False):
        cfg = self.cfg
        check_values(series, "series")
        check_series(series.shape, cfg.num_channels, cfg.receptive_field, cfg.input_len)
        b, length, _ = series.shape
        inter = {}
        # 1) temporal convolutions, length-preserving explicit pads
        x = series
        for i, conv in enumerate(self.conv_layers):
            x = jax.nn.relu(conv(x))  # [B, L, D]
            inter[f"conv_layers.{i}"] = x
        # 2) positions
        if self.embed_positions is not None:
            x = x + self.embed_positions(default_positions(b, length))  # [B, L, D]
        x = self.dropout(x)
        inter["embeddings"] = x
        # 3) encoder stack
        out = self.encoder(x, return_intermediates=return_intermediates, return_attention=return_attention)
        h, enc = out if return_intermediates else (out, None)  # [B, L, D]
        # 4) forecast from the last step (or the mean over steps)
        pooled = h[:, -1] if cfg.pool == "last" else jnp.mean(h, axis=1)  # [B, D]
        y = self.head(pooled).reshape(b, cfg.horizon, cfg.num_targets)  # [B, horizon, C_out]
        if not return_intermediates:
            return y
        return y, {**inter, **{f"encoder.{k}": v for k, v in enc.items()}, "pooled": pooled}
