"""The table of HF families (timm's style): one Row (tests/hf_helpers.py) per (family, case), each
a tiny random HF model of an odd configuration (no download), checked by the one parametrized
test of tests/test_hf_table.py: import, logits within 1e-5 x max(1, max|logit|) in fp32 with a
left-padded row (docs/numerics.md §19), generation against HF generate where `generate` is set
(its greedy and beam loops compile for seconds per model, so on one or two cases a family),
the export loading back in transformers with identical logits. Each family's own checks
(refusals, odd options, other layouts) stay in its tests/test_hf_<family>.py, on the same
built models (hf_helpers.built).

Worst measured |logit| differences (fp32, printed by check_hf_logits, -s; docs/numerics.md):
llama / qwen 1.6e-6 (llama_dynamic, max |logit| 1.7-3.1, §19); Mistral 8.3e-7 (max |logit| 2.6)
and Gemma2 3.6e-6 (4.8, §21); Gemma3 5.4e-6 (4.5, default pattern, §33); GPT-NeoX 9.5e-7 (3.9,
§35); OLMo 2 1.3e-6 (2.6, §35); Phi-3 1.2e-6 (1.9-2.5, §34); ModernBERT 8.3e-7 (4.1) and
RoBERTa 7.2e-7 (1.6, §36).
"""
from __future__ import annotations

from functools import partial

import numpy as np
from hf_helpers import Row

ROWS: dict[str, Row] = {}


def rows(family: str, hf_class: str, batch: tuple, cases: dict, **common) -> None:
    """Add `family`'s cases: case -> dict of Row fields (config at least) over `common`."""
    for case, fields in cases.items():
        row = Row(family, case, fields.pop("hf_class", hf_class), **{"batch": batch, **common, **fields})
        ROWS[row.id] = row


def row(key: str) -> Row:
    """The row "family/case"."""
    return ROWS[key]


# ----------------------------------------------------------------------------- llama, qwen, gpt2
V = 64
SMALL = dict(vocab_size=V, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, bos_token_id=1, eos_token_id=2, pad_token_id=0)
NOT_QK = dict(qk_norm=False)
rows("llama_qwen", "LlamaForCausalLM", (1, 11, 3), {
    "llama_llama3": dict(config=dict(SMALL, max_position_embeddings=32, rope_parameters=dict(
        rope_type="llama3", rope_theta=500.0, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
        original_max_position_embeddings=8)), expect=NOT_QK),
    "llama_yarn_head_dim": dict(config=dict(SMALL, head_dim=12, max_position_embeddings=32, rope_parameters=dict(
        rope_type="yarn", rope_theta=1000.0, factor=4.0, beta_fast=8.0, original_max_position_embeddings=8)),
        expect=NOT_QK),
    # dynamic NTK grows the base past max_position_embeddings (8): the prompt is 11 long
    "llama_dynamic": dict(config=dict(SMALL, max_position_embeddings=8, rope_parameters=dict(
        rope_type="dynamic", rope_theta=100.0, factor=2.0)), max_len=64, expect=NOT_QK, export=True),
    "qwen2": dict(hf_class="Qwen2ForCausalLM", config=dict(SMALL, max_position_embeddings=32, rope_theta=500.0),
                  expect=NOT_QK, export=True),
    "qwen2_tied_mqa": dict(hf_class="Qwen2ForCausalLM", config=dict(
        SMALL, num_key_value_heads=1, max_position_embeddings=32, tie_word_embeddings=True, sliding_window=4),
        expect=NOT_QK),
    "qwen3_bias_head_dim": dict(hf_class="Qwen3ForCausalLM", config=dict(
        SMALL, head_dim=12, attention_bias=True, max_position_embeddings=32), expect=dict(qk_norm=True), export=True),
    "gpt2_tanh_gelu": dict(hf_class="GPT2LMHeadModel", config=dict(
        vocab_size=V, n_embd=32, n_layer=2, n_head=4, n_inner=56, n_positions=32, bos_token_id=1, eos_token_id=2,
        pad_token_id=0), expect=NOT_QK),
    "qwen3_linear_rope": dict(hf_class="Qwen3ForCausalLM", config=dict(
        SMALL, head_dim=8, max_position_embeddings=32,
        rope_parameters=dict(rope_type="linear", rope_theta=10000.0, factor=2.0)), expect=dict(qk_norm=True)),
}, export=False)  # the export round trip on the three of test_hf_families' greedy-with-eos-list test

# ----------------------------------------------------------------------------- Mistral, Gemma2
V = 96
SMALL = dict(vocab_size=V, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, bos_token_id=1, eos_token_id=2, pad_token_id=0,
             max_position_embeddings=64)
WINDOW_KEYS = ("sliding_window", "layer_types", "final_logit_softcapping", "attn_logit_softcapping",
               "query_pre_attn_scalar")
# windows shorter than the 11-token prompts; generation runs past them (ring caches)
rows("mistral", "MistralForCausalLM", (3, 11, 3), {
    "w3": dict(config=dict(SMALL, sliding_window=3, rope_theta=500.0), expect=dict(sliding_window=3)),
    "w5_mqa_head_dim_tied": dict(config=dict(SMALL, num_hidden_layers=3, num_key_value_heads=1, head_dim=12,
                                             sliding_window=5, tie_word_embeddings=True),
                                 expect=dict(sliding_window=5), generate=(12, 8)),
    # without a window it is LLaMA
    "no_window_linear_rope": dict(config=dict(SMALL, sliding_window=None, rope_parameters=dict(
        rope_type="linear", rope_theta=1000.0, factor=2.0)), expect=dict(sliding_window=None),
        export_class="LlamaForCausalLM", keys=()),
}, keys=WINDOW_KEYS)
rows("gemma2", "Gemma2ForCausalLM", (3, 11, 3), {
    # default layer_types (sliding, full, sliding); caps small enough that tanh bends the scores
    "default_layers_caps": dict(config=dict(
        SMALL, num_hidden_layers=3, head_dim=12, sliding_window=4, query_pre_attn_scalar=20,
        attn_logit_softcapping=2.0, final_logit_softcapping=3.0, bos_token_id=2, eos_token_id=1),
        expect={"sliding_window": 4, "norm_position": "sandwich", "local_layers()": (True, False, True)},
        generate=(12, 8)),
    "untied_gelu_bias_mqa_no_caps": dict(config=dict(
        SMALL, num_key_value_heads=1, head_dim=8, sliding_window=3, query_pre_attn_scalar=8,
        layer_types=["full_attention", "sliding_attention"], hidden_activation="gelu", attention_bias=True,
        tie_word_embeddings=False, attn_logit_softcapping=None, final_logit_softcapping=None,
        rope_parameters=dict(rope_type="default", rope_theta=300.0)),
        expect={"sliding_window": 3, "norm_position": "sandwich", "local_layers()": (False, True)}),
}, keys=WINDOW_KEYS)

# ----------------------------------------------------------------------------- Gemma3
V = 97
SMALL = dict(vocab_size=V, hidden_size=32, intermediate_size=48, num_attention_heads=4, num_key_value_heads=2,
             bos_token_id=2, eos_token_id=1, pad_token_id=0, max_position_embeddings=64)
GEMMA3 = dict(qk_norm=True, norm="rmsnorm_offset")
S, F = "sliding_attention", "full_attention"
rows("gemma3", "Gemma3ForCausalLM", (3, 11, 3), {
    # HF's default pattern (sliding_window_pattern 6): layers 0-4 and 6 sliding, 5 full; the
    # global RoPE base 1e6 scaled linear 8, the local one 1e4 unscaled (Gemma3's own values);
    # 11 + 12 tokens through a window of 4
    "default_pattern_linear_global_tied": dict(config=dict(
        SMALL, num_hidden_layers=7, head_dim=12, sliding_window=4, query_pre_attn_scalar=20,
        rope_parameters={"full_attention": dict(rope_type="linear", factor=8.0, rope_theta=1e6),
                         "sliding_attention": dict(rope_type="default", rope_theta=1e4)}),
        expect=dict(GEMMA3, layer_types=(S, S, S, S, S, F, S)), generate=(12, 8)),
    # a pattern of 2 (sliding, full, sliding), each kind scaled its own way; untied head, GeLU
    # (erf), biases, one kv head, a final logit cap small enough to bend
    "pattern2_local_scaled_untied_gelu_bias_mqa_cap": dict(config=dict(
        SMALL, num_hidden_layers=3, num_key_value_heads=1, head_dim=8, sliding_window=3, sliding_window_pattern=2,
        query_pre_attn_scalar=8, hidden_activation="gelu", attention_bias=True, tie_word_embeddings=False,
        final_logit_softcapping=3.0,
        rope_parameters={"full_attention": dict(rope_type="default", rope_theta=500.0),
                         "sliding_attention": dict(rope_type="linear", factor=2.0, rope_theta=50.0)}),
        expect=dict(GEMMA3, layer_types=(S, F, S))),
}, keys=("layer_types", "sliding_window", "rope_parameters", "query_pre_attn_scalar", "final_logit_softcapping",
         "attn_logit_softcapping", "tie_word_embeddings", "head_dim"))
del S, F

# ----------------------------------------------------------------------------- GPT-NeoX / Pythia
V = 89
SMALL = dict(vocab_size=V, hidden_size=48, intermediate_size=72, num_hidden_layers=2, bos_token_id=1,
             eos_token_id=2, pad_token_id=0, max_position_embeddings=64)
rows("gpt_neox", "GPTNeoXForCausalLM", (5, 10, 3), {
    # Pythia's layout: rotary_pct 0.25 of head_dim 24 -> 6, parallel, untied, exact GELU
    "pct25_parallel_untied": dict(config=dict(SMALL, num_attention_heads=2, rotary_pct=0.25, rotary_emb_base=500.0,
                                              use_parallel_residual=True, tie_word_embeddings=False),
                                  expect=dict(rotary_dim=6, parallel_residual=True), generate=(8, None)),
    # 0.5 of head_dim 12 -> 6, sequential, tied, tanh GELU, no attention biases, linear RoPE scaling
    "pct50_sequential_tied_linear": dict(config=dict(
        SMALL, num_attention_heads=4, hidden_act="gelu_new", use_parallel_residual=False,
        tie_word_embeddings=True, attention_bias=False, num_hidden_layers=3,
        rope_parameters=dict(rope_type="linear", factor=2.0, rope_theta=300.0, partial_rotary_factor=0.5)),
        expect=dict(rotary_dim=6, parallel_residual=False)),
}, keys=("use_parallel_residual", "tie_word_embeddings", "attention_bias", "hidden_act"),
   back_expect={"gpt_neox.layers.0.attention.rotary_ndims": 6})

# ----------------------------------------------------------------------------- OLMo 2
V = 83
SMALL = dict(vocab_size=V, hidden_size=40, intermediate_size=56, num_hidden_layers=2, bos_token_id=1,
             eos_token_id=2, pad_token_id=0, max_position_embeddings=64)
OLMO2 = dict(norm_position="post_sublayer", qk_norm_full=True, qk_norm=False)
rows("olmo2", "Olmo2ForCausalLM", (6, 9, 2), {
    # GQA (4 heads, 2 kv), head_dim 6 (not 40 / 4), linear RoPE scaling, untied
    "gqa_head_dim6_linear": dict(config=dict(SMALL, num_attention_heads=4, num_key_value_heads=2, head_dim=6,
                                             rope_parameters=dict(rope_type="linear", factor=2.0, rope_theta=700.0)),
                                 expect=dict(OLMO2, resolved_head_dim=6), generate=(8, None)),
    # MQA, head_dim 10 with 5 heads (50 != 40), attention biases, tied, yarn, 3 layers
    "mqa_bias_tied_yarn": dict(config=dict(SMALL, num_hidden_layers=3, num_attention_heads=5, num_key_value_heads=1,
                                           head_dim=10, attention_bias=True, tie_word_embeddings=True,
                                           rms_norm_eps=1e-6,
                                           rope_parameters=dict(rope_type="yarn", factor=2.0, rope_theta=1000.0,
                                                                original_max_position_embeddings=32)),
                               expect=dict(OLMO2, resolved_head_dim=10)),
}, keys=("num_key_value_heads", "head_dim", "tie_word_embeddings", "attention_bias"),
   subset_keys=("rope_parameters",))  # export also spells out yarn's defaults

# ----------------------------------------------------------------------------- Phi-3
V = 97
BASE = dict(vocab_size=V, intermediate_size=56, num_hidden_layers=2, bos_token_id=1, eos_token_id=2,
            pad_token_id=0, max_position_embeddings=40)


def longrope(n: int, seed: int, **kw) -> dict:
    r = np.random.RandomState(seed)
    return dict(rope_type="longrope", rope_theta=100.0, short_factor=[float(x) for x in 1 + r.rand(n)],
                long_factor=[float(x) for x in 2 + 20 * r.rand(n)], **kw)


def fused(heads: int, kv: int, head_dim: int) -> dict:
    """The loaded-back Phi-3 holds its fused projections, of these widths."""
    return {"model.layers.0.self_attn.qkv_proj.out_features": (heads + 2 * kv) * head_dim,
            "model.layers.0.mlp.gate_up_proj.out_features": 2 * BASE["intermediate_size"]}


# head_dim 10 with Phi-4-mini's partial rotary (factor 0.6: 6 of 10 dims rotate, 3 factors) and
# 12 (6 factors); original_max 9 and 8: the 11-token prompt runs the long factors (its first 7
# tokens, test_hf_phi3, the short ones). The export holds the fused qkv_proj / gate_up_proj.
rows("phi3", "Phi3ForCausalLM", (7, 11, 3), {
    "longrope_gqa_hd10_partial": dict(config=dict(
        BASE, hidden_size=40, num_attention_heads=4, num_key_value_heads=2, original_max_position_embeddings=9,
        rope_parameters=longrope(3, 0, partial_rotary_factor=0.6)), expect=dict(sliding_window=None, dropout=0),
        back_expect=fused(heads=4, kv=2, head_dim=10)),
    "longrope_attn_factor_window_mqa_tied": dict(config=dict(
        BASE, hidden_size=36, num_attention_heads=3, num_key_value_heads=1, num_hidden_layers=3,
        original_max_position_embeddings=8, sliding_window=5, tie_word_embeddings=True, resid_pdrop=0.1,
        rope_parameters=longrope(6, 1, factor=3.0, attention_factor=1.3)), expect=dict(sliding_window=5, dropout=0.1),
        back_expect=fused(heads=3, kv=1, head_dim=12)),
    "default_rope_window_dropout": dict(config=dict(
        BASE, hidden_size=32, num_attention_heads=4, num_key_value_heads=2, sliding_window=4, resid_pdrop=0.1,
        embd_pdrop=0.2, original_max_position_embeddings=6), expect=dict(sliding_window=4, dropout=0.1),
        back_expect=fused(heads=4, kv=2, head_dim=8)),
}, seed=3)

# ----------------------------------------------------------------------------- gpt-oss
V = 80
SMALL = dict(vocab_size=V, hidden_size=32, intermediate_size=24, num_hidden_layers=3, num_attention_heads=4,
             num_key_value_heads=2, head_dim=8, num_local_experts=5, num_experts_per_tok=2, sliding_window=3,
             max_position_embeddings=64, bos_token_id=1, eos_token_id=2, pad_token_id=0)
YARN = dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=16, rope_theta=500.0, beta_fast=8.0,
            beta_slow=1.0, truncate=False)
OSS_KEYS = ("layer_types", "swiglu_limit", "swiglu_alpha", "num_local_experts", "num_experts_per_tok",
            "attention_bias", "rope_parameters")
# windows shorter than the 11-token prompts; limits small enough that the clamps bite; the export
# is save_pretrained's state_dict (fused, interleaved gate_up_proj) value for value
rows("gpt_oss", "GptOssForCausalLM", (5, 11, 3), {
    "default_layers_yarn_limit": dict(config=dict(SMALL, swiglu_limit=1.5, rope_parameters=YARN),
                                      generate=(12, 8), keys=OSS_KEYS + ("sliding_window",)),
    "mqa_top3_full_first_no_bias": dict(config=dict(
        SMALL, num_key_value_heads=1, num_experts_per_tok=3, num_hidden_layers=2,
        layer_types=["full_attention", "sliding_attention"], attention_bias=False, swiglu_alpha=1.2,
        swiglu_limit=0.8, tie_word_embeddings=True, rope_parameters=dict(rope_type="default", rope_theta=300.0)),
        keys=OSS_KEYS + ("sliding_window",)),
    "head_dim_12_e7_top1_all_full": dict(config=dict(
        SMALL, head_dim=12, num_local_experts=7, num_experts_per_tok=1, layer_types=["full_attention"] * 3,
        intermediate_size=20, eos_token_id=[2, 5], rope_parameters=dict(YARN, truncate=True, factor=2.0)),
        keys=OSS_KEYS),
}, expect={"attn_sinks": True, "moe.router": "topk_softmax"}, same_weights=True)

# ----------------------------------------------------------------------------- Mixtral, Qwen2-MoE, Qwen3-MoE
V = 96
SMALL = dict(vocab_size=V, hidden_size=32, intermediate_size=40, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, bos_token_id=1, eos_token_id=2, pad_token_id=0, max_position_embeddings=64)
MOE_KEYS = ("num_experts", "num_local_experts", "num_experts_per_tok", "norm_topk_prob", "sliding_window",
            "qkv_bias", "attention_bias", "shared_expert_intermediate_size", "moe_intermediate_size")
# odd expert counts, top_k, head counts; dense layers, the shared expert, norm_topk_prob and
# biases on and off; the export holds save_pretrained's per-expert keys
MOE = partial(dict, keys=MOE_KEYS, same_files=True)
rows("moe", "MixtralForCausalLM", (5, 11, 3), {
    # the window is shorter than the prompt: the ring cache
    "mixtral_e5_k2_window4": MOE(config=dict(SMALL, num_local_experts=5, num_experts_per_tok=2, sliding_window=4),
                                 expect={"sparse_layers()": (True, True)}, generate=(10, 6)),
    "mixtral_e3_k3_mqa_head12_tied": MOE(config=dict(
        SMALL, num_hidden_layers=3, num_attention_heads=3, num_key_value_heads=1, head_dim=12, num_local_experts=3,
        num_experts_per_tok=3, tie_word_embeddings=True, intermediate_size=20),
        expect={"sparse_layers()": (True, True, True)}),
    "qwen2_moe_e5_k3_dense1": MOE(hf_class="Qwen2MoeForCausalLM", config=dict(
        SMALL, num_hidden_layers=3, num_experts=5, num_experts_per_tok=3, moe_intermediate_size=16,
        shared_expert_intermediate_size=20, mlp_only_layers=[1]), expect={"sparse_layers()": (True, False, True)}),
    "qwen2_moe_e7_k2_norm_nobias_step2": MOE(hf_class="Qwen2MoeForCausalLM", config=dict(
        SMALL, num_hidden_layers=2, num_attention_heads=6, num_key_value_heads=3, head_dim=6, num_experts=7,
        num_experts_per_tok=2, moe_intermediate_size=12, shared_expert_intermediate_size=8, norm_topk_prob=True,
        qkv_bias=False, decoder_sparse_step=2), expect={"sparse_layers()": (False, True)}, generate=(10, None)),
    "qwen3_moe_e5_k3_head12": MOE(hf_class="Qwen3MoeForCausalLM", config=dict(
        SMALL, num_experts=5, num_experts_per_tok=3, moe_intermediate_size=16, head_dim=12),
        expect={"sparse_layers()": (True, True)}, generate=(10, None)),
    "qwen3_moe_e4_k1_norm_bias_dense0": MOE(hf_class="Qwen3MoeForCausalLM", config=dict(
        SMALL, num_hidden_layers=3, num_attention_heads=5, num_key_value_heads=5, head_dim=8, num_experts=4,
        num_experts_per_tok=1, moe_intermediate_size=8, norm_topk_prob=True, attention_bias=True,
        mlp_only_layers=[0]), expect={"sparse_layers()": (False, True, True)}),
})


# ----------------------------------------------------------------------------- DeepSeek-V3
def randomize_router_bias(model, seed: int = 3):
    """Every e_score_correction_bias redrawn (HF initialises the buffer to zeros, and
    helpers.randomize leaves buffers alone), at the scale of the sigmoid scores' spread, so the
    choosing-only bias moves some choices but not all."""
    import torch
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, buf in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                buf.copy_(torch.randn(buf.shape, generator=g) * 0.1)
    return model


V = 80
BASE = dict(vocab_size=V, hidden_size=32, intermediate_size=40, num_hidden_layers=2, bos_token_id=1, eos_token_id=2,
            pad_token_id=0, max_position_embeddings=64)
# q_lora and plain q; grouped choice with topk_group < n_group; a dense first layer and an
# all-sparse stack; YaRN with mscale != mscale_all_dim; both rope layouts. Expert widths are
# multiples of 4: HF's grouped_mm experts need 16-byte strides. Generation on one case: each
# search compiles for over 10 s, and the plain-q decode step is checked against full recompute
# in tests/test_mla.py.
rows("deepseek", "DeepseekV3ForCausalLM", (5, 11, 3), {
    "qlora_yarn_e8_g4_dense0": dict(config=dict(
        BASE, num_attention_heads=4, num_key_value_heads=4, q_lora_rank=10, kv_lora_rank=12, qk_nope_head_dim=6,
        qk_rope_head_dim=4, v_head_dim=10, n_routed_experts=8, num_experts_per_tok=3, n_group=4, topk_group=2,
        moe_intermediate_size=12, n_shared_experts=1, first_k_dense_replace=1, routed_scaling_factor=2.5,
        attention_bias=True, rope_parameters=dict(rope_type="yarn", rope_theta=500.0, factor=4.0,
                                                  original_max_position_embeddings=16, mscale=0.9,
                                                  mscale_all_dim=1.3, beta_fast=8.0, beta_slow=1.0)),
        expect={"sparse_layers()": (False, True)}, generate=(8, 5)),
    "plainq_e6_g3_shared2_tied": dict(config=dict(
        BASE, num_attention_heads=3, num_key_value_heads=3, q_lora_rank=None, kv_lora_rank=9, qk_nope_head_dim=5,
        qk_rope_head_dim=6, v_head_dim=7, n_routed_experts=6, num_experts_per_tok=2, n_group=3, topk_group=1,
        moe_intermediate_size=8, n_shared_experts=2, first_k_dense_replace=0, norm_topk_prob=False,
        routed_scaling_factor=1.5, rope_interleave=False, tie_word_embeddings=True),
        expect={"sparse_layers()": (True, True)}),
}, prepare=randomize_router_bias, same_files=True)  # config.json's keys and types: test_hf_deepseek

# ----------------------------------------------------------------------------- ModernBERT, RoBERTa
V = 97
BASE = dict(vocab_size=V, hidden_size=48, intermediate_size=40, num_hidden_layers=3, num_attention_heads=4,
            max_position_embeddings=64, pad_token_id=0, bos_token_id=1, eos_token_id=2, cls_token_id=1,
            sep_token_id=2, global_rope_theta=500.0, local_rope_theta=50.0)
# windows (local_attention 2 to 5) much shorter than the 11-token rows; no attn_norm before
# layer 0, the embedding and final norms; sliding_window counts the query: local_attention // 2 + 1
MODERN = dict(first_attn_norm=False, embed_norm=True, final_norm=True)
CLS = "ModernBertForSequenceClassification"
rows("modernbert", "ModernBertModel", (0,), {
    # global, local, global; no biases (ModernBERT's default)
    "model_w4_every2": dict(config=dict(BASE, local_attention=4, global_attn_every_n_layers=2), auto="AutoModel",
                            expect={**MODERN, "local_layers()": (False, True, False), "sliding_window": 3,
                                    "rope_base": 500.0, "rope_local_base": 50.0}),
    # an odd window (5 -> |i - j| <= 2), biases everywhere, the tanh GELU, mean pooling
    "cls_mean_w5_biases_tanh_gelu": dict(hf_class=CLS, config=dict(
        BASE, local_attention=5, global_attn_every_n_layers=3, attention_bias=True, mlp_bias=True, norm_bias=True,
        classifier_bias=True, hidden_activation="gelu_pytorch_tanh", classifier_pooling="mean", num_labels=3,
        norm_eps=1e-6), expect={**MODERN, "local_layers()": (False, True, True), "sliding_window": 3,
                                "rope_base": 500.0, "rope_local_base": 50.0}),
    # layer 0 local (layer_types given), SwiGLU, a silu head, cls pooling, 6 heads of 6
    "cls_w2_local_first_silu": dict(hf_class=CLS, config=dict(
        BASE, hidden_size=36, num_attention_heads=6, intermediate_size=24, local_attention=2,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"], hidden_activation="silu",
        classifier_activation="silu", classifier_pooling="cls", num_labels=2,
        rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1000.0},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 20.0}}),
        expect={**MODERN, "local_layers()": (True, False, True), "sliding_window": 2, "rope_base": 1000.0,
                "rope_local_base": 20.0}),
}, kind="encoder", auto="AutoModelForSequenceClassification")
del CLS

V = 97
BASE = dict(vocab_size=V, hidden_size=48, num_hidden_layers=2, num_attention_heads=4, intermediate_size=72,
            max_position_embeddings=40)
# positions derived from the padding, pad ids 1 (RoBERTa's) and 2 (odd); the classification
# head as pooler + classifier
ROBERTA = dict(positions_from_padding=True, pooler=True)
rows("roberta", "RobertaForSequenceClassification", (1,), {
    "roberta_model_pooler": dict(hf_class="RobertaModel", config=dict(BASE, type_vocab_size=1, pad_token_id=1),
                                 auto="AutoModel", expect=dict(ROBERTA, pad_id=1)),
    "roberta_cls_gelu_new_3_layers": dict(config=dict(
        BASE, num_hidden_layers=3, hidden_size=36, num_attention_heads=3, intermediate_size=50, hidden_act="gelu_new",
        num_labels=3, pad_token_id=1, layer_norm_eps=1e-5), expect=dict(ROBERTA, pad_id=1)),
    "xlmr_cls_pad2_types2": dict(hf_class="XLMRobertaForSequenceClassification", config=dict(
        BASE, type_vocab_size=2, pad_token_id=2, num_labels=5, max_position_embeddings=16),
        batch=(2,), expect=dict(ROBERTA, pad_id=2)),
}, kind="encoder", auto="AutoModelForSequenceClassification")
