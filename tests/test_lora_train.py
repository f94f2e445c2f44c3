"""LoRA fine-tuning in both trainers (`train.lora`, jaxformer/train/lora.py): the config
section from one --set, a 20-step JAX/torch trajectory, the frozen base bit-identical (fp32,
bf16, int8), adapters alone in the optimiser, pmap and mesh, resume, load and generate."""
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx
from helpers import step_losses
from test_train import _pair, run_cfg

from jaxformer.config import ConfigError, LoRAConfig
from jaxformer.train.config import TrainLoRAConfig, apply_override, config_from_dict, load_config
from jaxformer.train.jax_trainer import JaxTrainer, params_numpy
from jaxformer.train.torch.trainer import TorchTrainer

LORA = {"r": 4, "alpha": 16}


def lora_cfg(family="lm_llama_gqa", lora=LORA, **train):
    d = run_cfg(family, **train).to_dict()
    d["train"]["lora"] = dict(lora)
    return config_from_dict(d)


def _host(tree):
    def f(x):
        return jax.random.key_data(x) if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key) else x
    return [np.asarray(f(x)).copy() for x in jax.tree.leaves(tree)]


def _torch_frozen(module):
    """Every frozen tensor of the module, reduced-precision LoRA bases included."""
    from torch_ref.layers import lora as tl
    out = {k: v.detach().clone() for k, v in module.named_parameters() if not v.requires_grad}
    for path, m in tl.lora_modules(module).items():
        if not isinstance(m.weight, torch.nn.Parameter):
            out[path + ".weight"] = m.weight.data.clone()
            if m.weight.scale is not None:
                out[path + ".scale"] = m.weight.scale
    return out


# ----------------------------------------------------------------------------- config
def test_set_r_alone_creates_the_section_with_peft_defaults():
    raw = {"model": {"name": "lm", "vocab_size": 259, "max_len": 32}, "data": {"name": "stdlib_docs", "seq_len": 16}}
    apply_override(raw, "train.lora.r=8")  # no train section at all: --set creates both levels
    lora = config_from_dict(raw).train.lora
    assert lora == TrainLoRAConfig(r=8) and lora.base_dtype == "fp32"
    assert lora.adapter() == LoRAConfig(r=8, alpha=8, dropout=0.0, use_rslora=False, init="kaiming", target_modules=None)
    cfg = load_config("llama", ["train.lora.r=8", "train.lora.base_dtype=int8"])
    assert cfg.train.lora.base_dtype == "int8" and config_from_dict(cfg.to_dict()) == cfg
    for bad, msg in (("train.lora.use_dora=true", "use_dora: PEFT's use_dora is not supported"),
                     ("train.lora.base_dtype=int4", "train.lora.base_dtype: must be one of"),
                     ("train.lora.rank=4", "unknown config key.*train.lora.rank")):
        with pytest.raises(ConfigError, match=msg):
            load_config("llama", ["train.lora.r=8", bad])


# ----------------------------------------------------------------------------- trajectory
def test_lora_trajectory_parity_and_frozen_base(tmp_path):
    """20 LoRA steps (every projection, r 4, grad accumulation, clipping, weight decay) in both
    trainers from the same base and adapters: losses, rates, gradient norms (the adapters'
    alone) and final params agree as full fine-tuning's do (tests/test_train.py); the base stays
    bit-identical in both trees, and only the adapters carry optimiser state."""
    cfg = lora_cfg()
    tmod, jmod = _pair(cfg)
    tt = TorchTrainer(cfg, str(tmp_path / "torch"), module=tmod, progress=False)  # adds the adapters
    from jaxformer.layers import lora as jl
    jl.apply_lora(jmod, cfg.train.lora.adapter(), nnx.Rngs(0))
    from jaxformer.convert import load_torch_state_dict
    load_torch_state_dict(jmod, tmod.state_dict())  # torch's adapter init (A kaiming, B 0) in both
    jt = JaxTrainer(cfg, str(tmp_path / "jax"), model=jmod, progress=False)
    base_t, base_j = _torch_frozen(tmod), _host(jt.state["frozen"])
    n_adapter = sum(x.size for x in jax.tree.leaves(jt.state["params"]))
    assert n_adapter == sum(p.numel() for p in tmod.parameters() if p.requires_grad)
    assert sum(x.size for x in jax.tree.leaves(jt.state["opt_state"])) == 2 * n_adapter + 2  # mu, nu, counts
    assert sum(len(g["params"]) for g in tt.opt.param_groups) == 2 * len(jl.lora_modules(jmod))
    jh, th = jt.run(), tt.run()
    assert len(jh) == len(th) == 20
    worst = {k: max(abs(a[k] - b[k]) / max(1.0, abs(b[k])) for a, b in zip(jh, th, strict=True)) for k in ("loss", "lr", "grad_norm")}
    jp = params_numpy(jt.state)
    tp = {k: v.detach().numpy() for k, v in tt.module.state_dict().items()}
    assert set(jp) == set(tp)
    worst["params"] = max(float(np.abs(jp[k] - tp[k]).max()) for k in tp)
    print("LoRA trajectory JAX vs torch:", {k: f"{v:.2e}" for k, v in worst.items()})
    assert max(worst.values()) <= 1e-4
    assert all(np.array_equal(a, b) for a, b in zip(base_j, _host(jt.state["frozen"]), strict=True))
    assert all(torch.equal(v, _torch_frozen(tt.module)[k]) for k, v in base_t.items())
    assert all(np.abs(jp[k]).max() > 0 for k in jp if ".lora_B." in k)  # the adapters trained
    assert np.mean([r["loss"] for r in jh[-5:]]) < np.mean([r["loss"] for r in jh[:5]])


# One reduced-base LoRA run per base dtype, shared by the tests below: 4 steps (int8: checkpoints
# at steps 2 and 4, both kept; lr 3e-2 so that the adapters visibly move), batch 16 so that the
# pmap and mesh runs split it over 8 devices.
REDUCED = {"steps": 4, "batch_size": 16, "eval_every": 2, "checkpoint_every": 2, "keep_checkpoints": 2, "lr": 3e-2}


def reduced_cfg(base_dtype, **train):
    return lora_cfg(lora={**LORA, "base_dtype": base_dtype}, **{**REDUCED, **train})


@pytest.fixture(scope="module")
def reduced_runs(tmp_path_factory):
    """base_dtype -> the run of reduced_cfg(base_dtype) in both trainers, made at first use:
    (cfg, run root, JAX trainer, JAX losses, JAX frozen base and adapters before training,
    torch trainer, torch losses, torch frozen base before training). The JAX run is in
    ROOT/jax, the torch one in ROOT/torch; tests copy a folder before changing anything in it."""
    runs = {}

    def get(base_dtype):
        if base_dtype not in runs:
            # the int8 run's step-2 checkpoint is resumed below; the bf16 run's eval and saves
            # are never read, so torch evaluates and saves at its last step alone and JAX runs
            # the train steps alone (each save writes a checkpoint and model exports; the
            # losses do not depend on them)
            cfg = reduced_cfg(base_dtype, **({} if base_dtype == "int8" else {"eval_every": 4, "checkpoint_every": 4}))
            root = tmp_path_factory.mktemp(f"{base_dtype}_run")
            jt = JaxTrainer(cfg, str(root / "jax"), progress=False)
            j_before = (_host(jt.state["frozen"]), _host(jt.state["params"]))
            # bf16: nothing reads the run's eval or saves, its train steps alone
            j_losses = [r["loss"] for r in jt.run()] if base_dtype == "int8" else step_losses(jt)
            tt = TorchTrainer(cfg, str(root / "torch"), progress=False)
            t_before = _torch_frozen(tt.module)
            t_losses = [r["loss"] for r in tt.run()]
            runs[base_dtype] = (cfg, root, jt, j_losses, j_before, tt, t_losses, t_before)
        return runs[base_dtype]
    return get


@pytest.fixture(scope="module")
def int8_run(reduced_runs):
    return reduced_runs("int8")


@pytest.fixture(scope="module")
def fp32_first_loss(tmp_path_factory):
    """The first step's loss of reduced_cfg's run on an fp32 base: the loss of the initial
    weights on batch 0 (the trainer's own train step, once)."""
    from jaxformer.train import data as data_lib
    cfg = lora_cfg(**REDUCED)
    tr = JaxTrainer(cfg, str(tmp_path_factory.mktemp("fp32")), progress=False)
    batch = data_lib.batch_at(tr.train_data, 0, cfg.train.batch_size, cfg.train.seed)  # run()'s first batch
    _, out = tr.train_step(tr.state, tr._train_batch(batch))
    tr.close()
    return float(out["loss"])


@pytest.mark.parametrize("base_dtype", ["bf16", "int8"])
def test_reduced_base_trains_and_stays_bit_identical(base_dtype, reduced_runs, fp32_first_loss):
    """QLoRA style: the base stored as layers/kernels/quant.py's bf16/int8 weight, the adapters fp32;
    steps run in both trees, only the adapters move, and the first step's loss is the fp32
    base's within the weight rounding."""
    _, _, jt, jh, (before, adapters), tt, th, t_before = reduced_runs(base_dtype)
    from jaxformer.layers.kernels.quant import QuantizedWeight
    kernel = jt.state["frozen"]["decoder"]["layers"][0]["self_attn"]["q_proj"]["kernel"].get_value()
    assert isinstance(kernel, QuantizedWeight) and kernel.data.dtype == (jnp.int8 if base_dtype == "int8" else jnp.uint16)
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(jt.state["params"]))
    assert all(np.isfinite(loss) for loss in jh)
    assert all(np.array_equal(a, b) for a, b in zip(before, _host(jt.state["frozen"]), strict=True))
    assert not all(np.array_equal(a, b) for a, b in zip(adapters, _host(jt.state["params"]), strict=True))
    assert any(isinstance(v, torch.Tensor) and v.dtype == (torch.int8 if base_dtype == "int8" else torch.bfloat16)
               for v in t_before.values())
    assert all(np.isfinite(loss) for loss in th)
    assert all(torch.equal(v, _torch_frozen(tt.module)[k]) for k, v in t_before.items())
    print(f"{base_dtype} base: step-1 loss {jh[0]:.6f} vs fp32 base {fp32_first_loss:.6f}")
    assert abs(jh[0] - fp32_first_loss) < 0.05


# ----------------------------------------------------------------------------- parallel modes
@pytest.mark.usefixtures("whole_replica_saves")  # its checkpoints are never restored
def test_pmap_and_mesh_match_one_device(int8_run, tmp_path):
    """The int8-base LoRA run on one device, pmapped over 8 and on a (data 2, fsdp 2, tensor 2)
    mesh: the same losses; on the mesh the adapters and the base are sharded by their logical
    axes (lora_A [embed, None] over fsdp, int8 data [out, in] over tensor and fsdp)."""
    cfg, _, _, single, *_ = int8_run
    d = cfg.to_dict()
    # one eval and one checkpoint, at the last step: the losses compared do not depend on them
    # (eval leaves the train state alone), and each save writes orbax checkpoints and exports
    d["train"] = {**d["train"], "eval_every": 4, "checkpoint_every": 4}
    pmap = JaxTrainer(config_from_dict({**d, "parallel": {"mode": "pmap"}}), str(tmp_path / "pmap"), progress=False).run()
    mesh_cfg = config_from_dict({**d, "parallel": {"mode": "mesh", "mesh": {"data": 2, "fsdp": 2, "tensor": 2}}})
    mt = JaxTrainer(mesh_cfg, str(tmp_path / "mesh"), progress=False)
    q = mt.state["params"]["decoder"]["layers"][0]["self_attn"]["q_proj"]
    assert q["lora_A"]["kernel"].get_value().sharding.spec == jax.sharding.PartitionSpec("fsdp", None)
    assert q["lora_B"]["kernel"].get_value().sharding.spec == jax.sharding.PartitionSpec(None, "tensor")
    base = mt.state["frozen"]["decoder"]["layers"][0]["self_attn"]["q_proj"]["kernel"].get_value()
    assert base.data.sharding.spec == jax.sharding.PartitionSpec("tensor", "fsdp")
    assert base.scale.sharding.spec == jax.sharding.PartitionSpec("tensor")
    mesh = mt.run()
    diffs = {name: max(abs(a - b["loss"]) for a, b in zip(single, other, strict=False)) for name, other in (("pmap", pmap), ("mesh", mesh))}
    print("LoRA int8 base, loss diffs vs one device:", {k: f"{v:.1e}" for k, v in diffs.items()})
    assert len(pmap) == len(mesh) == len(single) == 4 and max(diffs.values()) <= 1e-5


# ----------------------------------------------------------------------------- resume
def test_resume_is_exact_in_both_trainers(int8_run, tmp_path):
    """An int8-base LoRA run stopped after its step-2 checkpoint and resumed ends exactly where
    the uninterrupted run does (adapters, optimiser state, base), in both trainers."""
    cfg, run, full, full_losses, _, tfull, t_losses, _ = int8_run
    shutil.copytree(run / "jax", tmp_path / "jax2")
    shutil.rmtree(tmp_path / "jax2" / "checkpoints" / "4")  # as if killed before step 4's save
    resumed = JaxTrainer(cfg, str(tmp_path / "jax2"), resume=True, progress=False)
    assert resumed.start_step == 2
    assert [r["loss"] for r in resumed.run()] == full_losses[2:]
    assert all(np.array_equal(a, b) for a, b in zip(_host(full.state), _host(resumed.state), strict=False))

    shutil.copytree(run / "torch", tmp_path / "torch2")
    shutil.rmtree(tmp_path / "torch2" / "torch_checkpoints" / "step_4")
    tres = TorchTrainer(cfg, str(tmp_path / "torch2"), resume=True, progress=False)
    assert tres.start_step == 2 and [r["loss"] for r in tres.run()] == t_losses[2:]
    for k, v in _torch_frozen(tfull.module).items():
        assert torch.equal(v, _torch_frozen(tres.module)[k]), k
    for (k, a), b in zip(tfull.module.state_dict().items(), tres.module.state_dict().values(), strict=False):
        assert torch.equal(a, b), k


# ----------------------------------------------------------------------------- using the result
def test_load_and_generate_give_the_adapted_model(int8_run, capsys):
    """jaxformer.load(RUN) is the trained model with its adapters (model.yaml's lora section,
    an int8 base written as the fp32 values it stood for); generate --weights RUN decodes it
    (the adapters merged into the base) from model/last and from checkpoint step 4 alike."""
    import jaxformer
    from jaxformer import cli
    from jaxformer.layers import lora as jl
    _, root, trainer, *_ = int8_run
    run = str(root / "jax")
    model, _ = jaxformer.load(run)
    assert set(jl.lora_modules(model)) == set(jl.lora_modules(trainer.trained_model()))
    ids = jnp.asarray(np.random.RandomState(0).randint(3, 259, (2, 9)), jnp.int32)
    trained = trainer.trained_model()
    trained.eval()
    # one compiled forward per model structure (loaded, int8-based, merged), not an eager
    # program per op: the same layers' code, traced
    logits = nnx.jit(lambda m: m(ids))
    a, b = np.asarray(logits(model)), np.asarray(logits(trained))
    print(f"load(RUN) vs the trainer's model (int8 base dequantized): max |dlogit| {np.abs(a - b).max():.2e}")
    assert np.abs(a - b).max() < 1e-4
    merged, _ = jaxformer.load(run)
    jl.merge_lora(merged)
    assert np.abs(np.asarray(logits(merged)) - a).max() < 1e-4
    for m in jl.lora_modules(model).values():
        m.lora_B.kernel.set_value(jnp.zeros_like(m.lora_B.kernel.get_value()))
    assert np.abs(np.asarray(logits(model)) - a).max() > 1e-3  # the adapters matter

    capsys.readouterr()
    texts = {}
    for name, weights in (("run", run), ("step", run)):
        extra = ["--step", "4"] if name == "step" else []
        assert cli.main(["generate", "--weights", weights, "--prompt", "def ", "--max-new-tokens", "8",
                         *extra]) == 0
        texts[name] = capsys.readouterr().out
    assert texts["run"] == texts["step"] and texts["run"].startswith("def ")
    import json
    evals = []
    for step in ("last", "4"):  # jaxformer eval: model/last (fp32 base) and the int8 checkpoint
        assert cli.main(["eval", run, "--step", step, "--json"]) == 0
        evals.append(json.loads(capsys.readouterr().out.strip().splitlines()[-1])["eval_loss"])
    assert abs(evals[0] - evals[1]) <= 1e-5 * abs(evals[1])
