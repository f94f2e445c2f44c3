"""LoRA (layers/lora.py in both trees, config/lora.py): target matching, the init rule, keys,
freezing, merging, a frozen bf16/int8 base, and PEFT options refused by name. Outputs and
gradients against torch are the parity registry's lora_* cases."""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx

from jaxformer import convert
from jaxformer.config import ConfigError, LoRAConfig
from jaxformer.config.lora import DEFAULT_TARGETS, lora_config_from_dict
from jaxformer.config.models import LMConfig
from jaxformer.layers import lora as jl
from jaxformer.layers.kernels import partitioning
from jaxformer.layers.linear import Linear
from jaxformer.models import build_model as jbuild
from jaxformer.parity.cases import twin
from jaxformer.parity.cases_lora import fill_adapters
from jaxformer.parity.cases_models import realistic_embeddings
from jaxformer.parity.results import GRAD_TOL, OUT_TOL
from torch_ref.layers import lora as tl
from torch_ref.models import build_model as tbuild

LLAMA, GPT2 = LMConfig.tiny("llama"), LMConfig.tiny("gpt2")
IDS = np.random.RandomState(0).randint(1, 64, (2, 7)).astype(np.int32)


def pair(lm_cfg=LLAMA, cfg=LoRAConfig(r=4, alpha=8)):  # noqa: B008 (a frozen dataclass)
    """Both trees' LoRA'd LMs with the same weights (adapters non-zero), in eval mode."""
    t = tbuild("lm", lm_cfg, seed=0)
    j_paths = []

    def make():  # built abstractly (parity.cases.twin): the load below fills every leaf
        j = jbuild("lm", lm_cfg, seed=0)
        j_paths[:] = jl.apply_lora(j, cfg, nnx.Rngs(0))
        return j
    j = twin(make, 0)
    t_paths = tl.apply_lora(t, cfg, seed=0)
    assert t_paths == j_paths
    fill_adapters(t)
    convert.load_torch_state_dict(j, t.state_dict())
    j.eval()
    return t.eval(), j, t_paths


def logits(t, j):
    with torch.no_grad():
        a = t(torch.from_numpy(IDS)).numpy()
    return a, np.asarray(j(jnp.asarray(IDS)))


# ----------------------------------------------------------------------------- target matching
def test_default_targets_are_every_projection_never_the_head():
    for lm_cfg, kinds in ((LLAMA, ("q", "k", "v", "o", "gate", "up", "down")), (GPT2, ("q", "k", "v", "o", "up", "down"))):
        lm_cfg = lm_cfg.__class__(**{**lm_cfg.__dict__, "tie_embeddings": False})
        t = tbuild("lm", lm_cfg, seed=0)
        paths = tl.apply_lora(t, LoRAConfig(r=2))
        assert len(paths) == 2 * len(kinds) and not any("lm_head" in p or "embed" in p for p in paths)
        assert {p.rsplit(".", 1)[1] for p in paths} == {f"{k}_proj" for k in kinds}


def test_names_suffixes_and_regex_select_the_same_modules_in_both_trees():
    for targets, want in ((["q_proj", "down_proj"], {"self_attn.q_proj", "ffn.down_proj"}),
                          (["self_attn.v_proj"], {"self_attn.v_proj"}),
                          (r"decoder\.layers\.1\.self_attn\.(k|o)_proj", {"self_attn.k_proj", "self_attn.o_proj"})):
        cfg = LoRAConfig(r=2, target_modules=targets)
        t_paths = tl.find_targets(tbuild("lm", LLAMA), cfg)
        j_paths = list(jl.find_targets(jbuild("lm", LLAMA), cfg))
        assert t_paths == j_paths
        assert {p.split(".", 3)[3] for p in t_paths} == want
    assert all(".1." in p for p in t_paths)  # fullmatch: the regex names layer 1 only


@pytest.mark.parametrize("targets, msg", [(["q_proj", "qproj"], r"\['qproj'\] match no module"),
                                          (r"q_proj", "matches no module path"),  # fullmatch, not search
                                          (["self_attn"], "not Linear layers")])
def test_targets_that_match_nothing_or_no_linear_are_errors(targets, msg):
    cfg = LoRAConfig(r=2, target_modules=targets)
    for apply in (lambda: tl.apply_lora(tbuild("lm", LLAMA), cfg), lambda: jl.apply_lora(jbuild("lm", LLAMA), cfg, nnx.Rngs(0))):
        with pytest.raises(ConfigError, match=msg):
            apply()


def test_applying_twice_is_refused():
    t, j, _ = pair()
    with pytest.raises(ValueError, match="already has LoRA"):
        tl.apply_lora(t, LoRAConfig(r=2))
    with pytest.raises(ValueError, match="already has LoRA"):
        jl.apply_lora(j, LoRAConfig(r=2), nnx.Rngs(0))


# ----------------------------------------------------------------------------- keys and layout
def test_keys_base_names_unchanged_adapters_in_peft_layout():
    t, j, paths = pair(GPT2)
    base_keys = set(tbuild("lm", GPT2).state_dict())
    t_keys = set(t.state_dict())
    assert base_keys <= t_keys
    assert t_keys - base_keys == {f"{p}.lora_{x}.weight" for p in paths for x in "AB"}
    j_arrays = convert.flax_to_torch_arrays(j)
    assert set(j_arrays) == t_keys
    q = "decoder.layers.0.self_attn.q_proj"
    assert j_arrays[f"{q}.lora_A.weight"].shape == (4, 32) and j_arrays[f"{q}.lora_B.weight"].shape == (32, 4)
    a = j.decoder.layers[0].self_attn.q_proj
    assert partitioning.logical_axes(a.lora_A.kernel) == ("embed", None)
    assert partitioning.logical_axes(a.lora_B.kernel) == (None, "heads")


# ----------------------------------------------------------------------------- init
@pytest.mark.parametrize("init", ["kaiming", "gaussian"])
def test_init_rule_is_peft_s_in_both_trees(init):
    """kaiming: A ~ U(-1/sqrt(in), 1/sqrt(in)) (torch nn.Linear's); gaussian: A ~ N(0, (1/r)^2);
    B = 0; fresh adapters change nothing."""
    d_in, d_out, r = 512, 64, 16
    t = tl.LoRALinear(torch.nn.Linear(d_in, d_out), r=r, alpha=8, init=init, generator=torch.Generator().manual_seed(0))
    j = jl.LoRALinear(Linear(d_in, d_out, rngs=nnx.Rngs(0)), r=r, alpha=8, init=init, rngs=nnx.Rngs(1))
    for a, b in ((t.lora_A.weight.detach().numpy(), t.lora_B.weight.detach().numpy()),
                 (np.asarray(j.lora_A.kernel[...]).T, np.asarray(j.lora_B.kernel[...]).T)):
        assert a.shape == (r, d_in) and b.shape == (d_out, r) and not b.any()
        if init == "kaiming":
            bound = d_in ** -0.5
            assert np.abs(a).max() <= bound and np.abs(a).max() > 0.99 * bound
            assert abs(a.std() / (bound / np.sqrt(3)) - 1) < 0.03  # n = 8192: std error ~0.8%
        else:
            assert abs(a.std() * r - 1) < 0.03 and abs(a.mean()) < 4 / r / np.sqrt(a.size)
        assert abs(a.mean()) < 4 * a.std() / np.sqrt(a.size)


# ----------------------------------------------------------------------------- freezing
def test_only_adapters_train_and_the_base_gradient_is_exactly_zero():
    t, j, paths = pair(GPT2)
    assert {n for n, p in t.named_parameters() if p.requires_grad} == {f"{p}.lora_{x}.weight" for p in paths for x in "AB"}
    wrt = jl.trainable_filter(j)
    assert wrt is jl.LoRAParam and jl.trainable_filter(jbuild("lm", GPT2)) is nnx.Param

    def loss(model):
        return jnp.sum(model(jnp.asarray(IDS)) ** 2)
    adapter_grads = nnx.jit(nnx.grad(loss, argnums=nnx.DiffState(0, wrt)))(j)
    flat = dict(nnx.to_flat_state(adapter_grads))
    assert flat and all(p[-2] in ("lora_A", "lora_B") for p in flat)
    every = dict(nnx.to_flat_state(nnx.jit(nnx.grad(loss))(j)))  # every nnx.Param: the base gets exact zeros
    for path in paths:
        for leaf in ("kernel", "bias"):
            key = tuple(int(p) if p.isdigit() else p for p in path.split(".")) + (leaf,)
            assert not np.asarray(every[key].get_value()).any(), key
    assert np.asarray(every[("embed", "embed_tokens", "embedding")].get_value()).any()


# ----------------------------------------------------------------------------- merging
def test_merge_equals_unmerged_and_restores_the_base_keys():
    """Merged weights are W + scaling * B @ A (float64 reference, fp32 rounding); merged logits
    equal the unmerged ones within the parity tolerance (only the summation order changes)."""
    t, j, paths = pair(GPT2, LoRAConfig(r=4, alpha=2, use_rslora=True))
    realistic_embeddings(t)
    convert.load_torch_state_dict(j, {k: v for k, v in t.state_dict().items()})
    want = {p: (m.weight.double() + m.scaling * m.lora_B.weight.double() @ m.lora_A.weight.double()).detach().numpy()
            for p, m in tl.lora_modules(t).items()}
    before_t, before_j = logits(t, j)
    assert tl.merge_lora(t) == jl.merge_lora(j) == paths
    after_t, after_j = logits(t, j)
    tol = OUT_TOL.bound(np.abs(before_t).max())
    assert np.abs(after_t - before_t).max() <= tol and np.abs(after_j - before_j).max() <= tol
    assert np.abs(after_j - after_t).max() <= tol
    j_arrays = convert.flax_to_torch_arrays(j)
    for p, w in want.items():
        ulp = np.spacing(np.float32(np.abs(w).max()))
        assert np.abs(t.get_submodule(p).weight.detach().numpy() - w).max() <= 2 * ulp
        assert np.abs(j_arrays[f"{p}.weight"] - w).max() <= 2 * ulp
    assert set(t.state_dict()) == set(tbuild("lm", GPT2).state_dict()) == set(convert.flax_to_torch_arrays(j))
    assert not tl.lora_modules(t) and not jl.lora_modules(j)
    assert type(j.decoder.layers[0].self_attn.q_proj) is Linear
    assert type(t.decoder.layers[0].self_attn.q_proj) is torch.nn.Linear


# ----------------------------------------------------------------------------- frozen bf16/int8 base
@pytest.mark.parametrize("weights_dtype", ["bf16", "int8"])
def test_reduced_precision_base_trains_the_fp32_adapter_alike(weights_dtype):
    """QLoRA style: the adapter's gradients through a bf16/int8 base agree across the trees
    (logits: the lora_llama_{bf16,int8}_base parity cases)."""
    t, j, paths = pair(LLAMA, LoRAConfig(r=4, alpha=8, target_modules=["q_proj", "down_proj"]))
    tl.quantize_base(t, weights_dtype)
    jl.quantize_base(j, weights_dtype)
    assert not any(k.endswith(f"{p}.weight") for k in t.state_dict() for p in paths)
    proj = np.random.RandomState(1).standard_normal((2, 7, 64)).astype(np.float32)
    (t(torch.from_numpy(IDS)) * torch.from_numpy(proj)).sum().backward()
    grads = nnx.jit(nnx.grad(lambda m: jnp.sum(m(jnp.asarray(IDS)) * proj), argnums=nnx.DiffState(0, jl.LoRAParam)))(j)
    j_grads = {convert.torch_key(p[:-1]) + ".weight": np.asarray(v.get_value()).T for p, v in nnx.to_flat_state(grads)}
    t_grads = {n: p.grad.numpy() for n, p in t.named_parameters() if p.requires_grad}
    assert set(j_grads) == set(t_grads) and len(t_grads) == 2 * len(paths)
    for k, g in t_grads.items():
        assert np.abs(j_grads[k] - g).max() <= GRAD_TOL.bound(np.abs(g).max()), k
    with pytest.raises(ValueError, match="reduced-precision"):
        jl.merge_lora(j)
    with pytest.raises(ValueError, match="reduced-precision"):
        tl.merge_lora(t)


# ----------------------------------------------------------------------------- config
def test_scaling_and_config_validation():
    assert LoRAConfig(r=4, alpha=16).scaling == 4.0 and LoRAConfig(r=4, alpha=16, use_rslora=True).scaling == 8.0
    assert LoRAConfig(r=8).alpha == 8 and LoRAConfig(r=8).target_modules is None
    assert LoRAConfig(r=2, target_modules=["q_proj"]).target_modules == ("q_proj",)
    for bad, msg in ((dict(r=0), "r: must be a positive int"), (dict(r=2, dropout=1.5), "dropout"),
                     (dict(r=2, init="pissa"), "init"), (dict(r=2, target_modules="(q_proj"), "not a regular expression"),
                     (dict(r=2, target_modules=[]), "target_modules"), (dict(r=2, alpha=0), "alpha")):
        with pytest.raises(ConfigError, match=msg):
            LoRAConfig(**bad)


@pytest.mark.parametrize("option, value", [("use_dora", True), ("modules_to_save", ["lm_head"]), ("bias", "all"),
                                           ("layers_to_transform", [0]), ("fan_in_fan_out", True),
                                           ("init_lora_weights", "pissa"), ("exclude_modules", ["v_proj"])])
def test_peft_options_we_do_not_implement_are_refused_by_name(option, value):
    with pytest.raises(ConfigError, match=option):
        LoRAConfig.from_peft({"r": 8, "target_modules": ["q_proj"], option: value})
    if option != "init_lora_weights":
        with pytest.raises(ConfigError, match=f"lora.{option}: PEFT's"):
            lora_config_from_dict({"r": 8, option: value})


def test_peft_config_round_trip():
    peft = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": 16, "lora_alpha": 32, "lora_dropout": 0.05,
            "use_rslora": True, "init_lora_weights": "gaussian", "target_modules": ["v_proj", "q_proj"], "bias": "none",
            "use_dora": False, "modules_to_save": None, "rank_pattern": {}, "fan_in_fan_out": False}
    cfg = LoRAConfig.from_peft(peft)
    assert cfg == LoRAConfig(r=16, alpha=32, dropout=0.05, use_rslora=True, init="gaussian",
                             target_modules=("v_proj", "q_proj"))
    assert LoRAConfig.from_peft(cfg.to_peft()) == LoRAConfig(**{**cfg.__dict__, "target_modules": ("q_proj", "v_proj")})
    assert LoRAConfig.from_peft({"r": 8, "target_modules": "all-linear"}).target_modules is None
    assert LoRAConfig(r=2).to_peft()["target_modules"] == sorted(DEFAULT_TARGETS)
    with pytest.raises(ConfigError, match="some_new_option=1: unknown PEFT"):
        LoRAConfig.from_peft({"r": 8, "some_new_option": 1})
    with pytest.raises(ConfigError, match="some_new_config=.*: unknown PEFT"):
        LoRAConfig.from_peft({"r": 8, "some_new_config": {"rank": 2}})
    # a newer PEFT's own fields at their defaults (None / False / empty) leave the adapter as is
    assert LoRAConfig.from_peft({"r": 8, "some_new_config": None, "use_new_thing": False, "new_pattern": {}}) \
        == LoRAConfig.from_peft({"r": 8})
