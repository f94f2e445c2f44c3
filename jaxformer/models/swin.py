"""Swin Transformer (Liu et al. 2021, "Hierarchical Vision Transformer using Shifted Windows").
Twin: torch_ref/models/swin.py. Weights map onto HF SwinForImageClassification by renaming
only (jaxformer/hf/vision.py).

Feature maps stay channels-last [B, h, w, C] between blocks. A block attends inside
non-overlapping W x W windows (N = W*W tokens, nW windows per image), with a learned relative
position bias; every second block cyclically shifts the map by W // 2 first and masks pairs of
tokens that came from different regions (SW-MSA). Odd sizes follow HF / the reference code:
  * the image is zero-padded bottom/right to a multiple of the patch size;
  * after the block's norm, the map is zero-padded to a multiple of the window; those zero
    tokens are attended to like any other (not masked), exactly as in HF, and cropped after;
  * patch merging zero-pads an odd side to even;
  * if min(h, w) <= window_size, the window is clamped to min(h, w) and the shift dropped.
    The bias table keeps its (2*window_size - 1)^2 rows; a clamped window reads the rows of
    its own offsets, so the same offset always gets the same learned bias.
Index tables and shift masks come from jaxformer/tables.py (numpy), shared by both trees.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxformer.config.vision import SwinConfig
from jaxformer.layers import stack
from jaxformer.layers.attention import key_projection
from jaxformer.layers.dispatch import dot_product_attention
from jaxformer.layers.ffn import FeedForward
from jaxformer.layers.kernels import partitioning
from jaxformer.layers.linear import Linear
from jaxformer.layers.norm import LayerNorm
from jaxformer.layers.sow import capture, sow
from jaxformer.models.common import check_values
from jaxformer.models.vit import PatchEmbedding, check_images
from jaxformer.tables import relative_position_index, shift_mask


# ----------------------------------------------------------------------------- windows
def effective_window(h: int, w: int, window: int, shift: int) -> tuple[int, int]:
    """HF's rule: a map no larger than the window is one window, with no shift."""
    if min(h, w) <= window:
        return min(h, w), 0
    return window, shift


def window_partition(x: jax.Array, window: int) -> jax.Array:
    """[B, h, w, C] -> [B*nW, W*W, C], windows in (batch, row, column) order like HF."""
    b, h, w, c = x.shape
    x = x.reshape(b, h // window, window, w // window, window, c).transpose(0, 1, 3, 2, 4, 5)
    return x.reshape(-1, window * window, c)


def window_reverse(x: jax.Array, window: int, h: int, w: int) -> jax.Array:
    """[B*nW, W*W, C] -> [B, h, w, C]."""
    c = x.shape[-1]
    x = x.reshape(-1, h // window, w // window, window, window, c).transpose(0, 1, 3, 2, 4, 5)
    return x.reshape(-1, h, w, c)


# ----------------------------------------------------------------------------- modules
class WindowAttention(nnx.Module):
    """Multi-head self-attention inside windows with a learned relative position bias table
    [(2W-1)^2, H] (Liu et al. 2021, eq. 4).

    Args:
        dim: C.  num_heads: H.  window_size: W, sizes the table.  qkv_bias: biases on q/k/v
        (o_proj always has one).  attn_dropout, dropout: on the weights / the output.
    Shapes: x [B*nW, N, C], mask bool [nW, N, N] or None -> [B*nW, N, C]; N = w*w for the
    block's (possibly clamped) window w <= W.
    """

    def __init__(self, dim: int, num_heads: int, window_size: int, *, qkv_bias: bool = True,
                 attn_dropout: float = 0.0, dropout: float = 0.0, rngs: nnx.Rngs):
        self.num_heads, self.head_dim, self.window_size = num_heads, dim // num_heads, window_size
        self.q_proj = Linear(dim, dim, use_bias=qkv_bias, axes=("embed", "heads"), rngs=rngs)
        self.k_proj = Linear(dim, dim, use_bias=qkv_bias, axes=("embed", "heads"), rngs=rngs)
        self.v_proj = Linear(dim, dim, use_bias=qkv_bias, axes=("embed", "heads"), rngs=rngs)
        self.o_proj = Linear(dim, dim, axes=("heads", "embed"), rngs=rngs)
        self.relative_position_bias_table = partitioning.param(jax.random.normal(
            rngs.params(), ((2 * window_size - 1) ** 2, num_heads), jnp.float32) * 0.02, (None, None))
        self.attn_dropout = nnx.Dropout(attn_dropout, rngs=rngs)
        self.dropout = nnx.Dropout(dropout, rngs=rngs)

    def relative_bias(self, window: int) -> jax.Array:
        """-> [1, H, N, N] bias for a window x window window."""
        index = jnp.asarray(relative_position_index(window, self.window_size))  # [N, N]
        bias = jnp.take(self.relative_position_bias_table[...], index, axis=0)  # [N, N, H]
        return jnp.transpose(bias, (2, 0, 1))[None]

    def __call__(self, x: jax.Array, window: int, mask: np.ndarray | None = None) -> jax.Array:
        bw, n, c = x.shape
        # 1) project and split heads
        q = self.q_proj(x).reshape(bw, n, self.num_heads, self.head_dim)  # [B*nW, N, H, K]
        k = key_projection(self.k_proj, x).reshape(bw, n, self.num_heads, self.head_dim)  # [B*nW, N, H, K]
        v = self.v_proj(x).reshape(bw, n, self.num_heads, self.head_dim)  # [B*nW, N, H, K]
        # 2) the shift mask repeats for every image: [nW, N, N] -> [B*nW, 1, N, N]
        if mask is not None:
            mask = jnp.tile(jnp.asarray(mask), (bw // mask.shape[0], 1, 1))[:, None]
        # 3) attend with the relative position bias
        out = dot_product_attention(q, k, v, mask=mask, bias=self.relative_bias(window),
                                    dropout=self.attn_dropout)  # [B*nW, N, H, K]
        # 4) merge heads and project out
        return self.dropout(self.o_proj(out.reshape(bw, n, c)))


class SwinBlock(nnx.Module):
    """x + attn(norm(x)) over (shifted) windows, then x + MLP(norm(x)); Pre-LN.

    Shapes: x [B, h, w, C] -> [B, h, w, C].
    """

    def __init__(self, cfg: SwinConfig, dim: int, num_heads: int, *, shift: int, drop_path: float,
                 rngs: nnx.Rngs):
        self.window_size, self.shift = cfg.window_size, shift
        self.attn_norm = LayerNorm(dim, eps=cfg.norm_eps)
        self.self_attn = WindowAttention(dim, num_heads, cfg.window_size, qkv_bias=cfg.qkv_bias,
                                         attn_dropout=cfg.attn_dropout, dropout=cfg.dropout, rngs=rngs)
        self.ffn_norm = LayerNorm(dim, eps=cfg.norm_eps)
        self.ffn = FeedForward(dim, int(cfg.mlp_ratio * dim), kind=cfg.ffn, dropout=cfg.dropout, rngs=rngs)
        # stochastic depth: one keep/drop per example (timm's DropPath), scaled by 1/keep
        self.drop_path = nnx.Dropout(drop_path, broadcast_dims=(1, 2, 3), rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        """Under a capture (layers/sow.py) the block sows its sub-layer outputs as the stacks'
        layers do (stack.SUBLAYERS): "attn_output" (before the residual add), "attn_residual"
        and "ffn_output" (before its add)."""
        b, h, w, c = x.shape
        window, shift = effective_window(h, w, self.window_size, self.shift)
        shortcut = x
        x = self.attn_norm(x)
        # 1) zero-pad to whole windows (after the norm, as HF)
        hp, wp = h + (-h % window), w + (-w % window)
        x = jnp.pad(x, ((0, 0), (0, hp - h), (0, wp - w), (0, 0)))  # [B, hp, wp, C]
        # 2) cyclic shift up-left, attend within windows, shift back
        if shift:
            x = jnp.roll(x, (-shift, -shift), axis=(1, 2))
        windows = window_partition(x, window)  # [B*nW, N, C]
        windows = self.self_attn(windows, window, shift_mask(hp, wp, window, shift))  # [B*nW, N, C]
        x = window_reverse(windows, window, hp, wp)  # [B, hp, wp, C]
        if shift:
            x = jnp.roll(x, (shift, shift), axis=(1, 2))
        x = shortcut + self.drop_path(sow(self, "attn_output", x[:, :h, :w]))  # [B, h, w, C]
        sow(self, "attn_residual", x)
        # 3) MLP
        return x + self.drop_path(sow(self, "ffn_output", self.ffn(self.ffn_norm(x))))


class PatchMerging(nnx.Module):
    """Concatenate each 2x2 neighbourhood (order x[0::2, 0::2], x[1::2, 0::2], x[0::2, 1::2],
    x[1::2, 1::2], as HF), LayerNorm, then a bias-free Linear 4C -> 2C. Odd sides are
    zero-padded. Shapes: x [B, h, w, C] -> [B, ceil(h/2), ceil(w/2), 2C]."""

    def __init__(self, dim: int, *, eps: float, rngs: nnx.Rngs):
        self.norm = LayerNorm(4 * dim, eps=eps)
        self.reduction = Linear(4 * dim, 2 * dim, use_bias=False, axes=("embed", None), rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = jnp.pad(x, ((0, 0), (0, x.shape[1] % 2), (0, x.shape[2] % 2), (0, 0)))
        x = jnp.concatenate([x[:, 0::2, 0::2], x[:, 1::2, 0::2], x[:, 0::2, 1::2], x[:, 1::2, 1::2]],
                            axis=-1)  # [B, h/2, w/2, 4C]
        return self.reduction(self.norm(x))  # [B, h/2, w/2, 2C]


class SwinStage(nnx.Module):
    """depth blocks alternating W-MSA / SW-MSA, then PatchMerging unless it is the last stage.
    Shapes: x [B, h, w, C] -> [B, h', w', C'] (h' = ceil(h/2), C' = 2C when merging)."""

    def __init__(self, cfg: SwinConfig, index: int, drop_paths: list[float], *, rngs: nnx.Rngs):
        dim = cfg.stage_dim(index)
        self.blocks = nnx.List([
            SwinBlock(cfg, dim, cfg.num_heads[index], shift=0 if i % 2 == 0 else cfg.window_size // 2,
                      drop_path=drop_paths[i], rngs=rngs) for i in range(cfg.depths[index])])
        last = index == len(cfg.depths) - 1
        self.downsample = None if last else PatchMerging(dim, eps=cfg.patch_norm_eps, rngs=rngs)


class SwinTransformer(nnx.Module):
    """Swin image classifier: patch embedding + norm, stages, final norm, mean pool, head.

    Shapes: images [B, H, W, C] (any H, W) -> logits [B, num_classes]. With
    return_intermediates, also {"patch_embed", "stages.s.blocks.b.attn" (.attn_residual, .ffn:
    the sub-layers, as SwinBlock sows them), "stages.s.blocks.b", "stages.s" (after merging),
    "final_norm": [B, h, w, C] maps; "pooled": [B, C]}.
    """

    def __init__(self, cfg: SwinConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        self.patch_embed = PatchEmbedding(cfg.num_channels, cfg.embed_dim, cfg.patch_size,
                                          norm_eps=cfg.patch_norm_eps, pad=True, rngs=rngs)
        rates, starts = cfg.drop_path_rates(), np.cumsum((0,) + tuple(cfg.depths))
        self.stages = nnx.List([SwinStage(cfg, i, rates[starts[i]:starts[i + 1]], rngs=rngs)
                                for i in range(len(cfg.depths))])
        self.final_norm = LayerNorm(cfg.num_features, eps=cfg.norm_eps)
        self.classifier = Linear(cfg.num_features, cfg.num_classes, axes=("embed", None), rngs=rngs)
        # made last, so that its RNG stream leaves the other layers' streams as they were
        self.embed_dropout = nnx.Dropout(cfg.embed_dropout, rngs=rngs)

    def __call__(self, images: jax.Array, *, return_intermediates: bool = False):
        check_values(images, "images")
        check_images(images.shape, self.cfg.num_channels)
        inter = {}
        x = self.patch_embed(images)  # [B, H/p, W/p, C]
        inter["patch_embed"] = x
        x = self.embed_dropout(x)
        for s, stage in enumerate(self.stages):
            for i, block in enumerate(stage.blocks):
                x, sown = capture(lambda blk, h: blk(h))(block, x) if return_intermediates else (block(x), {})
                stack.store_layer(inter, f"stages.{s}.blocks.{i}", sown, x)  # [B, h, w, C]
            if stage.downsample is not None:
                x = stage.downsample(x)  # [B, h/2, w/2, 2C]
            inter[f"stages.{s}"] = x
        x = self.final_norm(x)  # [B, h, w, C]
        pooled = jnp.mean(x, axis=(1, 2))  # [B, C]
        logits = self.classifier(pooled)  # [B, num_classes]
        if not return_intermediates:
            return logits
        return logits, {**inter, "final_norm": x, "pooled": pooled}
