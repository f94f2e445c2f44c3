"""The decode layout and the other lowering switches (jaxformer.lowering): generate with
[out, in] kernel copies gives the ids of the stored kernels; kept copies follow new weights
(never stale), are released on demand and go with the model; a Linear under
transposed_kernels computes the same map; layouts are validated; the fused attention backend
comes from the argument or the active lowering."""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from generation_helpers import LMS, PROMPTS, S2S, SOURCES, N, pair

from jaxformer import generation as jgen
from jaxformer import lowering
from jaxformer.config.models import GenerationConfig
from jaxformer.layers import linear
from jaxformer.lowering import DecodeLayout


@pytest.mark.parametrize("name,flavour", [("lm", "gpt2"), ("lm", "llama_gqa"), ("seq2seq", "separate_untied_pre")])
def test_transposed_weight_layout_generates_what_the_stored_one_does(name, flavour):
    """DecodeLayout.kernels: the [out, in] kernel copies (jaxformer/layers/linear.py) change
    only the order of fp32 additions inside each matmul; greedy and beam ids match."""
    _, j = pair(name, (LMS if name == "lm" else S2S)[flavour])
    args = jgen.pad_prompts(PROMPTS, 0) if name == "lm" else (SOURCES, None)
    for gen in (GenerationConfig(max_new_tokens=N, stop_at_eos=False),
                GenerationConfig(max_new_tokens=8, strategy="beam", num_beams=3)):
        stored = jgen.generate(j, *args, gen=gen, layout="stored")
        transposed = jgen.generate(j, *args, gen=gen, layout="transposed")
        if gen.strategy == "beam":  # (tokens, scores): scores may differ in the last bit
            np.testing.assert_allclose(transposed[1], stored[1], rtol=1e-6)
            stored, transposed = stored[0], transposed[0]
        np.testing.assert_array_equal(stored, transposed)


def test_kept_decode_weights_follow_the_model_weights():
    """DecodeLayout.keep_weights: the [out, in] copies are made once and reused;
    new kernel arrays (a training step, a weight load) are transposed again, so generation
    never runs stale weights; release_decode_weights and the model's death free them."""
    import gc
    # the model (its own instance) and gen of the layout test above: its programs, compiled once
    _, j = pair("lm", LMS["gpt2"])
    ids, mask = jgen.pad_prompts(PROMPTS, 0)
    gen = GenerationConfig(max_new_tokens=N, stop_at_eos=False)
    layout = DecodeLayout("transposed")
    first = jgen.decode_kernels(j, layout)
    assert jgen.decode_kernels(j, layout) is first  # reused, not transposed again
    before = jgen.lm_generate(j, ids, mask, gen, layout)
    # new weights: every kernel scaled by -1 (a different model, same shapes)
    for m in linear.linear_modules(j):
        m.kernel.set_value(-m.kernel.get_value())
    assert jgen.decode_kernels(j, layout) is not first
    after = jgen.lm_generate(j, ids, mask, gen, layout)
    fresh = jgen.lm_generate(j, ids, mask, gen, dataclasses.replace(layout, keep_weights=False))
    stored = jgen.lm_generate(j, ids, mask, gen, dataclasses.replace(layout, kernels="stored"))
    np.testing.assert_array_equal(after, fresh)
    np.testing.assert_array_equal(after, stored)
    assert not np.array_equal(after, before)  # the new weights were used
    assert j not in lowering._KEPT_KERNELS  # keep_weights=False dropped the kept copies
    jgen.decode_kernels(j, layout)
    jgen.release_decode_weights(j)
    assert j not in lowering._KEPT_KERNELS
    jgen.decode_kernels(j, layout)
    n = len(lowering._KEPT_KERNELS)
    del j, m
    gc.collect()
    assert len(lowering._KEPT_KERNELS) == n - 1  # the copies went with the model


def test_linear_in_the_transposed_layout_computes_the_same_map():
    lin = linear.Linear(24, 40, rngs=nnx.Rngs(0))
    lin.bias[...] = jax.random.normal(jax.random.key(1), (40,))
    x = jax.random.normal(jax.random.key(2), (3, 5, 24))
    graphdef, state = nnx.split(lin)

    def apply(state, x, transposed):
        with lowering.tracing(transposed_kernels=transposed):
            m = nnx.merge(graphdef, state)
            if transposed:
                linear.transpose_kernels(m)
                assert m.kernel[...].shape == (40, 24)  # [out, in]
            return m(x), m(x, stop_bias_gradient=True)

    ref, ref_cut = jax.jit(apply, static_argnums=2)(state, x, False)
    out, out_cut = jax.jit(apply, static_argnums=2)(state, x, True)
    assert float(jnp.abs(out - ref).max()) <= 1e-6 * float(jnp.abs(ref).max())
    np.testing.assert_array_equal(ref, ref_cut)  # the cut bias is still added
    np.testing.assert_array_equal(out, out_cut)
    # the cut removes the bias gradient only
    grad = jax.grad(lambda st: jnp.sum(apply(st, x, False)[1] ** 2))(state)
    assert float(jnp.abs(grad["bias"][...]).max()) == 0.0
    assert float(jnp.abs(grad["kernel"][...]).max()) > 0.0


def test_decode_layout_is_validated():
    with pytest.raises(ValueError):
        DecodeLayout("column_major")
    _, j = pair("lm", dataclasses.replace(LMS["gpt2"], num_layers=1))
    with pytest.raises(ValueError, match="column_major"):
        jgen.lm_generate(j, np.array([[5, 6]]), layout="column_major")


def test_fused_attention_backend_comes_from_the_argument_or_the_lowering():
    """The fused path's backend is the active lowering's fused_attention: on the CPU backend
    "cudnn" must reach jax and fail there, and an inner context's backend wins."""
    from jaxformer.layers.attention import dot_product_attention
    if jax.default_backend() != "cpu":
        pytest.skip("cuDNN may be present off the CPU backend")
    q = jnp.ones((1, 4, 2, 8))
    plain = dot_product_attention(q, q, q)
    with lowering.tracing(fused_attention="cudnn"):
        with pytest.raises(RuntimeError, match="cuDNN"):
            dot_product_attention(q, q, q)
        with lowering.tracing(fused_attention="xla"):
            np.testing.assert_array_equal(dot_product_attention(q, q, q), plain)
    np.testing.assert_array_equal(dot_product_attention(q, q, q), plain)  # the context is left
