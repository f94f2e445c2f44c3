"""Parity cases for the components: attention, positions, FFN, norms, conv, layers, stacks.

Sections of docs/numerics.md covered here: §1 (LayerNorm eps on std-1e-3 input), §2 (GELU
exact vs tanh), §3 (precision: every case runs at 'highest' / TF32 off), §4 (fully masked
rows), §5 (conv padding, k=7 s=2, causal pads), §6 (rotate-half RoPE; also checked against HF
LLaMA in tests/test_layers.py), §8 (separate q/k/v/o), §10 (out-of-range ids:
tests/test_layers.py).
"""
from __future__ import annotations

import numpy as np

from jaxformer.config import Dropouts, Projections, QKNorm, Rope, RopeScaling, Scores, TransformerConfig
from jaxformer.parity.cases import case, ids, mirror, mirror_fn, model_pair, normal, padding, sdpa_fn

B, T, S, D, H = 2, 6, 5, 32, 4
K = D // H


def _qkv(t=T, s=S, h=H, g=H, k=K):
    def make(rng):
        return {"q": rng.standard_normal((B, t, h, k)).astype(np.float32),
                "k": rng.standard_normal((B, s, g, k)).astype(np.float32),
                "v": rng.standard_normal((B, s, g, k)).astype(np.float32)}
    return make


def _with(make, **extra):
    def f(rng):
        d = make(rng)
        d.update({k: (v(rng) if callable(v) else v) for k, v in extra.items()})
        return d
    return f


def _pad_mask(lengths, s=S):
    return padding(B, s, lengths).astype(bool)[:, None, None, :]


def _causal(t=T):
    return np.tril(np.ones((t, t), bool))[None, None]


def _window(t, w):
    d = np.arange(t)[:, None] - np.arange(t)[None, :]
    return ((d >= 0) & (d < w))[None, None]


# ---------------------------------------------------------------- 1. scaled dot-product attention
for fused in (True, False):
    tag = "fused" if fused else "weights"
    fn = mirror_fn("layers.attention.dot_product_attention", return_weights=not fused)
    case(f"sdpa_{tag}_nomask", "attention", fn, _qkv())
    case(f"sdpa_{tag}_padding", "attention", fn, _with(_qkv(), mask=_pad_mask([5, 3])))
    case(f"sdpa_{tag}_causal", "attention", fn, _with(_qkv(s=T), mask=_causal()))
    case(f"sdpa_{tag}_padding_causal", "attention", fn,
         _with(_qkv(s=T), mask=_pad_mask([6, 4], T) & _causal()))
    case(f"sdpa_{tag}_sliding_window", "attention", fn, _with(_qkv(s=T), mask=_window(T, 3)))
    case(f"sdpa_{tag}_additive_bias", "attention", fn,
         _with(_qkv(), bias=normal(B, H, T, S), mask=_pad_mask([5, 2])))
    # docs/numerics.md §4: query rows with no visible key must output 0 (not NaN, not mean(V))
    m = np.ones((B, 1, T, S), bool)
    m[0, 0, 1] = False
    m[1, 0, 3:] = False
    case(f"sdpa_{tag}_fully_masked_rows", "attention", fn, _with(_qkv(), mask=m))
    case(f"sdpa_{tag}_gqa", "attention", fn, _with(_qkv(g=2, s=T), mask=_causal()))

# ---------------------------------------------------------------- 2. multi-head attention
case("mha_self_padding", "attention", mirror("layers.attention.MultiHeadAttention", D, H),
     lambda r: {"x": normal(B, T, D)(r), "mask": _pad_mask([6, 3], T)})
case("mha_cross", "attention", mirror("layers.attention.MultiHeadAttention", D, H),
     lambda r: {"x": normal(B, T, D)(r), "kv": normal(B, S, D)(r), "mask": _pad_mask([5, 2])})
case("mha_gqa_nobias_causal", "attention",
     mirror("layers.attention.MultiHeadAttention", D, H, num_kv_heads=2, projections=Projections(bias=False)),
     lambda r: {"x": normal(B, T, D)(r), "mask": _causal()})
# T5 (docs/numerics.md §22): unscaled scores plus a position bias, no biases, a head_dim of its own
case("mha_t5_unscaled_bias", "attention",
     mirror("layers.attention.MultiHeadAttention", D, H, head_dim=6, projections=Projections(bias=False),
            scores=Scores(scale=1.0)),
     lambda r: {"x": normal(B, T, D)(r), "bias": normal(1, H, T, T)(r), "mask": _pad_mask([6, 3], T)})
case("mha_mqa_head_dim", "attention",
     mirror("layers.attention.MultiHeadAttention", D, H, num_kv_heads=1, head_dim=12),
     lambda r: {"x": normal(B, T, D)(r), "mask": _causal()})
case("mha_rope_gqa", "attention",
     mirror("layers.attention.MultiHeadAttention", D, H, num_kv_heads=2, rope=Rope(16, 500.0)),
     lambda r: {"x": normal(B, T, D)(r), "mask": _causal(),
                "positions": np.stack([np.arange(T), np.arange(3, 3 + T)]).astype(np.int32)})
# positions up to 2000: the RoPE angle pos * base^(-2i/K) is large, so a base off by 0.1% moves
# outputs and every gradient leaf well past the tolerance (mutation rope_base_0.1pct)
case("mha_rope_long_positions", "attention",
     mirror("layers.attention.MultiHeadAttention", D, H, rope=Rope(2048)),
     lambda r: {"x": normal(B, T, D)(r), "mask": _causal(),
                "positions": np.sort(r.randint(0, 2048, (B, T)), axis=1).astype(np.int32)})
# dropout configured but eval mode: both sides must be deterministic (mutation dropout_active_in_eval)
case("mha_dropout_in_eval", "attention",
     mirror("layers.attention.MultiHeadAttention", D, H, dropouts=Dropouts(attn=0.1, out=0.1)),
     lambda r: {"x": normal(B, T, D)(r), "mask": _pad_mask([6, 3], T)})
case("mha_return_weights", "attention", mirror("layers.attention.MultiHeadAttention", D, H),
     lambda r: {"x": normal(B, T, D)(r), "mask": _pad_mask([6, 1], T), "return_weights": True})

# ---------------------------------------------------------------- 3. positions
case("pos_sinusoidal", "positional", mirror("layers.positional.SinusoidalPositionalEncoding", 64, D),
     lambda r: {"positions": r.randint(0, 64, (B, T)).astype(np.int32)}, grads=False)
case("pos_learned", "positional", mirror("layers.positional.LearnedPositionalEmbedding", 16, D),
     lambda r: {"positions": r.randint(0, 16, (B, T)).astype(np.int32)})
case("pos_rope_rotate_half", "positional", mirror("layers.positional.RotaryEmbedding", K, 32, 10000.0),
     lambda r: {"x": normal(B, T, H, K)(r), "positions": r.randint(0, 32, (B, T)).astype(np.int32)})
case("pos_rope_long_positions", "positional", mirror("layers.positional.RotaryEmbedding", K, 2048, 10000.0),
     lambda r: {"x": normal(B, T, H, K)(r), "positions": r.randint(0, 2048, (B, T)).astype(np.int32)})
# RoPE scaling (Llama 3.x, YaRN, linear, dynamic NTK; docs/numerics.md §20); positions past
# original_max_len so every band of llama3 and the grown base of dynamic are exercised
ROPE_SCALINGS = {
    "linear": RopeScaling("linear", 4.0),
    "dynamic": RopeScaling("dynamic", 2.0, original_max_len=16),
    "llama3": RopeScaling("llama3", 8.0, original_max_len=16, low_freq_factor=1.0, high_freq_factor=4.0),
    "yarn": RopeScaling("yarn", 4.0, original_max_len=16, beta_fast=8.0, beta_slow=1.0),
}
for tag, scaling in ROPE_SCALINGS.items():
    case(f"pos_rope_scaling_{tag}", "positional",
         mirror("layers.positional.RotaryEmbedding", K, 64, 500.0, scaling),
         lambda r: {"x": normal(B, T, H, K)(r), "positions": r.randint(0, 64, (B, T)).astype(np.int32)})
# longrope (Phi-3, §34): the short factors while every position < original_max_len (16), the
# long ones past it; an attention factor from factor 4
LONGROPE = RopeScaling("longrope", 4.0, original_max_len=16, short_factor=(1.0, 1.5, 2.0, 3.0),
                       long_factor=(2.0, 5.0, 9.0, 17.0))
for tag, top in (("short", 16), ("long", 64)):
    case(f"pos_rope_scaling_longrope_{tag}", "positional",
         mirror("layers.positional.RotaryEmbedding", K, 64, 500.0, LONGROPE),
         lambda r, top=top: {"x": normal(B, T, H, K)(r),
                             "positions": r.randint(top - 16, top, (B, T)).astype(np.int32)})
# partial rotary (GPT-NeoX's rotary_pct, docs/numerics.md §35): 6 of 12 dims rotate, alone and
# under dynamic scaling (its base grows with the rotated width's exponent R / (R - 2))
for tag, scaling in {"": None, "_dynamic": ROPE_SCALINGS["dynamic"]}.items():
    case(f"pos_rope_partial_rotary{tag}", "positional",
         mirror("layers.positional.RotaryEmbedding", 12, 64, 500.0, scaling, rotary_dim=6),
         lambda r: {"x": normal(B, T, H, 12)(r), "positions": r.randint(0, 64, (B, T)).astype(np.int32)})
# Qwen2 / Qwen3 attention: q/k/v biases without an o_proj bias; per-head RMSNorm on q and k
case("mha_qkv_bias_qk_norm_rope", "attention",
     mirror("layers.attention.MultiHeadAttention", D, H, num_kv_heads=2, rope=Rope(16),
            projections=Projections(out_bias=False), qk_norm=QKNorm("rmsnorm", 1e-6)),
     lambda r: {"x": normal(B, T, D)(r), "mask": _causal()})
# torch.nn.MultiheadAttention's own options (kdim / vdim, add_bias_kv, add_zero_attn) are
# interop.TorchMultiheadAttention's: their cases are against nn.MultiheadAttention itself
# (cases_interop.py)
# Gemma2 attention: scores scaled by query_pre_attn_scalar ** -0.5, then soft-capped (tanh bends
# them: inputs of std 2 give |scores| well above the cap of 3), grouped-query, RoPE
case("mha_gemma2_softcap_scalar", "attention",
     mirror("layers.attention.MultiHeadAttention", D, H, num_kv_heads=2, rope=Rope(16),
            projections=Projections(bias=False),
            scores=Scores(scale=20.0 ** -0.5, softcap=3.0)),
     lambda r: {"x": normal(B, T, D, scale=2.0)(r), "mask": _causal()})
case("sdpa_softcap_padding_causal", "attention",
     sdpa_fn(softcap=2.0),
     _with(_qkv(s=T), mask=_pad_mask([6, 4], T) & _causal()))
for heads in (4, 6, 12):  # 6, 12: not powers of two
    case(f"pos_alibi_{heads}_heads", "positional", mirror_fn("layers.positional.alibi_bias", num_heads=heads),
         lambda r: {"q_positions": np.tile(np.arange(T, dtype=np.int32), (B, 1)),
                    "k_positions": np.tile(np.arange(S, dtype=np.int32), (B, 1))}, grads=False)
for bidirectional in (True, False):
    case(f"pos_t5_bias_{'bidirectional' if bidirectional else 'causal'}", "positional",
         mirror("layers.positional.T5RelativePositionBias", 32, 128, H, bidirectional=bidirectional),
         lambda r: {"q_positions": np.tile(np.arange(0, 200, 20, dtype=np.int32), (B, 1)),
                    "k_positions": np.tile(np.arange(0, 300, 7, dtype=np.int32), (B, 1))})

# ---------------------------------------------------------------- 4. feed-forward
for kind in ("relu", "gelu", "gelu_tanh", "silu", "swiglu", "geglu", "geglu_tanh"):
    # inputs on [-5, 5]-ish so the GELU variants would differ by ~5e-4 if swapped (docs/numerics.md §2)
    case(f"ffn_{kind}", "ffn", mirror("layers.ffn.FeedForward", D, 64, kind=kind),
         lambda r: {"x": normal(B, T, D, scale=2.5)(r)})
case("ffn_swiglu_nobias", "ffn", mirror("layers.ffn.FeedForward", D, 48, kind="swiglu", bias=False),
     lambda r: {"x": normal(B, T, D)(r)})

# ---------------------------------------------------------------- 5. norms
case("norm_layernorm", "norm", mirror("layers.norm.LayerNorm", D, eps=1e-5),
     lambda r: {"x": normal(B, T, D, scale=3.0, offset=1.0)(r)})
# docs/numerics.md §1: std 1e-3 input makes eps dominate; torch 1e-5 vs flax 1e-6 differs by ~1.05
case("norm_layernorm_eps_small_std", "norm", mirror("layers.norm.LayerNorm", D, eps=1e-5),
     lambda r: {"x": normal(B, T, D, scale=1e-3)(r)})
# No offset here: with mean 0.5 and std 1e-3 the fp32 problem itself is ill-conditioned (the
# mean's rounding, ulp(0.5) = 6e-8, is amplified by 1/std): torch and JAX are then each ~3e-5
# from the float64 answer, measured, whatever the implementation. That is not a parity bug.
case("norm_layernorm_nobias_eps1e-6", "norm", mirror("layers.norm.LayerNorm", D, eps=1e-6, bias=False),
     lambda r: {"x": normal(B, T, D, scale=1e-3)(r)})
case("norm_rmsnorm", "norm", mirror("layers.norm.RMSNorm", D, eps=1e-6),
     lambda r: {"x": normal(B, T, D, scale=2.0)(r)})
case("norm_rmsnorm_unit_offset", "norm", mirror("layers.norm.RMSNorm", D, eps=1e-6, unit_offset=True),
     lambda r: {"x": normal(B, T, D, scale=2.0)(r)})
case("norm_rmsnorm_eps_small_std", "norm", mirror("layers.norm.RMSNorm", D, eps=1e-5),
     lambda r: {"x": normal(B, T, D, scale=1e-3)(r)})

# ---------------------------------------------------------------- conv layout and padding (docs/numerics.md §5)
case("conv2d_k7_s2_explicit_pad", "conv", mirror("layers.conv.Conv2d", 3, 8, 7, stride=2, padding=3),
     lambda r: {"x": normal(B, 16, 16, 3)(r)})
case("conv2d_patchify_k4_s4", "conv", mirror("layers.conv.Conv2d", 3, 16, 4, stride=4, padding=0),
     lambda r: {"x": normal(B, 12, 8, 3)(r)})
case("conv1d_causal_pad_dilated", "conv",
     mirror("layers.conv.Conv1d", 4, 8, 3, padding=[(4, 0)], dilation=2),
     lambda r: {"x": normal(B, 10, 4)(r)})
case("conv1d_same_pad", "conv", mirror("layers.conv.Conv1d", 4, 8, 5, padding=2),
     lambda r: {"x": normal(B, 10, 4)(r)})

# ---------------------------------------------------------------- 6. layers and stacks
def _cfg(**kw):
    base = dict(vocab_size=40, d_model=D, num_heads=H, d_ff=64, num_layers=2, max_len=32)
    base.update(kw)
    return TransformerConfig(**base)


for pos in ("post", "pre"):
    cfg = _cfg(norm_position=pos)
    case(f"encoder_layer_{pos}ln", "encoder_layer", mirror("layers.transformer.EncoderLayer", cfg),
         lambda r: {"x": normal(B, T, D)(r), "mask": _pad_mask([6, 4], T)})
    case(f"decoder_layer_{pos}ln", "decoder_layer", mirror("layers.transformer.DecoderLayer", cfg),
         lambda r: {"x": normal(B, T, D)(r), "memory": normal(B, S, D)(r),
                    "mask": _causal(), "memory_mask": _pad_mask([5, 3])})

STACKS = {
    "post_sinusoidal_relu": dict(norm_position="post"),
    "post_nofinalnorm": dict(norm_position="post", final_norm=False),
    "pre_rmsnorm_swiglu_rope_gqa": dict(norm_position="pre", norm="rmsnorm", ffn="swiglu",
                                        position="rope", num_kv_heads=2, bias=False, norm_eps=1e-6),
    "pre_alibi_6heads_gelu": dict(norm_position="pre", position="alibi", num_heads=8, d_model=48,
                                  ffn="gelu"),
    "pre_t5_rmsnorm_geglu": dict(norm_position="pre", position="t5", norm="rmsnorm", ffn="geglu_tanh"),
    "pre_sliding_window_learned": dict(norm_position="pre", position="learned", sliding_window=3),
    # Gemma2's layer: sandwich norms of the (1 + w) RMSNorm, GeGLU-tanh, soft-capped scores
    # scaled by query_pre_attn_scalar, a sliding-window layer then a full one
    "sandwich_gemma2_layer_types": dict(norm_position="sandwich", norm="rmsnorm_offset", norm_eps=1e-6,
                                        position="rope", ffn="geglu_tanh", bias=False, sliding_window=2,
                                        layer_types=("sliding_attention", "full_attention"),
                                        attn_logit_softcap=5.0, query_pre_attn_scalar=12.0),
}
for tag, kw in STACKS.items():
    cfg = _cfg(**kw)
    d = cfg.d_model
    case(f"encoder_stack_{tag}", "encoder_stack", mirror("layers.transformer.Encoder", cfg),
         lambda r, d=d: {"x": normal(B, T, d)(r), "mask": _pad_mask([6, 4], T)})
    case(f"decoder_stack_{tag}", "decoder_stack", mirror("layers.transformer.Decoder", cfg),
         lambda r, d=d: {"x": normal(B, T, d)(r), "memory": normal(B, S, d)(r),
                         "memory_mask": _pad_mask([5, 3])})
case("decoder_stack_not_causal", "decoder_stack",
     mirror("layers.transformer.Decoder", _cfg(norm_position="pre"), causal=False),
     lambda r: {"x": normal(B, T, D)(r), "memory": normal(B, S, D)(r), "mask": _pad_mask([6, 4], T),
                "memory_mask": _pad_mask([5, 3])})
case("decoder_stack_no_cross_attention", "decoder_stack",
     mirror("layers.transformer.Decoder", _cfg(norm_position="pre"), cross_attention=False),
     lambda r: {"x": normal(B, T, D)(r), "mask": _pad_mask([6, 4], T)})

case("embedding_scaled", "embedding", mirror("layers.embedding.Embedding", 40, D, scale=True),
     lambda r: {"ids": ids(B, T, 40, low=0)(r)})
case("text_embedding_sinusoidal_scaled", "embedding", mirror("layers.text_embedding.TextEmbedding", _cfg()),
     lambda r: {"ids": ids(B, T, 40)(r)})
for pos in ("post", "pre"):
    case(f"text_encoder_{pos}ln_padding", "encoder_model", model_pair("encoder", _cfg(norm_position=pos)),
         lambda r: {"ids": ids(B, T, 40)(r), "attention_mask": padding(B, T, [6, 3])})
