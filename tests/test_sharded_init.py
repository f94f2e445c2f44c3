"""Sharded init and partitioning metadata on 8 host CPU devices (tests/conftest.py): the train
state created in its shardings equals the single-device one bit for bit under any mesh; every
parameter of every registered model carries logical axes; resume and init_from restore into
sharded targets without initialising a model; the torch trainer starts from the same init."""
import functools
import os
import sys

import jax
import numpy as np
import pytest
from flax import nnx

from jaxformer import convert
from jaxformer.config import MODELS
from jaxformer.layers.kernels.partitioning import logical_axes
from jaxformer.train import init as init_lib
from jaxformer.train import sharding
from jaxformer.train.config import LOGICAL_AXIS_RULES, config_from_dict
from jaxformer.train.jax_trainer import JaxTrainer, params_numpy
from jaxformer.train.optim import make_optax

sys.path.insert(0, os.path.dirname(__file__))
from test_train import FAMILIES

# (data, fsdp, tensor), devices used
MESHES = {"fsdp8": ((1, 8, 1), 8), "data2_fsdp2_tensor2": ((2, 2, 2), 8), "tensor4": ((1, 1, 4), 4)}


def _cfg(scheme: str, scan: bool = False, **model):
    m, data = FAMILIES["lm_llama_gqa"]  # vocab 259: its dims divide by nothing, so they stay whole
    return config_from_dict({"model": {**m, "scan_layers": scan, **model}, "data": dict(data),
                             "train": {"steps": 4, "batch_size": 8, "init": scheme, "seed": 5}})


def _tx(cfg):
    am = init_lib.abstract_model(cfg.model_name, cfg.model)
    return make_optax(cfg.train, nnx.split(am, nnx.Param, ...)[1], convert.scan_prefixes(am))[0]


def _create(cfg, mesh=None):
    tx = _tx(cfg)
    sh = None
    if mesh is not None:
        sh = sharding.state_shardings(init_lib.abstract_state(cfg.model_name, cfg.model, cfg.train.seed, tx), mesh)
    return init_lib.create_state(cfg.model_name, cfg.model, cfg.train.init, cfg.train.seed, tx, sh)


@functools.cache
def _single(scheme: str, scan: bool = False):
    return _create(_cfg(scheme, scan))


def _host(x):
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
        x = jax.random.key_data(x)
    return np.asarray(x)


def _assert_same(a, b):
    la, ta = jax.tree_util.tree_flatten_with_path(a)
    lb, tb = jax.tree_util.tree_flatten_with_path(b)
    assert ta == tb
    for (path, x), (_, y) in zip(la, lb, strict=True):
        assert np.array_equal(_host(x), _host(y)), jax.tree_util.keystr(path)


def _mesh(name):
    (d, f, t), n = MESHES[name]
    return sharding.make_mesh(d, f, t, devices=jax.devices()[:n])


@pytest.mark.parametrize("mesh,scheme", [("fsdp8", "normal_0.02"), ("data2_fsdp2_tensor2", "xavier_uniform"),
                                         ("tensor4", "default")])
def test_sharded_init_equals_single_device(mesh, scheme):
    assert jax.device_count() == 8
    m = _mesh(mesh)
    state = _create(_cfg(scheme), m)
    _assert_same(_single(scheme), state)  # params, Adam state, RNG streams, step
    params = state["params"]
    up = params["decoder"]["layers"][0]["ffn"]["up_proj"]["kernel"].get_value()  # [D, F] = (embed, mlp)
    assert up.sharding.mesh == m
    assert up.sharding.spec == sharding.spec_for(up.shape, ("embed", "mlp"), m)
    shard = up.addressable_shards[0].data.shape
    assert np.prod(shard) * m.devices.size == np.prod(up.shape) * (2 if mesh == "data2_fsdp2_tensor2" else 1)
    emb = params["embed"]["embed_tokens"]["embedding"].get_value()  # [259, D]: vocab 259 stays whole
    assert emb.sharding.spec[0] is None
    mu = state["opt_state"][1][0].mu["decoder"]["layers"][0]["ffn"]["up_proj"]["kernel"].get_value()
    assert mu.sharding == up.sharding  # Adam's moments are sharded like their param


def test_scanned_init_equals_unscanned():
    scanned, loop = _create(_cfg("xavier_uniform", scan=True), _mesh("fsdp8")), _single("xavier_uniform")
    prefixes = convert.scan_prefixes(init_lib.abstract_model("lm", _cfg("xavier_uniform", scan=True).model))
    assert prefixes
    a, b = params_numpy(scanned, prefixes), params_numpy(loop)
    assert set(a) == set(b) and all(np.array_equal(a[k], b[k]) for k in a)
    axes = logical_axes(scanned["params"]["decoder"]["layers"]["ffn"]["up_proj"]["kernel"])
    assert axes == ("layers", "embed", "mlp")  # nnx.vmap adds the stacked axis to the metadata


def _model_cases():
    from jaxformer.parity.registry import CASES, load_all
    load_all()
    out, seen = [], set()
    for n, c in CASES.items():  # each model config once (cases differ in inputs too)
        if getattr(c.build, "model", None) and repr((c.build.model, c.build.cfg)) not in seen:
            seen.add(repr((c.build.model, c.build.cfg)))
            out.append((n, c.build.model, c.build.cfg))
    return out


def test_every_parameter_of_every_registered_model_is_annotated():
    cases = _model_cases()
    buildable = {n for n, (_, model) in MODELS.items() if model}
    assert buildable <= {m for _, m, _ in cases}
    seen = set()
    for case, name, cfg in cases:
        variants = [cfg]
        if hasattr(cfg, "scan_layers") and name not in seen:  # each model once with stacked layers
            variants.append(type(cfg)(**{**{f: getattr(cfg, f) for f in cfg.__dataclass_fields__
                                            if cfg.__dataclass_fields__[f].init}, "scan_layers": True}))
        seen.add(name)
        for c in variants:
            for path, var in convert.param_leaves(init_lib.abstract_model(name, c)).items():
                axes = logical_axes(var)
                where = f"{case}: {convert.flax_key(path)} {tuple(var.shape)}"
                assert axes is not None, f"{where} has no logical axes (jaxformer/layers/kernels/partitioning.py)"
                assert len(axes) == len(var.shape), f"{where}: axes {axes}"
                assert all(a is None or a in LOGICAL_AXIS_RULES for a in axes), f"{where}: axes {axes}"


def test_unannotated_parameter_is_an_error_in_mesh_mode(tmp_path):
    cfg = _cfg("normal_0.02")
    cfg = config_from_dict({**cfg.to_dict(), "parallel": {"mode": "mesh", "mesh": {"data": 1, "fsdp": 8}}})
    model = init_lib.build_model(cfg.model_name, cfg.model, seed=0)
    model.decoder.layers[1].ffn.extra = nnx.Param(np.zeros((32, 8), np.float32))  # no logical axes
    with pytest.raises(ValueError, match=r"decoder\.layers\.1\.ffn\.extra \(32, 8\): no logical axes"):
        JaxTrainer(cfg, str(tmp_path), progress=False, model=model)
    assert not os.path.exists(tmp_path / "config.yaml")
    # without a mesh the annotation is not needed
    JaxTrainer(config_from_dict({**cfg.to_dict(), "parallel": {"mode": "none"}}), str(tmp_path / "b"),
               progress=False, model=model).close()


def test_axis_rules_change_the_layout_and_are_checked():
    from jaxformer.config import ConfigError
    from jaxformer.train.config import ParallelConfig
    rules = ParallelConfig(mode="mesh", axis_rules={"mlp": None, "embed": ["fsdp", "tensor"]}).logical_axis_rules()
    m = _mesh("data2_fsdp2_tensor2")
    assert sharding.spec_for((32, 64), ("embed", "mlp"), m, rules) == jax.sharding.PartitionSpec(("fsdp", "tensor"), None)
    assert sharding.spec_for((32, 64), ("embed", "mlp"), m) == jax.sharding.PartitionSpec("fsdp", "tensor")
    for bad in ({"mpl": "tensor"}, {"mlp": "model"}, {"mlp": ["fsdp", "fsdp"]}):
        with pytest.raises(ConfigError, match="parallel.axis_rules"):
            ParallelConfig(axis_rules=bad)


def _forbid_init(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("a model was initialised")
    monkeypatch.setattr(init_lib, "create_params", boom)
    monkeypatch.setattr(init_lib, "init_params", boom)


def _mesh_cfg(cfg, mesh: str | None):
    if mesh is None:
        return cfg
    (d, f, t), n = MESHES[mesh]
    return config_from_dict({**cfg.to_dict(), "parallel": {"mode": "mesh", "num_devices": n,
                                                           "mesh": {"data": d, "fsdp": f, "tensor": t}}})


def test_resume_restores_into_another_mesh_without_an_init(tmp_path, monkeypatch):
    cfg = _cfg("normal_0.02")
    first = JaxTrainer(_mesh_cfg(cfg, "fsdp8"), str(tmp_path), progress=False)
    first.ckpt.save(1, first.state, {"skipped_steps": 0})
    first.ckpt.close()  # waits for the (asynchronous) write
    ref = params_numpy(first.state)
    first.close()
    _forbid_init(monkeypatch)
    tr = JaxTrainer(_mesh_cfg(cfg, "data2_fsdp2_tensor2"), str(tmp_path), resume=True, progress=False)
    assert tr.start_step == 1
    got = params_numpy(tr.state)
    assert set(got) == set(ref) and all(np.array_equal(got[k], ref[k]) for k in ref)
    leaf = tr.state["opt_state"][1][0].nu["decoder"]["layers"][0]["self_attn"]["q_proj"]["kernel"].get_value()
    assert leaf.sharding == tr.shardings["opt_state"][1][0].nu["decoder"]["layers"][0]["self_attn"]["q_proj"]["kernel"].get_value()
    tr.close()


@pytest.fixture(scope="module")
def flat_checkpoint(tmp_path_factory):
    """(config, directory, {key: values}): an unscanned model checkpoint, built once."""
    from jaxformer.checkpoint_io import save_model
    cfg = _cfg("normal_0.02")
    model = init_lib.build_model(cfg.model_name, cfg.model, seed=11)  # constructor init, not `normal_0.02`
    path = str(tmp_path_factory.mktemp("init_from") / "src")
    save_model(model, cfg.model_name, cfg.model, path)
    return cfg, path, {convert.flax_key(p): np.asarray(v.get_value()) for p, v in convert.param_leaves(model).items()}


def test_init_from_restores_each_param_into_its_sharding(tmp_path, monkeypatch, flat_checkpoint):
    cfg, src, want = flat_checkpoint
    _forbid_init(monkeypatch)
    tuned = config_from_dict({**_mesh_cfg(cfg, "fsdp8").to_dict(),
                              "train": {**cfg.to_dict()["train"], "init_from": src}})
    tr = JaxTrainer(tuned, str(tmp_path / "run"), progress=False)
    got = {convert.flax_key(p): v.get_value() for p, v in nnx.to_flat_state(tr.state["params"])}
    assert set(got) == set(want) and all(np.array_equal(np.asarray(got[k]), want[k]) for k in want)
    assert got["decoder.layers.0.ffn.down_proj.kernel"].sharding.spec == jax.sharding.PartitionSpec(None, "fsdp")
    tr.close()


def test_torch_trainer_starts_from_the_jax_init(tmp_path):
    """The torch trainer's first weights are the JAX trainer's (initialised on a mesh),
    converted to torch layout. (Both schemes, key by key: tests/test_train.py.)"""
    from jaxformer.train.torch.trainer import TorchTrainer
    cfg = _cfg("xavier_uniform")
    jax_tr = JaxTrainer(_mesh_cfg(cfg, "data2_fsdp2_tensor2"), str(tmp_path / "jax"), progress=False)
    want = params_numpy(jax_tr.state)
    jax_tr.close()
    torch_tr = TorchTrainer(cfg, str(tmp_path / "torch"), progress=False)
    got = {k: v.detach().numpy() for k, v in torch_tr.module.state_dict().items()}
    assert set(got) == set(want)
    for k in want:
        assert np.array_equal(got[k], want[k]), k


def test_init_from_names_a_scanned_unscanned_layout_mismatch(tmp_path, flat_checkpoint):
    """An unscanned checkpoint into a model.scan_layers run (and the reverse) is a ConfigError
    naming both settings and the fix, raised before any restore (orbax would only report that
    the tree structures differ)."""
    import shutil

    from jaxformer.config import ConfigError
    from jaxformer.train.jax_trainer import build_jax_model
    cfg, src, _ = flat_checkpoint
    run = _cfg("normal_0.02", scan=True).to_dict()
    tuned = config_from_dict({**run, "train": {**run["train"], "init_from": src}})
    with pytest.raises(ConfigError, match=r"saved with model.scan_layers=False .* this run has "
                                          r"model.scan_layers=True .* --set model.scan_layers=false"):
        JaxTrainer(tuned, str(tmp_path / "run"), progress=False)
    # the reverse: a checkpoint whose model.yaml says scanned (the check reads only model.yaml,
    # so the copy's params need not be restacked), into an unscanned run
    shutil.copytree(src, tmp_path / "scanned")
    yaml_path = tmp_path / "scanned" / "model.yaml"
    text = yaml_path.read_text()
    assert "scan_layers: false" in text
    yaml_path.write_text(text.replace("scan_layers: false", "scan_layers: true"))
    flat = config_from_dict({**cfg.to_dict(), "train": {**cfg.to_dict()["train"],
                                                        "init_from": str(tmp_path / "scanned")}})
    with pytest.raises(ConfigError, match=r"scan_layers=True \(scanned.*--set model.scan_layers=true"):
        build_jax_model(flat)
