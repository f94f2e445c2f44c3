"""Parity cases for ViT, Swin and the TCN-Transformer.

Every case compares outputs (and, with return_intermediates, every named intermediate) and the
gradients of all parameters and inputs at the foundation tolerances. Images are channels-last
[B, H, W, C]; series [B, L, C].

Swin coverage: W-MSA and SW-MSA blocks, two and three stages, an odd window (shift 1), a stage
whose map equals the window (shift dropped), a stage smaller than the window (window clamped),
and an input that needs padding at the patch embedding, at the window and at patch merging.
DINOv2 coverage (docs/numerics.md §37): LayerScale (random gammas, so a wrong scale shows)
with the cls_mean head at a non-square size whose patch positions are resampled bicubically
(JAX's hand-written kernel against torch's F.interpolate), and the resampling on its own
(down and up in one call; a 2x3 grid where every output reads clamped edge taps).
TCN coverage (docs/numerics.md §5): causal and same pads, k = 7, even k (asymmetric same pads),
dilation 2 and 4.
"""
from __future__ import annotations

from jaxformer.config.vision import SwinConfig, TimeSeriesConfig, ViTConfig
from jaxformer.parity.cases import case, mirror_fn, model_pair, normal

B = 2


def _vit(**kw):
    base = dict(image_size=8, patch_size=4, num_channels=3, num_classes=5, d_model=16, num_heads=2,
                d_ff=32, num_layers=2)
    base.update(kw)
    return ViTConfig(**base)


def _swin(**kw):
    base = dict(image_size=16, patch_size=2, num_channels=3, num_classes=5, embed_dim=8,
                depths=(2, 2), num_heads=(2, 2), window_size=4, mlp_ratio=2.0)
    base.update(kw)
    return SwinConfig(**base)


def _ts(**kw):
    base = dict(input_len=16, num_channels=3, target_channels=(0, 2), horizon=4, d_model=16,
                num_heads=2, d_ff=32, num_layers=2, conv_layers=2, kernel_size=3)
    base.update(kw)
    return TimeSeriesConfig(**base)


def _images(h, w, c=3, **extra):
    return lambda r: {"images": normal(B, h, w, c)(r), "return_intermediates": True, **extra}


# ---------------------------------------------------------------- ViT
case("vit_cls_pool", "vit", model_pair("vit", _vit()), _images(8, 8))
case("vit_mean_pool_no_cls_gray", "vit",
     model_pair("vit", _vit(num_channels=1, class_token=False, pool="mean", ffn="gelu_tanh")),
     _images(8, 8, 1))
case("vit_mean_pool_with_cls_eps1e-12", "vit",
     model_pair("vit", _vit(image_size=12, pool="mean", norm_eps=1e-12)), _images(12, 12))
# HF ViT qkv_bias=False: no q/k/v biases, o_proj and FFN biases kept
case("vit_no_qkv_bias", "vit", model_pair("vit", _vit(qkv_bias=False)), _images(8, 8))
# HF ViTModel: no classifier; the output is tanh(pooler([CLS] output)) [B, D]
case("vit_pooler_head", "vit", model_pair("vit", _vit(head="pooler")), _images(8, 8))

# ---------------------------------------------------------------- DINOv2 (LayerScale, bicubic positions)
def _random_gammas(build):
    """model_pair's builder with every LayerScale gamma redrawn in torch (the harness copies
    torch's weights into the JAX twin): a constant init would hide a gamma applied to the
    wrong sublayer."""
    def b(seed):
        import torch
        t, j = build(seed)
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, p in t.named_parameters():
                if name.endswith(".gamma"):
                    p.copy_(torch.randn(p.shape, generator=g) * 0.5)
        return t, j
    b.model, b.cfg = build.model, build.cfg
    return b


_DINO = dict(layer_scale=0.1, interpolate_positions=True, pool="cls_mean", num_heads=4, norm_eps=1e-6)
# 8x8 config (2x2 grid) run on 12x20 (3x5): rows up x1.5, columns up x2.5; LayerScale, cls_mean head
case("dinov2_interpolated_positions_12x20", "vit", _random_gammas(model_pair("vit", _vit(**_DINO))),
     _images(12, 20))
case("resize_bicubic_5x5_to_3x8", "positional", mirror_fn("layers.positional.resize_bicubic", height=3, width=8),
     lambda r: (normal(5, 5, 6)(r),))
case("resize_bicubic_2x3_to_7x1", "positional", mirror_fn("layers.positional.resize_bicubic", height=7, width=1),
     lambda r: (normal(2, 3, 4)(r),))

# ---------------------------------------------------------------- Swin
# 16/2 = 8x8 map, window 4: stage 0 = W-MSA + SW-MSA (shift 2); stage 1 is 4x4 = window: no shift
case("swin_two_stages_shifted", "swin", model_pair("swin", _swin()), _images(16, 16))
# stage 2 is 2x2 < window 4: the window is clamped to 2 and reads the 3x3 centre of the 7x7 table
case("swin_three_stages_clamped_window", "swin",
     model_pair("swin", _swin(depths=(2, 2, 2), num_heads=(2, 2, 4))), _images(16, 16))
# 17x13 -> patch pad 18x14 -> 9x7 map -> window pad 12x8 (shifted) -> merge pad 10x8 -> 5x4
case("swin_padded_input", "swin", model_pair("swin", _swin()), _images(17, 13))
# odd window 3 (shift 1) on a 6x6 map, no q/k/v bias, one-channel input, ReLU MLP
case("swin_window3_noqkvbias_relu", "swin",
     model_pair("swin", _swin(num_channels=1, window_size=3, qkv_bias=False, ffn="relu",
                              depths=(2, 1), num_heads=(1, 2))), _images(12, 12, 1))
# HF layer_norm_eps=1e-6: the blocks' and final norms use it, the patch and merge norms 1e-5
case("swin_block_eps1e-6_patch_eps1e-5", "swin",
     model_pair("swin", _swin(norm_eps=1e-6, patch_norm_eps=1e-5)), _images(16, 16))

# ---------------------------------------------------------------- TCN-Transformer
def _series(length, c=3):
    return lambda r: {"series": normal(B, length, c)(r), "return_intermediates": True}


case("tcn_causal_k3_dilation2", "timeseries",
     model_pair("timeseries", _ts(padding="causal", dilation_base=2, conv_layers=3)), _series(16))
case("tcn_same_k3", "timeseries", model_pair("timeseries", _ts(padding="same")), _series(12))
case("tcn_causal_k7_preln_learned_mean", "timeseries",
     model_pair("timeseries", _ts(padding="causal", kernel_size=7, norm_position="pre",
                                  final_norm=True, position="learned", pool="mean", ffn="gelu")),
     _series(16))
# even kernel: same padding is asymmetric, (k-1)*d = 6 -> (3, 3) with d=2; k=4, d=1 -> (1, 2)
case("tcn_same_k4_even_kernel", "timeseries",
     model_pair("timeseries", _ts(padding="same", kernel_size=4, position="none")), _series(10))
case("tcn_same_k4_dilation2_single_target", "timeseries",
     model_pair("timeseries", _ts(padding="same", kernel_size=4, dilation_base=2,
                                  target_channels=(1,))), _series(16))
