"""The full text models (classifier, seq2seq, lm) beyond the parity registry
(jaxformer/parity/cases_models.py): configs/*.yaml build in both frameworks, bad input raises
in both, named intermediates locate a divergence, padding invariance, and the bf16-compute
forward against torch's bf16 autocast (KL reported). The converter's key sets and round trips
over every registered model are in tests/test_convert.py."""
from __future__ import annotations

import dataclasses
import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import yaml
from flax import nnx
from helpers import converted_pair

from jaxformer import convert
from jaxformer.config import model_config_from_dict
from jaxformer.config.models import TINY_SIZES, ClassifierConfig, LMConfig, Seq2SeqConfig
from jaxformer.config.moe import MoEConfig
from jaxformer.parity import first_divergence, setup_precision

setup_precision()
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
V = TINY_SIZES["vocab_size"]


def _text_model_yamls():
    """configs/*.yaml whose model is one of this file's text models."""
    out = []
    for fname in sorted(os.listdir(os.path.join(ROOT, "configs"))):
        if fname.endswith(".yaml"):
            with open(os.path.join(ROOT, "configs", fname)) as f:
                if yaml.safe_load(f)["model"]["name"] in ("classifier", "seq2seq", "lm"):
                    out.append(fname)
    return out


def run_both(t, j, *args, **kw):
    with torch.no_grad():
        to = t(*[torch.as_tensor(a) for a in args], **kw)
    return to, jitted(j, *args, **kw)


def jitted(model, *args, return_intermediates: bool = False):
    """The JAX model's forward on numpy inputs as one compiled program (a model of a structure
    and shapes seen before reuses it), not op by op: the same function of the same weights."""
    return _forward(model, *[jnp.asarray(a) for a in args], inter=return_intermediates)


_forward = nnx.jit(lambda m, *xs, inter: m(*xs, return_intermediates=True) if inter else m(*xs),
                   static_argnames="inter")


def _intermediates(out) -> dict:
    """An LM's LMOutput.intermediates, or the other models' (output, intermediates)[1]."""
    return out.intermediates if dataclasses.is_dataclass(out) else out[1]


def rand_ids(rng, b, n, vocab=V):
    return rng.randint(1, vocab, size=(b, n)).astype(np.int32)


MODELS = {
    "classifier_post": ("classifier", ClassifierConfig.tiny(norm_position="post")),
    "classifier_pre_mean": ("classifier", ClassifierConfig.tiny(norm_position="pre", pooling="mean")),
    "seq2seq": ("seq2seq", Seq2SeqConfig.tiny()),
    "lm_gpt2": ("lm", LMConfig.tiny("gpt2")),
    "lm_llama": ("lm", LMConfig.tiny("llama")),
}


@functools.cache
def shared_pair(key):
    """converted_pair of MODELS[key], built once for the tests that only read it (the bad-input
    ones: every call raises before computing)."""
    return converted_pair(*MODELS[key])


def model_inputs(name, rng, t=6):
    if name == "seq2seq":
        return rand_ids(rng, 2, t), rand_ids(rng, 2, t - 1)
    return (rand_ids(rng, 2, t),)


# ----------------------------------------------------------------------------- configs
def toy_size(cfg):
    """A published-size config (llama3_8b.yaml, mixtral_8x7b.yaml, ...: d_model over 1024) with
    its architecture kept and its sizes shrunk to a toy's, so both trees build it here; fp32."""
    if cfg.d_model <= 1024:
        return cfg
    moe = cfg.feedforward.moe and dataclasses.replace(cfg.feedforward.moe, num_experts=4, top_k=2, d_expert=32)
    return cfg.replace(vocab_size=300, d_model=64, num_heads=4, num_kv_heads=2,
                               head_dim=16 if cfg.attention.head_dim else None, d_ff=96, num_layers=2, moe=moe,
                               dtype="float32")  # the check below is an fp32 one


def test_every_text_model_has_a_yaml():
    names = set()
    for fname in _text_model_yamls():
        with open(os.path.join(ROOT, "configs", fname)) as f:
            names.add(yaml.safe_load(f)["model"]["name"])
    assert names == {"classifier", "seq2seq", "lm"}


@pytest.mark.parametrize("fname", _text_model_yamls())
def test_yaml_model_section_loads_and_builds_in_both(fname):
    with open(os.path.join(ROOT, "configs", fname)) as f:
        raw = yaml.safe_load(f)
    assert set(raw) == {"model", "data", "train", "parallel"}
    name, cfg = model_config_from_dict(raw["model"])
    cfg = toy_size(cfg)
    t, j = converted_pair(name, cfg)
    assert set(t.state_dict()) == set(convert.flax_to_torch_arrays(j))
    ids = np.random.RandomState(0).randint(3, cfg.vocab_size, (1, 8)).astype(np.int32)
    args = (ids, ids) if name == "seq2seq" else (ids,)
    with torch.no_grad():
        to = t(*[torch.as_tensor(a) for a in args])
    jo = jitted(j, *args)
    assert np.abs(np.asarray(jo) - to.numpy()).max() < 1e-4  # d_model 128: a smoke check only


# ----------------------------------------------------------------------------- structure
def test_shared_and_tied_weights_have_one_key():
    t, j = converted_pair("seq2seq", Seq2SeqConfig.tiny(share_embeddings=True, tie_output=True))
    keys = set(t.state_dict())
    assert "embed.embed_tokens.weight" in keys and not any(k.startswith(("src_embed", "tgt_embed", "lm_head")) for k in keys)
    t2, _ = converted_pair("seq2seq", Seq2SeqConfig.tiny(share_embeddings=False, tie_output=False, tgt_vocab_size=40))
    keys2 = set(t2.state_dict())
    assert {"src_embed.embed_tokens.weight", "tgt_embed.embed_tokens.weight", "lm_head.weight"} <= keys2
    assert t2.state_dict()["lm_head.weight"].shape == (40, TINY_SIZES["d_model"])


# ----------------------------------------------------------------------------- intermediates
@pytest.mark.parametrize("key", sorted(MODELS))
def test_intermediates_agree_and_locate_a_divergence(key):
    name, cfg = MODELS[key]
    t, j = converted_pair(name, cfg)
    args = model_inputs(name, np.random.RandomState(1))
    t_inter, j_inter = (_intermediates(o) for o in run_both(t, j, *args, return_intermediates=True))
    assert set(t_inter) == set(j_inter)
    assert first_divergence(t_inter, j_inter) is None
    # perturb the JAX twin's last FFN only: the report must name that sub-layer, not earlier ones
    stack = j.decoder if name in ("lm", "seq2seq") else j.encoder
    last = len(stack.layers) - 1
    kernel = stack.layers[last].ffn.down_proj.kernel
    kernel[...] = kernel[...] * 1.05  # (not a constant shift, which a Post-LN norm would remove)
    t_inter, j_inter = (_intermediates(o) for o in run_both(t, j, *args, return_intermediates=True))
    report = first_divergence(t_inter, j_inter)
    assert report is not None and report.split(" ")[0].endswith(f"layers.{last}.ffn"), report


# ----------------------------------------------------------------------------- padding
@pytest.mark.parametrize("flavour", ["gpt2", "llama"])
def test_lm_left_padded_row_equals_unpadded_row(flavour):
    cfg = LMConfig.tiny(flavour)
    t, j = converted_pair("lm", cfg)
    rng = np.random.RandomState(2)
    short = rand_ids(rng, 1, 4)
    padded = np.concatenate([np.zeros((1, 3), np.int32), short], axis=1)
    mask = np.array([[0, 0, 0, 1, 1, 1, 1]], np.int32)
    for model, to_np in ((lambda *xs: jitted(j, *xs), np.asarray), (t, lambda x: x.detach().numpy())):
        conv = np.asarray if model is not t else torch.as_tensor
        alone = to_np(model(conv(short)))
        padded_out = to_np(model(conv(padded), conv(mask)))
        assert np.abs(padded_out[:, 3:] - alone).max() <= 1e-5
        assert np.isfinite(padded_out).all()
    for model, conv in ((j, jnp.asarray), (t, torch.as_tensor)):  # a concrete mask's values are checked
        with pytest.raises(ValueError, match="attention_mask"):
            model(conv(padded), conv(mask * 2))


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_classifier_ignores_padding(pooling):
    t, j = converted_pair("classifier", ClassifierConfig.tiny(pooling=pooling, norm_position="pre"))
    ids = rand_ids(np.random.RandomState(3), 1, 5)
    padded = np.concatenate([ids, np.zeros((1, 3), np.int32)], axis=1)  # pad_id 0 at the end
    jax_model = lambda *xs: jitted(j, *xs)
    for model, conv, to_np in ((jax_model, np.asarray, np.asarray), (t, torch.as_tensor, lambda x: x.detach().numpy())):
        assert np.abs(to_np(model(conv(padded))) - to_np(model(conv(ids)))).max() <= 1e-5
    # and the pad mask matters: treating the pads as tokens changes the answer
    ones = np.ones_like(padded)
    assert np.abs(np.asarray(jax_model(padded, ones)) - np.asarray(jax_model(ids))).max() > 1e-4


# ----------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("key", sorted(MODELS))
@pytest.mark.parametrize("bad", [-1, V])
def test_out_of_range_ids_raise_in_both(key, bad):
    name, cfg = MODELS[key]
    t, j = shared_pair(key)
    args = list(model_inputs(name, np.random.RandomState(4)))
    for i in range(len(args)):  # every id input: source and target for seq2seq
        bad_args = [a.copy() for a in args]
        bad_args[i][0, 1] = bad
        with pytest.raises(ValueError, match="out of range"):
            j(*[jnp.asarray(a) for a in bad_args])
        with pytest.raises(ValueError, match="out of range"):
            t(*[torch.as_tensor(a) for a in bad_args])


@pytest.mark.parametrize("key", sorted(MODELS))
def test_sequence_over_max_len_raises_in_both(key):
    name, cfg = MODELS[key]
    t, j = shared_pair(key)
    args = model_inputs(name, np.random.RandomState(5), t=cfg.max_len + 1)
    with pytest.raises(ValueError, match="exceeds max_len"):
        j(*[jnp.asarray(a) for a in args])
    with pytest.raises(ValueError, match="exceeds max_len"):
        t(*[torch.as_tensor(a) for a in args])


def test_bad_configs_are_rejected():
    with pytest.raises(ValueError, match="pooling"):
        ClassifierConfig.tiny(pooling="max")
    with pytest.raises(ValueError, match="tgt_vocab_size"):
        Seq2SeqConfig.tiny(share_embeddings=True, tgt_vocab_size=10)
    with pytest.raises(ValueError, match="eos_id"):
        LMConfig.tiny(eos_id=-1)
    with pytest.raises(ValueError, match="eos_id"):
        LMConfig.tiny(eos_id="2")
    # ids past the vocab are token metadata, as in HF configs (generation never samples them)
    assert LMConfig.tiny(eos_id=(2, V)).eos_id == (2, V)
    with pytest.raises(ValueError, match="dtype"):
        LMConfig.tiny(dtype="float16")


# ----------------------------------------------------------------------------- bf16 compute
def _kl(p_logits: np.ndarray, q_logits: np.ndarray) -> float:
    """mean over positions of KL(p || q), from logits, in float64."""
    lp = p_logits - np.logaddexp.reduce(p_logits, axis=-1, keepdims=True)
    lq = q_logits - np.logaddexp.reduce(q_logits, axis=-1, keepdims=True)
    return float(np.mean(np.sum(np.exp(lp) * (lp - lq), axis=-1)))


BF16 = {
    "lm_gpt2": ("lm", LMConfig.tiny("gpt2")),
    "lm_llama": ("lm", LMConfig.tiny("llama")),
    "lm_moe": ("lm", LMConfig.tiny("llama", moe=MoEConfig(num_experts=4, top_k=2, router="softmax_topk",
                                                           d_expert=16))),
    "seq2seq": ("seq2seq", Seq2SeqConfig.tiny(norm_position="pre")),
    "classifier": ("classifier", ClassifierConfig.tiny(num_classes=8)),
}


@pytest.mark.parametrize("key", sorted(BF16))
def test_bf16_forward_matches_torch_autocast(key, capsys):
    """bf16 compute (fp32 params): JAX (nnx.Linear dtype=bf16) vs torch.autocast(bf16) on CPU,
    KL(p_torch || p_jax) <= 1e-3 (docs/numerics.md §13: compare bf16 with bf16, report the KL).
    Measured (seed 0, torch 2.13 / jax 0.10.2 CPU): lm_gpt2 2.9e-5, seq2seq 2.0e-5, lm_llama
    7.2e-6, classifier 3.3e-6 (max |logit diff| 8e-3..3e-2; each framework's bf16 is itself
    4e-3..3e-2 off its fp32 run)."""
    name, cfg = BF16[key]
    t, j = converted_pair(name, dataclasses.replace(cfg, dtype="bfloat16"))
    t32, j32 = converted_pair(name, cfg)
    assert all(p.dtype == torch.float32 for p in t.parameters())  # params stay fp32
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(nnx.state(j, nnx.Param)))
    args = model_inputs(name, np.random.RandomState(6), t=8)
    to, jo = run_both(t, j, *args)
    to32, jo32 = run_both(t32, j32, *args)
    assert to.dtype == torch.float32 and jo.dtype == jnp.float32  # logits cast back at the exit
    to, to32 = to.numpy().astype(np.float64), to32.numpy().astype(np.float64)
    jo, jo32 = np.asarray(jo, np.float64), np.asarray(jo32, np.float64)
    kl = _kl(to, jo)
    with capsys.disabled():
        print(f"\n[bf16] {key}: KL(p_torch || p_jax) = {kl:.3e}, max |logit diff| = "
              f"{np.abs(to - jo).max():.3e}; bf16 vs fp32: jax {np.abs(jo - jo32).max():.3e}, "
              f"torch {np.abs(to - to32).max():.3e}")
    assert kl <= 1e-3
    # the bf16 runs really computed in bf16 (so this test could fail): both moved off fp32
    assert np.abs(jo - jo32).max() > 1e-3 and np.abs(to - to32).max() > 1e-3


def test_cast_params_stores_a_concrete_model_in_the_asked_dtype():
    """models.cast_params on a built (concrete) model: every float Param is stored as bfloat16,
    each value rounded as astype rounds it, and the other state (RNG keys and counts) is left
    alone; an unknown dtype is refused. (jaxformer.load and the HF import cast abstract models:
    tests/test_hf_bf16.py, tests/test_export.py.)"""
    from jaxformer.models import build_model, cast_params

    def flat(filt):
        return {p: np.asarray(jax.random.key_data(v.get_value()) if jnp.issubdtype(v.dtype, jax.dtypes.prng_key)
                              else v.get_value()) for p, v in nnx.to_flat_state(nnx.state(model, filt))}
    model = build_model("lm", LMConfig(vocab_size=V, d_model=16, num_heads=2, d_ff=32, num_layers=1, max_len=8))
    params, rest = flat(nnx.Param), flat(nnx.Not(nnx.Param))
    cast_params(model, "bfloat16")
    cast = flat(nnx.Param)
    assert cast.keys() == params.keys() and {x.dtype for x in cast.values()} == {np.dtype(jnp.bfloat16)}
    assert all(np.array_equal(params[p].astype(jnp.bfloat16), cast[p]) for p in params)
    after = flat(nnx.Not(nnx.Param))
    assert after.keys() == rest.keys() and all(np.array_equal(rest[p], after[p]) for p in rest)
    with pytest.raises(ValueError, match="param dtype 'float16'"):
        cast_params(model, "float16")
