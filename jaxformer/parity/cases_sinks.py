"""Parity cases for gpt-oss's attention sinks (docs/numerics.md §28): a learned logit per query
head that joins every softmax denominator. Outputs and every gradient, the sinks' included, with
causal, padded (rows with no visible key among them), sliding-window and grouped-query masks,
in the bare kernel, the attention module, a stack of alternating sliding / full layers and an LM.

Sinks of std 1.5 put a visible share of each row's weight on the sink, so a sink that is
dropped, shared by a key/value group or left out of the maximum moves the outputs.
"""
from __future__ import annotations

import numpy as np

from jaxformer.config import Rope, Scores
from jaxformer.config.models import LMConfig
from jaxformer.parity.cases import case, mirror, normal, padding, sdpa_fn
from jaxformer.parity.cases_models import left_padding, model_pair, token_ids

B, T, D, H = 2, 7, 32, 4
K = D // H
V = 64


def _qkv(g=H, sink_scale=1.5):
    def make(rng):
        return {"q": rng.standard_normal((B, T, H, K)).astype(np.float32),
                "k": rng.standard_normal((B, T, g, K)).astype(np.float32),
                "v": rng.standard_normal((B, T, g, K)).astype(np.float32),
                "sinks": (sink_scale * rng.standard_normal(H)).astype(np.float32)}
    return make


def _with_mask(make, mask):
    def f(rng):
        return {**make(rng), "mask": mask}
    return f


CAUSAL = np.tril(np.ones((T, T), bool))[None, None]
PADDED = padding(B, T, [7, 4]).astype(bool)[:, None, None, :] & CAUSAL
_dist = np.arange(T)[:, None] - np.arange(T)[None, :]
WINDOW = ((_dist >= 0) & (_dist < 3))[None, None]
NO_KEYS = PADDED.copy()
NO_KEYS[1, 0, 2] = False  # row 2 of batch 1 sees no key: all its weight goes to the sink -> 0

# ---------------------------------------------------------------- the kernel
sdpa = sdpa_fn()

case("sdpa_sinks_causal", "attention", sdpa, _with_mask(_qkv(), CAUSAL))
case("sdpa_sinks_padded_no_visible_key", "attention", sdpa, _with_mask(_qkv(), NO_KEYS))
case("sdpa_sinks_sliding_gqa", "attention", sdpa, _with_mask(_qkv(g=2), WINDOW))
case("sdpa_sinks_return_weights", "attention", sdpa_fn(return_weights=True), _with_mask(_qkv(g=2), PADDED))

# ---------------------------------------------------------------- the module and stacks
def big_sinks(build):
    """The torch side's sinks redrawn at std 1.5 (its init draws std 0.02), before conversion."""
    def f(seed: int):
        import torch
        t, j = build(seed)
        with torch.no_grad():
            for name, p in t.named_parameters():
                if name.endswith("sinks"):
                    p.copy_(1.5 * torch.randn(p.shape, generator=torch.Generator().manual_seed(seed)))
        return t, j
    return f


case("mha_sinks_rope_gqa_sliding", "attention",
     big_sinks(mirror("layers.attention.MultiHeadAttention", D, H, num_kv_heads=2, rope=Rope(16), scores=Scores(sinks=True))),
     lambda r: {"x": normal(B, T, D)(r), "mask": WINDOW & PADDED})
# gpt-oss's attention: q/k/v/o biases, RoPE, GQA, sinks; alternating sliding / full layers
GPT_OSS_ATTN = LMConfig.tiny(position="rope", norm="rmsnorm", norm_position="pre", norm_eps=1e-5, ffn="swiglu",
                             bias=True, num_kv_heads=2, head_dim=12, num_layers=3, sliding_window=3,
                             layer_types=("sliding_attention", "full_attention", "sliding_attention"),
                             tie_embeddings=False, attn_sinks=True)
case("lm_sinks_layer_types_left_padding", "lm_model", big_sinks(model_pair("lm", GPT_OSS_ATTN)),
     lambda r: {"ids": token_ids(B, T, V, lengths=[7, 4], left=True)(r),
                "attention_mask": left_padding(B, T, [7, 4])})
