"""Hugging Face transformers decoder-only language models outside jaxformer's own families (issue 47
§7), each its `*ForCausalLM` modeling class from a tiny config with random weights (no download):
vocab 64, hidden 32, 2 layers, 4 heads, seq 8, batch 2, use_cache=False. The attention
implementation is set explicitly per model; the second row of `attention_mask` is right-padded
(its last two tokens masked) where the model takes a mask. Outputs are the models' own
CausalLMOutput objects (logits), as they return them.

  - OPT (OPTForCausalLM): learned positions offset by 2 (computed from the attention mask's
    cumsum), post-projection `project_out` off, ReLU MLP; eager.
  - Falcon (FalconForCausalLM): the 7B layout (multi-query, parallel attention+MLP, rotary); sdpa.
  - Bloom (BloomForCausalLM): ALiBi biases added with `baddbmm(alibi, q, k, beta=, alpha=)`,
    embedding LayerNorm, word embeddings tied to lm_head; eager.
  - MPT (MptForCausalLM): ALiBi built with a symbolic slice bound (`alibi[:, :, :, -seq:]` style),
    no biases, tied head; eager.
  - GPT-J (GPTJForCausalLM): interleaved rotary on a partial rotary_dim, parallel residual; eager.
  - GPT-Neo (GPTNeoForCausalLM): alternating global/local attention layers (window 4),
    unscaled attention scores; eager.
  - CodeGen (CodeGenForCausalLM): fused qkv with CodeGen's mp_num=4 split, interleaved partial
    rotary; eager.
  - GPTBigCode (GPTBigCodeForCausalLM): multi-query attention with fused c_attn; eager.
  - StableLM (StableLmForCausalLM): LayerNorm, partial rotary (25%), qkv bias; sdpa.
  - Persimmon (PersimmonForCausalLM): squared-ReLU MLP, qk LayerNorm, partial rotary; eager.
  - Phi (PhiForCausalLM, phi-1/2): parallel attention+MLP with one LayerNorm, partial rotary,
    gelu_new, lm_head with bias; eager.
  - Starcoder2 (Starcoder2ForCausalLM): GQA, sliding window, biased projections; sdpa.
  - Cohere (CohereForCausalLM): a LayerNorm without bias, interleaved rotary, logit_scale,
    parallel block, tied head; eager.
"""
import numpy as np
import torch

B, T, V = 2, 8, 64


def _ids(seed):
    return np.random.RandomState(seed).randint(0, V, size=(B, T)).astype(np.int64)


def _mask():
    m = np.ones((B, T), np.int64)
    m[1, 6:] = 0
    return m


def _perturb_norms(model):
    """Norm weights/biases away from their ones/zeros init, so a dropped scale or shift shows."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            low = name.lower()
            if ("norm" in low or "ln" in low) and p.ndim == 1:
                p.add_(torch.randn_like(p) * 0.1)
    return model


def _build(config_cls, model_cls, seed, *, mask=True, **cfg):
    torch.manual_seed(seed)
    config = config_cls(vocab_size=V, use_cache=False, bos_token_id=1, eos_token_id=2, pad_token_id=0, **cfg)
    model = _perturb_norms(model_cls(config).eval())
    inputs = {"input_ids": _ids(seed)}
    if mask:
        inputs["attention_mask"] = _mask()
    return model, inputs


def opt():
    from transformers import OPTConfig, OPTForCausalLM
    return _build(OPTConfig, OPTForCausalLM, 10, hidden_size=32, num_hidden_layers=2, ffn_dim=64,
                  num_attention_heads=4, max_position_embeddings=32, word_embed_proj_dim=32,
                  attn_implementation="eager")


def falcon():
    from transformers import FalconConfig, FalconForCausalLM
    return _build(FalconConfig, FalconForCausalLM, 11, hidden_size=32, num_hidden_layers=2,
                  num_attention_heads=4, multi_query=True, parallel_attn=True, new_decoder_architecture=False,
                  alibi=False, bias=False, max_position_embeddings=32, attn_implementation="sdpa")


def bloom():
    from transformers import BloomConfig, BloomForCausalLM
    return _build(BloomConfig, BloomForCausalLM, 12, hidden_size=32, n_layer=2, n_head=4,
                  attn_implementation="eager")


def mpt():
    from transformers import MptConfig, MptForCausalLM
    return _build(MptConfig, MptForCausalLM, 13, d_model=32, n_layers=2, n_heads=4, expansion_ratio=2,
                  max_seq_len=32, attn_implementation="eager")


def gptj():
    from transformers import GPTJConfig, GPTJForCausalLM
    return _build(GPTJConfig, GPTJForCausalLM, 14, n_embd=32, n_layer=2, n_head=4, rotary_dim=4,
                  n_positions=32, n_inner=64, attn_implementation="eager")


def gpt_neo():
    from transformers import GPTNeoConfig, GPTNeoForCausalLM
    return _build(GPTNeoConfig, GPTNeoForCausalLM, 15, hidden_size=32, num_layers=2, num_heads=4,
                  attention_types=[[["global", "local"], 1]], window_size=4, max_position_embeddings=32,
                  intermediate_size=64, attn_implementation="eager")


def codegen():
    from transformers import CodeGenConfig, CodeGenForCausalLM
    return _build(CodeGenConfig, CodeGenForCausalLM, 16, n_embd=32, n_layer=2, n_head=4, rotary_dim=4,
                  n_positions=32, n_ctx=32, n_inner=64, attn_implementation="eager")


def gpt_bigcode():
    from transformers import GPTBigCodeConfig, GPTBigCodeForCausalLM
    return _build(GPTBigCodeConfig, GPTBigCodeForCausalLM, 17, n_embd=32, n_layer=2, n_head=4,
                  n_positions=32, n_inner=64, multi_query=True, attn_implementation="eager")


def stablelm():
    from transformers import StableLmConfig, StableLmForCausalLM
    return _build(StableLmConfig, StableLmForCausalLM, 18, hidden_size=32, intermediate_size=64,
                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, partial_rotary_factor=0.25,
                  use_qkv_bias=True, max_position_embeddings=32, attn_implementation="sdpa")


def persimmon():
    from transformers import PersimmonConfig, PersimmonForCausalLM
    return _build(PersimmonConfig, PersimmonForCausalLM, 19, hidden_size=32, intermediate_size=64,
                  num_hidden_layers=2, num_attention_heads=4, partial_rotary_factor=0.5, qk_layernorm=True,
                  max_position_embeddings=32, attn_implementation="eager")


def phi():
    from transformers import PhiConfig, PhiForCausalLM
    return _build(PhiConfig, PhiForCausalLM, 20, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, partial_rotary_factor=0.5, max_position_embeddings=32,
                  attn_implementation="eager")


def starcoder2():
    from transformers import Starcoder2Config, Starcoder2ForCausalLM
    return _build(Starcoder2Config, Starcoder2ForCausalLM, 21, hidden_size=32, intermediate_size=64,
                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, sliding_window=4,
                  max_position_embeddings=32, attn_implementation="sdpa")


def cohere():
    from transformers import CohereConfig, CohereForCausalLM
    return _build(CohereConfig, CohereForCausalLM, 22, hidden_size=32, intermediate_size=64,
                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, logit_scale=0.5,
                  max_position_embeddings=32, attn_implementation="eager")


ALL = {
    "hf_opt": opt, "hf_falcon": falcon, "hf_bloom": bloom, "hf_mpt": mpt, "hf_gptj": gptj,
    "hf_gpt_neo": gpt_neo, "hf_codegen": codegen, "hf_gpt_bigcode": gpt_bigcode, "hf_stablelm": stablelm,
    "hf_persimmon": persimmon, "hf_phi": phi, "hf_starcoder2": starcoder2, "hf_cohere": cohere,
}
