"""The worst fp32 logit difference against transformers per HF family (docs/huggingface.md,
"Supported models"), over two random seeds of a few odd tiny configurations each; the tests check
the same bound on their own configurations. Not a test: it prints one JSON object.

    python docs/measure_hf_diffs.py
"""
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
import jax.numpy as jnp
import numpy as np
import torch
import transformers as T
from helpers import randomize

from jaxformer import hf
from jaxformer.parity import setup_precision

setup_precision()
rng = np.random.RandomState(0)
out: dict[str, list] = {}  # family -> [(max |diff|, max |logit|)]


def lm_check(fam, cls, kw, seeds=(0, 1)):
    """Causal LMs: a left-padded batch, positions counting real tokens (as HF generate)."""
    for s in seeds:
        torch.manual_seed(s)
        m = randomize(cls(cls.config_class(**kw)), seed=s)
        for n, b in m.named_buffers():  # DeepSeek-V3's choosing-only router bias (HF: zeros)
            if n.endswith("e_score_correction_bias"):
                b.copy_(torch.randn(b.shape) * 0.1)
        d = tempfile.mkdtemp(); m.save_pretrained(d)
        j, name, cfg = hf.from_pretrained(d)
        V = kw["vocab_size"]
        ids = rng.randint(3, V, size=(2, 9)); mask = np.ones_like(ids); mask[1, :3] = 0
        mt = torch.from_numpy(mask)
        with torch.no_grad():
            ref = m(torch.from_numpy(ids), attention_mask=mt, position_ids=(mt.cumsum(-1) - 1).clamp(min=0)).logits.numpy()
        ours = np.asarray(j(jnp.asarray(ids), jnp.asarray(mask)))
        real = mask.astype(bool)
        diff = float(np.abs(ref[real] - ours[real]).max()); mx = float(np.abs(ref[real]).max())
        out.setdefault(fam, []).append((diff, mx))


SMALL = dict(vocab_size=97, hidden_size=48, intermediate_size=80, num_hidden_layers=3, num_attention_heads=6,
             num_key_value_heads=2, bos_token_id=1, eos_token_id=2, pad_token_id=0, max_position_embeddings=64)
lm_check("gpt2", T.GPT2LMHeadModel, dict(vocab_size=97, n_embd=48, n_layer=3, n_head=6, n_positions=64, bos_token_id=1, eos_token_id=2))
lm_check("gpt2", T.GPT2LMHeadModel, dict(vocab_size=131, n_embd=36, n_layer=2, n_head=3, n_inner=50, n_positions=40, activation_function="gelu", bos_token_id=1, eos_token_id=2))
lm_check("llama", T.LlamaForCausalLM, SMALL)
lm_check("llama", T.LlamaForCausalLM, dict(SMALL, head_dim=10, tie_word_embeddings=True, rope_parameters=dict(rope_type="llama3", rope_theta=500.0, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=8)))
lm_check("qwen2", T.Qwen2ForCausalLM, SMALL)
lm_check("qwen3", T.Qwen3ForCausalLM, dict(SMALL, head_dim=12, attention_bias=True))
lm_check("mistral", T.MistralForCausalLM, dict(SMALL, sliding_window=4))
lm_check("gemma2", T.Gemma2ForCausalLM, dict(SMALL, head_dim=16, sliding_window=4, query_pre_attn_scalar=20, attn_logit_softcapping=5.0, final_logit_softcapping=3.0))
# mixtures of experts: odd expert counts and top_k, a dense layer, the shared expert, norm_topk_prob
lm_check("mixtral", T.MixtralForCausalLM, dict(SMALL, num_local_experts=5, num_experts_per_tok=2, sliding_window=4))
lm_check("mixtral", T.MixtralForCausalLM, dict(SMALL, num_local_experts=7, num_experts_per_tok=3, num_key_value_heads=1, head_dim=12, tie_word_embeddings=True))
lm_check("qwen2_moe", T.Qwen2MoeForCausalLM, dict(SMALL, num_experts=5, num_experts_per_tok=3, moe_intermediate_size=24, shared_expert_intermediate_size=40, mlp_only_layers=[1]))
lm_check("qwen2_moe", T.Qwen2MoeForCausalLM, dict(SMALL, num_experts=7, num_experts_per_tok=2, moe_intermediate_size=16, shared_expert_intermediate_size=20, norm_topk_prob=True, qkv_bias=False, decoder_sparse_step=2))
lm_check("qwen3_moe", T.Qwen3MoeForCausalLM, dict(SMALL, num_experts=5, num_experts_per_tok=3, moe_intermediate_size=24, head_dim=12))
lm_check("qwen3_moe", T.Qwen3MoeForCausalLM, dict(SMALL, num_experts=9, num_experts_per_tok=1, moe_intermediate_size=16, head_dim=8, norm_topk_prob=True, attention_bias=True, mlp_only_layers=[0]))


def enc_check(fam, cls, kw, inputs):
    """Encoders and image classifiers (jaxformer's images are NHWC)."""
    for s in (0, 1):
        m = randomize(cls(cls.config_class(**kw)), seed=s)
        d = tempfile.mkdtemp(); m.save_pretrained(d)
        j, name, cfg = hf.from_pretrained(d)
        with torch.no_grad():
            o = m(**{k: torch.from_numpy(v) for k, v in inputs.items()})
        ref = (o.logits if hasattr(o, "logits") else o.last_hidden_state).numpy()
        if name in ("vit", "swin"):
            x = jnp.asarray(inputs["pixel_values"].transpose(0, 2, 3, 1))
            if ref.ndim == 3:  # Dinov2Model: last_hidden_state, the final norm's output
                ours = np.asarray(j(x, return_intermediates=True)[1]["encoder.final_norm"])
            else:
                ours = np.asarray(j(x))
        else:
            ours = j(jnp.asarray(inputs["input_ids"]), jnp.asarray(inputs["attention_mask"]).astype(bool))
            ours = np.asarray(ours[0] if isinstance(ours, tuple) else ours)  # (hidden, pooled): hidden
        if ref.ndim == 3 and "attention_mask" in inputs:
            real = inputs["attention_mask"].astype(bool); ref, ours = ref[real], ours[real]
        out.setdefault(fam, []).append((float(np.abs(ref - ours).max()), float(np.abs(ref).max())))


ids = rng.randint(3, 97, size=(2, 9)); am = np.ones_like(ids); am[1, 6:] = 0
bert = dict(vocab_size=97, hidden_size=48, num_hidden_layers=2, num_attention_heads=4, intermediate_size=72, max_position_embeddings=32)
enc_check("bert_cls", T.BertForSequenceClassification, dict(bert, num_labels=3), {"input_ids": ids, "attention_mask": am})
# RoBERTa / XLM-R and ModernBERT (docs/numerics.md §36): rows padded on the right and on the left
# with the pad id (RoBERTa's positions come from it); ModernBERT windows shorter than the 11 tokens;
# their own RandomState leaves the other families' inputs as before
pid = np.random.RandomState(36).randint(3, 97, size=(3, 11)); pam = np.ones_like(pid); pam[1, 7:] = 0; pam[2, :3] = 0
rob = dict(bert, max_position_embeddings=40, type_vocab_size=1)
enc_check("roberta", T.RobertaModel, rob, {"input_ids": np.where(pam == 1, pid, 1), "attention_mask": pam})
enc_check("roberta", T.XLMRobertaForSequenceClassification, dict(rob, num_labels=3, pad_token_id=2, num_hidden_layers=3, hidden_act="gelu_new"), {"input_ids": np.where(pam == 1, pid, 2), "attention_mask": pam})
mb = dict(vocab_size=97, hidden_size=48, intermediate_size=40, num_hidden_layers=3, num_attention_heads=4, max_position_embeddings=64, pad_token_id=0, bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2, global_rope_theta=500.0, local_rope_theta=50.0)
enc_check("modernbert", T.ModernBertModel, dict(mb, local_attention=4, global_attn_every_n_layers=2), {"input_ids": np.where(pam == 1, pid, 0), "attention_mask": pam})
enc_check("modernbert", T.ModernBertForSequenceClassification, dict(mb, local_attention=5, num_labels=3, classifier_pooling="mean", attention_bias=True, mlp_bias=True, norm_bias=True, classifier_bias=True, hidden_activation="gelu_pytorch_tanh"), {"input_ids": np.where(pam == 1, pid, 0), "attention_mask": pam})
px = rng.randn(2, 3, 32, 32).astype(np.float32)
enc_check("vit", T.ViTForImageClassification, dict(image_size=32, patch_size=8, hidden_size=48, num_hidden_layers=2, num_attention_heads=4, intermediate_size=72, num_labels=5, qkv_bias=False), {"pixel_values": px})
enc_check("swin", T.SwinForImageClassification, dict(image_size=32, patch_size=4, embed_dim=16, depths=[2, 2], num_heads=[2, 4], window_size=4, num_labels=5, layer_norm_eps=1e-6), {"pixel_values": px})
# DINOv2 at sizes other than the config's (bicubic positions, docs/numerics.md §37); its own
# RandomState, so that the families below keep their inputs
dino_rng = np.random.RandomState(37)
enc_check("dinov2", T.Dinov2ForImageClassification, dict(image_size=32, patch_size=8, hidden_size=36, num_hidden_layers=2, num_attention_heads=3, mlp_ratio=3, layerscale_value=0.37, num_labels=5), {"pixel_values": dino_rng.randn(2, 3, 24, 40).astype(np.float32)})
enc_check("dinov2", T.Dinov2Model, dict(image_size=20, patch_size=4, hidden_size=40, num_hidden_layers=2, num_attention_heads=5, mlp_ratio=2, use_swiglu_ffn=True, qkv_bias=False, hidden_act="gelu_pytorch_tanh", layer_norm_eps=1e-5), {"pixel_values": dino_rng.randn(2, 3, 28, 16).astype(np.float32)})
# DeepSeek-V3 last: its draws from `rng` leave the other families' inputs as before
DS = dict(SMALL, num_key_value_heads=6, kv_lora_rank=12, qk_nope_head_dim=6, qk_rope_head_dim=4, v_head_dim=10,
          n_routed_experts=8, num_experts_per_tok=3, n_group=4, topk_group=2, moe_intermediate_size=12,
          first_k_dense_replace=1)
lm_check("deepseek_v3", T.DeepseekV3ForCausalLM, dict(DS, q_lora_rank=10, attention_bias=True, rope_parameters=dict(
    rope_type="yarn", rope_theta=500.0, factor=4.0, original_max_position_embeddings=16, mscale=0.9, mscale_all_dim=1.3)))
lm_check("deepseek_v3", T.DeepseekV3ForCausalLM, dict(DS, num_attention_heads=5, num_key_value_heads=5, q_lora_rank=None,
         n_routed_experts=6, n_group=3, topk_group=1, num_experts_per_tok=2, n_shared_experts=2,
         first_k_dense_replace=0, norm_topk_prob=False, rope_interleave=False, tie_word_embeddings=True))
# Phi-3 last, for the same reason: longrope with short != long factors; the 9-token batch runs the
# long ones past original_max 8, the short ones within 16; fused qkv_proj / gate_up_proj
lm_check("phi3", T.Phi3ForCausalLM, dict(SMALL, original_max_position_embeddings=8, rope_parameters=dict(
    rope_type="longrope", rope_theta=100.0, short_factor=[1.0, 1.3, 1.9, 2.6], long_factor=[1.5, 4.0, 9.0, 20.0])))
lm_check("phi3", T.Phi3ForCausalLM, dict(SMALL, hidden_size=40, num_attention_heads=4, num_key_value_heads=1,
         sliding_window=5, tie_word_embeddings=True, original_max_position_embeddings=16, rope_parameters=dict(
             rope_type="longrope", rope_theta=500.0, attention_factor=1.2, short_factor=[1.0, 1.1, 1.4, 2.0, 2.5],
             long_factor=[2.0, 3.0, 5.0, 8.0, 13.0])))
# GPT-NeoX (partial rotary 6 of 12 and 6 of 20 dims, parallel and sequential blocks) and OLMo 2
# (post-sublayer norms, full-width q/k norms; GQA / MQA, odd head_dim, RoPE scaling), §35
NEOX = dict(vocab_size=97, hidden_size=48, intermediate_size=80, num_hidden_layers=3, num_attention_heads=4,
            bos_token_id=1, eos_token_id=2, pad_token_id=0, max_position_embeddings=64)
lm_check("gpt_neox", T.GPTNeoXForCausalLM, dict(NEOX, rotary_pct=0.5, rotary_emb_base=500.0, use_parallel_residual=True))
lm_check("gpt_neox", T.GPTNeoXForCausalLM, dict(NEOX, hidden_size=40, num_attention_heads=2, rotary_pct=0.3, hidden_act="gelu_new",
         use_parallel_residual=False, tie_word_embeddings=True, attention_bias=False,
         rope_parameters=dict(rope_type="linear", factor=2.0, rope_theta=300.0, partial_rotary_factor=0.3)))
lm_check("olmo2", T.Olmo2ForCausalLM, dict(SMALL, head_dim=10))
lm_check("olmo2", T.Olmo2ForCausalLM, dict(SMALL, num_key_value_heads=1, head_dim=6, attention_bias=True, tie_word_embeddings=True,
         rope_parameters=dict(rope_type="llama3", rope_theta=500.0, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                              original_max_position_embeddings=8)))
# Gemma3 (after DeepSeek-V3 for the same reason): HF's default pattern of 6 (7 layers: both
# kinds), the global RoPE scaled linear 8; a pattern of 2 with a scaled local RoPE and yarn on
# the global one, biases, MQA, GeLU, an untied head and a final logit cap
lm_check("gemma3", T.Gemma3ForCausalLM, dict(SMALL, num_hidden_layers=7, head_dim=16, sliding_window=4, query_pre_attn_scalar=20, rope_parameters=dict(
    full_attention=dict(rope_type="linear", rope_theta=1e6, factor=8.0), sliding_attention=dict(rope_type="default", rope_theta=1e4))))
lm_check("gemma3", T.Gemma3ForCausalLM, dict(SMALL, num_hidden_layers=4, num_key_value_heads=1, head_dim=12, sliding_window=3, sliding_window_pattern=2,
         query_pre_attn_scalar=12, hidden_activation="gelu", attention_bias=True, tie_word_embeddings=False, final_logit_softcapping=3.0,
         rope_parameters=dict(full_attention=dict(rope_type="yarn", rope_theta=500.0, factor=4.0, original_max_position_embeddings=16),
                              sliding_attention=dict(rope_type="linear", rope_theta=50.0, factor=2.0))))
print(json.dumps({k: {"worst_diff": max(d for d, _ in v), "tol_share": max(d / (1e-5 * max(1, m)) for d, m in v), "max_logit": max(m for _, m in v), "runs": len(v)} for k, v in out.items()}, indent=0))
