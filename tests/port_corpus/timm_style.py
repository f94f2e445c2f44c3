"""Compact re-implementations of timm (pytorch-image-models 1.0.31) vision blocks, as timm writes
them (timm cannot be imported here: it needs torchvision, which does not install with this torch).
Each class keeps timm's forward line for line, its attribute names (so the state_dict keys are
timm's) and its init where it matters; constructor arguments timm uses only for options not
taken here are left out. Tiny sizes: 16x16 or 32x32 images, width 32, batch 2; BatchNorm running
statistics random, layer scales 0.1.

  - ConViT (timm/models/convit.py: GPSA, MHSA, Block, ConVit): gated positional self-attention
    whose `rel_indices` buffer is rebuilt in forward by get_rel_indices, with the index
    assignments `rel_indices[:, :, :, 2] = indd.unsqueeze(0)` (and 1, 0) into a torch.zeros
    tensor, the in-place `attn /= attn.sum(dim=-1).unsqueeze(-1)`, local_init, the class token
    concatenated after the local layers.
  - LeViT (timm/models/levit.py: ConvNorm, LinearNorm, NormLinear, Stem16-style stem, Attention,
    LevitMlp, a residual block, the distilled head): Conv2d+BatchNorm2d stem with Hardswish,
    Linear+BatchNorm1d on `x.flatten(0, 1)`, attention biases indexed by a long buffer
    `attention_biases[:, attention_bias_idxs]` and cached per device in eval mode.
  - XCiT (timm/models/xcit.py: ConvPatchEmbed with conv3x3+BatchNorm, PositionalEncodingFourier
    built from H and W in forward, XCA cross-covariance attention with F.normalize and a
    temperature, LPI depthwise convs + BatchNorm, ClassAttentionBlock with timm/models/cait.py's
    ClassAttn).
  - ViT hybrid, ResNetV2 flavour (timm/layers/std_conv.py StdConv2d: weight standardisation by
    `F.batch_norm(weight.reshape(1, out, -1), None, None, training=True, momentum=0.)`, GroupNorm,
    timm/layers/hybrid_embed.py HybridEmbed, timm/models/vision_transformer.py Block/Attention
    with fused qkv and F.scaled_dot_product_attention, LayerScale).
  - ViT hybrid, ResNet flavour (timm/models/resnet.py stem: conv7x7 s2 + BatchNorm2d + ReLU +
    MaxPool, one BasicBlock with BatchNorm and a downsample; then HybridEmbed and ViT blocks).
  - ConvNeXt (timm/models/convnext.py ConvNeXtBlock, stem and downsample with timm/layers/norm.py
    LayerNorm2d: an nn.LayerNorm subclass with its own forward, permute + F.layer_norm + permute;
    the block's channels-last LayerNorm, Mlp, gamma via `x.mul(gamma.reshape(1, -1, 1, 1))`).
  - MobileViTv2 (timm/models/mobilevit.py MobileVitV2Block, LinearTransformerBlock and
    timm/layers LinearSelfAttention; ConvNormAct with BatchNorm2d + SiLU, GroupNorm(1, C)): the
    feature map (14x14) resized to a multiple of the patch with
    F.interpolate(mode="bilinear", align_corners=True), unfolded to [B, C, P, N] and folded back.
"""
import math

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

B = 2


def _pixels(seed, size, channels=3):
    return np.random.RandomState(seed).standard_normal((B, channels, size, size)).astype(np.float32)


def _randomize(model):
    with torch.no_grad():
        for mod in model.modules():
            if isinstance(mod, nn.modules.batchnorm._BatchNorm):
                mod.running_mean.normal_(0.0, 0.2)
                mod.running_var.uniform_(0.5, 1.5)
                mod.weight.normal_(1.0, 0.2)
                mod.bias.normal_(0.0, 0.1)
            elif isinstance(mod, (nn.LayerNorm, nn.GroupNorm)) and mod.weight is not None:
                mod.weight.normal_(1.0, 0.1)
                mod.bias.normal_(0.0, 0.1)
    return model.eval()


class Mlp(nn.Module):
    """timm/layers/mlp.py Mlp (fc1, act, drop1, norm Identity, fc2, drop2)."""

    def __init__(self, in_features, hidden_features=None, out_features=None, act_layer=nn.GELU, drop=0.):
        super().__init__()
        out_features = out_features or in_features
        hidden_features = hidden_features or in_features
        self.fc1 = nn.Linear(in_features, hidden_features)
        self.act = act_layer()
        self.drop1 = nn.Dropout(drop)
        self.norm = nn.Identity()
        self.fc2 = nn.Linear(hidden_features, out_features)
        self.drop2 = nn.Dropout(drop)

    def forward(self, x):
        x = self.fc1(x)
        x = self.act(x)
        x = self.drop1(x)
        x = self.norm(x)
        x = self.fc2(x)
        x = self.drop2(x)
        return x


class PatchEmbed(nn.Module):
    """timm/layers/patch_embed.py PatchEmbed (flatten, NCHW -> NLC)."""

    def __init__(self, img_size=16, patch_size=4, in_chans=3, embed_dim=32):
        super().__init__()
        self.num_patches = (img_size // patch_size) ** 2
        self.proj = nn.Conv2d(in_chans, embed_dim, kernel_size=patch_size, stride=patch_size)
        self.norm = nn.Identity()

    def forward(self, x):
        x = self.proj(x)
        x = x.flatten(2).transpose(1, 2)  # NCHW -> NLC
        x = self.norm(x)
        return x


# ------------------------------------------------------------------------------------------ ConViT
class GPSA(nn.Module):
    def __init__(self, dim, num_heads=8, qkv_bias=False, attn_drop=0., proj_drop=0., locality_strength=1.):
        super().__init__()
        self.num_heads = num_heads
        self.dim = dim
        head_dim = dim // num_heads
        self.scale = head_dim ** -0.5
        self.locality_strength = locality_strength
        self.qk = nn.Linear(dim, dim * 2, bias=qkv_bias)
        self.v = nn.Linear(dim, dim, bias=qkv_bias)
        self.attn_drop = nn.Dropout(attn_drop)
        self.proj = nn.Linear(dim, dim)
        self.pos_proj = nn.Linear(3, num_heads)
        self.proj_drop = nn.Dropout(proj_drop)
        self.gating_param = nn.Parameter(torch.ones(self.num_heads))
        self.register_buffer('rel_indices', torch.zeros(1, 1, 1, 3), persistent=False)

    def forward(self, x):
        B, N, C = x.shape
        if self.rel_indices is None or self.rel_indices.shape[1] != N:
            self.rel_indices = self.get_rel_indices(N)
        attn = self.get_attention(x)
        v = self.v(x).reshape(B, N, self.num_heads, C // self.num_heads).permute(0, 2, 1, 3)
        x = (attn @ v).transpose(1, 2).reshape(B, N, C)
        x = self.proj(x)
        x = self.proj_drop(x)
        return x

    def get_attention(self, x):
        B, N, C = x.shape
        qk = self.qk(x).reshape(B, N, 2, self.num_heads, C // self.num_heads).permute(2, 0, 3, 1, 4)
        q, k = qk[0], qk[1]
        pos_score = self.rel_indices.expand(B, -1, -1, -1)
        pos_score = self.pos_proj(pos_score).permute(0, 3, 1, 2)
        patch_score = (q @ k.transpose(-2, -1)) * self.scale
        patch_score = patch_score.softmax(dim=-1)
        pos_score = pos_score.softmax(dim=-1)

        gating = self.gating_param.view(1, -1, 1, 1)
        attn = (1. - torch.sigmoid(gating)) * patch_score + torch.sigmoid(gating) * pos_score
        attn /= attn.sum(dim=-1).unsqueeze(-1)
        attn = self.attn_drop(attn)
        return attn

    def local_init(self):
        self.v.weight.data.copy_(torch.eye(self.dim))
        locality_distance = 1  # max(1,1/locality_strength**.5)

        kernel_size = int(self.num_heads ** .5)
        center = (kernel_size - 1) / 2 if kernel_size % 2 == 0 else kernel_size // 2
        for h1 in range(kernel_size):
            for h2 in range(kernel_size):
                position = h1 + kernel_size * h2
                self.pos_proj.weight.data[position, 2] = -1
                self.pos_proj.weight.data[position, 1] = 2 * (h1 - center) * locality_distance
                self.pos_proj.weight.data[position, 0] = 2 * (h2 - center) * locality_distance
        self.pos_proj.weight.data *= self.locality_strength

    def get_rel_indices(self, num_patches: int) -> torch.Tensor:
        img_size = int(num_patches ** .5)
        rel_indices = torch.zeros(1, num_patches, num_patches, 3)
        ind = (
            torch.arange(img_size, dtype=torch.float32).view(1, -1)
            - torch.arange(img_size, dtype=torch.float32).view(-1, 1)
        )
        indx = ind.repeat(img_size, img_size)
        indy = ind.repeat_interleave(img_size, dim=0).repeat_interleave(img_size, dim=1)
        indd = indx ** 2 + indy ** 2
        rel_indices[:, :, :, 2] = indd.unsqueeze(0)
        rel_indices[:, :, :, 1] = indy.unsqueeze(0)
        rel_indices[:, :, :, 0] = indx.unsqueeze(0)
        device = self.qk.weight.device
        dtype = self.qk.weight.dtype
        return rel_indices.to(device=device, dtype=dtype)


class MHSA(nn.Module):
    def __init__(self, dim, num_heads=8, qkv_bias=False, attn_drop=0., proj_drop=0.):
        super().__init__()
        self.num_heads = num_heads
        head_dim = dim // num_heads
        self.scale = head_dim ** -0.5
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.attn_drop = nn.Dropout(attn_drop)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)

    def forward(self, x):
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, C // self.num_heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        attn = (q @ k.transpose(-2, -1)) * self.scale
        attn = attn.softmax(dim=-1)
        attn = self.attn_drop(attn)
        x = (attn @ v).transpose(1, 2).reshape(B, N, C)
        x = self.proj(x)
        x = self.proj_drop(x)
        return x


class ConvitBlock(nn.Module):
    """timm convit.Block."""

    def __init__(self, dim, num_heads, mlp_ratio=4., qkv_bias=False, use_gpsa=True, locality_strength=1.):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.use_gpsa = use_gpsa
        if self.use_gpsa:
            self.attn = GPSA(dim, num_heads=num_heads, qkv_bias=qkv_bias, locality_strength=locality_strength)
        else:
            self.attn = MHSA(dim, num_heads=num_heads, qkv_bias=qkv_bias)
        self.drop_path = nn.Identity()
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = Mlp(in_features=dim, hidden_features=int(dim * mlp_ratio), act_layer=nn.GELU)

    def forward(self, x):
        x = x + self.drop_path(self.attn(self.norm1(x)))
        x = x + self.drop_path(self.mlp(self.norm2(x)))
        return x


class ConVit(nn.Module):
    def __init__(self, img_size=16, patch_size=4, in_chans=3, num_classes=5, embed_dim=8, depth=2, num_heads=4,
                 mlp_ratio=2., local_up_to_layer=1, locality_strength=1.):
        super().__init__()
        embed_dim *= num_heads
        self.local_up_to_layer = local_up_to_layer
        self.patch_embed = PatchEmbed(img_size=img_size, patch_size=patch_size, in_chans=in_chans, embed_dim=embed_dim)
        num_patches = self.patch_embed.num_patches
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim))
        self.pos_drop = nn.Dropout(p=0.)
        self.pos_embed = nn.Parameter(torch.zeros(1, num_patches, embed_dim))
        nn.init.trunc_normal_(self.pos_embed, std=.02)
        self.blocks = nn.ModuleList([
            ConvitBlock(embed_dim, num_heads, mlp_ratio=mlp_ratio, use_gpsa=i < local_up_to_layer,
                        locality_strength=locality_strength) for i in range(depth)])
        self.norm = nn.LayerNorm(embed_dim)
        self.head_drop = nn.Dropout(0.)
        self.head = nn.Linear(embed_dim, num_classes)
        nn.init.trunc_normal_(self.cls_token, std=.02)
        for n, m in self.named_modules():  # noqa: B007 (as timm writes it: the corpus keeps its source)
            if hasattr(m, 'local_init'):
                m.local_init()

    def forward_features(self, x):
        x = self.patch_embed(x)
        x = x + self.pos_embed
        x = self.pos_drop(x)
        cls_tokens = self.cls_token.expand(x.shape[0], -1, -1)
        for u, blk in enumerate(self.blocks):
            if u == self.local_up_to_layer:
                x = torch.cat((cls_tokens, x), dim=1)
            x = blk(x)
        x = self.norm(x)
        return x

    def forward_head(self, x, pre_logits: bool = False):
        x = x[:, 0]
        x = self.head_drop(x)
        return x if pre_logits else self.head(x)

    def forward(self, x):
        x = self.forward_features(x)
        x = self.forward_head(x)
        return x


def convit():
    torch.manual_seed(80)
    return _randomize(ConVit()), {"x": _pixels(80, 16)}


# ------------------------------------------------------------------------------------------- LeViT
class ConvNorm(nn.Module):
    def __init__(self, in_chs, out_chs, kernel_size=1, stride=1, padding=0, dilation=1, groups=1, bn_weight_init=1):
        super().__init__()
        self.linear = nn.Conv2d(in_chs, out_chs, kernel_size, stride, padding, dilation, groups, bias=False)
        self.bn = nn.BatchNorm2d(out_chs)
        nn.init.constant_(self.bn.weight, bn_weight_init)

    def forward(self, x):
        return self.bn(self.linear(x))


class LinearNorm(nn.Module):
    def __init__(self, in_features, out_features, bn_weight_init=1):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features, bias=False)
        self.bn = nn.BatchNorm1d(out_features)
        nn.init.constant_(self.bn.weight, bn_weight_init)

    def forward(self, x):
        x = self.linear(x)
        return self.bn(x.flatten(0, 1)).reshape_as(x)


class NormLinear(nn.Module):
    def __init__(self, in_features, out_features, bias=True, std=0.02, drop=0.):
        super().__init__()
        self.bn = nn.BatchNorm1d(in_features)
        self.drop = nn.Dropout(drop)
        self.linear = nn.Linear(in_features, out_features, bias=bias)
        nn.init.trunc_normal_(self.linear.weight, std=std)
        if self.linear.bias is not None:
            nn.init.constant_(self.linear.bias, 0)

    def forward(self, x):
        return self.linear(self.drop(self.bn(x)))


class Stem8(nn.Sequential):
    def __init__(self, in_chs, out_chs, act_layer):
        super().__init__()
        self.stride = 8
        self.add_module('conv1', ConvNorm(in_chs, out_chs // 4, 3, stride=2, padding=1))
        self.add_module('act1', act_layer())
        self.add_module('conv2', ConvNorm(out_chs // 4, out_chs // 2, 3, stride=2, padding=1))
        self.add_module('act2', act_layer())
        self.add_module('conv3', ConvNorm(out_chs // 2, out_chs, 3, stride=2, padding=1))


def _ndgrid(*tensors):
    return torch.meshgrid(*tensors, indexing='ij')


class LevitAttention(nn.Module):
    """timm levit.Attention (use_conv=False)."""

    def __init__(self, dim, key_dim, num_heads=8, attn_ratio=4., resolution=14, act_layer=nn.SiLU):
        super().__init__()
        ln_layer = LinearNorm
        resolution = (resolution, resolution)
        self.use_conv = False
        self.num_heads = num_heads
        self.scale = key_dim ** -0.5
        self.key_dim = key_dim
        self.key_attn_dim = key_dim * num_heads
        self.val_dim = int(attn_ratio * key_dim)
        self.val_attn_dim = int(attn_ratio * key_dim) * num_heads
        self.resolution = resolution
        self.qkv = ln_layer(dim, self.val_attn_dim + self.key_attn_dim * 2)
        self.proj = nn.Sequential()
        self.proj.add_module('act', act_layer())
        self.proj.add_module('ln', ln_layer(self.val_attn_dim, dim, bn_weight_init=0))
        N = resolution[0] * resolution[1]
        self.attention_biases = nn.Parameter(torch.empty(num_heads, N))
        self.register_buffer('attention_bias_idxs', torch.empty((N, N), dtype=torch.long), persistent=False)
        self.attention_bias_cache = {}
        nn.init.zeros_(self.attention_biases)
        pos = torch.stack(_ndgrid(torch.arange(resolution[0]), torch.arange(resolution[1]))).flatten(1)
        rel_pos = (pos[..., :, None] - pos[..., None, :]).abs()
        rel_pos = (rel_pos[0] * resolution[1]) + rel_pos[1]
        self.attention_bias_idxs.copy_(rel_pos)

    @torch.no_grad()
    def train(self, mode=True):
        super().train(mode)
        if self.attention_bias_cache:
            self.attention_bias_cache = {}  # clear ab cache
        return self

    def get_attention_biases(self, device: torch.device) -> torch.Tensor:
        if torch.jit.is_tracing() or self.training:
            return self.attention_biases[:, self.attention_bias_idxs]
        else:
            device_key = str(device)
            if device_key not in self.attention_bias_cache:
                self.attention_bias_cache[device_key] = self.attention_biases[:, self.attention_bias_idxs]
            return self.attention_bias_cache[device_key]

    def forward(self, x):
        B, N, C = x.shape
        q, k, v = self.qkv(x).view(
            B, N, self.num_heads, -1).split([self.key_dim, self.key_dim, self.val_dim], dim=3)
        q = q.permute(0, 2, 1, 3)
        k = k.permute(0, 2, 3, 1)
        v = v.permute(0, 2, 1, 3)
        attn = q @ k * self.scale + self.get_attention_biases(x.device)
        attn = attn.softmax(dim=-1)
        x = (attn @ v).transpose(1, 2).reshape(B, N, self.val_attn_dim)
        x = self.proj(x)
        return x


class LevitMlp(nn.Module):
    def __init__(self, in_features, hidden_features=None, out_features=None, act_layer=nn.SiLU, drop=0.):
        super().__init__()
        hidden_features = hidden_features or in_features
        out_features = out_features or in_features
        self.ln1 = LinearNorm(in_features, hidden_features)
        self.act = act_layer()
        self.drop = nn.Dropout(drop)
        self.ln2 = LinearNorm(hidden_features, out_features, bn_weight_init=0)

    def forward(self, x):
        x = self.ln1(x)
        x = self.act(x)
        x = self.drop(x)
        x = self.ln2(x)
        return x


class LevitBlock(nn.Module):
    def __init__(self, dim, key_dim, num_heads=8, attn_ratio=4., mlp_ratio=2., resolution=14, act_layer=nn.SiLU):
        super().__init__()
        self.attn = LevitAttention(dim, key_dim, num_heads, attn_ratio, resolution, act_layer)
        self.drop_path1 = nn.Identity()
        self.mlp = LevitMlp(dim, int(dim * mlp_ratio), act_layer=act_layer)
        self.drop_path2 = nn.Identity()

    def forward(self, x):
        x = x + self.drop_path1(self.attn(x))
        x = x + self.drop_path2(self.mlp(x))
        return x


class LevitDistilled(nn.Module):
    """timm levit.LevitDistilled with one stage (Stem8 on 32x32 -> 4x4 tokens, 2 blocks)."""

    def __init__(self, img_size=32, in_chans=3, num_classes=5, embed_dim=32, key_dim=8, num_heads=2, depth=2,
                 act_layer=nn.Hardswish):
        super().__init__()
        resolution = img_size // 8
        self.stem = Stem8(in_chans, embed_dim, act_layer=act_layer)
        self.stages = nn.Sequential(*[
            LevitBlock(embed_dim, key_dim, num_heads, attn_ratio=2., mlp_ratio=2., resolution=resolution,
                       act_layer=act_layer) for _ in range(depth)])
        self.head = NormLinear(embed_dim, num_classes)
        self.head_dist = NormLinear(embed_dim, num_classes)
        self.distilled_training = False

    def forward_features(self, x):
        x = self.stem(x)
        x = x.flatten(2).transpose(1, 2)
        x = self.stages(x)
        return x

    def forward_head(self, x):
        x = x.mean(dim=1)
        x, x_dist = self.head(x), self.head_dist(x)
        if self.distilled_training and self.training and not torch.jit.is_scripting():
            return x, x_dist
        return (x + x_dist) / 2

    def forward(self, x):
        x = self.forward_features(x)
        x = self.forward_head(x)
        return x


def levit():
    torch.manual_seed(81)
    model = LevitDistilled()
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, LevitAttention):
                m.attention_biases.normal_(0.0, 0.5)
    return _randomize(model), {"x": _pixels(81, 32)}


# -------------------------------------------------------------------------------------------- XCiT
class PositionalEncodingFourier(nn.Module):
    def __init__(self, hidden_dim=32, dim=768, temperature=10000):
        super().__init__()
        self.token_projection = nn.Conv2d(hidden_dim * 2, dim, kernel_size=1)
        self.scale = 2 * math.pi
        self.temperature = temperature
        self.hidden_dim = hidden_dim
        self.dim = dim
        self.eps = 1e-6

    def forward(self, B: int, H: int, W: int):
        device = self.token_projection.weight.device
        dtype = self.token_projection.weight.dtype
        y_embed = torch.arange(1, H + 1, device=device).to(torch.float32).unsqueeze(1).repeat(1, 1, W)
        x_embed = torch.arange(1, W + 1, device=device).to(torch.float32).repeat(1, H, 1)
        y_embed = y_embed / (y_embed[:, -1:, :] + self.eps) * self.scale
        x_embed = x_embed / (x_embed[:, :, -1:] + self.eps) * self.scale
        dim_t = torch.arange(self.hidden_dim, device=device).to(torch.float32)
        dim_t = self.temperature ** (2 * torch.div(dim_t, 2, rounding_mode='floor') / self.hidden_dim)
        pos_x = x_embed[:, :, :, None] / dim_t
        pos_y = y_embed[:, :, :, None] / dim_t
        pos_x = torch.stack([pos_x[:, :, :, 0::2].sin(), pos_x[:, :, :, 1::2].cos()], dim=4).flatten(3)
        pos_y = torch.stack([pos_y[:, :, :, 0::2].sin(), pos_y[:, :, :, 1::2].cos()], dim=4).flatten(3)
        pos = torch.cat((pos_y, pos_x), dim=3).permute(0, 3, 1, 2)
        pos = self.token_projection(pos.to(dtype))
        return pos.repeat(B, 1, 1, 1)  # (B, C, H, W)


def conv3x3(in_planes, out_planes, stride=1):
    """3x3 convolution + batch norm"""
    return torch.nn.Sequential(
        nn.Conv2d(in_planes, out_planes, kernel_size=3, stride=stride, padding=1, bias=False),
        nn.BatchNorm2d(out_planes)
    )


class ConvPatchEmbed(nn.Module):
    """patch_size 8 branch."""

    def __init__(self, img_size=32, patch_size=8, in_chans=3, embed_dim=32, act_layer=nn.GELU):
        super().__init__()
        self.proj = torch.nn.Sequential(
            conv3x3(in_chans, embed_dim // 4, 2),
            act_layer(),
            conv3x3(embed_dim // 4, embed_dim // 2, 2),
            act_layer(),
            conv3x3(embed_dim // 2, embed_dim, 2),
        )

    def forward(self, x):
        x = self.proj(x)
        Hp, Wp = x.shape[2], x.shape[3]
        x = x.flatten(2).transpose(1, 2)  # (B, N, C)
        return x, (Hp, Wp)


class LPI(nn.Module):
    def __init__(self, in_features, out_features=None, act_layer=nn.GELU, kernel_size=3):
        super().__init__()
        out_features = out_features or in_features
        padding = kernel_size // 2
        self.conv1 = torch.nn.Conv2d(
            in_features, in_features, kernel_size=kernel_size, padding=padding, groups=in_features)
        self.act = act_layer()
        self.bn = nn.BatchNorm2d(in_features)
        self.conv2 = torch.nn.Conv2d(
            in_features, out_features, kernel_size=kernel_size, padding=padding, groups=out_features)

    def forward(self, x, H: int, W: int):
        B, N, C = x.shape
        x = x.permute(0, 2, 1).reshape(B, C, H, W)
        x = self.conv1(x)
        x = self.act(x)
        x = self.bn(x)
        x = self.conv2(x)
        x = x.reshape(B, C, N).permute(0, 2, 1)
        return x


class ClassAttn(nn.Module):
    """timm/models/cait.py ClassAttn (fused_attn False)."""

    def __init__(self, dim, num_heads=8, qkv_bias=False, attn_drop=0., proj_drop=0.):
        super().__init__()
        self.num_heads = num_heads
        head_dim = dim // num_heads
        self.scale = head_dim ** -0.5
        self.q = nn.Linear(dim, dim, bias=qkv_bias)
        self.k = nn.Linear(dim, dim, bias=qkv_bias)
        self.v = nn.Linear(dim, dim, bias=qkv_bias)
        self.attn_drop = nn.Dropout(attn_drop)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)

    def forward(self, x):
        B, N, C = x.shape
        q = self.q(x[:, 0]).unsqueeze(1).reshape(B, 1, self.num_heads, C // self.num_heads).permute(0, 2, 1, 3)
        k = self.k(x).reshape(B, N, self.num_heads, C // self.num_heads).permute(0, 2, 1, 3)
        v = self.v(x).reshape(B, N, self.num_heads, C // self.num_heads).permute(0, 2, 1, 3)
        q = q * self.scale
        attn = q @ k.transpose(-2, -1)
        attn = attn.softmax(dim=-1)
        attn = self.attn_drop(attn)
        x_cls = attn @ v
        x_cls = x_cls.transpose(1, 2).reshape(B, 1, C)
        x_cls = self.proj(x_cls)
        x_cls = self.proj_drop(x_cls)
        return x_cls


class ClassAttentionBlock(nn.Module):
    def __init__(self, dim, num_heads, mlp_ratio=4., qkv_bias=False, eta=1., tokens_norm=False):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = ClassAttn(dim, num_heads=num_heads, qkv_bias=qkv_bias)
        self.drop_path1 = nn.Identity()
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = Mlp(in_features=dim, hidden_features=int(dim * mlp_ratio), act_layer=nn.GELU)
        self.drop_path2 = nn.Identity()
        self.gamma1 = nn.Parameter(eta * torch.ones(dim))
        self.gamma2 = nn.Parameter(eta * torch.ones(dim))
        self.tokens_norm = tokens_norm

    def forward(self, x):
        x_norm1 = self.norm1(x)
        x_attn = torch.cat([self.attn(x_norm1), x_norm1[:, 1:]], dim=1)
        x = x + self.drop_path1(self.gamma1 * x_attn)
        if self.tokens_norm:  # noqa: SIM108 (as timm writes it: the corpus keeps its source)
            x = self.norm2(x)
        else:
            x = torch.cat([self.norm2(x[:, 0:1]), x[:, 1:]], dim=1)
        x_res = x
        cls_token = x[:, 0:1]
        cls_token = self.gamma2 * self.mlp(cls_token)
        x = torch.cat([cls_token, x[:, 1:]], dim=1)
        x = x_res + self.drop_path2(x)
        return x


class XCA(nn.Module):
    """fused_attn False."""

    def __init__(self, dim, num_heads=8, qkv_bias=False, attn_drop=0., proj_drop=0.):
        super().__init__()
        self.num_heads = num_heads
        self.temperature = nn.Parameter(torch.ones(num_heads, 1, 1))
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.attn_drop = nn.Dropout(attn_drop)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)

    def forward(self, x):
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, C // self.num_heads).permute(2, 0, 3, 4, 1)
        q, k, v = qkv.unbind(0)  # make torchscript happy (cannot use tensor as tuple)
        q = torch.nn.functional.normalize(q, dim=-1)
        k = torch.nn.functional.normalize(k, dim=-1)
        attn = (q @ k.transpose(-2, -1)) * self.temperature
        attn = attn.softmax(dim=-1)
        attn = self.attn_drop(attn)
        x = attn @ v
        x = x.permute(0, 3, 1, 2).reshape(B, N, C)
        x = self.proj(x)
        x = self.proj_drop(x)
        return x


class XCABlock(nn.Module):
    def __init__(self, dim, num_heads, mlp_ratio=4., qkv_bias=False, eta=1.):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = XCA(dim, num_heads=num_heads, qkv_bias=qkv_bias)
        self.drop_path1 = nn.Identity()
        self.norm3 = nn.LayerNorm(dim)
        self.local_mp = LPI(in_features=dim, act_layer=nn.GELU)
        self.drop_path3 = nn.Identity()
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = Mlp(in_features=dim, hidden_features=int(dim * mlp_ratio), act_layer=nn.GELU)
        self.drop_path2 = nn.Identity()
        self.gamma1 = nn.Parameter(eta * torch.ones(dim))
        self.gamma3 = nn.Parameter(eta * torch.ones(dim))
        self.gamma2 = nn.Parameter(eta * torch.ones(dim))

    def forward(self, x, H: int, W: int):
        x = x + self.drop_path1(self.gamma1 * self.attn(self.norm1(x)))
        x = x + self.drop_path3(self.gamma3 * self.local_mp(self.norm3(x), H, W))
        x = x + self.drop_path2(self.gamma2 * self.mlp(self.norm2(x)))
        return x


class Xcit(nn.Module):
    def __init__(self, img_size=32, patch_size=8, in_chans=3, num_classes=5, embed_dim=32, depth=2, num_heads=4,
                 mlp_ratio=2., cls_attn_layers=1, eta=0.1, tokens_norm=False):
        super().__init__()
        self.patch_embed = ConvPatchEmbed(img_size=img_size, patch_size=patch_size, in_chans=in_chans,
                                          embed_dim=embed_dim)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim))
        self.pos_embed = PositionalEncodingFourier(dim=embed_dim, hidden_dim=8)
        self.pos_drop = nn.Dropout(p=0.)
        self.blocks = nn.ModuleList([XCABlock(embed_dim, num_heads, mlp_ratio, eta=eta) for _ in range(depth)])
        self.cls_attn_blocks = nn.ModuleList([
            ClassAttentionBlock(embed_dim, num_heads, mlp_ratio, eta=eta, tokens_norm=tokens_norm)
            for _ in range(cls_attn_layers)])
        self.norm = nn.LayerNorm(embed_dim)
        self.head_drop = nn.Dropout(0.)
        self.head = nn.Linear(embed_dim, num_classes)
        nn.init.trunc_normal_(self.cls_token, std=.02)

    def forward_cls(self, x):
        x = torch.cat((self.cls_token.expand(x.shape[0], -1, -1), x), dim=1)
        for blk in self.cls_attn_blocks:
            x = blk(x)
        return x

    def forward_features(self, x):
        B = x.shape[0]
        x, (Hp, Wp) = self.patch_embed(x)
        pos_encoding = self.pos_embed(B, Hp, Wp).reshape(B, -1, x.shape[1]).permute(0, 2, 1)
        x = x + pos_encoding
        x = self.pos_drop(x)
        for blk in self.blocks:
            x = blk(x, Hp, Wp)
        x = self.forward_cls(x)
        x = self.norm(x)
        return x

    def forward(self, x):
        x = self.forward_features(x)
        x = x[:, 0]
        x = self.head_drop(x)
        return self.head(x)


def xcit():
    torch.manual_seed(82)
    model = Xcit()
    with torch.no_grad():
        for blk in model.blocks:
            blk.attn.temperature.uniform_(0.5, 2.0)
    return _randomize(model), {"x": _pixels(82, 32)}


# ------------------------------------------------------------------------------------ ViT (timm)
class Attention(nn.Module):
    """timm/models/vision_transformer.py Attention (fused: F.scaled_dot_product_attention)."""

    def __init__(self, dim, num_heads=8, qkv_bias=False, qk_norm=False, attn_drop=0., proj_drop=0.):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.scale = self.head_dim ** -0.5
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.q_norm = nn.LayerNorm(self.head_dim) if qk_norm else nn.Identity()
        self.k_norm = nn.LayerNorm(self.head_dim) if qk_norm else nn.Identity()
        self.attn_drop = nn.Dropout(attn_drop)
        self.norm = nn.Identity()
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)

    def forward(self, x, attn_mask=None):
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        q, k = self.q_norm(q), self.k_norm(k)
        x = F.scaled_dot_product_attention(
            q, k, v,
            attn_mask=attn_mask,
            dropout_p=self.attn_drop.p if self.training else 0.,
        )
        x = x.transpose(1, 2).reshape(B, N, C)
        x = self.norm(x)
        x = self.proj(x)
        x = self.proj_drop(x)
        return x


class LayerScale(nn.Module):
    def __init__(self, dim, init_values=1e-5, inplace=False):
        super().__init__()
        self.inplace = inplace
        self.gamma = nn.Parameter(init_values * torch.ones(dim))

    def forward(self, x):
        return x.mul_(self.gamma) if self.inplace else x * self.gamma


class Block(nn.Module):
    def __init__(self, dim, num_heads, mlp_ratio=4., qkv_bias=False, qk_norm=False, init_values=None):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = Attention(dim, num_heads=num_heads, qkv_bias=qkv_bias, qk_norm=qk_norm)
        self.ls1 = LayerScale(dim, init_values=init_values) if init_values else nn.Identity()
        self.drop_path1 = nn.Identity()
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = Mlp(in_features=dim, hidden_features=int(dim * mlp_ratio), act_layer=nn.GELU)
        self.ls2 = LayerScale(dim, init_values=init_values) if init_values else nn.Identity()
        self.drop_path2 = nn.Identity()

    def forward(self, x, attn_mask=None):
        x = x + self.drop_path1(self.ls1(self.attn(self.norm1(x), attn_mask=attn_mask)))
        x = x + self.drop_path2(self.ls2(self.mlp(self.norm2(x))))
        return x


class HybridEmbed(nn.Module):
    """timm/layers/hybrid_embed.py HybridEmbed (flatten, patch_size 1, no dynamic pad)."""

    def __init__(self, backbone, feature_dim, embed_dim):
        super().__init__()
        self.backbone = backbone
        self.proj = nn.Conv2d(feature_dim, embed_dim, kernel_size=1, stride=1)
        self.flatten = True

    def forward(self, x):
        x = self.backbone(x)
        if isinstance(x, (list, tuple)):
            x = x[-1]  # last feature if backbone outputs list/tuple of features
        x = self.proj(x)
        if self.flatten:
            x = x.flatten(2).transpose(1, 2)  # NCHW -> NLC
        return x


class HybridVit(nn.Module):
    """timm VisionTransformer with a HybridEmbed patch embed (vision_transformer_hybrid.py)."""

    def __init__(self, backbone, feature_dim, num_patches, embed_dim=32, depth=2, num_heads=4, mlp_ratio=2.,
                 num_classes=5, init_values=None):
        super().__init__()
        self.patch_embed = HybridEmbed(backbone, feature_dim, embed_dim)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim))
        self.pos_embed = nn.Parameter(torch.randn(1, num_patches + 1, embed_dim) * .02)
        self.pos_drop = nn.Dropout(p=0.)
        self.norm_pre = nn.Identity()
        self.blocks = nn.Sequential(*[Block(embed_dim, num_heads, mlp_ratio, qkv_bias=True, init_values=init_values)
                                      for _ in range(depth)])
        self.norm = nn.LayerNorm(embed_dim)
        self.fc_norm = nn.Identity()
        self.head_drop = nn.Dropout(0.)
        self.head = nn.Linear(embed_dim, num_classes)
        nn.init.normal_(self.cls_token, std=1e-6)

    def _pos_embed(self, x):
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)
        x = x + self.pos_embed
        return self.pos_drop(x)

    def forward(self, x):
        x = self.patch_embed(x)
        x = self._pos_embed(x)
        x = self.norm_pre(x)
        x = self.blocks(x)
        x = self.norm(x)
        x = x[:, 0]
        x = self.fc_norm(x)
        x = self.head_drop(x)
        return self.head(x)


class StdConv2d(nn.Conv2d):
    """timm/layers/std_conv.py StdConv2d: weight standardisation through F.batch_norm."""

    def __init__(self, in_channel, out_channels, kernel_size, stride=1, padding=None, dilation=1, groups=1,
                 bias=False, eps=1e-6):
        if padding is None:
            padding = ((stride - 1) + dilation * (kernel_size - 1)) // 2
        super().__init__(in_channel, out_channels, kernel_size, stride=stride, padding=padding, dilation=dilation,
                         groups=groups, bias=bias)
        self.eps = eps

    def forward(self, x):
        weight = F.batch_norm(
            self.weight.reshape(1, self.out_channels, -1),
            None,  # running_mean
            None,  # running_var
            training=True,
            momentum=0.,
            eps=self.eps,
        ).reshape_as(self.weight)
        x = F.conv2d(x, weight, self.bias, self.stride, self.padding, self.dilation, self.groups)
        return x


class PreActBottleneck(nn.Module):
    """timm/models/resnetv2.py PreActBottleneck (GroupNormAct = GroupNorm + ReLU), with its
    DownsampleConv (a StdConv2d, preact)."""

    def __init__(self, in_chs, out_chs, bottle_ratio=0.25, stride=1, groups=4):
        super().__init__()
        mid_chs = int(out_chs * bottle_ratio)
        self.downsample = StdConv2d(in_chs, out_chs, 1, stride=stride) if (stride != 1 or in_chs != out_chs) else None
        self.norm1 = nn.Sequential(nn.GroupNorm(groups, in_chs), nn.ReLU())
        self.conv1 = StdConv2d(in_chs, mid_chs, 1)
        self.norm2 = nn.Sequential(nn.GroupNorm(groups, mid_chs), nn.ReLU())
        self.conv2 = StdConv2d(mid_chs, mid_chs, 3, stride=stride)
        self.norm3 = nn.Sequential(nn.GroupNorm(groups, mid_chs), nn.ReLU())
        self.conv3 = StdConv2d(mid_chs, out_chs, 1)
        self.drop_path = nn.Identity()

    def forward(self, x):
        x_preact = self.norm1(x)
        shortcut = x
        if self.downsample is not None:
            shortcut = self.downsample(x_preact)
        x = self.conv1(x_preact)
        x = self.conv2(self.norm2(x))
        x = self.conv3(self.norm3(x))
        x = self.drop_path(x)
        return x + shortcut


def vit_hybrid_resnetv2():
    """ResNetV2 stem (StdConv2d 7x7 s2, max-pool) + a pre-activation bottleneck, then ViT."""
    torch.manual_seed(83)
    stem = nn.Sequential()
    stem.add_module('conv', StdConv2d(3, 16, kernel_size=7, stride=2))
    stem.add_module('pool', nn.MaxPool2d(kernel_size=3, stride=2, padding=1))
    backbone = nn.Sequential()
    backbone.add_module('stem', stem)
    backbone.add_module('stage', PreActBottleneck(16, 32, stride=2))
    backbone.add_module('norm', nn.Sequential(nn.GroupNorm(4, 32), nn.ReLU()))
    model = HybridVit(backbone, feature_dim=32, num_patches=16, init_values=0.1)  # 32x32 -> 4x4
    return _randomize(model), {"x": _pixels(83, 32)}


class BasicBlock(nn.Module):
    """timm/models/resnet.py BasicBlock."""
    expansion = 1

    def __init__(self, inplanes, planes, stride=1, downsample=None):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, kernel_size=3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.drop_block = nn.Identity()
        self.act1 = nn.ReLU(inplace=True)
        self.aa = nn.Identity()
        self.conv2 = nn.Conv2d(planes, planes, kernel_size=3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.se = None
        self.act2 = nn.ReLU(inplace=True)
        self.downsample = downsample
        self.drop_path = None

    def forward(self, x):
        shortcut = x
        x = self.conv1(x)
        x = self.bn1(x)
        x = self.drop_block(x)
        x = self.act1(x)
        x = self.aa(x)
        x = self.conv2(x)
        x = self.bn2(x)
        if self.se is not None:
            x = self.se(x)
        if self.drop_path is not None:
            x = self.drop_path(x)
        if self.downsample is not None:
            shortcut = self.downsample(shortcut)
        x += shortcut
        x = self.act2(x)
        return x


class ResNetFeatures(nn.Module):
    """timm/models/resnet.py ResNet.forward_features: conv1, bn1, act1 (inplace ReLU), maxpool, layer1."""

    def __init__(self, width=16):
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.act1 = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        down = nn.Sequential(nn.Conv2d(width, 2 * width, 1, stride=2, bias=False), nn.BatchNorm2d(2 * width))
        self.layer1 = nn.Sequential(BasicBlock(width, 2 * width, stride=2, downsample=down))

    def forward(self, x):
        x = self.conv1(x)
        x = self.bn1(x)
        x = self.act1(x)
        x = self.maxpool(x)
        x = self.layer1(x)
        return x


def vit_hybrid_resnet():
    torch.manual_seed(84)
    model = HybridVit(ResNetFeatures(16), feature_dim=32, num_patches=16)  # 32x32 -> 4x4
    return _randomize(model), {"x": _pixels(84, 32)}


# ---------------------------------------------------------------------------------------- ConvNeXt
class LayerNorm2d(nn.LayerNorm):
    """ LayerNorm for channels of '2D' spatial NCHW tensors """

    def __init__(self, num_channels, eps=1e-6, affine=True):
        super().__init__(num_channels, eps=eps, elementwise_affine=affine)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.permute(0, 2, 3, 1)
        x = F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
        x = x.permute(0, 3, 1, 2)
        return x


class ConvNeXtBlock(nn.Module):
    def __init__(self, in_chs, kernel_size=7, mlp_ratio=4, ls_init_value=1e-6):
        super().__init__()
        self.use_conv_mlp = False
        self.conv_dw = nn.Conv2d(in_chs, in_chs, kernel_size=kernel_size, padding=kernel_size // 2, groups=in_chs)
        self.norm = nn.LayerNorm(in_chs, eps=1e-6)
        self.mlp = Mlp(in_chs, int(mlp_ratio * in_chs), act_layer=nn.GELU)
        self.gamma = nn.Parameter(ls_init_value * torch.ones(in_chs)) if ls_init_value is not None else None
        self.shortcut = nn.Identity()
        self.drop_path = nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shortcut = x
        x = self.conv_dw(x)
        if self.use_conv_mlp:
            x = self.norm(x)
            x = self.mlp(x)
        else:
            x = x.permute(0, 2, 3, 1)
            x = self.norm(x)
            x = self.mlp(x)
            x = x.permute(0, 3, 1, 2)
        if self.gamma is not None:
            x = x.mul(self.gamma.reshape(1, -1, 1, 1))

        x = self.drop_path(x) + self.shortcut(shortcut)
        return x


class ConvNeXtStage(nn.Module):
    def __init__(self, in_chs, out_chs, depth=1, ls_init_value=0.1):
        super().__init__()
        if in_chs != out_chs:
            self.downsample = nn.Sequential(LayerNorm2d(in_chs), nn.Conv2d(in_chs, out_chs, kernel_size=2, stride=2))
        else:
            self.downsample = nn.Identity()
        self.blocks = nn.Sequential(*[ConvNeXtBlock(out_chs, ls_init_value=ls_init_value) for _ in range(depth)])

    def forward(self, x):
        x = self.downsample(x)
        x = self.blocks(x)
        return x


class ConvNeXt(nn.Module):
    def __init__(self, in_chans=3, num_classes=5, dims=(16, 32), patch_size=4):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(in_chans, dims[0], kernel_size=patch_size, stride=patch_size),
                                  LayerNorm2d(dims[0]))
        self.stages = nn.Sequential(ConvNeXtStage(dims[0], dims[0]), ConvNeXtStage(dims[0], dims[1]))
        self.norm_pre = nn.Identity()
        # NormMlpClassifierHead: global avg pool, LayerNorm2d, flatten, fc
        self.head = nn.Module()
        self.head.global_pool = nn.AdaptiveAvgPool2d(1)
        self.head.norm = LayerNorm2d(dims[1])
        self.head.flatten = nn.Flatten(1)
        self.head.drop = nn.Dropout(0.)
        self.head.fc = nn.Linear(dims[1], num_classes)

    def forward(self, x):
        x = self.stem(x)
        x = self.stages(x)
        x = self.norm_pre(x)
        x = self.head.global_pool(x)
        x = self.head.norm(x)
        x = self.head.flatten(x)
        x = self.head.drop(x)
        return self.head.fc(x)


def convnext():
    torch.manual_seed(85)
    return _randomize(ConvNeXt()), {"x": _pixels(85, 32)}


# -------------------------------------------------------------------------------------- MobileViTv2
class ConvNormAct(nn.Module):
    """timm/layers/conv_bn_act.py ConvNormAct: conv (no bias), BatchNorm2d, act."""

    def __init__(self, in_channels, out_channels, kernel_size=1, stride=1, groups=1, apply_act=True):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, stride=stride, padding=kernel_size // 2,
                              groups=groups, bias=False)
        self.bn = nn.BatchNorm2d(out_channels)
        self.act = nn.SiLU() if apply_act else nn.Identity()

    def forward(self, x):
        x = self.conv(x)
        x = self.bn(x)
        x = self.act(x)
        return x


class LinearSelfAttention(nn.Module):
    def __init__(self, embed_dim, attn_drop=0.0, proj_drop=0.0, bias=True):
        super().__init__()
        self.embed_dim = embed_dim
        self.qkv_proj = nn.Conv2d(embed_dim, 1 + (2 * embed_dim), bias=bias, kernel_size=1)
        self.attn_drop = nn.Dropout(attn_drop)
        self.out_proj = nn.Conv2d(embed_dim, embed_dim, bias=bias, kernel_size=1)
        self.out_drop = nn.Dropout(proj_drop)

    def _forward_self_attn(self, x: torch.Tensor) -> torch.Tensor:
        # [B, C, P, N] --> [B, h + 2d, P, N]
        qkv = self.qkv_proj(x)
        query, key, value = qkv.split([1, self.embed_dim, self.embed_dim], dim=1)
        # apply softmax along N dimension
        context_scores = F.softmax(query, dim=-1)
        context_scores = self.attn_drop(context_scores)
        # [B, d, P, N] x [B, 1, P, N] -> [B, d, P, N] --> [B, d, P, 1]
        context_vector = (key * context_scores).sum(dim=-1, keepdim=True)
        out = F.relu(value) * context_vector.expand_as(value)
        out = self.out_proj(out)
        out = self.out_drop(out)
        return out

    def forward(self, x, x_prev=None):
        return self._forward_self_attn(x)


class GroupNorm1(nn.GroupNorm):
    """timm/layers/norm.py GroupNorm1: GroupNorm with one group."""

    def __init__(self, num_channels, eps=1e-5, affine=True):
        super().__init__(1, num_channels, eps=eps, affine=affine)

    def forward(self, x):
        return F.group_norm(x, self.num_groups, self.weight, self.bias, self.eps)


class ConvMlp(nn.Module):
    """timm/layers/mlp.py ConvMlp (1x1 convs)."""

    def __init__(self, in_features, hidden_features, act_layer=nn.SiLU):
        super().__init__()
        self.fc1 = nn.Conv2d(in_features, hidden_features, kernel_size=1, bias=True)
        self.norm = nn.Identity()
        self.act = act_layer()
        self.drop = nn.Dropout(0.)
        self.fc2 = nn.Conv2d(hidden_features, in_features, kernel_size=1, bias=True)

    def forward(self, x):
        x = self.fc1(x)
        x = self.norm(x)
        x = self.act(x)
        x = self.drop(x)
        x = self.fc2(x)
        return x


class LinearTransformerBlock(nn.Module):
    def __init__(self, embed_dim, mlp_ratio=2.0):
        super().__init__()
        self.norm1 = GroupNorm1(embed_dim)
        self.attn = LinearSelfAttention(embed_dim=embed_dim)
        self.drop_path1 = nn.Identity()
        self.norm2 = GroupNorm1(embed_dim)
        self.mlp = ConvMlp(embed_dim, int(embed_dim * mlp_ratio), act_layer=nn.SiLU)
        self.drop_path2 = nn.Identity()

    def forward(self, x, x_prev=None):
        if x_prev is None:
            # self-attention
            x = x + self.drop_path1(self.attn(self.norm1(x)))
        else:
            res = x
            x = self.norm1(x)  # norm
            x = self.attn(x, x_prev)  # attn
            x = self.drop_path1(x) + res  # residual
        # Feed forward network
        x = x + self.drop_path2(self.mlp(self.norm2(x)))
        return x


class MobileVitV2Block(nn.Module):
    def __init__(self, in_chs, out_chs=None, kernel_size=3, bottle_ratio=1.0, mlp_ratio=2.0, transformer_depth=2,
                 patch_size=4):
        super().__init__()
        out_chs = out_chs or in_chs
        transformer_dim = int(bottle_ratio * in_chs)
        self.conv_kxk = ConvNormAct(in_chs, in_chs, kernel_size=kernel_size, groups=in_chs)
        self.conv_1x1 = nn.Conv2d(in_chs, transformer_dim, kernel_size=1, bias=False)
        self.transformer = nn.Sequential(*[LinearTransformerBlock(transformer_dim, mlp_ratio=mlp_ratio)
                                           for _ in range(transformer_depth)])
        self.norm = GroupNorm1(transformer_dim)
        self.conv_proj = ConvNormAct(transformer_dim, out_chs, kernel_size=1, stride=1, apply_act=False)
        self.patch_size = (patch_size, patch_size)
        self.patch_area = self.patch_size[0] * self.patch_size[1]
        self.coreml_exportable = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, C, H, W = x.shape
        patch_h, patch_w = self.patch_size
        new_h, new_w = math.ceil(H / patch_h) * patch_h, math.ceil(W / patch_w) * patch_w
        num_patch_h, num_patch_w = new_h // patch_h, new_w // patch_w  # n_h, n_w
        num_patches = num_patch_h * num_patch_w  # N
        if new_h != H or new_w != W:
            x = F.interpolate(x, size=(new_h, new_w), mode="bilinear", align_corners=True)

        # Local representation
        x = self.conv_kxk(x)
        x = self.conv_1x1(x)

        # Unfold (feature map -> patches), [B, C, H, W] -> [B, C, P, N]
        C = x.shape[1]
        if self.coreml_exportable:
            x = F.unfold(x, kernel_size=(patch_h, patch_w), stride=(patch_h, patch_w))
        else:
            x = x.reshape(B, C, num_patch_h, patch_h, num_patch_w, patch_w).permute(0, 1, 3, 5, 2, 4)
        x = x.reshape(B, C, -1, num_patches)

        # Global representations
        x = self.transformer(x)
        x = self.norm(x)

        # Fold (patches -> feature map), [B, C, P, N] --> [B, C, H, W]
        if self.coreml_exportable:
            x = x.reshape(B, C * patch_h * patch_w, num_patch_h, num_patch_w)
            x = F.pixel_shuffle(x, upscale_factor=patch_h)
        else:
            x = x.reshape(B, C, patch_h, patch_w, num_patch_h, num_patch_w).permute(0, 1, 4, 2, 5, 3)
            x = x.reshape(B, C, num_patch_h * patch_h, num_patch_w * patch_w)

        x = self.conv_proj(x)
        return x


class MobileVitV2(nn.Module):
    """A stem (ConvNormAct 3x3 s2), one MobileVitV2Block on the 14x14 map, the classifier head."""

    def __init__(self, chs=16, num_classes=5):
        super().__init__()
        self.stem = ConvNormAct(3, chs, kernel_size=3, stride=2)
        self.stage = MobileVitV2Block(chs)
        self.final_conv = nn.Identity()
        self.global_pool = nn.AdaptiveAvgPool2d(1)
        self.flatten = nn.Flatten(1)
        self.fc = nn.Linear(chs, num_classes)

    def forward(self, x):
        x = self.stem(x)
        x = self.stage(x)
        x = self.final_conv(x)
        return self.fc(self.flatten(self.global_pool(x)))


def mobilevitv2():
    torch.manual_seed(86)
    return _randomize(MobileVitV2()), {"x": _pixels(86, 28)}


ALL = {
    "timm_convit": convit, "timm_levit": levit, "timm_xcit": xcit, "timm_vit_hybrid_resnetv2": vit_hybrid_resnetv2,
    "timm_vit_hybrid_resnet": vit_hybrid_resnet, "timm_convnext": convnext, "timm_mobilevitv2": mobilevitv2,
}
