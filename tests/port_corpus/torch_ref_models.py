"""Our own PyTorch mirror's models (torch_ref/), built from the tiny configs the rest of the suite
uses: the GPT-2 and LLaMA flavoured LMs, the Post-LN [CLS] classifier (an encoder), a LLaMA LM with
a mixture-of-experts layer, the ViT, the TCN-Transformer and a two-stage Swin. Each forward is
called with its tensors only (no return_intermediates), fixed seeds, eval mode."""
import numpy as np

from jaxformer.config.models import ClassifierConfig, LMConfig
from jaxformer.config.moe import MoEConfig
from jaxformer.config.vision import SwinConfig, TimeSeriesConfig, ViTConfig
from torch_ref.models import build_model

B, T = 2, 8


def _ids(seed, vocab=64):
    return np.random.RandomState(seed).randint(1, vocab, size=(B, T)).astype(np.int32)


def lm_gpt2():
    return build_model("lm", LMConfig.tiny("gpt2"), seed=0).eval(), {"ids": _ids(0)}


def lm_llama():
    return build_model("lm", LMConfig.tiny("llama"), seed=1).eval(), {"ids": _ids(1)}


def lm_moe():
    cfg = LMConfig.tiny("llama", d_ff=48,
                        moe=MoEConfig(num_experts=4, top_k=2, router="softmax_topk", d_expert=16, dense_layers=(0,)))
    return build_model("lm", cfg, seed=2).eval(), {"ids": _ids(2)}


def classifier():
    ids = _ids(3)
    attention_mask = np.ones((B, T), np.int32)
    attention_mask[1, 5:] = 0
    ids[1, 5:] = 0
    model = build_model("classifier", ClassifierConfig.tiny(num_classes=3), seed=3).eval()
    return model, {"ids": ids, "attention_mask": attention_mask}


def vit():
    cfg = ViTConfig(image_size=8, patch_size=4, num_channels=3, num_classes=5, d_model=16, num_heads=2,
                    d_ff=32, num_layers=2)
    images = np.random.RandomState(4).standard_normal((B, 8, 8, 3)).astype(np.float32)  # channels-last
    return build_model("vit", cfg, seed=4).eval(), {"images": images}


def timeseries():
    cfg = TimeSeriesConfig(input_len=8, num_channels=3, target_channels=(0, 2), horizon=4, d_model=16,
                           num_heads=2, d_ff=32, num_layers=2, conv_layers=2, kernel_size=3)
    series = np.random.RandomState(5).standard_normal((B, 8, 3)).astype(np.float32)
    return build_model("timeseries", cfg, seed=5).eval(), {"series": series}


def swin():
    cfg = SwinConfig(image_size=16, patch_size=2, num_channels=3, num_classes=5, embed_dim=8, depths=(2, 2),
                     num_heads=(2, 2), window_size=4, mlp_ratio=2.0)
    images = np.random.RandomState(6).standard_normal((B, 16, 16, 3)).astype(np.float32)
    return build_model("swin", cfg, seed=6).eval(), {"images": images}
