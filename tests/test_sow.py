"""Intermediates by sow (layers/sow.py, both trees): what a layer sows equals its sub-layers
computed by hand, nothing stays on the modules after a capture (nor after one that raised), and
the loop, the scan and remat give the same intermediates and MoE aux outputs, in both trees."""
import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx

from jaxformer import convert
from jaxformer.config.models import LMConfig
from jaxformer.config.moe import MoEConfig
from jaxformer.layers import sow as jsow
from jaxformer.layers import transformer as jtr
from jaxformer.models import build_model as jbuild
from jaxformer.parity.cases import twin
from jaxformer.parity.results import OUT_TOL
from torch_ref.layers import sow as tsow
from torch_ref.layers import transformer as ttr
from torch_ref.models import build_model as tbuild

CFG = LMConfig.tiny("llama", moe=MoEConfig(num_experts=4, top_k=2, router="softmax_topk", d_expert=16))
IDS = np.random.RandomState(0).randint(1, 64, (2, 7))
call = lambda layer, x: layer(x)


@nnx.jit
def _by_hand(j, x):
    """(the layer's output and what it sows, its sub-layers called one by one, a plain call)."""
    attn = j.self_attn(j.attn_norm(x))  # Pre-LN
    return jsow.capture(call)(j, x), (attn, x + attn, j.ffn(j.ffn_norm(x + attn))), j(x)


def test_a_layer_sows_its_sublayers_as_computed_by_hand():
    cfg = LMConfig.tiny("gpt2").decoder_config()
    x = np.random.RandomState(1).randn(2, 5, cfg.d_model).astype(np.float32)
    j = jtr.EncoderLayer(cfg, rngs=nnx.Rngs(0))
    (y, sown), (attn, attn_residual, ffn), plain = _by_hand(j, jnp.asarray(x))
    assert set(sown) == {"attn_output", "attn_residual", "ffn_output"}
    np.testing.assert_array_equal(sown["attn_output"], attn)
    np.testing.assert_array_equal(sown["attn_residual"], attn_residual)
    np.testing.assert_array_equal(sown["ffn_output"], ffn)
    np.testing.assert_array_equal(y, attn_residual + ffn)
    np.testing.assert_array_equal(plain, y)  # an ordinary call: the same output, nothing sown
    assert not nnx.state(j, nnx.Intermediate)
    t = ttr.EncoderLayer(cfg).eval()
    with torch.no_grad():
        y, sown = tsow.capture(call)(t, torch.from_numpy(x))
        attn = t.self_attn(t.attn_norm(torch.from_numpy(x)))
        assert list(sown) == ["attn_output", "attn_residual", "ffn_output"]
        torch.testing.assert_close(sown["attn_output"], attn, rtol=0, atol=0)
        torch.testing.assert_close(sown["ffn_output"], t.ffn(t.ffn_norm(sown["attn_residual"])), rtol=0, atol=0)
        torch.testing.assert_close(t(torch.from_numpy(x)), y, rtol=0, atol=0)


def test_nothing_stays_on_the_modules():
    model = twin(lambda: jbuild("lm", CFG, seed=0), 0)
    t = tbuild("lm", CFG, seed=0).eval()
    convert.load_torch_state_dict(model, t.state_dict())
    model.eval()
    out = nnx.jit(lambda m, ids: m(ids, return_intermediates=True, return_attention=True, return_aux=True))(
        model, jnp.asarray(IDS))
    assert "layers.1.attn_weights" in out.intermediates and set(out.aux) == {"router_logits", "expert_load"}
    assert not nnx.state(model, nnx.Intermediate)
    assert not any(jsow.capturing(m) for _, m in nnx.iter_modules(model))
    # a capture whose call raises (cross-attention without memory) leaves no mark either
    cfg = LMConfig.tiny("gpt2").decoder_config()
    for layer, marked in ((jtr.DecoderLayer(cfg, rngs=nnx.Rngs(0)), lambda m: [jsow.capturing(s) for _, s in nnx.iter_modules(m)]),
                          (ttr.DecoderLayer(cfg), lambda m: [tsow.capturing(s) for s in m.modules()])):
        capture = jsow.capture if isinstance(layer, nnx.Module) else tsow.capture
        x = np.zeros((1, 3, cfg.d_model), np.float32)
        with pytest.raises(ValueError, match="needs `memory`"):
            capture(call)(layer, jnp.asarray(x) if isinstance(layer, nnx.Module) else torch.from_numpy(x))
        assert not any(marked(layer))
    with torch.no_grad():
        t(torch.from_numpy(IDS), return_intermediates=True, return_aux=True)
    assert not any(tsow.capturing(m) for m in t.modules())


def test_loop_scan_and_remat_sow_the_same_in_both_trees():
    t = tbuild("lm", CFG, seed=0).eval()
    sd = t.state_dict()
    with torch.no_grad():
        ref = t(torch.from_numpy(IDS), return_intermediates=True, return_aux=True)
    names = list(ref.intermediates)
    assert names[:6] == ["embeddings", "layers.0.attn", "layers.0.attn_residual", "layers.0.ffn", "layers.0",
                         "layers.1.attn"] and names[-1] == "final_norm"
    run = nnx.jit(lambda m, ids: m(ids, return_intermediates=True, return_aux=True))
    outs = {}
    for scan in (False, True):
        for remat in (None, "nothing_saveable"):
            cfg = dataclasses.replace(CFG, scan_layers=scan)
            m = twin(lambda cfg=cfg: jbuild("lm", cfg, seed=0), 0)
            convert.load_torch_state_dict(m, sd)
            m.eval()
            m.decoder.remat_policy = remat
            outs[scan, remat] = out = run(m, jnp.asarray(IDS))
            assert set(out.intermediates) == set(names) and set(out.aux) == {"router_logits", "expert_load"}
            assert not nnx.state(m, nnx.Intermediate)
    loop = outs[False, None]
    for key, out in outs.items():
        if not key[0]:  # the loop with and without remat: the same program's values
            for k in names:
                np.testing.assert_array_equal(out.intermediates[k], loop.intermediates[k], err_msg=f"{key} {k}")
        got = {**out.intermediates, **out.aux}
        for k, v in {**ref.intermediates, **ref.aux}.items():  # scan and torch: within the parity tolerance
            want = v.numpy()
            assert got[k].shape == want.shape and got[k].dtype == want.dtype, (key, k)
            bound = OUT_TOL.bound(float(np.abs(want).max()))
            assert float(np.abs(np.asarray(got[k]) - want).max()) <= bound, (key, k)
        assert out.aux["router_logits"].shape == (2, 2, 7, 4)
