"""Parity cases for blockwise attention (jaxformer/layers/kernels/blockwise.py, docs/numerics.md §29):
the JAX side traced with attention="blockwise" and small blocks (8 queries x 16 keys, so every
case spans several blocks and skips some), the torch side on its plain path (the dense mask).
Outputs and every gradient, the sinks' and the bias' included.

Lengths are not multiples of the blocks (37 against 8 / 16), so the internal padding of q and k
is exercised everywhere. Rows with no visible key (left padding, segment 0) are in the padded,
segment and sink cases.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from jaxformer import tables
from jaxformer.parity.cases import case, padding
from jaxformer.parity.cases_models import left_padding, model_pair, token_ids
from jaxformer.parity.cases_sinks import GPT_OSS_ATTN, big_sinks

B, T, H, K = 2, 37, 4, 8
V = 64
BLOCKWISE = (("attention", "blockwise"), ("attention_blocks", (8, 16)))


def kernel(*, causal: bool = True, window: int | None = None, alibi: bool = False, softcap: float | None = None):
    """Builder: dot_product_attention with AttentionMask parts made from the inputs (key_valid,
    segment_ids) in each tree; the JAX side computes blockwise under the case's lowering."""
    def build(seed: int):
        import jax.numpy as jnp
        import torch

        from jaxformer.layers import attention as ja
        from torch_ref.layers import attention as ta

        def parts(mod, q, key_valid, segment_ids, slopes):
            m = mod.AttentionMask.self_attention(1, q.shape[1], causal=causal, key_valid=key_valid,
                                                 segment_ids=segment_ids)
            m = m if window is None else m.with_window(window)
            return m if not alibi else dataclasses.replace(m, alibi_slopes=slopes)

        def jf(q, k, v, key_valid=None, segment_ids=None, sinks=None, bias=None):
            m = parts(ja, q, key_valid, segment_ids, jnp.asarray(tables.alibi_slopes(q.shape[2])))
            return ja.dot_product_attention(q, k, v, mask=m, bias=bias, scores=ja.ScoreMods(softcap=softcap, sinks=sinks))

        def tf(q, k, v, key_valid=None, segment_ids=None, sinks=None, bias=None):
            m = parts(ta, q, key_valid, segment_ids, torch.tensor(tables.alibi_slopes(q.shape[2])))
            return ta.dot_product_attention(q, k, v, mask=m, bias=bias, scores=ta.ScoreMods(softcap=softcap, sinks=sinks))
        return tf, jf
    return build


def qkv(g: int = H, **extra):
    """q [B, T, H, K], k / v [B, T, G, K] and the named extra inputs (makers of rng)."""
    def make(rng):
        out = {"q": rng.standard_normal((B, T, H, K)).astype(np.float32),
               "k": rng.standard_normal((B, T, g, K)).astype(np.float32),
               "v": rng.standard_normal((B, T, g, K)).astype(np.float32)}
        out.update({name: f(rng) for name, f in extra.items()})
        return out
    return make


def rng_normal(rng, shape, scale=1.0):
    return (scale * rng.standard_normal(shape)).astype(np.float32)


LEFT_RIGHT = np.stack([padding(1, T, [30])[0], left_padding(1, T, [20])[0]])  # right- and left-padded rows
SEGMENTS = np.array([[1] * 10 + [2] * 15 + [3] * 9 + [0] * 3,
                     [0] * 5 + [1] * 20 + [2] * 12], np.int32)  # packed documents, 0 = padding

case("blockwise_causal_odd_length", "attention", kernel(), qkv(), lowering=BLOCKWISE)
case("blockwise_padded_gqa", "attention", kernel(), qkv(2, key_valid=lambda r: LEFT_RIGHT), lowering=BLOCKWISE)
case("blockwise_sliding_window", "attention", kernel(window=6), qkv(2, key_valid=lambda r: LEFT_RIGHT),
     lowering=BLOCKWISE)
case("blockwise_bidirectional_window", "attention", kernel(causal=False, window=9), qkv(), lowering=BLOCKWISE)
case("blockwise_segments", "attention", kernel(), qkv(segment_ids=lambda r: SEGMENTS), lowering=BLOCKWISE)
case("blockwise_softcap_bias", "attention", kernel(softcap=2.0),
     qkv(2, bias=lambda r: rng_normal(r, (1, H, T, T))), lowering=BLOCKWISE)
case("blockwise_sinks_padded_gqa", "attention", kernel(window=6),
     qkv(2, key_valid=lambda r: LEFT_RIGHT, sinks=lambda r: rng_normal(r, (H,), 1.5)), lowering=BLOCKWISE)
# ALiBi from the slots plus a per-key bias [B, 1, 1, S] (its gradient summed over heads and rows)
case("blockwise_alibi_key_bias_padded", "attention", kernel(alibi=True),
     qkv(key_valid=lambda r: LEFT_RIGHT, bias=lambda r: rng_normal(r, (B, 1, 1, T))), lowering=BLOCKWISE)


# ---------------------------------------------------------------- an LM
# gpt-oss's attention (cases_sinks.py: RoPE, GQA, sinks, alternating sliding / full layers), left
# padding, 21 tokens in blocks of 8; the same config as the plain case, so no new model to build
TL = 21
case("lm_blockwise_gpt_oss_layer_types_left_padding", "lm_model", big_sinks(model_pair("lm", GPT_OSS_ATTN)),
     lambda r: {"ids": token_ids(B, TL, V, lengths=[21, 13], left=True)(r),
                "attention_mask": left_padding(B, TL, [21, 13])},
     lowering=(("attention", "blockwise"), ("attention_blocks", (8, 8))))
