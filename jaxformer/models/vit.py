"""Vision Transformer (Dosovitskiy et al. 2021, "An Image is Worth 16x16 Words"): a patchify
conv, a [CLS] token, learned positions, a Pre-LN encoder and a linear classification head.
Twin: torch_ref/models/vit.py.

Images are channels-last [B, H, W, C] in both trees (HF and torchvision use NCHW; transpose
with x.permute(0, 2, 3, 1) before calling). P = patches, N = P + 1 tokens with [CLS].

DINOv2 (HF Dinov2Model / Dinov2ForImageClassification) is this model with LayerScale
(cfg.layer_scale), other image sizes by a bicubic resampling of the patch positions
(cfg.interpolate_positions; docs/numerics.md §37) and the "cls_mean" pool.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from jaxformer.config.vision import ViTConfig
from jaxformer.layers.conv import Conv2d
from jaxformer.layers.kernels import partitioning
from jaxformer.layers.linear import Linear
from jaxformer.layers.norm import LayerNorm
from jaxformer.layers.positional import LearnedPositionalEmbedding, default_positions, resize_bicubic
from jaxformer.layers.special import tanh
from jaxformer.layers.transformer import Encoder
from jaxformer.models.common import check_values


def check_images(shape: tuple, num_channels: int, patch_size: int | None = None,
                 image_size: int | None = None) -> None:
    """Raise ValueError for an image batch that is not [B, H, W, num_channels] (channels last),
    whose sides are not multiples of patch_size, or that is not image_size x image_size."""
    if len(shape) != 4:
        raise ValueError(f"images must be [B, H, W, C] (channels last), got shape {tuple(shape)}")
    _, h, w, c = shape
    if c != num_channels:
        raise ValueError(f"images have {c} channels (last axis), config num_channels={num_channels}; "
                         f"images are channels-last [B, H, W, C], got shape {tuple(shape)}")
    if patch_size is not None and (h % patch_size or w % patch_size):
        raise ValueError(f"image size {h}x{w} is not divisible by patch_size={patch_size}")
    if image_size is not None and (h, w) != (image_size, image_size):
        raise ValueError(f"image size {h}x{w} does not match image_size={image_size} "
                         f"(the learned positions are fixed to a {image_size}x{image_size} image)")


class PatchEmbedding(nnx.Module):
    """Non-overlapping patches by a conv with kernel = stride = patch size, then an optional
    LayerNorm (Swin). With pad=True, the bottom/right edges are zero-padded up to a multiple of
    the patch size first (HF Swin's maybe_pad); otherwise they must already be multiples.

    Args:
        in_channels: C.  dim: D.  patch_size: p.  norm_eps: LayerNorm after the conv (None = none).
    Shapes: x [B, H, W, C] -> [B, ceil(H/p), ceil(W/p), D].
    """

    def __init__(self, in_channels: int, dim: int, patch_size: int, *, norm_eps: float | None = None,
                 pad: bool = False, rngs: nnx.Rngs):
        self.patch_size, self.pad = patch_size, pad
        self.proj = Conv2d(in_channels, dim, patch_size, stride=patch_size, padding=0, rngs=rngs)
        self.norm = LayerNorm(dim, eps=norm_eps) if norm_eps is not None else None

    def __call__(self, x: jax.Array) -> jax.Array:
        p = self.patch_size
        if self.pad:
            x = jnp.pad(x, ((0, 0), (0, -x.shape[1] % p), (0, -x.shape[2] % p), (0, 0)))
        x = self.proj(x)  # [B, H/p, W/p, D]
        return self.norm(x) if self.norm is not None else x


class ViT(nnx.Module):
    """ViT classifier (cfg.head "classifier"), or HF ViTModel's backbone with its pooler
    (cfg.head "pooler").

    Args:
        cfg: ViTConfig.
    Shapes: images [B, H, W, C] (H = W = image_size, or any multiples of patch_size with
    interpolate_positions) -> logits [B, num_classes] (num_classes=0: the pooled features
    [B, D], or [B, 2D] for pool="cls_mean"; head "pooler": the pooler output [B, D], the last
    hidden state is "encoder.final_norm"). With
    return_intermediates, also {"patch_embed": [B, P, D], "embeddings": [B, N, D],
    "encoder.layers.i": [B, N, D], "encoder.final_norm": [B, N, D], "pooled": [B, D]}.
    """

    def __init__(self, cfg: ViTConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        self.patch_embed = PatchEmbedding(cfg.num_channels, cfg.d_model, cfg.patch_size, rngs=rngs)
        self.cls_token = partitioning.param(jax.random.normal(rngs.params(), (1, 1, cfg.d_model), jnp.float32)
                                            * 0.02, (None, None, "embed")) if cfg.class_token else None
        self.embed_positions = LearnedPositionalEmbedding(cfg.num_tokens, cfg.d_model, rngs=rngs)
        self.dropout = nnx.Dropout(cfg.embed_dropout, rngs=rngs)
        self.encoder = Encoder(cfg.encoder_config(), rngs=rngs)
        self.classifier = (Linear(cfg.pooled_dim, cfg.num_classes, axes=("embed", None), rngs=rngs)
                           if cfg.head == "classifier" and cfg.num_classes else None)  # 0: pooled features out
        self.pooler = Linear(cfg.d_model, cfg.d_model, axes=("embed", None), rngs=rngs) if cfg.head == "pooler" else None

    def positions(self, gh: int, gw: int) -> jax.Array:
        """The position table of a gh x gw patch grid, [1, N, D]: the learned table at the
        config's grid; otherwise its patch rows resampled bicubically to gh x gw as HF DINOv2
        does (the [CLS] row kept; docs/numerics.md §37)."""
        cfg, g = self.cfg, self.cfg.grid_size
        table = self.embed_positions(default_positions(1, cfg.num_tokens))  # [1, N, D]
        if (gh, gw) == (g, g):
            return table
        k = int(cfg.class_token)
        grid = resize_bicubic(table[0, k:].reshape(g, g, cfg.d_model), gh, gw)  # [gh, gw, D]
        return jnp.concatenate([table[:, :k], grid.reshape(1, gh * gw, cfg.d_model)], axis=1)

    def __call__(self, images: jax.Array, *, return_intermediates: bool = False,
                 return_attention: bool = False):
        cfg = self.cfg
        check_values(images, "images")
        check_images(images.shape, cfg.num_channels, cfg.patch_size,
                     None if cfg.interpolate_positions else cfg.image_size)
        b, gh, gw = images.shape[0], images.shape[1] // cfg.patch_size, images.shape[2] // cfg.patch_size
        # 1) patchify: [B, H, W, C] -> [B, H/p, W/p, D] -> [B, P, D]
        patches = self.patch_embed(images).reshape(b, gh * gw, cfg.d_model)  # [B, P, D]
        # 2) prepend [CLS], add learned positions
        x = patches
        if self.cls_token is not None:
            cls = jnp.broadcast_to(self.cls_token[...], (b, 1, cfg.d_model))  # [B, 1, D]
            x = jnp.concatenate([cls, x], axis=1)  # [B, N, D]
        x = self.dropout(x + self.positions(gh, gw))  # [B, N, D]
        # 3) Pre-LN encoder with its final norm
        out = self.encoder(x, return_intermediates=return_intermediates, return_attention=return_attention)
        h, inter = out if return_intermediates else (out, None)  # [B, N, D]
        # 4) pool, then classify (or HF ViTModel's pooler)
        n_cls = int(cfg.class_token)
        if cfg.pool == "cls":
            pooled = h[:, 0]  # [B, D]
        elif cfg.pool == "mean":
            pooled = jnp.mean(h[:, n_cls:], axis=1)  # [B, D]
        else:  # cls_mean
            pooled = jnp.concatenate([h[:, 0], jnp.mean(h[:, n_cls:], axis=1)], axis=-1)  # [B, 2D]
        if self.pooler is not None:  # HF ViTModel's pooler: tanh of a dense layer
            logits = tanh(self.pooler(pooled))  # [B, D]
        else:
            logits = self.classifier(pooled) if self.classifier is not None else pooled  # [B, num_classes]
        if not return_intermediates:
            return logits
        return logits, {"patch_embed": patches, "embeddings": x,
                        **{f"encoder.{k}": v for k, v in inter.items()}, "pooled": pooled}
