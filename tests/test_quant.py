"""Reduced-precision decoding (GenerationConfig.weights_dtype; jaxformer/layers/kernels/quant.py and its
twin; docs/numerics.md §24): the two frameworks quantize to the same bits (ties included) and
give the same int8 and bf16 logits; against fp32, bf16 and int8 stay within their KL budgets on
the registry's LMs; quantized decoding with the KV cache equals a quantized full recompute;
the CLI's --weights-dtype."""
from __future__ import annotations

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from generation_helpers import LMS, PROMPTS, S2S, SOURCES, jitted, pair

from jaxformer import cli, convert
from jaxformer import generation as jgen
from jaxformer.config import ConfigError
from jaxformer.config.models import GenerationConfig
from jaxformer.layers import linear
from jaxformer.layers.kernels import quant as jquant
from jaxformer.parity import cases_models
from torch_ref import generation as tgen
from torch_ref.layers.kernels import quant as tquant

# KL(p_fp32 || p_reduced) budgets, mean over positions (issue 18; docs/numerics.md §24)
KL_BUDGET = {"bf16": 1e-3, "int8": 1e-2}


# ----------------------------------------------------------------------------- the same bits
def _weight_with_ties() -> np.ndarray:
    """[out, in] rows: random (enough rows that a division rounded another way shows: XLA:CPU's
    multiply-by-reciprocal form of amax / 127 changed 4% of GPT-2 small's scales); all zero;
    absmax 127 (scale exactly 1) with halves on both sides (round half to even must give 0, 2,
    2, -2, -4, 126); a row whose absmax is negative."""
    rng = np.random.RandomState(0)
    w = rng.randn(2048, 8).astype(np.float32)
    w[1] = 0.0
    w[2] = [127.0, 0.5, 1.5, 2.5, -2.5, -3.5, 125.5, 0.0]
    w[3] = [-3.0, 1.0, 0.25, -0.75, 2.0, 0.0, 1.5, -1.0]
    return w


def test_int8_and_bf16_weights_are_bit_identical_across_frameworks():
    w = _weight_with_ties()
    j, t = jquant.quantize_int8(jnp.asarray(w)), tquant.quantize_int8(torch.as_tensor(w))
    np.testing.assert_array_equal(np.asarray(j.data), t.data.numpy())
    np.testing.assert_array_equal(np.asarray(j.scale), t.scale.numpy())  # bitwise: same fp32 values
    assert np.asarray(j.data).dtype == np.int8 and np.abs(np.asarray(j.data)).max() == 127
    assert np.asarray(j.scale)[1] == 1.0 and not np.asarray(j.data)[1].any()  # an all-zero row
    assert np.asarray(j.scale)[2] == 1.0
    assert np.asarray(j.data)[2].tolist() == [127, 0, 2, 2, -2, -4, 126, 0]  # half to even
    # the int8 grid is symmetric: the largest magnitude of each row maps to +-127
    assert (np.abs(np.asarray(j.data)).max(axis=1)[[0, 2, 3, 4, 5]] == 127).all()
    q = jnp.asarray(w).at[2].set(0.0)  # in a jitted program too (XLA may rewrite divisions there)
    jitted_q = jax.jit(jquant.quantize_int8)(q)
    t = tquant.quantize_int8(torch.as_tensor(np.array(q)))
    np.testing.assert_array_equal(np.asarray(jitted_q.scale), t.scale.numpy())
    np.testing.assert_array_equal(np.asarray(jitted_q.data), t.data.numpy())
    err = np.abs(np.asarray(j.dequantized()) - w).max(axis=1)
    assert (err <= np.asarray(j.scale) / 2 * (1 + 1e-6)).all()  # half a step at most
    jb, tb = jquant.to_bf16(jnp.asarray(w)), tquant.to_bf16(torch.as_tensor(w))
    np.testing.assert_array_equal(np.asarray(jb.data), tb.data.view(torch.int16).numpy().view(np.uint16))
    np.testing.assert_array_equal(np.asarray(jb.dequantized()), tb.dequantized().numpy())


# ----------------------------------------------------------------------------- registry LMs
def _kl_top1(p_logits, q_logits):
    """Mean KL(p || q) over positions and the fraction of positions with the same argmax."""
    p_logits, q_logits = p_logits.astype(np.float64), q_logits.astype(np.float64)
    lp = p_logits - np.logaddexp.reduce(p_logits, axis=-1, keepdims=True)
    lq = q_logits - np.logaddexp.reduce(q_logits, axis=-1, keepdims=True)
    kl = (np.exp(lp) * (lp - lq)).sum(-1).mean()
    return float(kl), float((p_logits.argmax(-1) == q_logits.argmax(-1)).mean())


@pytest.mark.parametrize("flavour", sorted(cases_models.LMS))
def test_registry_lm_reduced_weights(flavour):
    """On the registry's LM (jaxformer/parity/cases_models.py; same weights in both frameworks):
    the two frameworks' bf16 and int8 logits agree within 1e-5 relative, and against fp32 each
    stays within its KL budget."""
    t, j = pair("lm", cases_models.LMS[flavour])
    ids = np.random.RandomState(1).randint(1, j.cfg.vocab_size, (4, 16)).astype(np.int32)
    fp32 = jitted(j)(ids)
    for weights_dtype, budget in KL_BUDGET.items():
        jl = jitted(jgen.decode_model(j, weights_dtype))(ids)
        with torch.no_grad():
            tl = tgen.decode_model(t, weights_dtype)(torch.as_tensor(ids).long()).numpy()
        rel = np.abs(jl - tl).max() / np.abs(tl).max()
        kl, top1 = _kl_top1(fp32, jl)
        print(f"[{weights_dtype}] lm_{flavour}: max |jax - torch| / max |torch| {rel:.2e}; vs fp32: "
              f"KL {kl:.2e} (budget {budget:.0e}), top-1 {top1:.3f}, max |diff| / max |fp32| "
              f"{np.abs(jl - fp32).max() / np.abs(fp32).max():.2e}")
        assert rel <= 1e-5
        assert 0 < kl <= budget  # KL > 0: the reduction happened (a no-op passes the parity check)
        assert top1 >= 0.9


# ----------------------------------------------------------------------------- decoding
def test_int8_cached_decoding_equals_int8_full_recompute():
    from test_generation_cache import _jax_lm_cached, _recompute
    n = 12
    _, j = pair("lm", LMS["gpt2"])  # tied: the int8 table serves the lookup and the output
    q = jgen.decode_model(j, "int8")
    ids, mask = jgen.pad_prompts(PROMPTS, 0)
    forward = jitted(q)
    for elementwise in (True, False):
        steps, tokens = _jax_lm_cached(q, ids, mask, n, elementwise)
        diffs = [np.abs(steps[k] - _recompute(forward, ids, mask, tokens, k)).max() for k in range(n)]
        print(f"[int8 cache vs recompute] lm_gpt2 elementwise={elementwise}: max |diff| {max(diffs):.3e}")
        assert max(diffs) <= 1e-5
    # generate (transposed layout: the weight-stationary int8 product) picks the same ids
    out = jgen.lm_generate(j, ids, mask, GenerationConfig(max_new_tokens=n, stop_at_eos=False, weights_dtype="int8"),
                           layout="transposed")
    np.testing.assert_array_equal(out, tokens)


def test_generate_gives_the_same_ids_in_both_frameworks():
    """int8 greedy on a scanned LLaMA stack (the stacked QuantizedWeight leaves slice per layer)
    and bf16 beam search on a tied seq2seq model."""
    cfg = dataclasses.replace(LMS["llama_gqa"], scan_layers=True)
    t, j = pair("lm", cfg)
    ids, mask = jgen.pad_prompts(PROMPTS, 0)
    gen = GenerationConfig(max_new_tokens=10, stop_at_eos=False, weights_dtype="int8")
    np.testing.assert_array_equal(jgen.lm_generate(j, ids, mask, gen), tgen.lm_generate(t, ids, mask, gen))
    t, j = pair("seq2seq", S2S["shared_tied"])
    beam = GenerationConfig(max_new_tokens=6, strategy="beam", num_beams=3, weights_dtype="bf16")
    jt, js = jgen.seq2seq_generate(j, SOURCES, gen=beam)
    tt, ts = tgen.seq2seq_generate(t, SOURCES, gen=beam)
    np.testing.assert_array_equal(jt, tt)
    np.testing.assert_allclose(js, ts, rtol=1e-5)


def test_reduced_copies_are_kept_per_dtype_and_leave_the_model_fp32():
    from jaxformer import lowering
    _, j = pair("lm", LMS["gpt2"])
    a = jgen.decode_kernels(j, "stored", "int8")
    assert jgen.decode_kernels(j, "stored", "int8") is a  # kept while the kernels stay the same
    b = jgen.decode_kernels(j, "stored", "bf16")
    assert b is not a and b["linear"][0].data.dtype == jnp.uint16 and a["linear"][0].data.dtype == jnp.int8
    assert a["tied"] is not None and a["tied"].data.shape == (j.cfg.vocab_size, j.cfg.d_model)
    assert all(m.kernel.get_value().dtype == jnp.float32 for m in linear.linear_modules(j))  # the model is untouched
    lowering.release_decode_weights(j)


# ----------------------------------------------------------------------------- CLI
def test_cli_weights_dtype(tmp_path, capsys):
    cfg = LMS["llama_gqa"]
    t, j = pair("lm", cfg)
    path = tmp_path / "lm.safetensors"
    convert.write_safetensors(str(path), {k: v.numpy() for k, v in t.state_dict().items()},
                              {"format": "pt", **convert.model_metadata("lm", cfg)})
    ids, mask = jgen.pad_prompts([[5, 6, 7, 8, 9], [3, 4]], 0)
    rc = cli.main(["generate", "--weights", str(path), "--prompt", "5 6 7 8 9", "--prompt", "3 4",
                   "--max-new-tokens", "10", "--no-eos-stop", "--weights-dtype", "int8", "--json", "--ids"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    expected = jgen.lm_generate(j, ids, mask, GenerationConfig(max_new_tokens=10, stop_at_eos=False,
                                                               weights_dtype="int8"))
    assert out["tokens"] == expected.tolist() and out["weights_dtype"] == "int8"
    with pytest.raises(SystemExit) as e:
        cli.main(["generate", "--weights", str(path), "--prompt", "5", "--weights-dtype", "int4", "--ids"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "--weights-dtype" in err and "int4" in err and "int8" in err


def test_bad_weights_dtype_is_a_config_error():
    with pytest.raises(ConfigError, match="weights_dtype"):
        GenerationConfig(weights_dtype="fp16")
    with pytest.raises(ValueError, match="weights dtype"):
        tgen.decode_model(pair("lm", LMS["gpt2"])[0], "int4")


# ----------------------------------------------------------------------------- fused attention kernel
def test_fused_attention_auto_falls_back_to_xla_off_nvidia_gpus():
    """"auto" (the default) is cuDNN only on an NVIDIA GPU; on this CPU backend it runs XLA's
    form, bit for bit; a missing tokamax is a clear ImportError; an unknown name a ValueError."""
    import importlib.util

    import jax

    from jaxformer import lowering
    from jaxformer.layers.attention import dot_product_attention
    if lowering.on_nvidia_gpu():
        pytest.skip("cuDNN may run here")
    rng = np.random.RandomState(0)
    q, k = jnp.asarray(rng.randn(2, 5, 4, 8), jnp.float32), jnp.asarray(rng.randn(2, 7, 2, 8), jnp.float32)
    mask = jnp.asarray(rng.rand(2, 1, 5, 7) > 0.3)
    xla = jax.nn.dot_product_attention(q, k, k, mask=mask, implementation="xla")
    np.testing.assert_array_equal(lowering.fused_attention(q, k, k, mask=mask), xla)
    with lowering.tracing(fused_attention="auto"):
        visible = np.asarray(mask).any(-1)[:, 0, :, None, None]  # rows with no visible key give 0
        np.testing.assert_array_equal(dot_product_attention(q, k, k, mask=mask), np.where(visible, xla, 0.0))
    with pytest.raises(ValueError, match="flash"):
        lowering.fused_attention(q, k, k, backend="flash")
    if importlib.util.find_spec("tokamax") is None:
        with pytest.raises(ImportError, match="pip install tokamax"):
            lowering.fused_attention(q, k, k, backend="tokamax")
