"""Component behaviour beyond torch-vs-JAX parity: reference formulas (HF LLaMA RoPE, ALiBi
paper slopes, HF T5 buckets), masked rows, range checks, and proofs that the parity cases
would catch each difference of docs/numerics.md if an implementation regressed."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from jaxformer import tables
from jaxformer.layers import attention as jattn
from jaxformer.layers import embedding as jemb
from jaxformer.layers import norm as jnorm
from jaxformer.layers import positional as jpos
from jaxformer.parity import check_parity
from jaxformer.parity.registry import CASES, load_all, run_case
from torch_ref.layers import attention as tattn
from torch_ref.layers import embedding as temb
from torch_ref.layers import norm as tnorm
from torch_ref.layers import positional as tpos

load_all()


def test_rope_matches_hf_llama_rotate_half():  # docs/numerics.md §6
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb
    rng = np.random.RandomState(0)
    b, t, h, k = 2, 7, 3, 16
    q = rng.standard_normal((b, t, h, k)).astype(np.float32)
    pos = np.tile(np.arange(t), (b, 1))
    cos, sin = tables.rope_tables(32, k, 10000.0)
    qt = torch.tensor(q).transpose(1, 2)  # HF: [B, H, T, K]
    hf_q, _ = apply_rotary_pos_emb(qt, qt, torch.tensor(cos[pos]), torch.tensor(sin[pos]))
    ours = np.asarray(jpos.RotaryEmbedding(k, 32)(jnp.asarray(q), jnp.asarray(pos)))
    np.testing.assert_allclose(ours, hf_q.transpose(1, 2).numpy(), atol=1e-6)
    # and the interleaved (GPT-J) layout would be a different function, so the test can fail
    inter = q.copy()
    inter[..., 0::2], inter[..., 1::2] = q[..., : k // 2], q[..., k // 2:]
    assert np.abs(np.asarray(jpos.RotaryEmbedding(k, 32)(jnp.asarray(inter), jnp.asarray(pos)))
                  - ours).max() > 1e-2


def test_alibi_slopes_match_paper():
    np.testing.assert_allclose(tables.alibi_slopes(8), [2.0 ** -(i + 1) for i in range(8)], rtol=1e-7)
    # 6 heads: the 4 slopes of 4 heads, then every other slope of 8 heads (Press et al., appendix)
    four = [2.0 ** -(2 * (i + 1)) for i in range(4)]
    eight = [2.0 ** -(i + 1) for i in range(8)]
    np.testing.assert_allclose(tables.alibi_slopes(6), four + eight[0::2][:2], rtol=1e-7)


def test_alibi_slopes_match_hf_bloom():
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor
    for heads in (4, 6, 12, 16):
        mask = torch.ones(1, 3)
        alibi = build_alibi_tensor(mask, heads, torch.float32)  # [H, 1, 3] = slope * pos
        np.testing.assert_allclose(alibi[:, 0, 1].numpy(), tables.alibi_slopes(heads), rtol=1e-6)


@pytest.mark.parametrize("bidirectional", [True, False])
def test_t5_buckets_match_hf(bidirectional):
    from transformers.models.t5.modeling_t5 import T5Attention
    rel = torch.arange(-300, 301)
    hf = T5Attention._relative_position_bucket(rel, bidirectional=bidirectional, num_buckets=32,
                                               max_distance=128)
    table = tables.t5_bucket_table(bidirectional, 32, 128)
    ours = table[np.clip(rel.numpy(), -128, 128) + 128]
    np.testing.assert_array_equal(ours, hf.numpy())


@pytest.mark.parametrize("return_weights", [False, True])
def test_fully_masked_rows_are_zero_in_both(return_weights):  # docs/numerics.md §4
    rng = np.random.RandomState(0)
    q, k, v = (rng.standard_normal((1, 3, 2, 4)).astype(np.float32) for _ in range(3))
    mask = np.array([[[[True, False, True], [False, False, False], [True, True, True]]]])
    j = jattn.dot_product_attention(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v), mask=jnp.asarray(mask),
                                    return_weights=return_weights)
    t = tattn.dot_product_attention(torch.tensor(q), torch.tensor(k), torch.tensor(v),
                                    mask=torch.tensor(mask), return_weights=return_weights)
    j_out = np.asarray(j[0] if return_weights else j)
    t_out = (t[0] if return_weights else t).numpy()
    for out in (j_out, t_out):
        assert np.isfinite(out).all()
        assert np.all(out[0, 1] == 0.0)  # the row with no visible key
        assert np.abs(out[0, 0]).max() > 0


def test_fused_and_explicit_paths_agree():
    rng = np.random.RandomState(1)
    q = jnp.asarray(rng.standard_normal((2, 5, 4, 8)).astype(np.float32))
    k = jnp.asarray(rng.standard_normal((2, 6, 2, 8)).astype(np.float32))
    v = jnp.asarray(rng.standard_normal((2, 6, 2, 8)).astype(np.float32))
    mask = jnp.asarray(rng.rand(2, 1, 5, 6) > 0.3)
    bias = jnp.asarray(rng.standard_normal((1, 4, 5, 6)).astype(np.float32))
    fused = jattn.dot_product_attention(q, k, v, mask=mask, bias=bias)
    explicit, _ = jattn.dot_product_attention(q, k, v, mask=mask, bias=bias, return_weights=True)
    assert float(jnp.abs(fused - explicit).max()) < 1e-6


def test_fused_path_rounds_as_the_explicit_one_under_jit():
    """docs/numerics.md §44: jitted, jax.nn.dot_product_attention (XLA) and the explicit ops give
    the same bits, outputs and gradients, here with grouped heads, a window of 3, rows of 0, 4
    and 9 left pads (padded queries see no key) and Gemma3's scale 7 ** -0.5."""
    rng = np.random.RandomState(2)
    q = jnp.asarray(rng.standard_normal((3, 11, 4, 8)).astype(np.float32) * 3)
    k, v = (jnp.asarray(rng.standard_normal((3, 11, 2, 8)).astype(np.float32) * 3) for _ in range(2))
    g = jnp.asarray(rng.standard_normal((3, 11, 4, 8)).astype(np.float32))
    pos = np.arange(11)
    mask = ((pos[None, :] <= pos[:, None]) & (pos[:, None] - pos[None, :] < 3))[None, None] \
        & np.stack([pos >= p for p in (0, 4, 9)])[:, None, None, :]  # [B, 1, T, S]
    mask = jnp.asarray(mask)

    def out_and_grads(return_weights):
        def f(q, k, v):
            out = jattn.dot_product_attention(q, k, v, mask=mask, scores=jattn.ScoreMods(scale=7 ** -0.5),
                                               return_weights=return_weights)
            return out[0] if return_weights else out
        out, vjp = jax.vjp(f, q, k, v)
        return (out, *vjp(g))
    fused, explicit = jax.jit(lambda: out_and_grads(False))(), jax.jit(lambda: out_and_grads(True))()
    for a, b in zip(fused, explicit, strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_non_boolean_mask_is_rejected():
    x = jnp.ones((1, 2, 1, 4))
    with pytest.raises(TypeError, match="boolean"):
        jattn.dot_product_attention(x, x, x, mask=jnp.ones((1, 1, 2, 2)))
    xt = torch.ones(1, 2, 1, 4)
    with pytest.raises(TypeError, match="boolean"):
        tattn.dot_product_attention(xt, xt, xt, mask=torch.ones(1, 1, 2, 2))


@pytest.mark.parametrize("bad", [-1, 10])
def test_out_of_range_ids_raise_in_both(bad):  # docs/numerics.md §10: JAX would not raise
    from flax import nnx
    ids = np.array([[1, bad]])
    with pytest.raises(ValueError, match=f"token id {bad} is out of range"):
        jemb.Embedding(10, 4, rngs=nnx.Rngs(0))(jnp.asarray(ids))
    with pytest.raises(ValueError, match=f"token id {bad} is out of range"):
        temb.Embedding(10, 4)(torch.tensor(ids))


def test_positions_past_max_len_raise_in_both():
    pos = np.array([[0, 1, 8]])
    with pytest.raises(ValueError, match="position 8 is out of range.*max_len=8"):
        jpos.SinusoidalPositionalEncoding(8, 4)(jnp.asarray(pos))
    with pytest.raises(ValueError, match="position 8 is out of range.*max_len=8"):
        tpos.SinusoidalPositionalEncoding(8, 4)(torch.tensor(pos))
    with pytest.raises(ValueError, match="out of range"):
        jpos.RotaryEmbedding(4, 8)(jnp.ones((1, 3, 1, 4)), jnp.asarray(pos))


def test_mha_rejects_indivisible_d_model():
    from flax import nnx
    with pytest.raises(ValueError, match="d_model=30 is not divisible by num_heads=4"):
        jattn.MultiHeadAttention(30, 4, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="d_model=30 is not divisible by num_heads=4"):
        tattn.MultiHeadAttention(30, 4)


# ------------------------------------------------- the parity cases can fail (mutation checks)
def test_eps_mismatch_would_fail_parity():  # docs/numerics.md §1
    c = CASES["norm_layernorm_eps_small_std"]
    torch_ln = tnorm.LayerNorm(32, eps=1e-5)
    flax_ln = jnorm.LayerNorm(32, eps=1e-6)  # flax's default eps
    r = check_parity(torch_ln, flax_ln, c.inputs(np.random.RandomState(0)))
    assert not r.ok and r.max_abs_out > 0.1, r.max_abs_out


def test_gelu_variant_mismatch_would_fail_parity():  # docs/numerics.md §2
    from flax import nnx

    from jaxformer.layers.ffn import FeedForward as JFF
    from torch_ref.layers.ffn import FeedForward as TFF
    c = CASES["ffn_gelu"]
    torch.manual_seed(0)
    r = check_parity(TFF(32, 64, kind="gelu"), JFF(32, 64, kind="gelu_tanh", rngs=nnx.Rngs(0)),
                     c.inputs(np.random.RandomState(0)))
    assert not r.ok and r.max_abs_out > 1e-5, r.max_abs_out


def test_conv_padding_mismatch_would_fail_parity():  # docs/numerics.md §5
    from flax import nnx

    from jaxformer.layers.conv import Conv2d as JConv
    from torch_ref.layers.conv import Conv2d as TConv
    c = CASES["conv2d_k7_s2_explicit_pad"]
    torch.manual_seed(0)
    r = check_parity(TConv(3, 8, 7, stride=2, padding=3), JConv(3, 8, 7, stride=2, padding=[(2, 4), (2, 4)],
                                                                rngs=nnx.Rngs(0)),
                     c.inputs(np.random.RandomState(0)))
    assert not r.ok


def test_parity_report_names_worst_offender():
    r = run_case(CASES["mha_self_padding"])
    assert r.ok and r.grads and "q_proj.weight" in " ".join(r.grads)
    assert math.isfinite(r.max_abs_grad)
