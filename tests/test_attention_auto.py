"""train.attention "auto" (jaxformer/layers/dispatch.py choose_attention): which kernel each
platform and shape gets, and why (traced only, nothing compiled but two CPU calls); that the
choice computes what the chosen kernel computes when asked for by name; that an explicit choice
is still taken as asked; the torch twin's rule. The compile report's per-choice lines are
checked on a compiled TPU program in tests/test_tpu_compile.py."""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from jaxformer import lowering
from jaxformer.layers.dispatch import ScoreMods, choose_attention, dot_product_attention
from jaxformer.layers.masks import AttentionMask
from jaxformer.tables import AUTO_BLOCKWISE_MIN_KEYS

H, G = 4, 2


def _qkv(t: int, k: int = 16, dtype=jnp.float32, s: int | None = None):
    s = t if s is None else s
    return (jax.ShapeDtypeStruct((1, t, H, k), dtype), jax.ShapeDtypeStruct((1, s, G, k), dtype),
            jax.ShapeDtypeStruct((1, s, G, k), dtype))


def _choice(platform: str, t: int, *, mask=None, k: int = 16, dtype=jnp.float32, **kw):
    q, kk, v = _qkv(t, k, dtype)
    mask = AttentionMask.self_attention(1, t, causal=True) if mask is None else mask
    with lowering.tracing(platform=platform):
        return choose_attention(q, kk, v, mask, **kw)


def _segments(t):
    return jnp.asarray(np.where(np.arange(t) < t // 2, 1, 2)[None], jnp.int32)


# (platform, T, options) -> (kernel, the start of its reason)
CHOICES = {
    "cpu_short": (("cpu", 128, {}), ("plain", "128 keys < 1024")),
    "cpu_at_threshold": (("cpu", 1024, {}), ("blockwise", "1024 keys >= 1024")),
    "cpu_long_bf16": (("cpu", 4096, {"dtype": jnp.bfloat16}), ("blockwise", "4096 keys >= 1024")),
    "tpu_causal": (("tpu", 256, {}), ("splash", "the TPU kernel takes this call")),
    "tpu_packed_window": (("tpu", 512, {"mask": "segments_window"}), ("splash", "the TPU kernel")),
    "tpu_alibi_long": (("tpu", 2048, {"mask": "alibi"}), ("blockwise", "splash refused: ALiBi; 2048 keys >= 1024")),
    "tpu_odd_length": (("tpu", 100, {}), ("plain", "splash refused: length not a multiple of 128; 100 keys < 1024")),
    "tpu_bias": (("tpu", 256, {"bias": True}), ("plain", "splash refused: attention bias; 256 keys < 1024")),
    "gpu_bf16_causal": (("gpu", 512, {"dtype": jnp.bfloat16}), ("cudnn", "cuDNN flash attention takes this call")),
    "gpu_bf16_window": (("gpu", 512, {"dtype": jnp.bfloat16, "mask": "window"}), ("cudnn", "cuDNN flash")),
    "gpu_fp32": (("gpu", 2048, {}), ("blockwise", "cuDNN refused: dtype float32 (bf16 / fp16 only); 2048 keys")),
    "gpu_head_dim_256": (("gpu", 512, {"dtype": jnp.bfloat16, "k": 256}), ("plain", "cuDNN refused: head dim 256")),
    "gpu_packed": (("gpu", 512, {"dtype": jnp.float16, "mask": "segments"}), ("plain", "cuDNN refused: segment ids")),
    "gpu_softcap": (("gpu", 512, {"dtype": jnp.bfloat16, "scores": ScoreMods(softcap=30.0)}), ("plain", "cuDNN refused: soft-cap")),
    "dense_mask": (("tpu", 256, {"mask": "dense"}), ("plain", "a dense mask: only the plain path takes it")),
    "weights_asked": (("tpu", 2048, {"return_weights": True}), ("plain", "the attention weights asked for")),
    "decode": (("tpu", 2048, {"mode": "decode"}), ("plain", "a KV cache")),
    "dropout": (("cpu", 2048, {"dropout_active": True}), ("plain", "attention dropout")),
}


def _mask(name, t):
    causal = AttentionMask.self_attention(1, t, causal=True)
    if name == "segments":
        return AttentionMask.self_attention(1, t, causal=True, segment_ids=_segments(t))
    if name == "segments_window":
        return AttentionMask.self_attention(1, t, causal=True, segment_ids=_segments(t)).with_window(64)
    if name == "window":
        return causal.with_window(64)
    if name == "alibi":
        return dataclasses.replace(causal, alibi_slopes=jnp.ones((H,), jnp.float32))
    if name == "dense":
        return dataclasses.replace(causal, other=jnp.ones((1, 1, t, t), bool))
    return None


@pytest.mark.parametrize("name", sorted(CHOICES))
def test_auto_choice_per_platform_and_shape(name):
    (platform, t, opts), (kernel, why) = CHOICES[name]
    opts = dict(opts)
    if "mask" in opts:
        opts["mask"] = _mask(opts["mask"], t)
    if opts.pop("bias", False):
        opts["bias"] = jnp.zeros((1, H, t, t), jnp.float32)
    got = _choice(platform, t, **opts)
    assert got[0] == kernel and got[1].startswith(why), got


def test_threshold_is_the_measured_one():
    """bench/attention_auto.py measured blockwise at least as fast as plain on CPU from 1024 keys
    on (bench/README.md, "Attention auto threshold"); lowering and the torch twin read this one."""
    from torch_ref import lowering as tlowering
    assert AUTO_BLOCKWISE_MIN_KEYS == lowering.AUTO_BLOCKWISE_MIN_KEYS == tlowering.AUTO_BLOCKWISE_MIN_KEYS == 1024


def test_context_axis_runs_ring():
    q, k, v = _qkv(256)
    with lowering.tracing(platform="tpu", context_axis="context"):
        assert choose_attention(q, k, v, AttentionMask.self_attention(1, 256, causal=True))[0] == "blockwise"


@pytest.mark.parametrize("t,asked", [(64, "plain"), (AUTO_BLOCKWISE_MIN_KEYS, "blockwise")])
def test_auto_computes_what_its_choice_computes(t, asked):
    """On CPU, auto's output is bit for bit the output of the kernel it chose, asked by name, and
    the kernel log says what ran and why."""
    r = np.random.RandomState(0)
    q = jnp.asarray(r.standard_normal((1, t, 2, 8)), jnp.float32)
    k, v = (jnp.asarray(r.standard_normal((1, t, 1, 8)), jnp.float32) for _ in range(2))
    mask = AttentionMask.self_attention(1, t, causal=True)
    outs = {}
    for attention in ("auto", asked):
        with lowering.tracing(attention=attention, platform="cpu"), lowering.recording_kernels() as log:
            outs[attention] = jax.jit(lambda q, k, v: dot_product_attention(q, k, v, mask=mask))(q, k, v)
        outs[attention + " log"] = log
    np.testing.assert_array_equal(outs["auto"], outs[asked])
    assert outs["auto log"] == [f"{outs[asked + ' log'][0]} [auto: {t} keys {'<' if asked == 'plain' else '>='} 1024]"]


@pytest.mark.parametrize("asked,ran", [("plain", "plain (fused: auto)"), ("blockwise", "blockwise"),
                                       ("splash", "splash")])
def test_an_explicit_choice_runs_as_asked(asked, ran):
    """A setting auto would not pick (plain at 4096 keys on TPU, blockwise where splash takes the
    call) still runs as asked, with no auto reason."""
    q, k, v = _qkv(4096)
    mask = AttentionMask.self_attention(1, 4096, causal=True)
    with lowering.tracing(attention=asked, platform="tpu"), lowering.recording_kernels() as log:
        jax.eval_shape(lambda q, k, v: dot_product_attention(q, k, v, mask=mask), q, k, v)
    assert log == [ran]


def test_torch_twin_auto_by_length():
    """torch_ref's "auto": blockwise from AUTO_BLOCKWISE_MIN_KEYS keys on, plain below (its
    computing() switch), the same numbers as that kernel asked by name."""
    from torch_ref import lowering as tlowering
    from torch_ref.layers import dispatch as tdispatch
    from torch_ref.layers.masks import AttentionMask as TMask
    calls = []
    real = tdispatch.blockwise_attention

    def spy(*a, **kw):
        calls.append(a[0].shape[1])
        return real(*a, **kw)
    r = np.random.RandomState(0)
    for t in (16, AUTO_BLOCKWISE_MIN_KEYS):
        q = torch.tensor(r.standard_normal((1, t, 2, 8)), dtype=torch.float32)
        k = torch.tensor(r.standard_normal((1, t, 1, 8)), dtype=torch.float32)
        mask = TMask.self_attention(1, t, causal=True)
        outs = {}
        for attention in ("auto", "plain" if t < AUTO_BLOCKWISE_MIN_KEYS else "blockwise"):
            tdispatch.blockwise_attention = spy
            try:
                with tlowering.computing(attention=attention):
                    outs[attention] = tdispatch.dot_product_attention(q, k, k, mask=mask)
            finally:
                tdispatch.blockwise_attention = real
        a, b = outs.values()
        assert torch.equal(a, b)
    assert calls == [AUTO_BLOCKWISE_MIN_KEYS, AUTO_BLOCKWISE_MIN_KEYS]  # auto and blockwise, at the long length only


def test_long_context_config_runs_blockwise_on_cpu_and_splash_on_tpu():
    """configs/long_context.yaml leaves attention at its default: at its 8192 tokens auto picks
    blockwise on CPU (O(T) memory) and splash on TPU (the v5p compile: docs/train.md, "Long context")."""
    from jaxformer.train.config import load_config
    cfg = load_config("long_context")
    assert cfg.train.attention == "auto"
    t = cfg.data.seq_len
    assert _choice("cpu", t)[0] == "blockwise" and _choice("tpu", t)[0] == "splash"
