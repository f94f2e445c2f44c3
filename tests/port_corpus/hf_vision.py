"""Hugging Face transformers vision (and CLIP's text tower) models outside jaxformer's own families
(issue 47 §7), each its modeling class from a tiny config with random weights (no download):
hidden 32 (or a few channels per stage), 2 layers, 4 heads, 16x16 to 64x64 images, batch 2. Every
BatchNorm gets random running statistics and affine parameters, every norm's weight is moved off
its init, and layer scales start at 0.1 (not 1e-6), so a dropped or misread one shows. Outputs are
the models' own ModelOutput objects, as they return them.

ViT family:
  - CLIP vision (CLIPVisionModel): `position_embedding(self.position_ids)`, an Embedding called on
    a buffer; pre-LN, quick_gelu, a pooled output; eager.
  - CLIP text (CLIPTextModel): causal mask plus padding mask, the pooled output gathered at the
    eos token (`argmax(input_ids == eos_token_id)`); eager.
  - SigLIP vision (SiglipVisionModel): Embedding on a position-id buffer, the attention-pooling
    head (nn.MultiheadAttention with a probe parameter); eager.
  - BEiT (BeitForImageClassification): relative position bias whose table is resized with
    F.interpolate(mode="bilinear") every call, layer scale, mean pooling; eager.
  - Data2Vec vision (Data2VecVisionForImageClassification): BEiT's layout with one relative
    position bias shared by all layers; eager.
  - DeiT (DeiTForImageClassificationWithTeacher): cls and distillation tokens, two heads averaged.
  - ViTMAE (ViTMAEModel, mask_ratio 0.5): the random masking made deterministic by passing the
    `noise` input (argsort of noise, gather of the kept patches); outputs include the integer
    mask and ids_restore; noise's true gradient is zero.
  - YOLOS (YolosForObjectDetection): detection tokens, position embeddings resized with bicubic
    interpolation, class and box MLP heads.
  - DPT (DPTForDepthEstimation): a ViT backbone read at 4 layers, reassembled with transposed
    convs and bilinear upsampling (align_corners=True), fusion blocks, the depth head.
Conv and hybrid conv-attention:
  - LeViT (LevitForImageClassification): conv+BatchNorm stem, attention with biases indexed by a
    buffer (`attention_biases[:, attention_bias_idxs]`, cached per device in eval mode),
    subsampling attention, BatchNorm'd Linears, distillation head.
  - ConvNeXt (ConvNextForImageClassification): depthwise 7x7 conv, LayerNorm over channels
    (channels_first and channels_last), layer scale.
  - ResNet (ResNetForImageClassification): conv stem + BatchNorm + max-pool, basic blocks.
  - MobileViT (MobileViTForImageClassification): inverted residuals with BatchNorm, MobileViT
    blocks unfolding the feature map into patches for a transformer and folding it back.
  - SegFormer (SegformerForSemanticSegmentation): overlapping patch embeds, efficient
    self-attention with spatial reduction, Mix-FFN depthwise conv, the all-MLP decode head
    (bilinear upsampling, BatchNorm).
  - PoolFormer (PoolFormerForImageClassification): avg-pool token mixer (count_include_pad=False),
    GroupNorm, layer scale.
"""
import numpy as np
import torch

B = 2


def _pixels(seed, size, channels=3):
    return np.random.RandomState(seed).standard_normal((B, channels, size, size)).astype(np.float32)


def _randomize(model):
    """BatchNorm running stats and every norm's affine parameters off their init; layer scales
    (gamma / lambda / layer_scale parameters) to ~0.1."""
    with torch.no_grad():
        for mod in model.modules():
            if isinstance(mod, torch.nn.modules.batchnorm._BatchNorm):
                mod.running_mean.normal_(0.0, 0.2)
                mod.running_var.uniform_(0.5, 1.5)
        for name, p in model.named_parameters():
            low = name.lower()
            last = low.rsplit(".", 1)[-1]
            if ("lambda" in last or "gamma" in last or "layer_scale" in last) and p.ndim <= 3:
                p.copy_(0.1 + 0.02 * torch.randn_like(p))
            elif ("norm" in low or "ln" in low or "bn" in low or "batch_norm" in low) and p.ndim == 1:
                p.add_(torch.randn_like(p) * 0.1)
    return model


def _build(config_cls, model_cls, seed, inputs, **cfg):
    torch.manual_seed(seed)
    model = _randomize(model_cls(config_cls(**cfg)).eval())
    return model, inputs


_VIT = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)


def clip_vision():
    from transformers import CLIPVisionConfig, CLIPVisionModel
    return _build(CLIPVisionConfig, CLIPVisionModel, 50, {"pixel_values": _pixels(50, 16)}, **_VIT, image_size=16,
                  patch_size=4, attn_implementation="eager")


def clip_text():
    from transformers import CLIPTextConfig, CLIPTextModel
    ids = np.random.RandomState(51).randint(3, 64, size=(B, 8)).astype(np.int64)
    ids[0, 7] = 2  # eos: the pooled output is read there
    ids[1, 5] = 2
    mask = np.ones((B, 8), np.int64)
    mask[1, 6:] = 0
    return _build(CLIPTextConfig, CLIPTextModel, 51, {"input_ids": ids, "attention_mask": mask}, **_VIT,
                  vocab_size=64, max_position_embeddings=16, pad_token_id=1, bos_token_id=0, eos_token_id=2,
                  attn_implementation="eager")


def siglip_vision():
    from transformers import SiglipVisionConfig, SiglipVisionModel
    return _build(SiglipVisionConfig, SiglipVisionModel, 52, {"pixel_values": _pixels(52, 16)}, **_VIT, image_size=16,
                  patch_size=4, attn_implementation="eager")


def beit():
    from transformers import BeitConfig, BeitForImageClassification
    return _build(BeitConfig, BeitForImageClassification, 53, {"pixel_values": _pixels(53, 16)}, **_VIT,
                  image_size=16, patch_size=4, use_relative_position_bias=True, use_mean_pooling=True,
                  layer_scale_init_value=0.1, num_labels=5, vocab_size=64, attn_implementation="eager")


def data2vec_vision():
    from transformers import Data2VecVisionConfig, Data2VecVisionForImageClassification
    return _build(Data2VecVisionConfig, Data2VecVisionForImageClassification, 54, {"pixel_values": _pixels(54, 16)},
                  **_VIT, image_size=16, patch_size=4, use_shared_relative_position_bias=True,
                  use_mean_pooling=True, layer_scale_init_value=0.1, num_labels=5, attn_implementation="eager")


def deit():
    from transformers import DeiTConfig, DeiTForImageClassificationWithTeacher
    return _build(DeiTConfig, DeiTForImageClassificationWithTeacher, 55, {"pixel_values": _pixels(55, 16)}, **_VIT,
                  image_size=16, patch_size=4, num_labels=5, attn_implementation="sdpa")


def vit_mae():
    from transformers import ViTMAEConfig, ViTMAEModel
    noise = np.random.RandomState(156).uniform(size=(B, 16)).astype(np.float32)
    return _build(ViTMAEConfig, ViTMAEModel, 56, {"pixel_values": _pixels(56, 16), "noise": noise}, **_VIT,
                  image_size=16, patch_size=4, mask_ratio=0.5, attn_implementation="eager")


def yolos():
    from transformers import YolosConfig, YolosForObjectDetection
    return _build(YolosConfig, YolosForObjectDetection, 57, {"pixel_values": _pixels(57, 16)}, **_VIT,
                  image_size=[16, 16], patch_size=4, num_detection_tokens=4, num_labels=3,
                  attn_implementation="eager")


def dpt():
    from transformers import DPTConfig, DPTForDepthEstimation
    return _build(DPTConfig, DPTForDepthEstimation, 58, {"pixel_values": _pixels(58, 32)}, hidden_size=32,
                  num_hidden_layers=4, num_attention_heads=4, intermediate_size=64, image_size=32, patch_size=8,
                  backbone_out_indices=[0, 1, 2, 3], neck_hidden_sizes=[8, 16, 16, 32], fusion_hidden_size=16,
                  head_hidden_size=8, reassemble_factors=[4, 2, 1, 0.5], attn_implementation="eager")


def levit():
    from transformers import LevitConfig, LevitForImageClassification
    return _build(LevitConfig, LevitForImageClassification, 59, {"pixel_values": _pixels(59, 64)}, image_size=64,
                  hidden_sizes=[32, 48], num_attention_heads=[2, 3], depths=[1, 1], key_dim=[8, 8],
                  mlp_ratio=[2, 2], attention_ratio=[2, 2],
                  down_ops=[["Subsample", 8, 32 // 8, 4, 2, 2]], num_labels=5)


def convnext():
    from transformers import ConvNextConfig, ConvNextForImageClassification
    return _build(ConvNextConfig, ConvNextForImageClassification, 60, {"pixel_values": _pixels(60, 32)},
                  num_stages=2, hidden_sizes=[16, 32], depths=[1, 1], layer_scale_init_value=0.1, image_size=32, num_labels=5)


def resnet():
    from transformers import ResNetConfig, ResNetForImageClassification
    return _build(ResNetConfig, ResNetForImageClassification, 61, {"pixel_values": _pixels(61, 32)},
                  embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], layer_type="basic", num_labels=5)


def mobilevit():
    from transformers import MobileViTConfig, MobileViTForImageClassification
    return _build(MobileViTConfig, MobileViTForImageClassification, 62, {"pixel_values": _pixels(62, 32)},
                  image_size=32, patch_size=2, hidden_sizes=[16, 24, 32], neck_hidden_sizes=[8, 8, 16, 16, 24, 24, 32],
                  num_attention_heads=2, mlp_ratio=2.0, expand_ratio=2.0, num_labels=5)


def segformer():
    from transformers import SegformerConfig, SegformerForSemanticSegmentation
    return _build(SegformerConfig, SegformerForSemanticSegmentation, 63, {"pixel_values": _pixels(63, 32)},
                  num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[16, 32], patch_sizes=[7, 3],
                  strides=[4, 2], num_attention_heads=[1, 2], mlp_ratios=[2, 2], decoder_hidden_size=32, num_labels=5)


def poolformer():
    from transformers import PoolFormerConfig, PoolFormerForImageClassification
    return _build(PoolFormerConfig, PoolFormerForImageClassification, 64, {"pixel_values": _pixels(64, 32)},
                  num_encoder_blocks=2, depths=[1, 1], hidden_sizes=[16, 32], patch_sizes=[7, 3], strides=[4, 2],
                  padding=[2, 1], pool_size=3, mlp_ratio=2.0, layer_scale_init_value=0.1, num_labels=5)


ALL = {
    "hf_clip_vision": clip_vision, "hf_clip_text": clip_text, "hf_siglip_vision": siglip_vision, "hf_beit": beit,
    "hf_data2vec_vision": data2vec_vision, "hf_deit": deit, "hf_vit_mae": vit_mae, "hf_yolos": yolos, "hf_dpt": dpt,
    "hf_levit": levit, "hf_convnext": convnext, "hf_resnet": resnet, "hf_mobilevit": mobilevit,
    "hf_segformer": segformer, "hf_poolformer": poolformer,
}
