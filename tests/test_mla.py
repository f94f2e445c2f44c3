"""Multi-head latent attention (layers/mla.py, both trees; docs/numerics.md §27).

  * transformers' DeepseekV3Attention on copied weights (tiny configs, no download): outputs
    of both trees within 1e-5 x max(1, max |out|), with and without q_lora_rank, interleaved
    and rotate-half rope pairs, YaRN with mscale / mscale_all_dim, biases, padding.
  * The compressed cache: init_cache holds the latent and the rope key only, its bytes per
    token are (kv_lora_rank + qk_rope_head_dim) x 4 per layer (fp32); the figures of
    DeepSeek-V3's real sizes against the expanded form.
  * Decoding a tiny MLA LM (dense FFN): cached logits (prefill expanded from the latent,
    one-token steps with kv_b_proj absorbed) equal a full recompute at every step, and greedy
    and beam ids of generate equal those of a full-recompute search, in both trees (and a
    scanned JAX stack); int8 decode weights take the absorbed path too.
  * Refusals: sliding windows, key/value groups, cross-attention, a ring cache.
"""
from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from generation_helpers import jitted, pair

from jaxformer import convert
from jaxformer import generation as jgen
from jaxformer.config import ConfigError, Rope, RopeScaling
from jaxformer.config.models import GenerationConfig, LMConfig, Seq2SeqConfig
from jaxformer.config.moe import MLAConfig
from jaxformer.layers.mla import MultiHeadLatentAttention as JaxMLA
from jaxformer.parity.cases_mla import MLA_INTERLEAVED, MLA_PLAIN_Q, MLA_Q_LORA
from torch_ref import generation as tgen
from torch_ref.layers.mla import MultiHeadLatentAttention as TorchMLA

T = pytest.importorskip("transformers")
from transformers.models.deepseek_v3 import modeling_deepseek_v3 as hf_ds

D, H, B, L = 32, 4, 2, 9


# ----------------------------------------------------------------------------- vs transformers
def _hf_config(mla: MLAConfig, rope: dict | None, bias: bool):
    rope_parameters = dict(rope_type="default", rope_theta=100.0) if rope is None else dict(rope, rope_theta=100.0)
    cfg = T.DeepseekV3Config(
        vocab_size=64, hidden_size=D, num_attention_heads=H, num_key_value_heads=H, q_lora_rank=mla.q_lora_rank,
        kv_lora_rank=mla.kv_lora_rank, qk_nope_head_dim=mla.qk_nope_head_dim, qk_rope_head_dim=mla.qk_rope_head_dim,
        v_head_dim=mla.v_head_dim, rope_interleave=mla.rope_interleave, attention_bias=bias,
        max_position_embeddings=32, rope_parameters=rope_parameters, num_hidden_layers=1)
    cfg._attn_implementation = "eager"
    return cfg


def _rope_scaling(rope: dict | None):
    """The RopeScaling an HF yarn dict maps to (the importer's rule, jaxformer/layers/mla.py)."""
    if rope is None:
        return None
    return RopeScaling("yarn", rope["factor"], original_max_len=rope["original_max_position_embeddings"],
                       mscale=rope.get("mscale"), mscale_all_dim=rope.get("mscale_all_dim"))


HF_CASES = {
    "q_lora_rotate_half": (MLA_Q_LORA, None, False),
    "plain_q_yarn_deepseek_bias": (MLA_PLAIN_Q, dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=8,
                                                     mscale=1.0, mscale_all_dim=1.0), True),
    "interleaved_yarn_split_mscale": (MLA_INTERLEAVED, dict(rope_type="yarn", factor=8.0,
                                                            original_max_position_embeddings=4,
                                                            mscale=0.7, mscale_all_dim=1.3), False),
}


@pytest.mark.parametrize("name", sorted(HF_CASES))
def test_mla_matches_transformers_deepseek_v3_attention(name):
    mla, rope, bias = HF_CASES[name]
    cfg = _hf_config(mla, rope, bias)
    torch.manual_seed(0)
    ref = hf_ds.DeepseekV3Attention(cfg, 0).eval()
    with torch.no_grad():  # random norms and biases too: every weight matters
        for p in ref.parameters():
            p.copy_(torch.randn(p.shape) * (0.5 if p.ndim == 1 else 0.2))
    rotary = hf_ds.DeepseekV3RotaryEmbedding(cfg)
    kw = dict(rope=Rope(32, 100.0, _rope_scaling(rope)), bias=bias)
    ours_t = TorchMLA(D, H, mla, **kw).eval()
    ours_t.load_state_dict(ref.state_dict(), strict=True)  # HF's names are ours
    from flax import nnx

    from jaxformer.parity.cases import twin
    ours_j = twin(lambda: JaxMLA(D, H, mla, **kw, rngs=nnx.Rngs(0)), 0)  # abstract until the load fills it
    convert.load_torch_state_dict(ours_j, ref.state_dict())
    ours_j.eval()
    rng = np.random.RandomState(1)
    x = rng.standard_normal((B, L, D)).astype(np.float32)
    valid = np.ones((B, L), bool)
    valid[1, 6:] = False  # right padding; with the causal mask every query sees a real key
    mask = valid[:, None, None, :] & np.tril(np.ones((L, L), bool))[None, None]
    positions = np.broadcast_to(np.arange(L), (B, L))
    with torch.no_grad():
        xt, pos_t = torch.from_numpy(x), torch.from_numpy(positions.copy())
        additive = torch.where(torch.from_numpy(mask), 0.0, torch.finfo(torch.float32).min)
        want = ref(xt, rotary(xt, pos_t), additive)[0].numpy()
        got_t = ours_t(xt, mask=torch.from_numpy(mask), positions=pos_t).numpy()
    got_j = np.asarray(ours_j(jnp.asarray(x), mask=jnp.asarray(mask), positions=jnp.asarray(positions)))
    bound = 1e-5 * max(1.0, float(np.abs(want).max()))
    d_t, d_j = float(np.abs(got_t - want).max()), float(np.abs(got_j - want).max())
    print(f"[mla vs HF] {name}: torch {d_t:.2e}, jax {d_j:.2e}, max |out| {np.abs(want).max():.2f}, "
          f"scale {ours_t.scale:.6f} (HF {ref.scaling:.6f})")
    assert ours_t.scale == ours_j.scale == ref.scaling  # the mscale_all_dim correction, exactly
    assert d_t <= bound and d_j <= bound, (d_t, d_j)


# ----------------------------------------------------------------------------- the compressed cache
def cache_bytes_per_token(cache, batch: int, length: int) -> int:
    """Bytes a cache holds per token (all layers): the sum of its leaves over batch * length."""
    total = sum(int(np.asarray(a).nbytes) for c in cache for a in c["self"].values())
    return total // (batch * length)


def test_latent_cache_holds_the_latent_and_rope_key_only():
    cfg = LMConfig.tiny("llama", num_kv_heads=None, mla=MLA_Q_LORA)
    t, j = pair("lm", cfg)
    for cache in (j.init_cache(B, 16), t.init_cache(B, 16)):
        assert [sorted(c["self"]) for c in cache] == [["k_rope", "latent"]] * cfg.num_layers
        assert tuple(cache[0]["self"]["latent"].shape) == (B, 1, 16, MLA_Q_LORA.kv_lora_rank)
        assert tuple(cache[0]["self"]["k_rope"].shape) == (B, 1, 16, MLA_Q_LORA.qk_rope_head_dim)
    latent = cache_bytes_per_token(j.init_cache(B, 16), B, 16)
    assert latent == cfg.num_layers * 4 * MLA_Q_LORA.latent_values_per_token()
    expanded = cfg.num_layers * 4 * MLA_Q_LORA.expanded_values_per_token(cfg.attention.num_heads)
    # DeepSeek-V3 (61 layers, 128 heads, bf16): 70,272 bytes per token against 4,997,120
    v3 = MLAConfig(kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, q_lora_rank=1536)
    v3_latent, v3_full = 61 * 2 * v3.latent_values_per_token(), 61 * 2 * v3.expanded_values_per_token(128)
    print(f"[mla cache bytes/token] tiny fp32: latent {latent} vs expanded {expanded} ({expanded / latent:.1f}x); "
          f"DeepSeek-V3 bf16: latent {v3_latent} vs expanded {v3_full} ({v3_full / v3_latent:.1f}x)")
    assert (v3_latent, v3_full) == (70_272, 4_997_120)


# ----------------------------------------------------------------------------- decoding
# q_lora, interleaved rope pairs and YaRN with mscale_all_dim: DeepSeek-V3's own options
MLA_LM = LMConfig.tiny("llama", num_kv_heads=None, max_len=64, mla=MLA_INTERLEAVED,
                       rope_scaling=RopeScaling("yarn", 4.0, original_max_len=16, mscale=1.0, mscale_all_dim=1.0))
PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [3, 4], [12, 13, 14, 15]]
N = 8


def _recompute_search(forward, ids, mask, gen: GenerationConfig, eos_ids, pad_id):
    """Greedy / beam ids with every step recomputed from the whole sequence (no cache), through
    torch_ref.generation's loops (the JAX loops are checked equal to them elsewhere)."""
    b, p = ids.shape
    if gen.strategy == "beam":
        ids, mask = np.repeat(ids, gen.num_beams, 0), np.repeat(mask, gen.num_beams, 0)
    seq = np.zeros((ids.shape[0], p + gen.max_new_tokens), np.int32)
    m = np.zeros_like(seq)
    seq[:, :p], m[:, :p] = ids, mask

    def step(tok, i, carry):
        seq, m = carry
        seq, m = seq.copy(), m.copy()
        seq[:, p + i], m[:, p + i] = np.asarray(tok), 1
        return torch.from_numpy(np.array(forward(seq, m)[:, p + i])).float(), (seq, m)

    first = torch.from_numpy(np.array(forward(seq, m)[:, p - 1])).float()
    if gen.strategy == "beam":
        reorder = lambda carry, rows: (carry[0][rows.numpy()], carry[1][rows.numpy()])
        return tgen.beam_loop(step, reorder, (seq, m), first, gen, eos_ids, pad_id)[0].numpy()
    return tgen.decode_loop(step, (seq, m), first, torch.Generator(), gen, eos_ids, pad_id).numpy()


def test_latent_cache_decoding_equals_full_recompute():
    from test_generation_cache import _jax_lm_cached, _recompute, _torch_lm_cached
    cfg = MLA_LM
    t, j = pair("lm", cfg)
    ids, mask = jgen.pad_prompts(PROMPTS, 0)
    fwd_j = jitted(j)
    fwd_t = lambda s, m: t(torch.as_tensor(s).long(), torch.as_tensor(m)).detach().numpy()
    # 1) logits at every step: the prefill expands the latent, each later step absorbs kv_b_proj
    for framework, forward in (("jax", fwd_j), ("torch", fwd_t)):
        steps, tokens = (_jax_lm_cached(j, ids, mask, N) if framework == "jax" else _torch_lm_cached(t, ids, mask, N))
        diffs = [np.abs(steps[k] - _recompute(forward, ids, mask, tokens, k)).max() for k in range(N)]
        print(f"[mla cache vs recompute] {framework}: max |diff| over {N} steps {max(diffs):.2e}")
        assert max(diffs) <= 1e-5, (framework, max(diffs))
    # 2) generate's greedy and beam ids (the latent cache) equal a full-recompute search
    eos = (cfg.eos_id,)
    for gen in (GenerationConfig(max_new_tokens=N, stop_at_eos=False),
                GenerationConfig(max_new_tokens=N, strategy="beam", num_beams=2)):
        got_j, got_t = jgen.generate(j, ids, mask, gen=gen), tgen.generate(t, ids, mask, gen=gen)
        got_j, got_t = (got_j[0], got_t[0]) if gen.strategy == "beam" else (got_j, got_t)
        for framework, forward, got in (("jax", fwd_j, got_j), ("torch", fwd_t, got_t)):
            want = _recompute_search(forward, ids, mask, gen, eos, cfg.pad_id)
            np.testing.assert_array_equal(got, want, err_msg=f"{framework} {gen.strategy}")


def test_scanned_stack_with_int8_weights_decodes_with_the_latent_cache():
    """A scanned stack's stacked latent cache [num_layers, B, 1, L, C], and int8 decode weights
    (the absorbed step dequantizes kv_b_proj): the same greedy ids as torch's int8 decoding."""
    from jaxformer.models import build_model
    from jaxformer.parity.cases import twin
    t, _ = pair("lm", MLA_LM)
    # built abstractly (parity.cases.twin): the load fills every leaf, and a concrete scanned
    # stack cost its initialisers' compiles
    js = twin(lambda: build_model("lm", dataclasses.replace(MLA_LM, scan_layers=True)), 0)
    convert.load_torch_state_dict(js, t.state_dict())
    js.eval()
    assert js.init_cache(3, 8)["self"]["latent"].shape == (MLA_LM.num_layers, 3, 1, 8, MLA_INTERLEAVED.kv_lora_rank)
    ids, mask = jgen.pad_prompts(PROMPTS, 0)
    gen = GenerationConfig(max_new_tokens=N, stop_at_eos=False, weights_dtype="int8")
    np.testing.assert_array_equal(jgen.generate(js, ids, mask, gen=gen), tgen.generate(t, ids, mask, gen=gen))


# ----------------------------------------------------------------------------- refusals
def test_mla_refuses_what_it_does_not_implement():
    base = dict(num_kv_heads=None, mla=MLA_Q_LORA)
    for bad, field in ((dict(sliding_window=4), "sliding_window"), (dict(num_kv_heads=2), "num_kv_heads"),
                       (dict(qk_norm=True), "qk_norm"), (dict(head_dim=8), "head_dim"),
                       (dict(position="alibi"), "mla")):
        with pytest.raises(ConfigError, match=field):
            LMConfig.tiny("llama", **{**base, **bad})
    with pytest.raises(ValueError, match="self-attention only"):
        pair("seq2seq", Seq2SeqConfig.tiny(position="rope", mla=MLA_Q_LORA))
    from flax import nnx
    layer = JaxMLA(D, H, MLA_Q_LORA, rope=Rope(16), rngs=nnx.Rngs(0))
    x = jnp.zeros((1, 2, D))
    with pytest.raises(ValueError, match="ring cache"):
        layer.init_cache(1, 4, ring=True)
    with pytest.raises(ValueError, match="cache_index"):
        layer(x, cache=layer.init_cache(1, 4))
