"""Swin Transformer (Liu et al. 2021, "Hierarchical Vision Transformer using Shifted Windows").
Twin: jaxformer/models/swin.py (see its docstring for padding, clamping and the shift mask).
Weights map onto HF SwinForImageClassification by renaming only (jaxformer/hf/vision.py).

Feature maps stay channels-last [B, h, w, C] between blocks; windows hold N = W*W tokens.
Index tables and shift masks come from jaxformer/tables.py (numpy), shared by both trees.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from jaxformer.config.vision import SwinConfig
from jaxformer.tables import relative_position_index, shift_mask
from torch_ref.layers import stack
from torch_ref.layers.attention import key_projection
from torch_ref.layers.dispatch import dot_product_attention
from torch_ref.layers.ffn import FeedForward
from torch_ref.layers.norm import LayerNorm
from torch_ref.layers.sow import capture, sow
from torch_ref.models.common import check_values
from torch_ref.models.vit import PatchEmbedding, check_images


# ----------------------------------------------------------------------------- windows
def effective_window(h: int, w: int, window: int, shift: int) -> tuple[int, int]:
    """HF's rule: a map no larger than the window is one window, with no shift."""
    if min(h, w) <= window:
        return min(h, w), 0
    return window, shift


def window_partition(x: torch.Tensor, window: int) -> torch.Tensor:
    """[B, h, w, C] -> [B*nW, W*W, C], windows in (batch, row, column) order like HF."""
    b, h, w, c = x.shape
    x = x.reshape(b, h // window, window, w // window, window, c).permute(0, 1, 3, 2, 4, 5)
    return x.reshape(-1, window * window, c)


def window_reverse(x: torch.Tensor, window: int, h: int, w: int) -> torch.Tensor:
    """[B*nW, W*W, C] -> [B, h, w, C]."""
    c = x.shape[-1]
    x = x.reshape(-1, h // window, w // window, window, window, c).permute(0, 1, 3, 2, 4, 5)
    return x.reshape(-1, h, w, c)


# ----------------------------------------------------------------------------- modules
class WindowAttention(nn.Module):
    """Multi-head self-attention inside windows with a learned relative position bias table
    [(2W-1)^2, H]. Shapes: x [B*nW, N, C], mask bool [nW, N, N] or None -> [B*nW, N, C]."""

    def __init__(self, dim: int, num_heads: int, window_size: int, *, qkv_bias: bool = True,
                 attn_dropout: float = 0.0, dropout: float = 0.0):
        super().__init__()
        self.num_heads, self.head_dim, self.window_size = num_heads, dim // num_heads, window_size
        self.q_proj = nn.Linear(dim, dim, bias=qkv_bias)
        self.k_proj = nn.Linear(dim, dim, bias=qkv_bias)
        self.v_proj = nn.Linear(dim, dim, bias=qkv_bias)
        self.o_proj = nn.Linear(dim, dim)
        self.relative_position_bias_table = nn.Parameter(
            torch.randn((2 * window_size - 1) ** 2, num_heads) * 0.02)
        self.attn_dropout = nn.Dropout(attn_dropout)
        self.dropout = nn.Dropout(dropout)

    def relative_bias(self, window: int) -> torch.Tensor:
        """-> [1, H, N, N] bias for a window x window window."""
        index = torch.from_numpy(relative_position_index(window, self.window_size).astype(np.int64))  # [N, N]
        bias = self.relative_position_bias_table[index.to(self.relative_position_bias_table.device)]  # [N, N, H]
        return bias.permute(2, 0, 1)[None]

    def forward(self, x: torch.Tensor, window: int, mask: np.ndarray | None = None) -> torch.Tensor:
        bw, n, c = x.shape
        # 1) project and split heads
        q = self.q_proj(x).view(bw, n, self.num_heads, self.head_dim)  # [B*nW, N, H, K]
        k = key_projection(self.k_proj, x).view(bw, n, self.num_heads, self.head_dim)  # [B*nW, N, H, K]
        v = self.v_proj(x).view(bw, n, self.num_heads, self.head_dim)  # [B*nW, N, H, K]
        # 2) the shift mask repeats for every image: [nW, N, N] -> [B*nW, 1, N, N]
        if mask is not None:
            mask = torch.from_numpy(mask.copy()).to(x.device).repeat(bw // mask.shape[0], 1, 1)[:, None]
        # 3) attend with the relative position bias
        out = dot_product_attention(q, k, v, mask=mask, bias=self.relative_bias(window),
                                    dropout=self.attn_dropout)  # [B*nW, N, H, K]
        # 4) merge heads and project out
        return self.dropout(self.o_proj(out.reshape(bw, n, c)))


class DropPath(nn.Module):
    """Stochastic depth: zero whole examples with probability p, scale the rest by 1/(1-p)."""

    def __init__(self, p: float):
        super().__init__()
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.p == 0.0 or not self.training:
            return x
        keep = torch.rand((x.shape[0],) + (1,) * (x.dim() - 1), device=x.device) < 1.0 - self.p
        return x * keep.to(x.dtype) / (1.0 - self.p)


class SwinBlock(nn.Module):
    """x + attn(norm(x)) over (shifted) windows, then x + MLP(norm(x)); Pre-LN.
    Shapes: x [B, h, w, C] -> [B, h, w, C]."""

    def __init__(self, cfg: SwinConfig, dim: int, num_heads: int, *, shift: int, drop_path: float):
        super().__init__()
        self.window_size, self.shift = cfg.window_size, shift
        self.attn_norm = LayerNorm(dim, eps=cfg.norm_eps)
        self.self_attn = WindowAttention(dim, num_heads, cfg.window_size, qkv_bias=cfg.qkv_bias,
                                         attn_dropout=cfg.attn_dropout, dropout=cfg.dropout)
        self.ffn_norm = LayerNorm(dim, eps=cfg.norm_eps)
        self.ffn = FeedForward(dim, int(cfg.mlp_ratio * dim), kind=cfg.ffn, dropout=cfg.dropout)
        # stochastic depth: one keep/drop per example (timm's DropPath), scaled by 1/keep
        self.drop_path = DropPath(drop_path)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Under a capture (layers/sow.py) the block sows its sub-layer outputs as the stacks'
        layers do (stack.SUBLAYERS): "attn_output" (before the residual add), "attn_residual"
        and "ffn_output" (before its add)."""
        b, h, w, c = x.shape
        window, shift = effective_window(h, w, self.window_size, self.shift)
        shortcut = x
        x = self.attn_norm(x)
        # 1) zero-pad to whole windows (after the norm, as HF)
        hp, wp = h + (-h % window), w + (-w % window)
        x = F.pad(x, (0, 0, 0, wp - w, 0, hp - h))  # [B, hp, wp, C]
        # 2) cyclic shift up-left, attend within windows, shift back
        if shift:
            x = torch.roll(x, (-shift, -shift), dims=(1, 2))
        windows = window_partition(x, window)  # [B*nW, N, C]
        windows = self.self_attn(windows, window, shift_mask(hp, wp, window, shift))  # [B*nW, N, C]
        x = window_reverse(windows, window, hp, wp)  # [B, hp, wp, C]
        if shift:
            x = torch.roll(x, (shift, shift), dims=(1, 2))
        x = shortcut + self.drop_path(sow(self, "attn_output", x[:, :h, :w]))  # [B, h, w, C]
        sow(self, "attn_residual", x)
        # 3) MLP
        return x + self.drop_path(sow(self, "ffn_output", self.ffn(self.ffn_norm(x))))


class PatchMerging(nn.Module):
    """Concatenate each 2x2 neighbourhood (HF order), LayerNorm, bias-free Linear 4C -> 2C.
    Odd sides are zero-padded. Shapes: x [B, h, w, C] -> [B, ceil(h/2), ceil(w/2), 2C]."""

    def __init__(self, dim: int, *, eps: float):
        super().__init__()
        self.norm = LayerNorm(4 * dim, eps=eps)
        self.reduction = nn.Linear(4 * dim, 2 * dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.pad(x, (0, 0, 0, x.shape[2] % 2, 0, x.shape[1] % 2))
        x = torch.cat([x[:, 0::2, 0::2], x[:, 1::2, 0::2], x[:, 0::2, 1::2], x[:, 1::2, 1::2]],
                      dim=-1)  # [B, h/2, w/2, 4C]
        return self.reduction(self.norm(x))  # [B, h/2, w/2, 2C]


class SwinStage(nn.Module):
    """depth blocks alternating W-MSA / SW-MSA, then PatchMerging unless it is the last stage.
    Shapes: x [B, h, w, C] -> [B, h', w', C'] (h' = ceil(h/2), C' = 2C when merging)."""

    def __init__(self, cfg: SwinConfig, index: int, drop_paths: list[float]):
        super().__init__()
        dim = cfg.stage_dim(index)
        self.blocks = nn.ModuleList([
            SwinBlock(cfg, dim, cfg.num_heads[index], shift=0 if i % 2 == 0 else cfg.window_size // 2,
                      drop_path=drop_paths[i]) for i in range(cfg.depths[index])])
        last = index == len(cfg.depths) - 1
        self.downsample = None if last else PatchMerging(dim, eps=cfg.patch_norm_eps)


class SwinTransformer(nn.Module):
    """Swin image classifier: patch embedding + norm, stages, final norm, mean pool, head.
    Shapes: images [B, H, W, C] (any H, W) -> logits [B, num_classes] (+ intermediates)."""

    def __init__(self, cfg: SwinConfig):
        super().__init__()
        self.cfg = cfg
        self.patch_embed = PatchEmbedding(cfg.num_channels, cfg.embed_dim, cfg.patch_size,
                                          norm_eps=cfg.patch_norm_eps, pad=True)
        rates, starts = cfg.drop_path_rates(), np.cumsum((0,) + tuple(cfg.depths))
        self.stages = nn.ModuleList([SwinStage(cfg, i, rates[starts[i]:starts[i + 1]])
                                     for i in range(len(cfg.depths))])
        self.final_norm = LayerNorm(cfg.num_features, eps=cfg.norm_eps)
        self.classifier = nn.Linear(cfg.num_features, cfg.num_classes)
        # made last, so that its RNG stream leaves the other layers' streams as they were
        self.embed_dropout = nn.Dropout(cfg.embed_dropout)

    def forward(self, images: torch.Tensor, *, return_intermediates: bool = False):
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
        pooled = x.mean(dim=(1, 2))  # [B, C]
        logits = self.classifier(pooled)  # [B, num_classes]
        if not return_intermediates:
            return logits
        return logits, {**inter, "final_norm": x, "pooled": pooled}
