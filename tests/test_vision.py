"""ViT, Swin and the TCN-Transformer: an independent check against Hugging Face transformers
(random weights, no download), input validation in both frameworks, configs, YAML files and
the datasets. Torch-vs-JAX parity of outputs and gradients is in parity_tests/cases_vision.py.

HF takes NCHW images, jaxformer NHWC: the tests transpose. Tolerance: 1e-5 max abs, fp32.
"""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
import torch
import yaml
from flax import nnx

from jaxformer import convert
from jaxformer.config import ConfigError, model_config_from_dict
from jaxformer.config.vision import SwinConfig, TimeSeriesConfig, ViTConfig
from jaxformer.hf import vision as hf_vision
from jaxformer.models import abstract_model
from jaxformer.models import build_model as jbuild
from jaxformer.parity import setup_precision
from jaxformer.parity.cases import twin
from torch_ref.models import build_model as tbuild

transformers = pytest.importorskip("transformers")
TOL = 1e-5


@pytest.fixture(autouse=True)
def _precision():
    setup_precision()


def _randomize(module: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """HF initialises biases, LayerNorms and the bias tables to 0 / 1; random values make every
    weight matter in the comparison."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * (0.5 if p.ndim == 1 else 0.2))
    return module.eval()


def _both(name, cfg, state_dict):
    """torch_ref model loaded strictly from state_dict, and its JAX twin converted from it."""
    t = tbuild(name, cfg).eval()
    t.load_state_dict(state_dict, strict=True)
    j = twin(lambda: jbuild(name, cfg), 0)  # abstract: every parameter is overwritten by the load
    convert.load_torch_state_dict(j, t.state_dict())
    j.eval()
    return t, j


def _compare_to_hf(hf_model, name, cfg, state_dict, nchw):
    with torch.no_grad():
        ref = hf_model(torch.from_numpy(nchw)).logits.numpy()
    t, j = _both(name, cfg, state_dict)
    nhwc = np.ascontiguousarray(nchw.transpose(0, 2, 3, 1))
    with torch.no_grad():
        out_t = t(torch.from_numpy(nhwc)).numpy()
    out_j = np.asarray(nnx.jit(lambda m, x: m(x))(j, jnp.asarray(nhwc)))  # one compile, not op by op
    d_t, d_j = float(np.abs(out_t - ref).max()), float(np.abs(out_j - ref).max())
    assert d_t <= TOL and d_j <= TOL, f"logits vs HF: torch_ref {d_t:.2e}, jax {d_j:.2e}"
    return d_t, d_j


def _images(*shape, seed=0):
    return np.random.RandomState(seed).standard_normal(shape).astype(np.float32)


# ----------------------------------------------------------------------------- HF ViT
def _hf_vit(**kw):
    base = dict(image_size=16, patch_size=4, num_channels=3, hidden_size=16, num_hidden_layers=2,
                num_attention_heads=2, intermediate_size=32, num_labels=5)
    base.update(kw)
    return _randomize(transformers.ViTForImageClassification(transformers.ViTConfig(**base)))


@pytest.mark.parametrize("kw", [{}, {"hidden_act": "gelu_pytorch_tanh", "num_channels": 1}])
def test_vit_matches_hf(kw):
    hf = _hf_vit(**kw)
    cfg = hf_vision.vit_config_from_hf(hf.config)
    assert cfg.norm_eps == 1e-12 and cfg.ffn == ("gelu" if not kw else "gelu_tanh")
    _compare_to_hf(hf, "vit", cfg, hf_vision.vit_state_dict_from_hf(hf.state_dict()),
                   _images(2, cfg.num_channels, 16, 16))


def test_vit_wrong_eps_fails_the_hf_comparison():
    """The comparison can fail: the same weights with a LayerNorm eps other than HF's
    (docs/numerics.md §1) give different logits."""
    hf = _hf_vit()
    cfg = hf_vision.vit_config_from_hf(hf.config, norm_eps=1e-1)
    with pytest.raises(AssertionError, match="logits vs HF"):
        _compare_to_hf(hf, "vit", cfg, hf_vision.vit_state_dict_from_hf(hf.state_dict()),
                       _images(2, 3, 16, 16))


def test_vit_legacy_hf_names_and_round_trip():
    hf = _hf_vit()
    sd = hf.state_dict()
    ours = hf_vision.vit_state_dict_from_hf(sd)
    # transformers 4.x names of hub checkpoints
    legacy = {}
    for k, v in sd.items():
        k = k.replace("vit.layers.", "vit.encoder.layer.")
        for new, old in (("attention.q_proj", "attention.attention.query"),
                         ("attention.k_proj", "attention.attention.key"),
                         ("attention.v_proj", "attention.attention.value"),
                         ("attention.o_proj", "attention.output.dense"),
                         ("mlp.fc1", "intermediate.dense"), ("mlp.fc2", "output.dense")):
            k = k.replace(new, old)
        legacy[k] = v
    assert any("attention.attention.query" in k for k in legacy)
    from_legacy = hf_vision.vit_state_dict_from_hf(legacy)
    assert from_legacy.keys() == ours.keys()
    assert all(torch.equal(from_legacy[k], ours[k]) for k in ours)
    back = hf_vision.vit_state_dict_to_hf(ours)
    assert back.keys() == sd.keys() and all(torch.equal(back[k], sd[k]) for k in sd)


def test_hf_unmapped_and_unsupported_are_errors():
    sd = dict(_hf_vit().state_dict())
    sd["vit.embeddings.mask_token"] = torch.zeros(1, 1, 2)  # ViTForMaskedImageModeling's; no jaxformer twin
    with pytest.raises(ValueError, match=r"unmapped: vit\.embeddings\.mask_token"):
        hf_vision.vit_state_dict_from_hf(sd)
    with pytest.raises(ValueError, match="use_absolute_embeddings"):
        hf_vision.swin_config_from_hf(transformers.SwinConfig(use_absolute_embeddings=True))


# ----------------------------------------------------------------------------- HF Swin
def _hf_swin(**kw):
    base = dict(image_size=32, patch_size=4, num_channels=3, embed_dim=8, depths=[2, 2],
                num_heads=[2, 4], window_size=4, mlp_ratio=2.0, num_labels=5)
    base.update(kw)
    return _randomize(transformers.SwinForImageClassification(transformers.SwinConfig(**base)))


SWIN_HF_CASES = {
    # 8x8 map: W-MSA + SW-MSA (shift 2); stage 1 is 4x4 = window: shift dropped (HF's <= rule)
    "two_stages_shifted": (dict(), (2, 3, 32, 32)),
    # 34x26 -> patch pad 36x28 -> 9x7 -> window pad 12x8, shifted -> merge pad 10x8 -> 5x4
    "padded_input": (dict(), (2, 3, 34, 26)),
    # odd window 3 (shift 1) on 12x12 then 6x6 (both shifted), no q/k/v bias, ReLU MLP
    "window3_noqkvbias": (dict(image_size=24, patch_size=2, window_size=3, qkv_bias=False,
                               hidden_act="relu", num_channels=1), (2, 1, 24, 24)),
}


@pytest.mark.parametrize("case", sorted(SWIN_HF_CASES))
def test_swin_matches_hf(case):
    kw, shape = SWIN_HF_CASES[case]
    hf = _hf_swin(**kw)
    cfg = hf_vision.swin_config_from_hf(hf.config)
    _compare_to_hf(hf, "swin", cfg, hf_vision.swin_state_dict_from_hf(hf.state_dict()),
                   _images(*shape))


def test_swin_clamped_window_matches_hf_with_that_window():
    """A 2x2 map with window_size 4: we clamp to a 2x2 window and read the offsets -1..1 of our
    7x7 bias table. HF cannot run this (its table is never clamped); HF built with window 2 and
    our table's centre 3x3 rows must give the same logits."""
    hf = _hf_swin(image_size=8, depths=[2], num_heads=[2], window_size=2)
    sd = hf_vision.swin_state_dict_from_hf(hf.state_dict())
    cfg = hf_vision.swin_config_from_hf(hf.config, window_size=4)
    from torch_ref.models.swin import relative_position_index
    g = torch.Generator().manual_seed(1)
    for k in [k for k in sd if k.endswith("relative_position_bias_table")]:
        small = sd[k]  # [3*3, H]
        big = torch.randn(7 * 7, small.shape[1], generator=g)  # rows of offsets |d| > 1 unused
        big[torch.from_numpy(relative_position_index(2, 4).astype(np.int64)).flatten()] = \
            small[torch.from_numpy(relative_position_index(2, 2).astype(np.int64)).flatten()]
        sd[k] = big
    _compare_to_hf(hf, "swin", cfg, sd, _images(2, 3, 8, 8))


def test_swin_relative_position_index_matches_hf():
    from transformers.models.swin.modeling_swin import SwinRelativePositionBias

    from jaxformer.models.swin import relative_position_index
    for w in (2, 3, 4, 7):
        hf_index = SwinRelativePositionBias(1, (w, w))._create_relative_position_index().numpy()
        np.testing.assert_array_equal(relative_position_index(w, w), hf_index)


def test_swin_hf_round_trip_and_legacy_names():
    sd = _hf_swin().state_dict()
    ours = hf_vision.swin_state_dict_from_hf(sd)
    back = hf_vision.swin_state_dict_to_hf(ours)
    assert back.keys() == sd.keys() and all(torch.equal(back[k], sd[k]) for k in sd)
    legacy = {re.sub(r"attention\.relative_position_bias\.", "attention.self.", k)
              .replace("attention.q_proj", "attention.self.query").replace("mlp.fc1", "intermediate.dense")
              .replace("mlp.fc2", "output.dense").replace("attention.o_proj", "attention.output.dense"): v
              for k, v in sd.items()}
    legacy["swin.encoder.layers.0.blocks.0.attention.self.relative_position_index"] = torch.zeros(4)
    assert any("attention.self.query" in k for k in legacy)
    from_legacy = hf_vision.swin_state_dict_from_hf(legacy)
    assert from_legacy.keys() == ours.keys()
    assert all(torch.equal(from_legacy[k], ours[k]) for k in ours)


# ----------------------------------------------------------------------------- both trees
VIT = ViTConfig(image_size=8, patch_size=4, num_channels=3, num_classes=4, d_model=16,
                num_heads=2, d_ff=32, num_layers=1)
SWIN = SwinConfig(image_size=8, patch_size=2, num_channels=3, num_classes=4, embed_dim=8,
                  depths=(2, 1), num_heads=(2, 2), window_size=2)
TS = TimeSeriesConfig(input_len=12, num_channels=2, target_channels=(1,), horizon=3, d_model=16,
                      num_heads=2, d_ff=32, num_layers=1, conv_layers=2, kernel_size=3,
                      dilation_base=2)  # receptive field 1 + 2 + 4 = 7

BAD_INPUTS = [
    ("vit", VIT, (2, 8, 8, 1), "1 channels .* num_channels=3"),
    ("vit", VIT, (2, 3, 8, 8), "3 channels|8 channels"),  # NCHW by mistake
    ("vit", VIT, (2, 10, 10, 3), "10x10 is not divisible by patch_size=4"),
    ("vit", VIT, (2, 12, 12, 3), "does not match image_size=8"),
    ("vit", VIT, (2, 8, 8), r"\[B, H, W, C\]"),
    ("swin", SWIN, (2, 8, 8, 4), "4 channels .* num_channels=3"),
    ("timeseries", TS, (2, 6, 2), "length 6 is shorter than the receptive field 7"),
    ("timeseries", TS, (2, 13, 2), "exceeds input_len=12"),
    ("timeseries", TS, (2, 12, 3), "3 channels .* num_channels=2"),
]


@pytest.mark.parametrize("name,cfg,shape,msg", BAD_INPUTS,
                         ids=[f"{n}-{'x'.join(map(str, s))}" for n, _, s, _ in BAD_INPUTS])
def test_bad_input_is_a_clear_error_in_both(name, cfg, shape, msg):
    with pytest.raises(ValueError, match=msg):
        tbuild(name, cfg)(torch.zeros(shape))
    with pytest.raises(ValueError, match=msg):
        jbuild(name, cfg)(jnp.zeros(shape))


@pytest.mark.parametrize("name,cfg,shape", [("vit", VIT, (2, 8, 8, 3)), ("swin", SWIN, (2, 9, 7, 3)),
                                            ("timeseries", TS, (2, 7, 2))])
def test_good_input_shapes_and_intermediates_match_in_both(name, cfg, shape):
    x = _images(*shape)
    t_out, t_inter = tbuild(name, cfg).eval()(torch.from_numpy(x), return_intermediates=True)
    order = []  # shapes only, traced abstractly; the keys in the order the model inserted them

    def forward(x):
        out, inter = jbuild(name, cfg)(x, return_intermediates=True)
        order.extend(inter)  # (a pytree round trip sorts dict keys)
        return out, inter
    j_out, j_inter = nnx.eval_shape(forward, jnp.asarray(x))
    j_inter = {k: j_inter[k] for k in order}
    assert tuple(t_out.shape) == tuple(j_out.shape)
    assert list(t_inter) == list(j_inter) and "pooled" in t_inter
    assert all(tuple(t_inter[k].shape) == tuple(j_inter[k].shape) for k in t_inter)


@pytest.mark.parametrize("name,cfg", [("vit", VIT), ("swin", SWIN), ("timeseries", TS)])
def test_key_sets_match_and_round_trip_exact(name, cfg):
    t = tbuild(name, cfg)
    keys = {convert.torch_key(p) for p in convert.param_leaves(abstract_model(name, cfg))}
    assert keys == set(t.state_dict())
    j = twin(lambda: jbuild(name, cfg), 0)  # abstract: every parameter is overwritten by the load
    convert.load_torch_state_dict(j, t.state_dict())
    back = convert.to_torch_state_dict(j)
    assert all(torch.equal(back[k], v) for k, v in t.state_dict().items())


@pytest.mark.parametrize("padding,causal", [("causal", True), ("same", False)])
def test_tcn_causal_padding_sees_no_future(padding, causal):
    """With causal pads, conv output at step t ignores inputs after t; with same pads it must not."""
    cfg = dataclasses.replace(TS, padding=padding)
    x = _images(1, 12, 2)
    y = x.copy()
    y[:, 8:] += 1.0  # change the future of step 7
    for run in (lambda a: tbuild("timeseries", cfg, seed=3)(torch.from_numpy(a), return_intermediates=True)[1],
                lambda a: jbuild("timeseries", cfg, seed=3)(jnp.asarray(a), return_intermediates=True)[1]):
        a, b = _np(run(x)["conv_layers.1"]), _np(run(y)["conv_layers.1"])  # [1, L, D]
        assert np.array_equal(a[:, :8], b[:, :8]) == causal
        assert not np.array_equal(a[:, 8:], b[:, 8:])


def test_swin_drop_path_drops_whole_examples_in_both():
    from flax import nnx

    from jaxformer.models.swin import SwinBlock as JBlock
    from torch_ref.models.swin import SwinBlock as TBlock
    j = JBlock(SWIN, 8, 2, shift=0, drop_path=0.5, rngs=nnx.Rngs(0))
    t = TBlock(SWIN, 8, 2, shift=0, drop_path=0.5)
    j.train()
    t.train()
    torch.manual_seed(0)
    for out in (np.asarray(j.drop_path(jnp.ones((64, 2, 2, 3)))), _np(t.drop_path(torch.ones(64, 2, 2, 3)))):
        per_example = out.reshape(64, -1)
        assert set(np.unique(per_example)) == {0.0, 2.0}  # kept examples scaled by 1 / (1 - 0.5)
        assert (per_example == per_example[:, :1]).all()  # one decision per example
    j.eval()
    t.eval()
    assert np.array_equal(np.asarray(j.drop_path(jnp.ones((4, 2, 2, 3)))), np.ones((4, 2, 2, 3)))
    assert torch.equal(t.drop_path(torch.ones(4, 2, 2, 3)), torch.ones(4, 2, 2, 3))


def _np(v):
    return v.detach().numpy() if isinstance(v, torch.Tensor) else np.asarray(v)


# ----------------------------------------------------------------------------- configs
@pytest.mark.parametrize("cls,kw,field", [
    (ViTConfig, dict(image_size=30, patch_size=4), "image_size"),
    (ViTConfig, dict(pool="cls", class_token=False), "pool"),
    (ViTConfig, dict(d_model=30, num_heads=4), "d_model"),
    (SwinConfig, dict(depths=(2, 2), num_heads=(2,)), "num_heads"),
    (SwinConfig, dict(embed_dim=6, num_heads=(4, 4)), r"num_heads\[0\]"),
    (SwinConfig, dict(ffn="swiglu"), "ffn"),
    (TimeSeriesConfig, dict(input_len=4, kernel_size=3, conv_layers=3), "input_len"),
    (TimeSeriesConfig, dict(num_channels=2, target_channels=(2,)), r"target_channels\[0\]"),
    (TimeSeriesConfig, dict(padding="valid"), "padding"),
])
def test_config_errors_name_the_field(cls, kw, field):
    with pytest.raises(ConfigError, match=rf"^{field}: "):
        cls(**kw)


def test_conv_padding_pairs():
    cfg = TimeSeriesConfig(kernel_size=4, dilation_base=2, conv_layers=2, padding="same")
    assert [cfg.conv_padding(i) for i in range(2)] == [(1, 2), (3, 3)]
    cfg = TimeSeriesConfig(kernel_size=4, dilation_base=2, conv_layers=2, padding="causal")
    assert [cfg.conv_padding(i) for i in range(2)] == [(3, 0), (6, 0)] and cfg.receptive_field == 10


@pytest.mark.parametrize("name", ["vit", "swin", "timeseries"])
def test_yaml_config_parses_builds_and_fits_its_data(name):
    from jaxformer.config import from_dict
    from jaxformer.train.data import dataset_config_class, load_dataset
    doc = yaml.safe_load(Path(f"configs/{name}.yaml").read_text())
    assert set(doc) == {"model", "data", "train", "parallel"}
    model_name, cfg = model_config_from_dict(doc["model"])
    assert model_name == name
    data = dict(doc["data"])
    data_name = data.pop("name")
    data_cfg = from_dict(dataset_config_class(data_name), data, prefix="data.")  # the trainer's path
    for field in ("image_size", "num_channels", "input_len", "horizon", "target_channels"):
        if hasattr(data_cfg, field):
            assert getattr(data_cfg, field) == getattr(cfg, field), field
    train, evals = load_dataset(data_name, data_cfg, seed=0)
    train_from_dict, _ = load_dataset(data_name, doc["data"], seed=0)  # a plain mapping works too
    assert all(np.array_equal(train[k], train_from_dict[k]) for k in train)
    x = next(iter(train.values()))[:2]
    # shapes only: traced abstractly (the build and the forward run the same code as eagerly,
    # without computing the yaml-sized model op by op)
    out = nnx.eval_shape(lambda x: jbuild(name, cfg)(x), jnp.asarray(x))
    if name == "timeseries":
        assert out.shape == (2,) + train["targets"].shape[1:]
    else:
        assert out.shape == (2, cfg.num_classes) and train["labels"].max() < cfg.num_classes


def test_training_refuses_the_pooler_head():
    """head 'pooler' (an imported ViTModel) outputs features, not class logits: a train config
    with it is refused by name before any data is read."""
    from jaxformer.config import ConfigError
    from jaxformer.train.config import config_from_dict
    doc = yaml.safe_load(Path("configs/vit.yaml").read_text())
    doc["model"]["head"] = "pooler"
    with pytest.raises(ConfigError, match="model.head='pooler': training needs class logits"):
        config_from_dict(doc)


# ----------------------------------------------------------------------------- datasets
def test_digits_split_is_seeded_disjoint_and_train_normalised():
    from jaxformer.train.data import digits
    tr, ev = digits.load({"image_size": 16}, seed=0)
    tr2, _ = digits.load({"image_size": 16}, seed=0)
    tr3, _ = digits.load({"image_size": 16}, seed=1)
    assert tr["images"].shape[1:] == (16, 16, 1) and tr["images"].dtype == np.float32
    assert tr["labels"].dtype == np.int32 and len(tr["labels"]) + len(ev["labels"]) == 1797
    assert np.array_equal(tr["labels"], tr2["labels"]) and not np.array_equal(tr["labels"], tr3["labels"])
    assert abs(tr["images"].mean()) < 1e-5 and abs(tr["images"].std() - 1) < 1e-4
    assert np.bincount(ev["labels"]).min() >= 30  # stratified: every class in eval
    flat_tr = {x.tobytes() for x in tr["images"]}
    assert sum(x.tobytes() in flat_tr for x in ev["images"]) < 5  # (the raw set has a few duplicates)


def test_series_windows_chronological_and_train_normalised():
    from jaxformer.train.data import series
    cfg = {"length": 400, "num_channels": 2, "input_len": 16, "horizon": 4, "target_channels": [1]}
    tr, ev = series.load(cfg, seed=0)
    assert tr["inputs"].shape == (320 - 20 + 1, 16, 2) and tr["targets"].shape == (301, 4, 1)
    assert ev["inputs"].shape == (80 - 20 + 1, 16, 2)
    # a target is the continuation of its window's channel 1 (stride 1)
    np.testing.assert_array_equal(tr["targets"][0, :, 0], tr["inputs"][16, :4, 1])
    raw = series.generate(400, 2, seed=0)
    np.testing.assert_allclose(tr["inputs"][0], (raw[:16] - raw[:320].mean(0)) / raw[:320].std(0), atol=1e-5)
    assert np.array_equal(series.load(cfg, seed=0)[1]["inputs"], ev["inputs"])
    with pytest.raises(ConfigError, match=r"^data\.target_channels: "):
        series.load({**cfg, "target_channels": [2]}, seed=0)
    with pytest.raises(ConfigError, match=r"unknown config key\(s\) data\.image_size"):
        series.load({**cfg, "image_size": 16}, seed=0)
