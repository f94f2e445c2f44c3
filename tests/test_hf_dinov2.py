"""DINOv2 (Dinov2Model, Dinov2ForImageClassification) against Hugging Face transformers, random
weights, no download: each odd tiny config is built once in HF (every weight redrawn, LayerScale's
lambda1 too, so a scale on the wrong sublayer shows), saved, imported with hf.from_pretrained
(config.json + the 4.x file names, the SwiGLU FFN's fused weights_in), and compared at the
config's image size and at other sizes (the positions resampled bicubically, docs/numerics.md
§37): last_hidden_state, pooler_output and logits, fp32, each within 1e-5 x max(1, max|out|)
of transformers'. The in-memory API (5.x names) loads torch_ref strictly and is checked too.
Then the export (hf.save_pretrained) loads in transformers and gives HF's outputs again.

Measured (fp32, scaled as above): worst jaxformer vs HF 3.4e-7 over the three configs and
their sizes; the torch_ref twin equals HF exactly (0.0: the same torch ops, F.interpolate
included); the export's outputs equal HF's exactly (0.0). HF takes NCHW images, jaxformer
NHWC: the tests transpose.
"""
from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxformer import convert, hf
from jaxformer.config import ConfigError
from jaxformer.config.vision import ViTConfig
from jaxformer.convert import ConversionError
from jaxformer.hf import dinov2
from jaxformer.hf.common import ACTIVATIONS
from jaxformer.hf.families import export_problems
from jaxformer.parity import setup_precision
from tests.helpers import randomize
from torch_ref.models import build_model as tbuild

T = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

# (HF config, classifier?, the image sizes to run (H, W): the config's first, then others)
CASES = {
    # 32/8 = 4x4 grid; 24x40 -> 3x5 (rows down, columns up); GELU MLP, mlp_ratio 3
    "cls_gelu_h36": (dict(image_size=32, patch_size=8, hidden_size=36, num_attention_heads=3, mlp_ratio=3,
                          layerscale_value=0.37, num_labels=5), True, [(32, 32), (24, 40)]),
    # 20/4 = 5x5 grid; SwiGLU (fused weights_in in the file), no q/k/v bias; 16x28 -> 4x7
    "model_swiglu_h40": (dict(image_size=20, patch_size=4, hidden_size=40, num_attention_heads=5, mlp_ratio=2,
                              use_swiglu_ffn=True, qkv_bias=False, layerscale_value=1e-5),
                         False, [(20, 20), (16, 28)]),
    # 18/6 = 3x3 grid; tanh GELU, eps 1e-5, 7 heads; 24x42 -> 4x7 (both up)
    "cls_tanh_h42_p6": (dict(image_size=18, patch_size=6, hidden_size=42, num_attention_heads=7, mlp_ratio=2,
                             hidden_act="gelu_pytorch_tanh", layer_norm_eps=1e-5, layerscale_value=2.5,
                             num_labels=3), True, [(18, 18), (24, 42)]),
}
COMMON = dict(num_hidden_layers=2, num_channels=3)


@pytest.fixture(autouse=True)
def _precision():
    setup_precision()


def _hf_outputs(model, classifier: bool, nchw: np.ndarray) -> dict[str, np.ndarray]:
    with torch.no_grad():
        x = torch.from_numpy(nchw)
        base = model.dinov2 if classifier else model
        out = base(x)
        res = {"last_hidden_state": out.last_hidden_state.numpy(), "pooler": out.pooler_output.numpy()}
        if classifier:
            res["logits"] = model(x).logits.numpy()
    return res


def _ours(run, classifier: bool, nhwc: np.ndarray) -> dict[str, np.ndarray]:
    out, inter = run(nhwc)
    h = np.asarray(inter["encoder.final_norm"])
    res = {"last_hidden_state": h, "pooler": h[:, 0]}
    if classifier:
        res["logits"] = np.asarray(out)
    else:  # the headless model's output is the pooled [CLS] vector
        assert np.array_equal(np.asarray(out), h[:, 0])
    return res


def _worst(ours: dict, ref: dict) -> float:
    """max over outputs of |ours - ref| / max(1, max|ref|); <= 1e-5 passes."""
    assert ours.keys() == ref.keys()
    return max(float(np.abs(ours[k] - ref[k]).max()) / max(1.0, float(np.abs(ref[k]).max())) for k in ref)


def _images(h, w, seed):
    return np.random.RandomState(seed).standard_normal((2, 3, h, w)).astype(np.float32)


@pytest.mark.parametrize("case", list(CASES))
def test_dinov2_matches_hf_at_every_size_and_exports(case, tmp_path):
    kw, classifier, sizes = CASES[case]
    cls = T.Dinov2ForImageClassification if classifier else T.Dinov2Model
    model = randomize(cls(T.Dinov2Config(**COMMON, **kw)), seed=len(case))
    model.save_pretrained(tmp_path / "hf")

    # 1) the checkpoint directory: config.json strictly, the 4.x names, fused weights_in
    j, name, cfg, report = hf.from_pretrained(str(tmp_path / "hf"), return_report=True)
    assert name == "vit" and report["architecture"] == cls.__name__
    assert cfg.layer_scale == kw["layerscale_value"] and cfg.interpolate_positions
    assert (cfg.num_classes, cfg.pool) == ((kw["num_labels"], "cls_mean") if classifier else (0, "cls"))
    assert cfg.ffn == ("swiglu" if kw.get("use_swiglu_ffn") else ACTIVATIONS[kw.get("hidden_act", "gelu")])

    # 2) the in-memory API (5.x names) loads torch_ref strictly; its weights equal the import's
    cfg_mem = dinov2.dinov2_config_from_hf(model.config, classifier=classifier)
    assert cfg_mem == dataclasses.replace(cfg, embed_dropout=cfg_mem.embed_dropout)
    t = tbuild("vit", cfg_mem).eval()
    t.load_state_dict({k: torch.as_tensor(np.asarray(v)) for k, v in
                       dinov2.dinov2_state_dict_from_hf(model.state_dict()).items()}, strict=True)
    theirs = convert.flax_to_torch_arrays(j)
    assert all(np.array_equal(theirs[k], v.detach().numpy()) for k, v in t.state_dict().items())

    # 3) outputs at the config's size and at the interpolated ones
    run = nnx.jit(lambda m, x: m(x, return_intermediates=True))
    worst = {"jax": 0.0, "torch_ref": 0.0}
    for i, (h, w) in enumerate(sizes):
        nchw = _images(h, w, seed=i)
        nhwc = np.ascontiguousarray(nchw.transpose(0, 2, 3, 1))
        ref = _hf_outputs(model, classifier, nchw)
        worst["jax"] = max(worst["jax"], _worst(_ours(lambda x: run(j, jnp.asarray(x)), classifier, nhwc), ref))
        with torch.no_grad():
            ours_t = _ours(lambda x: t(torch.from_numpy(x), return_intermediates=True), classifier, nhwc)
        worst["torch_ref"] = max(worst["torch_ref"], _worst({k: np.asarray(v) for k, v in ours_t.items()}, ref))
    assert max(worst.values()) <= 1e-5, worst

    # 4) the export loads in transformers (strictly: no missing or unexpected key) and gives
    #    HF's outputs; mask_token is not written (use_mask_token=false)
    hf.save_pretrained(j, name, cfg, str(tmp_path / "out"))
    back, info = cls.from_pretrained(str(tmp_path / "out"), output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    assert back.config.use_mask_token is False and back.config.layerscale_value == kw["layerscale_value"]
    back.eval()
    for i, (h, w) in enumerate(sizes[:2]):
        nchw = _images(h, w, seed=i)
        assert _worst(_hf_outputs(back, classifier, nchw), _hf_outputs(model, classifier, nchw)) <= 1e-6


def test_refusals_by_name():
    base = dict(architectures=["Dinov2ForImageClassification"], model_type="dinov2")
    bad = {"image_size": ([16, 24], "only square"), "hidden_act": ("relu6", "relu6"),
           "num_register_tokens": (4, "num_register_tokens"), "mlp_ratio": (2.5, "mlp_ratio=2.5")}
    for key, (value, match) in bad.items():
        with pytest.raises(ConfigError, match=match):
            dinov2.config_from_hf({**base, key: value}, "Dinov2ForImageClassification")
    # Backbone options are ignored; drop_path_rate (training only) is noted
    _, cfg, notes = dinov2.config_from_hf({**base, "apply_layernorm": False, "out_features": ["stage1"],
                                           "drop_path_rate": 0.2}, "Dinov2ForImageClassification")
    assert cfg.pool == "cls_mean" and any("drop_path_rate=0.2" in n for n in notes)
    # a checkpoint key that does not map is named
    fn = dinov2.tensor_fn("vit", cfg, "Dinov2Model")
    with pytest.raises(ValueError, match="classifier.weight"):
        fn("classifier.weight", np.zeros((2, 4)))
    # export: what HF DINOv2 cannot hold is named
    ok = ViTConfig(image_size=8, patch_size=4, d_model=8, num_heads=2, d_ff=16, layer_scale=0.5,
                   pool="cls_mean", interpolate_positions=True)
    assert export_problems(dinov2.FAMILY, "vit", ok) == []
    for change, match in [(dict(dropout=0.1), "dropout=0.1"), (dict(d_ff=20), "d_ff=20"),
                          (dict(pool="mean"), "pool='mean'"), (dict(layer_scale=None), "layer_scale=None"),
                          (dict(num_classes=0), "pool='cls_mean'"), (dict(ffn="geglu"), "ffn='geglu'")]:
        with pytest.raises(ConversionError, match=match):
            hf.exporter("vit", dataclasses.replace(ok, **change))
    # the model (checked before any weight is read, so an abstract one will do): a side that
    # is not a multiple of the patch, and another size without interpolate_positions
    from jaxformer.models import abstract_model
    with pytest.raises(ValueError, match="not divisible by patch_size=4"):
        abstract_model("vit", ok)(jnp.zeros((1, 8, 10, 3)))
    with pytest.raises(ValueError, match="does not match image_size=8"):
        abstract_model("vit", dataclasses.replace(ok, interpolate_positions=False))(jnp.zeros((1, 8, 12, 3)))
