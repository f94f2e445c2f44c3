"""`jaxformer port --layers jaxformer`: modules with a jaxformer twin written as jaxformer's classes.

nn.MultiheadAttention (batch-first and sequence-first, key padding, boolean, float and causal
masks, appended key slots, kdim/vdim, the weights averaged or per head), nn.TransformerEncoderLayer
and nn.TransformerEncoder, nn.TransformerDecoder with a float mask (which jaxformer's stack does
not take: the stack is written op by op and its layers become DecoderLayer twins), a layer that
jaxformer.interop refuses (written op by op, the header says why) and torch_ref's MoE (whose
expert loop torch.export cannot trace: the twin is traced as one opaque op). Each port is proven
with the parity harness: every output and every parameter's gradient, torch's names mapped onto
the twin's by jaxformer.interop (port.api.state_map). The default file stays self-contained."""
from __future__ import annotations

import ast
import os
import re
import sys
import textwrap

import numpy as np
import pytest
import torch
from torch import nn

from jaxformer.port import api, port

B, T, S, D, H = 2, 6, 5, 16, 4


def rand(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def imports(source: str) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            names.add((node.module or "").split(".")[0])
    return names


def flat(source: str) -> str:
    """The source with black's line breaks undone (one space for any run of whitespace)."""
    return re.sub(r"([(\[])\s+", r"\1", re.sub(r",?\s+([)\]])", r"\1", " ".join(source.split())))


def checked(module, inputs, **kw):
    """Port with layers="jaxformer", load, check parity (outputs and every parameter's gradient,
    none left out); -> (PortResult, report)."""
    result = port(module, inputs, layers="jaxformer", **kw)
    model = api._loaded(result, module)
    report = api.check(module, model, inputs, case=type(module).__name__)
    assert report.ok, report.message()
    assert report.outputs
    missing = set(api.state_map(module, model)(dict(module.named_parameters()))) - set(report.grads)
    assert not missing, f"gradients not compared: {sorted(missing)}"
    return result, report


# ----------------------------------------------------------------------------- nn.MultiheadAttention
class MHABlock(nn.Module):
    """LayerNorm -> nn.MultiheadAttention (self-attention) -> residual -> head; the attention
    weights, when asked for, are added in (so they are an output torch and the port must agree on).
    need_weights=None: torch's default (True), the weights left unused, as most code does."""

    def __init__(self, masks: str, need_weights: bool | None = False, **kw):
        super().__init__()
        self.norm = nn.LayerNorm(D)
        self.attn = nn.MultiheadAttention(D, H, **kw)
        self.masks, self.need_weights = masks, need_weights
        self.head = nn.Linear(D, 3)

    def forward(self, x, pad):
        h = self.norm(x)
        if not self.attn.batch_first:
            h = h.transpose(0, 1)  # [T, B, D]
        t = x.shape[1]
        kw = {}
        if "kpm" in self.masks:
            kw["key_padding_mask"] = pad
        if "bool" in self.masks:
            kw["attn_mask"] = torch.triu(torch.ones(t, t, dtype=torch.bool), 1)
        if "float" in self.masks:  # additive, finite off the causal part: a bias as well as a mask
            kw["attn_mask"] = torch.triu(torch.full((t, t), float("-inf")), 1) + 0.1 * torch.arange(t).float()
        if "causal" in self.masks:  # torch's SDPA path: the causal mask of attn_mask's shape
            kw["attn_mask"], kw["is_causal"] = nn.Transformer.generate_square_subsequent_mask(t), True
        if self.need_weights is not None:
            kw["need_weights"] = self.need_weights
        out, weights = self.attn(h, h, h, **kw)
        if not self.attn.batch_first:
            out = out.transpose(0, 1)
        y = x + out
        if weights is not None and self.need_weights:
            y = y + weights[..., :1]  # the weight on the first key, [B, T, 1]
        return self.head(y)


MHA_CASES = {
    "seq_first_no_mask": dict(masks="", need_weights=None, kw=dict(batch_first=False)),
    "batch_first_padding": dict(masks="kpm", kw=dict(batch_first=True)),
    "seq_first_bool_mask_weights": dict(masks="bool", need_weights=True, kw=dict(batch_first=False)),
    "padding_float_mask_bias_kv_zero_attn": dict(masks="kpm float", kw=dict(batch_first=True, add_bias_kv=True,
                                                                           add_zero_attn=True)),
    "is_causal_no_bias": dict(masks="causal", kw=dict(batch_first=True, bias=False)),
    # torch's flags pick the path: SDPA's causal mask over S + 2 keys hides the appended slots;
    # need_weights=True keeps attn_mask, the slots visible
    "is_causal_bias_kv_zero_attn": dict(masks="causal", kw=dict(batch_first=True, add_bias_kv=True,
                                                                add_zero_attn=True)),
    "is_causal_bias_kv_visible": dict(masks="causal", need_weights=True, kw=dict(batch_first=True, add_bias_kv=True)),
}


def make_mha(tag):
    spec = MHA_CASES[tag]
    torch.manual_seed(0)
    module = MHABlock(spec["masks"], spec.get("need_weights", False), **spec["kw"]).eval()
    with torch.no_grad():  # torch zero-inits these biases; random ones are checked too
        for p in (module.attn.in_proj_bias, module.attn.out_proj.bias, module.attn.bias_k, module.attn.bias_v):
            if p is not None:
                p.normal_()
    rng = np.random.RandomState(1)
    pad = np.zeros((B, T), bool)
    pad[1, 4:] = True  # torch polarity: True = padding
    return module, {"x": rand(rng, B, T, D), "pad": pad}


@pytest.mark.parametrize("tag", MHA_CASES)
def test_multihead_attention(tag):
    module, inputs = make_mha(tag)
    result, _ = checked(module, inputs)
    src = flat(result.source)
    slots = MHA_CASES[tag]["kw"].get("add_bias_kv") or MHA_CASES[tag]["kw"].get("add_zero_attn")
    cls = "TorchMultiheadAttention" if slots else "MultiHeadAttention"  # torch.nn's own options: interop's
    assert f"from jaxformer.{'interop' if slots else 'layers.attention'} import {cls}" in src
    assert f"self.attn = {cls}(16, 4," in src
    # the projections' biases as a config.Projections record, which the file imports
    projections = "out_bias=True" if MHA_CASES[tag]["kw"].get("bias", True) else "bias=False, out_bias=False"
    assert f"projections=Projections({projections})" in src
    assert re.search(r"from jaxformer\.config\.attention import (Dropouts, )?Projections\b", src)
    assert "in_proj" not in src  # the twin holds q/k/v_proj; the loader splits torch's in_proj_weight
    if "padding" in tag:
        assert "torch_masks(key_padding_mask=pad" in src
    if "weights" in tag:
        assert "mha_outputs(self.attn(h.swapaxes(0, 1), **torch_masks(attn_mask=triu), return_weights=True), " \
               "seq_first=True, average=True)" in src  # the output sequence-first, the weights averaged
    if "causal" in tag:
        assert ("sdpa_causal=True" in src) == ("visible" not in tag) and ("slots=2" in src) == ("zero_attn" in tag)
    if "no_mask" in tag:  # torch computes the weights (need_weights=True), nothing reads them
        assert "attn = self.attn(h.swapaxes(0, 1)).swapaxes(0, 1)" in src and "torch_masks" not in src


def test_multihead_attention_cross_kdim_vdim_per_head_weights():
    """Keys and values of other widths (kdim, vdim), an additive float attn_mask, and the
    per-head weights returned (average_attn_weights=False) as a second output."""
    class Cross(nn.Module):
        def __init__(self):
            super().__init__()
            self.attn = nn.MultiheadAttention(D, H, batch_first=True, kdim=12, vdim=10)

        def forward(self, x, mem, val, bias):
            return self.attn(x, mem, val, attn_mask=bias, need_weights=True, average_attn_weights=False)

    torch.manual_seed(0)
    rng = np.random.RandomState(2)
    result, report = checked(Cross().eval(), {"x": rand(rng, B, T, D), "mem": rand(rng, B, S, 12),
                                              "val": rand(rng, B, S, 10), "bias": rand(rng, T, S)})
    assert "self.attn(x, mem, value=val, **torch_masks(attn_mask=bias), return_weights=True)" in flat(result.source)
    assert len(report.outputs) == 2  # the output and the [B, H, T, S] weights


# ----------------------------------------------------------------------------- encoder and decoder
class Encoder(nn.Module):
    def __init__(self, stack: int, **kw):
        super().__init__()
        self.embed = nn.Embedding(20, D)
        layer = nn.TransformerEncoderLayer(D, H, dim_feedforward=24, dropout=0.1, **kw)
        self.enc = layer if not stack else nn.TransformerEncoder(layer, stack, norm=nn.LayerNorm(D),
                                                                   enable_nested_tensor=False)
        self.out = nn.Linear(D, 20)
        self.batch_first = kw.get("batch_first", False)

    def forward(self, ids, pad):
        x = self.embed(ids)
        if not self.batch_first:
            x = x.transpose(0, 1)  # [T, B, D]
        x = self.enc(x, src_key_padding_mask=pad)
        return self.out(x if self.batch_first else x.transpose(0, 1))


def make_encoder(stack: int, **kw):
    torch.manual_seed(0)
    rng = np.random.RandomState(3)
    pad = np.zeros((B, T), bool)
    pad[0, 5:] = True
    return Encoder(stack, **kw).eval(), {"ids": rng.randint(0, 20, (B, T)), "pad": pad}


@pytest.mark.parametrize("stack,kw", [(0, dict(norm_first=True, activation="gelu")),
                                      (2, dict(batch_first=True))], ids=["layer_seq_first_preln", "stack"])
def test_transformer_encoder(stack, kw):
    module, inputs = make_encoder(stack, **kw)
    result, _ = checked(module, inputs)
    src = flat(result.source)
    cls = "EncoderLayer" if not stack else "Encoder"
    # the ported model's own class is named Encoder: jaxformer's is imported under another name
    local = "EncoderLayer" if not stack else "JaxformerEncoder"
    assert f"from jaxformer.layers.transformer import {cls if not stack else 'Encoder as JaxformerEncoder'} " in src
    assert f"self.enc = {local}(TransformerConfig(" in src and "class Encoder(nnx.Module):" in src
    assert "torch_masks(key_padding_mask=pad" in src
    # the twins' dropout (0.1) is what train mode changes, and the header says so
    assert f"Train mode: dropout as nnx.Dropout (model.train() / model.eval()) in `enc` ({cls})" in src


class Decoder(nn.Module):
    def __init__(self):
        super().__init__()
        layer = nn.TransformerDecoderLayer(D, H, dim_feedforward=24, dropout=0.0, batch_first=True)
        self.dec = nn.TransformerDecoder(layer, 2)

    def forward(self, x, memory, mem_pad):
        causal = nn.Transformer.generate_square_subsequent_mask(x.shape[1])  # float: 0 / -inf
        return self.dec(x, memory, tgt_mask=causal, memory_key_padding_mask=mem_pad)


def test_decoder_stack_with_a_float_mask_falls_back_to_its_layers():
    """jaxformer's Decoder takes a boolean mask only: the stack is written op by op (the header
    says why) and its two layers, which take a bias, are DecoderLayer twins."""
    torch.manual_seed(0)
    rng = np.random.RandomState(4)
    pad = np.zeros((B, S), bool)
    pad[1, 3:] = True
    result, _ = checked(Decoder().eval(), {"x": rand(rng, B, T, D), "memory": rand(rng, B, S, D), "mem_pad": pad})
    src = flat(result.source)
    assert "Note: `dec` (TransformerDecoder) written op by op: a float (additive) mask" in src
    assert src.count("DecoderLayer(") == 1 and "nnx.List([DecoderLayer(" in src
    assert "prefix=\"memory_\"" in src
    assert "Train mode" not in src  # dropout 0: train mode is eval mode


def test_a_configuration_interop_refuses_is_written_op_by_op():
    """LayerNorms with different eps inside one layer: jaxformer's layer has one eps, interop
    refuses it, so the port writes the layer op by op (proven all the same) and says why; its
    own nn.MultiheadAttention is still a twin."""
    module, inputs = make_encoder(0, batch_first=True)
    module.enc.norm2.eps = 1e-6
    result, _ = checked(module, inputs)
    src = flat(result.source)
    assert "Note: `enc` (TransformerEncoderLayer) written op by op: TransformerEncoderLayer: the LayerNorms " \
           "have different eps" in src
    assert "class TransformerEncoderLayer(nnx.Module):" in src and "self.enc = TransformerEncoderLayer(" in src
    assert "self.self_attn = MultiHeadAttention(16, 4," in src


# ----------------------------------------------------------------------------- torch_ref's MoE
class MoEBlock(nn.Module):
    """A hand-written residual block around torch_ref's MoE (its expert loop has a
    data-dependent shape: torch.export cannot trace it, so the default port refuses it)."""

    def __init__(self):
        super().__init__()
        from jaxformer.config.moe import MoEConfig
        from torch_ref.layers.moe import MoE
        self.norm = nn.LayerNorm(D)
        self.moe = MoE(D, MoEConfig(num_experts=4, top_k=2, router="softmax_topk", d_expert=8))

    def forward(self, x):
        return x + self.moe(self.norm(x))


def test_torch_ref_moe_is_its_jaxformer_twin():
    torch.manual_seed(0)
    module, inputs = MoEBlock().eval(), {"x": rand(np.random.RandomState(5), B, T, D)}
    from jaxformer.port import PortError
    with pytest.raises(PortError, match=r"aten\.where in module `moe\.experts`"):
        port(module, inputs)
    result, _ = checked(module, inputs)
    src = flat(result.source)
    assert "self.moe = MoE(16, MoEConfig(num_experts=4, top_k=2, router=\"softmax_topk\", d_expert=8), rngs=rngs)" in src
    assert "from jaxformer.config.moe import MoEConfig" in src and "from jaxformer.layers.moe import MoE" in src
    assert "moe = self.moe(norm)" in src
    assert imports(result.source) == {"jax", "flax", "jaxformer"}
    assert "Train mode" not in src  # no dropout anywhere


class SharedFFN(nn.Module):
    """torch_ref's FeedForward, whose projections the block also reads itself (a tied shortcut):
    the port reads them from the twin's leaves, in torch's layout."""

    def __init__(self):
        super().__init__()
        from torch_ref.layers.ffn import FeedForward
        self.ffn = FeedForward(D, 24, kind="gelu_tanh")

    def forward(self, x):
        return self.ffn(x) + x @ self.ffn.up_proj.weight.T @ self.ffn.down_proj.weight.T


def test_a_twins_weight_read_outside_it():
    torch.manual_seed(0)
    result, _ = checked(SharedFFN().eval(), {"x": rand(np.random.RandomState(6), B, T, D)})
    src = flat(result.source)
    assert "self.ffn = FeedForward(16, 24, kind=\"gelu_tanh\", rngs=rngs)" in src
    assert "self.ffn.up_proj.kernel[...]" in src and "self.ffn.down_proj.kernel[...]" in src


# ----------------------------------------------------------------------------- the default file
def test_default_file_stays_self_contained():
    """Without --layers jaxformer the same modules are written op by op: jax, flax, numpy only."""
    module, inputs = make_mha("batch_first_padding")
    src = port(module, inputs).source
    assert imports(src) <= {"jax", "flax", "numpy"}
    assert "MultiHeadAttention" not in src and "Layers:" not in src


def test_layers_option_is_checked():
    from jaxformer.port import PortError
    module, inputs = make_mha("batch_first_padding")
    with pytest.raises(PortError, match="layers must be one of flax, jaxformer, got 'torch'"):
        port(module, inputs, layers="torch")


FACTORY = """
import sys
sys.path.insert(0, {test_dir!r})
from test_port_layers import make_encoder

def make():
    return make_encoder(2, batch_first=True)
"""


def test_cli_layers_jaxformer(tmp_path, monkeypatch, capsys):
    from jaxformer.cli import main
    name = f"port_layers_factory_{os.getpid()}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(FACTORY.format(test_dir=os.path.dirname(__file__))))
    monkeypatch.chdir(tmp_path)
    try:
        assert main(["port", f"{name}:make", "--out", "enc.py", "--layers", "jaxformer", "--check"]) == 0
    finally:
        sys.modules.pop(name, None)
    assert " ok" in capsys.readouterr().out
    src = flat((tmp_path / "enc.py").read_text())
    assert "import Encoder as JaxformerEncoder" in src and "self.enc = JaxformerEncoder(TransformerConfig(" in src
