"""bfloat16 checkpoints load as bfloat16 (`param_dtype`), through the in-memory import, the
streaming conversion to a model checkpoint and its reload, and export back to HF."""
from __future__ import annotations

import os

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import torch
import yaml
from flax import nnx
from helpers import randomize

from jaxformer import hf
from jaxformer.checkpoint_io import load_model
from jaxformer.parity import setup_precision


@pytest.fixture(scope="module")
def bf16_llama(tmp_path_factory):
    """A tiny random LlamaForCausalLM saved in bfloat16, and the same checkpoint loaded by
    transformers in float32 (weights exactly the bfloat16 values; a model cast with .float()
    would keep the RoPE inv_freq buffer rounded to bfloat16 by the earlier .to(bfloat16))."""
    import transformers
    setup_precision()
    cfg = transformers.LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                   tie_word_embeddings=False)
    torch.manual_seed(0)
    model = randomize(transformers.LlamaForCausalLM(cfg)).to(torch.bfloat16)
    path = str(tmp_path_factory.mktemp("hf") / "llama_bf16")
    model.save_pretrained(path)
    return path, transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def _leaves(model):
    import jax
    from flax import nnx
    return jax.tree.leaves(nnx.to_pure_dict(nnx.state(model, nnx.Param)))


IDS = np.array([[3, 17, 5, 90, 41, 8], [11, 2, 60, 7, 7, 30]])


# one jitted forward for the file (a model of a structure seen before reuses its compilation),
# not one compile per eager op
_forward = nnx.jit(lambda model, ids: model(ids))


def _logits_match(model, ref) -> float:
    with torch.no_grad():
        want = ref(torch.tensor(IDS)).logits.numpy()
    got = np.asarray(_forward(model, jnp.asarray(IDS)))
    diff = float(np.abs(got - want).max())
    assert diff <= 1e-5 * max(1.0, float(np.abs(want).max())), diff
    return diff


@pytest.mark.parametrize("param_dtype, want", [("auto", "bfloat16"), ("bfloat16", "bfloat16"),
                                               ("float32", "float32")])
def test_bf16_checkpoint_loads_in_the_asked_dtype(bf16_llama, param_dtype, want):
    path, ref = bf16_llama
    model, _, _ = hf.from_pretrained(path, param_dtype=param_dtype)
    assert {np.dtype(x.dtype).name for x in _leaves(model)} == {want}
    # bfloat16 storage holds the checkpoint's values exactly; the layers compute in float32
    _logits_match(model, ref)


def test_streamed_bf16_conversion_reloads_as_bf16_and_exports(bf16_llama, tmp_path):
    path, ref = bf16_llama
    out = str(tmp_path / "ckpt")
    report = hf.convert_hf_to_flax(path, out, param_dtype="auto")
    assert report["param_dtype"] == "bfloat16"
    with open(os.path.join(out, "model.yaml")) as f:
        assert yaml.safe_load(f)["param_dtype"] == "bfloat16"
    _, _, model = load_model(out)
    assert {np.dtype(x.dtype).name for x in _leaves(model)} == {"bfloat16"}
    _logits_match(model, ref)
    back = str(tmp_path / "hf_back")
    hf.convert_flax_to_hf(out, back)
    import json
    with open(os.path.join(back, "config.json")) as f:
        assert json.load(f)["dtype"] == "bfloat16"
    from safetensors import safe_open
    with safe_open(os.path.join(back, "model.safetensors"), "np") as f:
        assert {f.get_slice(k).get_dtype() for k in f.keys()} == {"BF16"}  # noqa: SIM118 (a safetensors handle, not a dict)
    import transformers
    again = transformers.AutoModelForCausalLM.from_pretrained(back, dtype=torch.float32).eval()
    with torch.no_grad():
        np.testing.assert_array_equal(again(torch.tensor(IDS)).logits.numpy(), ref(torch.tensor(IDS)).logits.numpy())


def test_float32_checkpoint_downcasts_only_when_asked(tmp_path):
    import transformers
    cfg = transformers.LlamaConfig(vocab_size=61, hidden_size=16, intermediate_size=24, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32)
    path = str(tmp_path / "llama32")
    randomize(transformers.LlamaForCausalLM(cfg)).save_pretrained(path)
    auto, _, _ = hf.from_pretrained(path, param_dtype="auto")
    assert {np.dtype(x.dtype).name for x in _leaves(auto)} == {"float32"}
    half, _, _ = hf.from_pretrained(path, param_dtype="bfloat16")
    a, b = _leaves(auto), _leaves(half)
    assert all(np.array_equal(np.asarray(x).astype(ml_dtypes.bfloat16), np.asarray(y)) for x, y in zip(a, b, strict=True))
    with pytest.raises(ValueError, match="param dtype 'float16'"):
        hf.from_pretrained(path, param_dtype="float16")


def test_bf16_gemma2_computes_as_hf_float32_on_the_same_weights(tmp_path):
    """A bfloat16 Gemma2 checkpoint kept in bfloat16 gives HF's float32 logits on the same
    weights: the sqrt(D) embedding factor is float32 (jaxformer's stream dtype), not rounded to
    the table's bfloat16 (D = 48: 6.9282 vs 6.9375; rounded, the logits moved by 7.1e-3,
    docs/numerics.md §21)."""
    import transformers
    setup_precision()
    cfg = transformers.Gemma2Config(vocab_size=97, hidden_size=48, intermediate_size=64, num_hidden_layers=2,
                                    num_attention_heads=4, num_key_value_heads=2, head_dim=12,
                                    query_pre_attn_scalar=12, sliding_window=4, max_position_embeddings=64)
    torch.manual_seed(0)
    path = str(tmp_path / "gemma2_bf16")
    randomize(transformers.Gemma2ForCausalLM(cfg)).to(torch.bfloat16).save_pretrained(path)
    ref = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    model, _, _ = hf.from_pretrained(path, param_dtype="auto")
    assert {np.dtype(x.dtype).name for x in _leaves(model)} == {"bfloat16"}
    _logits_match(model, ref)
