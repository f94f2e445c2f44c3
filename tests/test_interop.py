"""jaxformer.interop: live torch.nn Transformer modules imported into jaxformer, checked with
assert_parity (outputs and every parameter's gradient, fp32, eval mode), and the refusals.

Each torch module is called as its users call it (its own layout, torch's masks, True =
ignore); the jaxformer import is called batch-first with the masks converted by
interop.masks_from_torch. The weights come from from_torch itself (convert=False), so the
copy is checked too; interop.torch_state maps the torch gradients onto jaxformer's names.
"""
from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from flax import nnx
from torch import nn

from jaxformer import interop
from jaxformer.parity import ParityOptions, assert_parity

B, T, S, D, H = 2, 5, 4, 16, 4


class TorchCall(nn.Module):
    """The torch.nn module under test (`inner`), called by `call(inner, **inputs)`."""

    def __init__(self, inner: nn.Module, call):
        super().__init__()
        self.inner, self.call = inner, call

    def forward(self, **kw):
        return self.call(self.inner, **kw)


class FlaxCall(nnx.Module):
    """The imported jaxformer module (`inner`), called by `call(inner, **inputs)`."""

    def __init__(self, inner: nnx.Module, call):
        self.inner, self.call = inner, call

    def __call__(self, **kw):
        return self.call(self.inner, **kw)


def check(module: nn.Module, torch_call, flax_call, inputs: dict, case: str, **from_torch_kw):
    """from_torch(module), then assert_parity of the two calls; -> the report."""
    module.eval()
    imported = interop.from_torch(module, **from_torch_kw)

    def state_map(sd):
        inner = interop.torch_state(module, {k.removeprefix("inner."): v for k, v in sd.items()})
        return {f"inner.{k}": v for k, v in inner.items()}
    return assert_parity(TorchCall(module, torch_call), FlaxCall(imported, flax_call), inputs,
                         ParityOptions(convert=False, state_map=state_map, case=case))


def seq_first(x):  # [B, T, D] <-> [T, B, D]
    return None if x is None else x.transpose(0, 1)


def padding(lengths, n):
    """torch key_padding_mask [B, n]: True = padding (ignored)."""
    return np.arange(n)[None, :] >= np.asarray(lengths)[:, None]


def rand(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


# ----------------------------------------------------------------------------- nn.MultiheadAttention
MHA_CASES = {
    "batch_first_padding": dict(kw=dict(batch_first=True), attn_mask=False),
    "seq_first_nobias_bool_attn_mask": dict(kw=dict(batch_first=False, bias=False), attn_mask=True),
    "kdim_vdim_cross": dict(kw=dict(batch_first=True, kdim=12, vdim=10), attn_mask=False),
    "bias_kv_zero_attn_float_mask": dict(kw=dict(batch_first=True, add_bias_kv=True, add_zero_attn=True),
                                         attn_mask="float"),
}


@pytest.mark.parametrize("tag", MHA_CASES)
def test_multihead_attention(tag):
    spec = MHA_CASES[tag]
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(D, H, **spec["kw"])
    with torch.no_grad():  # torch zero-inits these biases; random ones are checked too
        for p in (mha.in_proj_bias, mha.out_proj.bias):
            if p is not None:
                p.normal_()
    first = mha.batch_first
    rng = np.random.RandomState(1)
    kdim, vdim = spec["kw"].get("kdim", D), spec["kw"].get("vdim", D)
    cross = kdim != D
    inputs = {"x": rand(rng, B, T, D), "kpm": padding([S, 2] if cross else [T, 3], S if cross else T)}
    if cross:
        inputs.update(key=rand(rng, B, S, kdim), value=rand(rng, B, S, vdim))
    n = S if cross else T
    if spec["attn_mask"] is True:
        inputs["am"] = np.triu(np.ones((T, n), bool), 1)  # torch polarity: True = not allowed
    elif spec["attn_mask"] == "float":
        inputs["am"] = rand(rng, T, n)  # additive, finite everywhere: jaxformer gets it as bias

    def t_call(m, x, kpm, key=None, value=None, am=None):
        key = x if key is None else key
        value = key if value is None else value
        if not first:
            x, key, value = seq_first(x), seq_first(key), seq_first(value)
        out = m(x, key, value, key_padding_mask=kpm, attn_mask=am, need_weights=False)[0]
        return out if first else seq_first(out)

    def j_call(m, x, kpm, key=None, value=None, am=None):
        mask, bias = interop.masks_from_torch(key_padding_mask=kpm, attn_mask=am, num_heads=H)
        return m(x, key, value=value, mask=mask, bias=bias)

    report = check(mha, t_call, j_call, inputs, f"interop_mha_{tag}")
    assert report.outputs and report.grads
    if spec["kw"].get("add_bias_kv"):  # the slots and the key bias have gradients to match
        assert {"inner.bias_k", "inner.bias_v", "inner.k_proj.bias"} <= set(report.grads)
        assert report.grads["inner.k_proj.bias"].ref_max > 1e-3  # not cut: the slots carry no b_k


@pytest.mark.parametrize("need_weights", [False, True])
@pytest.mark.parametrize("extra", ["add_bias_kv", "add_zero_attn"])
def test_multihead_attention_is_causal_with_appended_slots(extra, need_weights):
    """torch's is_causal hint: with need_weights=False and no key_padding_mask, torch drops
    attn_mask and runs SDPA's causal mask over the S + n keys, which hides the appended slot;
    with need_weights=True it uses attn_mask and the slot is visible. masks_from_torch with
    the same flags (and the imported module) gives the same outputs on both paths."""
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(D, H, batch_first=True, **{extra: True}).eval()
    if extra == "add_bias_kv":
        with torch.no_grad():
            mha.bias_v.normal_()  # torch inits it near 0: a hidden or visible slot must differ
    x = torch.from_numpy(rand(np.random.RandomState(1), B, T, D))
    causal = nn.Transformer.generate_square_subsequent_mask(T)
    with torch.no_grad():
        want = mha(x, x, x, attn_mask=causal, is_causal=True, need_weights=need_weights)[0].numpy()
    jmod = interop.from_torch(mha)
    mask, bias = interop.masks_from_torch(attn_mask=causal, is_causal=True, need_weights=need_weights,
                                          attention=jmod)
    got = np.asarray(jmod(x.numpy(), mask=mask, bias=bias))
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
    visible = np.asarray(jmod(x.numpy(), mask=interop.masks_from_torch(attn_mask=causal)[0]))
    assert np.abs(visible - want).max() > 1e-2 or need_weights  # the two torch paths differ


def test_is_causal_sdpa_path_needs_the_attention():
    causal = nn.Transformer.generate_square_subsequent_mask(T)
    with pytest.raises(ValueError, match="attention="):
        interop.masks_from_torch(attn_mask=causal, is_causal=True, need_weights=False)
    with pytest.raises(ValueError, match="needs attn_mask"):
        interop.masks_from_torch(is_causal=True)


def test_is_causal_without_need_weights_is_refused_where_the_paths_differ():
    """torch's two is_causal paths differ by 0.34-0.92 on a module with appended slots: without
    need_weights (or with a module that has slots) the call is ambiguous and refused by name;
    a module without slots gives one answer on both paths, so it needs no flag."""
    causal = nn.Transformer.generate_square_subsequent_mask(T)
    torch.manual_seed(0)
    slots = interop.from_torch(nn.MultiheadAttention(D, H, batch_first=True, add_zero_attn=True))
    plain = interop.from_torch(nn.MultiheadAttention(D, H, batch_first=True))
    for attention in (None, slots):
        with pytest.raises(ValueError, match=r"^masks_from_torch\(is_causal=True\) without key_padding_mask: pass "
                                             r"need_weights= as in the torch call \(False: SDPA's causal path"):
            interop.masks_from_torch(attn_mask=causal, is_causal=True, attention=attention)
    mask, bias = interop.masks_from_torch(attn_mask=causal, is_causal=True, attention=plain)
    assert bias is None and np.array_equal(np.asarray(mask)[0, 0], np.tril(np.ones((T, T), bool)))
    kpm = torch.from_numpy(padding([T, 3], T))  # with a key_padding_mask torch always uses attn_mask
    assert interop.masks_from_torch(kpm, causal, is_causal=True, attention=slots)[0].shape == (B, 1, T, T)


# ----------------------------------------------------------------------------- encoder layer and stack
ENCODER_CASES = {
    "layer_postln_relu": dict(stack=0, kw=dict(activation="relu", batch_first=True)),
    "layer_preln_gelu_seq_first_nobias": dict(stack=0, kw=dict(activation="gelu", norm_first=True, bias=False,
                                                               layer_norm_eps=1e-6)),
    "stack_preln_silu_final_norm": dict(stack=2, kw=dict(activation=nn.SiLU(), norm_first=True, batch_first=True)),
    "stack_postln_gelu_tanh": dict(stack=2, kw=dict(activation=functools.partial(F.gelu, approximate="tanh"),
                                                    batch_first=True)),
}


@pytest.mark.parametrize("tag", ENCODER_CASES)
def test_transformer_encoder(tag):
    spec = ENCODER_CASES[tag]
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(D, H, dim_feedforward=24, dropout=0.1, **spec["kw"])
    module = layer if not spec["stack"] else nn.TransformerEncoder(
        layer, spec["stack"], norm=nn.LayerNorm(D) if spec["kw"].get("norm_first") else None,
        enable_nested_tensor=False)
    first = layer.self_attn.batch_first
    rng = np.random.RandomState(2)
    inputs = {"x": rand(rng, B, T, D) * 2, "kpm": padding([T, 3], T)}

    def t_call(m, x, kpm):
        kw = dict(src_key_padding_mask=kpm)
        out = m(x, **kw) if first else seq_first(m(seq_first(x), **kw))
        return out

    def j_call(m, x, kpm):
        return m(x, mask=interop.masks_from_torch(key_padding_mask=kpm)[0])

    check(module, t_call, j_call, inputs, f"interop_encoder_{tag}")


def test_encoder_fast_path_matches_on_real_tokens():
    """Under torch.no_grad, eval and batch_first, nn.TransformerEncoder takes its fast path
    (nested tensors): padded positions come out 0 there, real ones match the import."""
    torch.manual_seed(0)
    enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(D, H, 24, batch_first=True), 2).eval()
    x, kpm = torch.randn(B, T, D), torch.from_numpy(padding([T, 3], T))
    with torch.no_grad():
        ref = enc(x, src_key_padding_mask=kpm).numpy()
    got = np.asarray(interop.from_torch(enc)(x.numpy(), mask=interop.masks_from_torch(kpm)[0]))
    real = ~kpm.numpy()
    assert np.abs(got[real] - ref[real]).max() < 1e-5
    assert np.all(ref[~real] == 0)  # torch's fast path zeroes padded rows; the import does not


# ----------------------------------------------------------------------------- decoder layer and stack
DECODER_CASES = {
    "layer_postln_relu_causal_float_mask": dict(stack=0, causal=None, kw=dict(batch_first=True)),
    "stack_causal_preln_gelu": dict(stack=2, causal=True, kw=dict(activation="gelu", norm_first=True,
                                                                   batch_first=True)),
    "stack_not_causal_postln_seq_first": dict(stack=2, causal=False, kw=dict(activation=nn.ReLU())),
}


@pytest.mark.parametrize("tag", DECODER_CASES)
def test_transformer_decoder(tag):
    spec = DECODER_CASES[tag]
    torch.manual_seed(0)
    layer = nn.TransformerDecoderLayer(D, H, dim_feedforward=24, dropout=0.1, **spec["kw"])
    module = layer if not spec["stack"] else nn.TransformerDecoder(layer, spec["stack"], norm=nn.LayerNorm(D))
    first = layer.self_attn.batch_first
    rng = np.random.RandomState(3)
    inputs = {"x": rand(rng, B, T, D), "memory": rand(rng, B, S, D), "tgt_kpm": padding([T, 4], T),
              "mem_kpm": padding([S, 2], S)}
    # torch sees causality only through tgt_mask; the layer and the causal stack get it, the
    # non-causal stack does not (then the import must not add one either)
    causal_mask = nn.Transformer.generate_square_subsequent_mask(T) if spec["causal"] is not False else None

    def t_call(m, x, memory, tgt_kpm, mem_kpm):
        kw = dict(tgt_mask=causal_mask, tgt_key_padding_mask=tgt_kpm, memory_key_padding_mask=mem_kpm)
        if first:
            return m(x, memory, **kw)
        return seq_first(m(seq_first(x), seq_first(memory), **kw))

    def j_call(m, x, memory, tgt_kpm, mem_kpm):
        if spec["stack"]:  # the stack adds the causal mask itself when imported with causal=True
            mask, _ = interop.masks_from_torch(key_padding_mask=tgt_kpm)
            return m(x, memory, mask=mask, memory_mask=interop.masks_from_torch(key_padding_mask=mem_kpm)[0])
        mask, bias = interop.masks_from_torch(key_padding_mask=tgt_kpm, attn_mask=causal_mask.numpy())
        assert bias is None  # 0 / -inf: a pure boolean mask
        return m(x, memory, mask=mask, memory_mask=interop.masks_from_torch(key_padding_mask=mem_kpm)[0])

    kw = {} if spec["causal"] is None else {"causal": spec["causal"]}
    check(module, t_call, j_call, inputs, f"interop_decoder_{tag}", **kw)


def test_transformer_end_to_end():
    """nn.Transformer (both final norms), sequence-first, pre-LN, GELU, padded source and
    target, causal target: from_torch(causal=True)."""
    torch.manual_seed(0)
    model = nn.Transformer(D, H, num_encoder_layers=2, num_decoder_layers=1, dim_feedforward=24,
                           dropout=0.1, activation="gelu", norm_first=True)
    rng = np.random.RandomState(4)
    inputs = {"src": rand(rng, B, S, D), "tgt": rand(rng, B, T, D), "src_kpm": padding([S, 2], S),
              "tgt_kpm": padding([T, 3], T)}
    causal = nn.Transformer.generate_square_subsequent_mask(T)

    def t_call(m, src, tgt, src_kpm, tgt_kpm):
        out = m(seq_first(src), seq_first(tgt), tgt_mask=causal, src_key_padding_mask=src_kpm,
                tgt_key_padding_mask=tgt_kpm, memory_key_padding_mask=src_kpm)
        return seq_first(out)

    def j_call(m, src, tgt, src_kpm, tgt_kpm):
        src_mask, _ = interop.masks_from_torch(key_padding_mask=src_kpm)
        tgt_mask, _ = interop.masks_from_torch(key_padding_mask=tgt_kpm)
        return m(src, tgt, src_mask=src_mask, tgt_mask=tgt_mask, memory_mask=src_mask)

    imported = interop.from_torch(model.eval(), causal=True)
    assert imported.encoder.final_norm is not None and imported.decoder.final_norm is not None
    check(model, t_call, j_call, inputs, "interop_transformer", causal=True)


# ----------------------------------------------------------------------------- masks and refusals
def test_masks_from_torch_polarity_and_forms():
    kpm = padding([3, 2], 3)
    mask, bias = interop.masks_from_torch(key_padding_mask=kpm)
    assert bias is None and mask.shape == (2, 1, 1, 3)
    np.testing.assert_array_equal(np.asarray(mask)[:, 0, 0], ~kpm)
    causal = nn.Transformer.generate_square_subsequent_mask(3)  # float 0 / -inf
    mask, bias = interop.masks_from_torch(attn_mask=causal)
    assert bias is None
    np.testing.assert_array_equal(np.asarray(mask)[0, 0], np.tril(np.ones((3, 3), bool)))
    additive = torch.tensor([[0.0, -1.0, float("-inf")]] * 3)
    mask, bias = interop.masks_from_torch(attn_mask=additive)
    np.testing.assert_array_equal(np.asarray(mask)[0, 0, 0], [True, True, False])
    np.testing.assert_array_equal(np.asarray(bias)[0, 0, 0], [0.0, -1.0, 0.0])
    per_head = np.zeros((2 * H, 3, 3), bool)
    per_head[H + 1, 0, 2] = True  # batch 1, head 1, query 0 may not see key 2
    mask, _ = interop.masks_from_torch(attn_mask=per_head, num_heads=H)
    assert mask.shape == (2, H, 3, 3) and not mask[1, 1, 0, 2] and bool(mask.sum() == 2 * H * 9 - 1)


@pytest.mark.parametrize("kw,match", [
    # jaxformer's polarity (True = attend) passed as torch's: a row without padding ignores all
    (dict(key_padding_mask=~padding([3, 2], 3)), r"row\(s\) \[0\] may attend to no key"),
    (dict(key_padding_mask=np.full((2, 3), -np.inf, np.float32)), r"row\(s\) \[0, 1\]"),
    (dict(key_padding_mask=np.ones((2, 3), np.int64)), "bool .* or float"),
    (dict(attn_mask=np.tril(np.ones((3, 3), bool))), r"query row\(s\) \[2\] ignore every key"),
    (dict(attn_mask=np.zeros((8, 3, 3), bool)), "needs num_heads"),
    (dict(key_padding_mask=np.zeros(3, bool)), r"must be \[B, S\]"),
])
def test_masks_from_torch_refuses(kw, match):
    with pytest.raises(ValueError, match=match):
        interop.masks_from_torch(**kw)


def test_check_key_mask():
    interop.check_key_mask(np.array([[True, False], [False, True]]))
    with pytest.raises(ValueError, match=r"row\(s\) \[1\].*looks inverted"):
        interop.check_key_mask(np.array([[True, False], [False, False]]))


class MyLayer(nn.TransformerEncoderLayer):
    pass


def _bad_modules():
    torch.manual_seed(0)
    odd = nn.TransformerEncoderLayer(D, H, 24, activation=lambda x: x * torch.sigmoid(1.702 * x))
    no_affine = nn.TransformerEncoderLayer(D, H, 24)
    no_affine.norm2 = nn.LayerNorm(D, elementwise_affine=False)
    mixed_eps = nn.TransformerEncoder(nn.TransformerEncoderLayer(D, H, 24), 2, enable_nested_tensor=False)
    mixed_eps.layers[1].norm1.eps = 1e-3
    kdim_inside = nn.TransformerDecoderLayer(D, H, 24)
    kdim_inside.multihead_attn = nn.MultiheadAttention(D, H, kdim=8, vdim=8)
    return {
        "activation": (odd, {}, r"activation <function .*<lambda>.* is not one jaxformer can identify"),
        "subclass": (MyLayer(D, H, 24), {}, "MyLayer subclasses nn.TransformerEncoderLayer"),
        "not_a_kind": (nn.Linear(2, 2), {}, "Linear is not one of"),
        "no_affine": (no_affine, {}, r"norm2: LayerNorm\(elementwise_affine=False\)"),
        "layers_differ": (mixed_eps, {}, r"layers.1: the LayerNorms have different eps"),
        "kdim_in_layer": (kdim_inside, {}, "multihead_attn uses kdim/vdim"),
        "causal_on_layer": (nn.TransformerEncoderLayer(D, H, 24), {"causal": True}, "causal= applies to"),
    }


@pytest.mark.parametrize("name", ["activation", "subclass", "not_a_kind", "no_affine", "layers_differ",
                                  "kdim_in_layer", "causal_on_layer"])
def test_from_torch_refuses(name):
    module, kw, match = _bad_modules()[name]
    with pytest.raises(ValueError, match=match):
        interop.from_torch(module, **kw)


def test_attention_slots_refuse_cache_and_rope():
    from jaxformer.config import Rope
    with pytest.raises(ValueError, match="cannot be combined with RoPE"):
        interop.TorchMultiheadAttention(D, H, rope=Rope(8), add_bias_kv=True, rngs=nnx.Rngs(0))
    m = interop.TorchMultiheadAttention(D, H, add_zero_attn=True, rngs=nnx.Rngs(0))
    cache = {"k": np.zeros((1, H, 4, D // H), np.float32), "v": np.zeros((1, H, 4, D // H), np.float32)}
    with pytest.raises(ValueError, match="not supported together with a KV cache"):
        m(np.zeros((1, 1, D), np.float32), cache=cache, cache_index=0)
