"""Parity cases for the full text models (classifier, seq2seq, lm): outputs and gradients of
every parameter at the foundation tolerances. Tiny sizes (the configs' tiny presets,
TINY_SIZES): D 32, 2 layers, vocab 64.

Flavours: Post-LN/[CLS] and Pre-LN/mean classifier; seq2seq with shared+tied embeddings and
with separate embeddings, an untied head, a different target vocabulary and decoder depth;
GPT-2 (learned positions, LayerNorm, GELU-tanh, Pre-LN, biases, tied) and LLaMA (RoPE,
RMSNorm, SwiGLU, no biases, GQA) LMs, with left padding; ALiBi and T5-bias LMs.

Token embeddings are rescaled from the constructor's N(0, 1) to N(0, 1/D) (realistic_
embeddings), the scale jaxformer/train/init.py's xavier scheme draws; `lm_default_init_tied_d88`
keeps the N(0, 1) tied table (logits near 90), which the per-leaf relative tolerance
(docs/numerics.md §19) also covers.
"""
from __future__ import annotations

import numpy as np

from jaxformer.config import RopeScaling
from jaxformer.config.models import TINY_SIZES, ClassifierConfig, LMConfig, Seq2SeqConfig
from jaxformer.parity.cases import case, padding
from jaxformer.parity.cases import model_pair as _model_pair

B, T, S = 2, 7, 6
V = TINY_SIZES["vocab_size"]


def realistic_embeddings(module):
    """Rescale a torch_ref model's token embeddings to N(0, 1/D), in place (jaxformer/train/init.py's
    xavier scheme draws the same scale; with the paper's sqrt(D) factor, unit-variance inputs)."""
    import torch
    with torch.no_grad():
        for name, m in module.named_modules():
            if name.endswith("embed_tokens"):
                m.weight.mul_(m.weight.shape[1] ** -0.5)
    return module


def model_pair(name: str, cfg):
    """registry.model_pair with realistic_embeddings on the torch side (converted into JAX)."""
    build = _model_pair(name, cfg)

    def f(seed: int):
        t, j = build(seed)
        return realistic_embeddings(t), j
    f.model, f.cfg = build.model, build.cfg
    return f


def token_ids(batch: int, length: int, vocab: int, lengths=None, left: bool = False, pad_id: int = 0):
    """Random ids in [1, vocab); rows shorter than `length` padded with pad_id (right, or left)."""
    def make(rng):
        x = rng.randint(1, vocab, size=(batch, length)).astype(np.int32)
        for b, n in enumerate(lengths or []):
            if left:
                x[b, : length - n] = pad_id
            else:
                x[b, n:] = pad_id
        return x
    return make


def left_padding(batch: int, length: int, lengths) -> np.ndarray:
    return padding(batch, length, lengths)[:, ::-1].copy()


# ---------------------------------------------------------------- classifier
for tag, kw in {"postln_cls": dict(norm_position="post", pooling="cls"),
                "preln_mean": dict(norm_position="pre", pooling="mean", num_classes=5)}.items():
    cfg = ClassifierConfig.tiny(**kw)
    case(f"classifier_{tag}", "classifier_model", model_pair("classifier", cfg),
         lambda r: {"ids": token_ids(B, T, V, lengths=[7, 4])(r)})  # mask from pad_id
# RoBERTa (jaxformer/hf/roberta.py): positions from the padding, counted from pad_id + 1 = 2,
# rows padded on the right and on the left; the pooler (dense + tanh) before the head (§36)
case("classifier_roberta_positions_from_padding", "classifier_model",
     model_pair("classifier", ClassifierConfig.tiny(position="learned", positions_from_padding=True, pad_id=1,
                                                    type_vocab_size=1, embed_norm=True, final_norm=False,
                                                    scale_embedding=False, pooler=True, ffn="gelu")),
     lambda r: {"ids": np.concatenate([token_ids(1, T, V, lengths=[4], pad_id=1)(r),
                                       token_ids(1, T, V, lengths=[5], left=True, pad_id=1)(r)])})
# ModernBERT (jaxformer/hf/modernbert.py): global, local, local layers with a bidirectional
# window of 2 (|i - j| < 2) over T = 7, a RoPE base per layer type, no attn_norm before layer 0,
# the embedding and final norms, GeGLU without biases, mean pooling through dense + GELU + norm
case("classifier_modernbert_local_global", "classifier_model",
     model_pair("classifier", ClassifierConfig.tiny(
         num_layers=3, position="rope", rope_base=500.0, rope_local_base=20.0, sliding_window=2,
         layer_types=("full_attention", "sliding_attention", "sliding_attention"), norm_position="pre",
         first_attn_norm=False, embed_norm=True, scale_embedding=False, ffn="geglu", bias=False, norm_bias=False,
         pooling="mean", pooler=True, pooler_act="gelu", pooler_bias=False, pooler_norm=True)),
     lambda r: {"ids": token_ids(B, T, V, lengths=[7, 5])(r)})
case("classifier_preln_mean_intermediates", "classifier_model",
     model_pair("classifier", ClassifierConfig.tiny(norm_position="pre", pooling="mean")),
     lambda r: {"ids": token_ids(B, T, V, lengths=[5, 7])(r), "return_intermediates": True})

# ---------------------------------------------------------------- seq2seq (Vaswani et al. 2017)
S2S = {
    "shared_tied": dict(share_embeddings=True, tie_output=True),
    "separate_untied": dict(share_embeddings=False, tie_output=False, tgt_vocab_size=48,
                            num_decoder_layers=3, norm_position="pre"),
    "separate_tied": dict(share_embeddings=False, tie_output=True, tgt_vocab_size=40),
}
for tag, kw in S2S.items():
    cfg = Seq2SeqConfig.tiny(**kw)
    case(f"seq2seq_{tag}", "seq2seq_model", model_pair("seq2seq", cfg),
         lambda r, cfg=cfg: {"src_ids": token_ids(B, S, V, lengths=[6, 3])(r),
                             "tgt_ids": token_ids(B, T, cfg.resolved_tgt_vocab, lengths=[7, 5])(r)})
case("seq2seq_shared_tied_intermediates", "seq2seq_model",
     model_pair("seq2seq", Seq2SeqConfig.tiny()),
     lambda r: {"src_ids": token_ids(B, S, V, lengths=[4, 6])(r), "tgt_ids": token_ids(B, T, V)(r),
                "return_intermediates": True})

# T5 (jaxformer/hf/t5.py): relative position bias shared by each stack's layers (10 buckets,
# max distance 6: 6 source tokens reach the encoder's log-spaced buckets, 7 target tokens the
# decoder's saturated one),
# unscaled scores, RMSNorm, no biases, a head_dim of its own; v1.0 (ReLU, tied head rescaled
# by D ** -0.5, a left-padded source row) and v1.1 (gated tanh-GELU, untied head)
T5_SIZES = dict(TINY_SIZES, head_dim=6, rel_num_buckets=10, rel_max_distance=6, bos_id=0, eos_id=1)
for tag, kw in {"v10": {}, "v11": dict(ffn="geglu_tanh", tie_output=False, scale_decoder_output=False)}.items():
    case(f"seq2seq_t5_{tag}", "seq2seq_model", model_pair("seq2seq", Seq2SeqConfig.t5(**T5_SIZES, **kw)),
         lambda r: {"src_ids": token_ids(B, S, V, lengths=[6, 3], left=True)(r),
                    "tgt_ids": token_ids(B, T, V)(r), "src_mask": left_padding(B, S, [6, 3])})

# ---------------------------------------------------------------- causal LMs
LMS = {
    "gpt2": LMConfig.tiny("gpt2"),
    "llama_gqa": LMConfig.tiny("llama"),
    "llama_mqa": LMConfig.tiny("llama", num_kv_heads=1),
    "alibi_postln": LMConfig.tiny(position="alibi", norm_position="post", tie_embeddings=False),
    "t5bias_sliding_window": LMConfig.tiny(position="t5", norm_position="pre", sliding_window=4),
}
for tag, cfg in LMS.items():
    case(f"lm_{tag}", "lm_model", model_pair("lm", cfg), lambda r: {"ids": token_ids(B, T, V)(r)})
    case(f"lm_{tag}_left_padding", "lm_model", model_pair("lm", cfg),
         lambda r: {"ids": token_ids(B, T, V, lengths=[7, 4], left=True)(r),
                    "attention_mask": left_padding(B, T, [7, 4])})
# Default initialisation (N(0, 1) tied table, no rescaling): logits near 90, where one fp32 step
# is 7.6e-6; the relative rule must pass it (docs/numerics.md §17, §19).
case("lm_default_init_tied_d88", "lm_model",
     _model_pair("lm", LMConfig(vocab_size=200, d_model=88, num_heads=8, d_ff=352, num_layers=3, max_len=16,
                                position="learned", norm="layernorm", ffn="gelu_tanh", norm_position="pre",
                                scale_embedding=False, tie_embeddings=True)),
     lambda r: {"ids": token_ids(B, T, 200)(r)})
# RoPE with biases (an HF LLaMA with attention_bias): the key bias keeps its gradient (§15)
case("lm_llama_rope_bias", "lm_model", model_pair("lm", LMConfig.tiny("llama", bias=True)),
     lambda r: {"ids": token_ids(B, T, V)(r)})
# Llama 3.x RoPE scaling; Qwen2 (q/k/v biases only) and Qwen3 (q/k norms, no biases) as
# jaxformer/hf/qwen.py imports them
LLAMA3_ROPE = RopeScaling("llama3", 8.0, original_max_len=4, low_freq_factor=1.0, high_freq_factor=4.0)
case("lm_llama3_rope_scaling", "lm_model", model_pair("lm", LMConfig.tiny("llama", rope_scaling=LLAMA3_ROPE)),
     lambda r: {"ids": token_ids(B, T, V)(r)})
case("lm_dynamic_rope_left_padding", "lm_model",
     model_pair("lm", LMConfig.tiny("llama", rope_scaling=RopeScaling("dynamic", 2.0, original_max_len=4))),
     lambda r: {"ids": token_ids(B, T, V, lengths=[7, 4], left=True)(r),
                "attention_mask": left_padding(B, T, [7, 4])})
# Phi-3's longrope (§34): rows of 7 and 4 tokens, original_max_len 6, so the call takes the long
# factors while the short row's own positions stay below it
case("lm_longrope_left_padding", "lm_model",
     model_pair("lm", LMConfig.tiny("llama", rope_scaling=RopeScaling(
         "longrope", 4.0, original_max_len=6, short_factor=(1.0, 1.2, 1.5, 2.0), long_factor=(1.5, 3.0, 6.0, 11.0)))),
     lambda r: {"ids": token_ids(B, T, V, lengths=[7, 4], left=True)(r),
                "attention_mask": left_padding(B, T, [7, 4])})
case("lm_qwen2_qkv_bias", "lm_model",
     model_pair("lm", LMConfig.tiny("llama", bias=False, attn_qkv_bias=True)),
     lambda r: {"ids": token_ids(B, T, V)(r)})
case("lm_qwen3_qk_norm", "lm_model",
     model_pair("lm", LMConfig.tiny("llama", qk_norm=True, head_dim=12)),
     lambda r: {"ids": token_ids(B, T, V, lengths=[7, 4], left=True)(r),
                "attention_mask": left_padding(B, T, [7, 4])})
# Mistral (every layer within a window of 3 < T, jaxformer/hf/mistral.py) and alternating
# sliding/full layers (layer_types), with left padding (docs/numerics.md §21)
case("lm_mistral_sliding_window_left_padding", "lm_model",
     model_pair("lm", LMConfig.tiny("llama", sliding_window=3)),
     lambda r: {"ids": token_ids(B, T, V, lengths=[7, 4], left=True)(r),
                "attention_mask": left_padding(B, T, [7, 4])})
case("lm_layer_types_mixed_window", "lm_model",
     model_pair("lm", LMConfig.tiny("llama", num_layers=3, sliding_window=2,
                                    layer_types=("sliding_attention", "full_attention", "sliding_attention"))),
     lambda r: {"ids": token_ids(B, T, V)(r), "return_intermediates": True})
# Gemma2 (jaxformer/hf/gemma2.py): sqrt(D)-scaled tied embeddings, (1 + w) RMSNorm in sandwich
# position, GeGLU-tanh, query_pre_attn_scalar, attention and final logit soft-capping (caps
# small enough to bend), alternating sliding/full layers, left padding
GEMMA2 = LMConfig.tiny(position="rope", norm="rmsnorm_offset", norm_eps=1e-6, ffn="geglu_tanh",
                       norm_position="sandwich", bias=False, num_kv_heads=2, head_dim=12, scale_embedding=True,
                       tie_embeddings=True, num_layers=3, sliding_window=3,
                       layer_types=("sliding_attention", "full_attention", "sliding_attention"),
                       query_pre_attn_scalar=10.0, attn_logit_softcap=2.0, final_logit_softcap=1.5)
case("lm_gemma2_left_padding", "lm_model", model_pair("lm", GEMMA2),
     lambda r: {"ids": token_ids(B, T, V, lengths=[7, 4], left=True)(r),
                "attention_mask": left_padding(B, T, [7, 4])})
# GPT-NeoX (jaxformer/hf/gpt_neox.py): the first 6 of 12 dims of each head rotated (3
# frequencies), LayerNorm with biases, the parallel residual and the sequential block; OLMo 2
# (jaxformer/hf/olmo2.py): norms on the sublayer outputs only and q/k RMSNorm over the full
# projected width, GQA (docs/numerics.md §35); left padding. (The sequential GPT-NeoX block is
# the plain pre-norm one; partial rotary under scaling: pos_rope_partial_rotary_dynamic.)
NEOX = LMConfig.tiny("gpt2", position="rope", head_dim=12, rotary_dim=6, parallel_residual=True, ffn="gelu",
                     tie_embeddings=False, rope_base=500.0)
OLMO2 = LMConfig.tiny("llama", norm_position="post_sublayer", qk_norm_full=True, num_kv_heads=2, head_dim=12)
for tag, cfg in {"gpt_neox_partial_rotary_parallel": NEOX, "olmo2_post_sublayer_qk_norm_full": OLMO2}.items():
    case(f"lm_{tag}_left_padding", "lm_model", model_pair("lm", cfg),
         lambda r: {"ids": token_ids(B, T, V, lengths=[7, 4], left=True)(r),
                    "attention_mask": left_padding(B, T, [7, 4])})
# Gemma3 (jaxformer/hf/gemma3.py): Gemma2's layer with (1 + w) q/k norms and no caps; the
# sliding layers rotate with their own RoPE (base 50, linear 2) and the full ones with base 1e4
# scaled linear 4 (docs/numerics.md §33); left padding
GEMMA3 = LMConfig.tiny(position="rope", norm="rmsnorm_offset", norm_eps=1e-6, ffn="geglu_tanh",
                       norm_position="sandwich", bias=False, num_kv_heads=2, head_dim=12, scale_embedding=True,
                       tie_embeddings=True, num_layers=3, sliding_window=3, qk_norm=True,
                       layer_types=("sliding_attention", "full_attention", "sliding_attention"),
                       query_pre_attn_scalar=10.0, rope_scaling=RopeScaling("linear", 4.0), rope_local_base=50.0,
                       rope_local_scaling=RopeScaling("linear", 2.0))
case("lm_gemma3_local_rope_qk_norm_left_padding", "lm_model", model_pair("lm", GEMMA3),
     lambda r: {"ids": token_ids(B, T, V, lengths=[7, 4], left=True)(r),
                "attention_mask": left_padding(B, T, [7, 4])})
# The two configurations of issue 36 (docs/numerics.md §44), on the fused attention path: Gemma3
# with every layer sliding (window 3), query_pre_attn_scalar 7, head_dim 8 and a final cap of 3,
# rows of 0, 4 and 9 left pads (the padded queries of the last two rows see no key at all);
# a 2-layer LM with (1 + w) RMSNorm, scores scaled by 2, q/k/v biases and a window of 3
GEMMA3_SLIDING = LMConfig.tiny(position="rope", norm="rmsnorm_offset", norm_eps=1e-6, ffn="geglu_tanh",
                               norm_position="sandwich", bias=False, num_kv_heads=2, head_dim=8,
                               scale_embedding=True, tie_embeddings=True, num_layers=5, sliding_window=3,
                               qk_norm=True, layer_types=("sliding_attention",) * 5, query_pre_attn_scalar=7.0,
                               rope_local_base=1e4, final_logit_softcap=3.0)
case("lm_gemma3_all_sliding_final_cap_left_padding", "lm_model", model_pair("lm", GEMMA3_SLIDING),
     lambda r: {"ids": token_ids(3, 11, V, lengths=[11, 7, 2], left=True)(r),
                "attention_mask": left_padding(3, 11, [11, 7, 2])})
case("lm_rmsnorm_offset_scale2_qkv_bias_window", "lm_model",
     model_pair("lm", LMConfig.tiny(norm="rmsnorm_offset", attn_scale=2.0, attn_qkv_bias=True, sliding_window=3)),
     lambda r: {"ids": token_ids(B, T, V, lengths=[7, 4], left=True)(r),
                "attention_mask": left_padding(B, T, [7, 4])})
case("lm_gpt2_left_padding_position_ids", "lm_model", model_pair("lm", LMConfig.tiny("gpt2")),
     lambda r: {"ids": token_ids(B, T, V, lengths=[7, 4], left=True)(r),
                "attention_mask": left_padding(B, T, [7, 4]),
                "position_ids": np.stack([np.arange(2, 2 + T), np.r_[[0, 0, 0], np.arange(5, 9)]]).astype(np.int32)})
case("lm_gpt2_intermediates", "lm_model", model_pair("lm", LMConfig.tiny("gpt2")),
     lambda r: {"ids": token_ids(B, T, V)(r), "return_intermediates": True})

# ---------------------------------------------------------------- BERT options (HF import)
# Token type embeddings, the embedding LayerNorm and the pooler (TransformerConfig's BERT
# options) on a Post-LN encoder without a final norm, as jaxformer/hf/bert.py imports BERT.
from jaxformer.config import TransformerConfig

BERT = dict(position="learned", norm="layernorm", norm_eps=1e-12, ffn="gelu", norm_position="post",
            final_norm=False, bias=True, scale_embedding=False, type_vocab_size=2, embed_norm=True,
            pooler=True)


def token_types(batch: int, length: int, split: int):
    """Segment A (type 0) then segment B (type 1) from position `split`."""
    return lambda rng: (np.arange(length)[None, :] >= split).astype(np.int32).repeat(batch, 0)


def bert_inputs(**extra):
    return lambda r: {"ids": token_ids(B, T, V, lengths=[7, 4])(r), "attention_mask": padding(B, T, [7, 4]),
                      "token_type_ids": token_types(B, T, 3)(r), **extra}


case("encoder_bert", "encoder_model", model_pair("encoder", TransformerConfig(**TINY_SIZES, **BERT)), bert_inputs())
case("encoder_bert_intermediates", "encoder_model", model_pair("encoder", TransformerConfig(**TINY_SIZES, **BERT)),
     bert_inputs(return_intermediates=True))
case("encoder_bert_no_pooler_default_types", "encoder_model",
     model_pair("encoder", TransformerConfig(**TINY_SIZES, **{**BERT, "pooler": False})),
     lambda r: {"ids": token_ids(B, T, V)(r)})  # token_type_ids None = all type 0
case("classifier_bert", "classifier_model",
     model_pair("classifier", ClassifierConfig.tiny(**BERT, num_classes=3)), bert_inputs())
case("classifier_bert_preln_mean_pooler_no_types", "classifier_model",
     model_pair("classifier", ClassifierConfig.tiny(**{**BERT, "type_vocab_size": 0, "norm_position": "pre",
                                                       "final_norm": True}, pooling="mean")),
     lambda r: {"ids": token_ids(B, T, V, lengths=[7, 4])(r)})
