"""Issue 48's other tasks for any NNX module (tests/test_user_module.py has causal_lm): a ported
torch encoder-decoder with `task: seq2seq` on the dates data, and a ported conv-patch ViT with
`task: classification` on the digits data, each named by YAML (`model.module` the port's file,
`model.torch` its factory in tests/user_modules.py) and written by the live port. Each is
ported twice: op by op, and with `--layers jaxformer` (torch.nn's encoder stack, and the
decoder's layers, written as jaxformer's Encoder / DecoderLayer, whose weights go by
jaxformer.interop's names: jaxformer.module_weights maps them both ways without jaxformer.port).

Each JAX run is made once (fixtures): 20 steps against 20 of the torch trainer (10 for the
`--layers jaxformer` ports), the seq2seq on a mesh (fsdp 2 x tensor 2, 4 of the 8 CPU devices)
against one device, and `export --to torch` loaded with load_state_dict(strict=True) into the
torch module, whose logits are the JAX model's within the harness's output tolerance. Then
module_weights' interop map alone, on torch.nn modules held by hand-made NNX modules."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import user_modules
import yaml
from flax import nnx
from helpers import shared_port
from test_user_module import FACTORIES, MESH_RTOL, OUT_ATOL, OUT_RTOL, RTOL, TRAIN, _worst

import jaxformer
from jaxformer.cli import main
from jaxformer.config.module import logits_of
from jaxformer.train.config import load_config
from jaxformer.train.jax_trainer import JaxTrainer

DATA = {"seq2seq": {"name": "dates", "src_len": user_modules.S2S_SRC, "tgt_len": user_modules.S2S_TGT,
                    "train_examples": 512, "eval_examples": 64},
        "classification": {"name": "digits", "image_size": 16, "num_channels": 1}}


class Run:
    """A torch module's port (layers: flax or jaxformer), its YAML (FILE relative to the YAML's
    folder) and its JAX run of `steps` steps."""

    def __init__(self, tmp_path_factory, name, example, factory: str, task: str, layers: str = "flax",
                 steps: int = 20):
        folder = tmp_path_factory.mktemp(name)
        self.folder, self.factory, self.task = folder, factory, task
        self.label = f"{factory} (--layers {layers})"
        _, self.inputs = example()
        source, class_name = shared_port(tmp_path_factory, factory, example, layers)
        (folder / "ported.py").write_text(source)
        self.spec = f"ported.py:{class_name}"
        self.train = {**TRAIN, "steps": steps}
        self.cfg = load_config(self.write_cfg())
        self.workdir = str(folder / "jax")
        self.history = JaxTrainer(self.cfg, self.workdir, progress=False).run()

    def write_cfg(self, parallel=None) -> str:
        raw = {"model": {"module": self.spec, "torch": f"{FACTORIES}:{self.factory}"}, "task": self.task,
               "data": DATA[self.task], "train": self.train}
        if parallel:
            raw["parallel"] = parallel
        path = self.folder / f"cfg_{len(list(self.folder.glob('cfg_*.yaml')))}.yaml"
        path.write_text(yaml.safe_dump(raw))
        return str(path)

    def torch_module(self):
        return getattr(user_modules, self.factory)()


@pytest.fixture(scope="module")
def translator(tmp_path_factory):
    return Run(tmp_path_factory, "s2s", user_modules.translator_example, "make_translator", "seq2seq")


@pytest.fixture(scope="module")
def vit(tmp_path_factory):
    return Run(tmp_path_factory, "vit", user_modules.vit_example, "make_vit", "classification")


@pytest.fixture(scope="module")
def vit_twin(tmp_path_factory):
    return Run(tmp_path_factory, "vit_twin", user_modules.vit_example, "make_vit", "classification",
               layers="jaxformer", steps=10)


@pytest.fixture(scope="module")
def translator_twin(tmp_path_factory):
    """--layers jaxformer on nn.Transformer: the encoder as jaxformer's Encoder, each decoder layer
    as its DecoderLayer (the decoder stack itself op by op: torch's tgt_is_causal flag)."""
    return Run(tmp_path_factory, "s2s_twin", user_modules.translator_example, "make_translator", "seq2seq",
               layers="jaxformer", steps=10)


@pytest.fixture(params=["translator", "vit", "vit_twin", "translator_twin"])
def run(request):
    return request.getfixturevalue(request.param)


def test_the_twin_ports_hold_jaxformers_classes(vit_twin, translator_twin):
    """--layers jaxformer wrote torch.nn's modules as jaxformer's classes: module_weights maps
    them by jaxformer.interop's names (in_proj_weight split into q/k/v_proj, linear1 ->
    ffn.up_proj, multihead_attn -> cross_attn, ...)."""
    from jaxformer import module_weights
    for run, twins, leaf in ((vit_twin, ["encoder"], "encoder.layers.0.self_attn.q_proj.weight"),
                             (translator_twin, ["transformer.encoder", "transformer.decoder.layers.0",
                                                "transformer.decoder.layers.1"],
                              "transformer.decoder.layers.1.cross_attn.k_proj.weight")):
        model, _ = jaxformer.load(run.workdir)
        found = module_weights.interop_twins(model, run.torch_module())
        assert [p for p, _ in found] == twins
        assert leaf in module_weights.flax_arrays(model)


def test_torch_trainer_follows_the_same_trajectory(run, tmp_path):
    """The torch module in the torch trainer, from the same YAML and start (the JAX init loaded
    under its own keys), against the JAX run: loss, lr and gradient norm per step, the final
    eval loss and the final weights under the torch keys."""
    from jaxformer import module_weights
    from jaxformer.checkpoint_io import load_run
    from jaxformer.train.torch.trainer import TorchTrainer
    tt = TorchTrainer(run.cfg, str(tmp_path / "torch"), progress=False)
    th = tt.run()
    assert len(th) == len(run.history) == run.train["steps"]
    worst = {k: _worst(run.history, th, k) for k in ("loss", "lr", "grad_norm")}
    final = module_weights.torch_state_dict(load_run(run.workdir, run.train["steps"])[2], run.torch_module())
    diffs, free = {}, {}
    for k, v in tt.module.state_dict().items():
        d = (final[k] - v).abs()
        if k.endswith("in_proj_bias"):  # [q; k; v]: the key third apart
            # a key projection's bias: softmax cancels it, so its true gradient is 0 and each
            # framework's is rounding noise that Adam turns into lr-sized steps (docs/numerics.md
            # §15; our own layers cut that gradient, torch.nn's MultiheadAttention has it). It moves no loss.
            q, key, val = d.chunk(3)
            free[k], d = float(key.max()), torch.cat([q, val])
        diffs[k] = float(d.max())
    params = max(diffs.values())
    eval_diff = abs(th[-1]["eval_loss"] - run.history[-1]["eval_loss"]) / abs(run.history[-1]["eval_loss"])
    print(f"{run.label}, {run.train['steps']} steps: worst relative loss {worst['loss']:.2e}, "
          f"lr {worst['lr']:.2e}, grad_norm {worst['grad_norm']:.2e}, eval loss {eval_diff:.2e}, final params "
          f"max |d| {params:.2e} (key biases, gradient 0 in exact arithmetic: {max(free.values()):.2e})")
    assert max(worst.values()) <= RTOL, worst
    assert params <= RTOL
    assert eval_diff <= RTOL
    # the torch run's own export (WORKDIR/model/last, flax layout, through module_weights.load_from_torch)
    # holds its module's weights: back under the torch keys, bit for bit
    back = module_weights.torch_state_dict(jaxformer.load(str(tmp_path / "torch"))[0], run.torch_module())
    assert all(torch.equal(back[k], v) for k, v in tt.module.state_dict().items())


MESH4 = {"mode": "mesh", "num_devices": 4, "mesh": {"data": 1, "fsdp": 2, "tensor": 2}}


def test_seq2seq_mesh_equals_one_device(translator, tmp_path):
    """fsdp 2 x tensor 2 on 4 of the 8 devices, by the logical axes the port wrote: every loss
    equals one device's, and the parameters are split."""
    import jax
    from jax.sharding import PartitionSpec as P

    from jaxformer.train.sharding import _key_of
    cfg = load_config(translator.write_cfg(MESH4))
    tr = JaxTrainer(cfg, str(tmp_path / "mesh"), progress=False)
    specs = {_key_of(p): s.spec for p, s in jax.tree_util.tree_flatten_with_path(tr.shardings["params"])[0]}
    assert specs["transformer.encoder.layers.0.linear1.kernel"] == P("fsdp", "tensor"), specs  # (embed, mlp)
    assert specs["transformer.decoder.layers.1.linear2.kernel"] == P("tensor", "fsdp"), specs  # (mlp, embed)
    history = tr.run()
    worst = _worst(history, translator.history, "loss")
    mem = tr.memory_report()
    print(f"{translator.factory}: mesh fsdp 2 x tensor 2 vs one device, worst relative loss {worst:.2e}; parameter bytes per device "
          f"{mem['param_bytes_per_device']} of {mem['param_bytes_total']}")
    assert worst <= MESH_RTOL
    assert mem["param_bytes_per_device"] < mem["param_bytes_total"]


def _inputs(run) -> tuple:
    """The model's call for the logits check: a fresh batch of the task's inputs."""
    rs = np.random.RandomState(3)
    if run.task == "seq2seq":
        src = rs.randint(3, user_modules.VOCAB, (3, user_modules.S2S_SRC))
        src[1, 17:] = 0
        return src, rs.randint(1, user_modules.VOCAB, (3, user_modules.S2S_TGT))
    return (rs.standard_normal((3, 16, 16, 1)).astype(np.float32),)


def test_export_loads_strictly_into_the_torch_module(run, tmp_path, capsys):
    """export --to torch (.safetensors and .pt): exactly the torch module's own state_dict keys,
    loaded with strict=True; its logits are the JAX model's within the harness's output
    tolerance (atol 1e-6 + rtol 2e-6 x max |torch|)."""
    from safetensors.torch import load_file
    model, _ = jaxformer.load(run.workdir)
    args = _inputs(run)
    ours = np.asarray(logits_of(model(*args)))
    for suffix, read in ((".safetensors", load_file), (".pt", lambda p: torch.load(p, weights_only=True))):
        out = str(tmp_path / f"w{suffix}")
        assert main(["export", run.workdir, "--to", "torch", out]) == 0
        module = run.torch_module().eval()
        state = read(out)
        assert set(state) == set(module.state_dict())
        module.load_state_dict(state, strict=True)
        with torch.no_grad():
            theirs = logits_of(module(*(torch.from_numpy(a) for a in args))).numpy()
        diff, top = float(np.abs(ours - theirs).max()), float(np.abs(theirs).max())
        with capsys.disabled():
            print(f"{run.label} {suffix}: max |jax - torch| logits {diff:.2e} (max |torch| {top:.2f}, "
                  f"tolerance {OUT_ATOL + OUT_RTOL * top:.2e})")
        assert diff <= OUT_ATOL + OUT_RTOL * top


# ----------------------------------------------------------------------------- module_weights, interop names
class _Holder(nnx.Module):
    """An NNX module holding a jaxformer twin of a torch.nn module (as a --layers jaxformer port
    does) beside a flax layer of its own."""

    def __init__(self, body, d: int):
        self.body = body
        self.head = nnx.Linear(d, 3, rngs=nnx.Rngs(0))


class _TorchHolder(torch.nn.Module):
    def __init__(self, body, d: int):
        super().__init__()
        self.body, self.head = body, torch.nn.Linear(d, 3)


def _torch_nn(kind: str, seed: int, layers: int = 2):
    torch.manual_seed(seed)
    nn = torch.nn
    if kind == "mha":  # separate q/k/v weights (kdim, vdim) and the appended bias_k / bias_v slots
        return nn.MultiheadAttention(16, 4, kdim=8, vdim=12, add_bias_kv=True, batch_first=True)
    if kind == "decoder":  # cross-attention, three norms, a final norm
        return nn.TransformerDecoder(nn.TransformerDecoderLayer(16, 4, 32, dropout=0.0, batch_first=True), layers,
                                     nn.LayerNorm(16))
    if kind == "encoder":
        return nn.TransformerEncoder(nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True), layers,
                                     enable_nested_tensor=False)
    return nn.Transformer(16, 4, 1, 1, 32, dropout=0.0, batch_first=True)  # the torch module itself (path '')


@pytest.mark.parametrize("kind", ["mha", "decoder", "transformer"])
def test_module_weights_map_torch_nn_twins_both_ways(kind):
    """torch -> NNX (interop.torch_state) -> torch (its inverse, by element indices) gives every
    tensor back bit for bit, under the torch module's own keys (in_proj_weight, bias_k, linear1,
    norm3, ...), at a path or as the module itself."""
    from jaxformer import interop, module_weights
    if kind == "transformer":
        source, target = _torch_nn(kind, 0), _torch_nn(kind, 1)
        model = interop.from_torch(_torch_nn(kind, 2))
    else:
        source, target = _TorchHolder(_torch_nn(kind, 0), 16), _TorchHolder(_torch_nn(kind, 1), 16)
        model = _Holder(interop.from_torch(_torch_nn(kind, 2)), 16)
    assert [p for p, _ in module_weights.interop_twins(model, source)] == ["" if kind == "transformer" else "body"]
    module_weights.load_from_torch(model, source)
    back = module_weights.torch_state_dict(model, target)
    want = source.state_dict()
    assert set(back) == set(want)
    assert all(torch.equal(back[k], want[k]) for k in want), [k for k in want if not torch.equal(back[k], want[k])]
    module_weights.load_into_torch(model, target)
    assert all(torch.equal(v, want[k]) for k, v in target.state_dict().items())


def test_module_weights_name_each_missing_twin_leaf_once():
    """A torch encoder of 3 layers against a twin of 2: one ConversionError naming each of the
    third layer's 16 leaves once, under jaxformer.interop's names."""
    from jaxformer import convert, interop, module_weights
    model = _Holder(interop.from_torch(_torch_nn("encoder", 0)), 16)
    with pytest.raises(convert.ConversionError) as e:
        module_weights.torch_state_dict(model, _TorchHolder(_torch_nn("encoder", 0, layers=3), 16))
    lines = e.value.problems
    assert len(lines) == len(set(lines)) == 16, lines
    assert all(ln.startswith("missing: body.layers.2.") and "jaxformer.interop's name" in ln for ln in lines), lines
    assert any("body.layers.2.self_attn.q_proj.weight" in ln for ln in lines)


# ----------------------------------------------------------------------------- bad input: one line, exit 2
_NETS = """import jax.numpy as jnp
from flax import nnx


class Tokens(nnx.Module):  # a causal LM's call: model(ids)
    def __init__(self, vocab=259, *, rngs):
        self.embed = nnx.Embed(vocab, 8, rngs=rngs)
        self.head = nnx.Linear(8, vocab, rngs=rngs)

    def __call__(self, ids):
        return self.head(self.embed(ids))


class Pooled(Tokens):  # one row of logits per example, not one per target position
    def __call__(self, src, tgt_in):
        return self.head(self.embed(src).mean(axis=1))


class Images(nnx.Module):
    def __init__(self, classes=10, *, rngs):
        self.head = nnx.Linear(1, classes, rngs=rngs)

    def __call__(self, images):
        return self.head(images.mean(axis=(1, 2)))
"""
BAD = {
    "seq2seq_call_takes_one_argument": ("Tokens", "seq2seq", {}, "does not fit task seq2seq: it is called as "
                                        "model(source ids [B, S], target ids [B, T] (teacher forcing)), but its "
                                        "__call__(ids) takes 1 positional argument(s)"),
    "seq2seq_logits_per_example": ("Pooled", "seq2seq", {}, "it returned float32 (2, 259); the task needs float "
                                   "logits [2, 12, N]"),  # traced on two examples
    "seq2seq_on_lm_data": ("Pooled", "seq2seq", {"name": "stdlib_docs", "seq_len": 8},
                           "data.name=stdlib_docs does not fit task=seq2seq (use ('dates',))"),
    "classification_too_few_classes": ("Images", "classification", {"classes": 3},
                                       "its logits have 3 entries, fewer than the 10 classes of data digits"),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_a_module_that_does_not_fit_its_task_is_one_line(name, tmp_path, capsys):
    cls, task, extra, phrase = BAD[name]
    (tmp_path / "nets.py").write_text(_NETS)
    data = extra if "name" in extra else DATA[task]
    kwargs = {} if "name" in extra else extra
    raw = {"model": {"module": f"nets.py:{cls}", "kwargs": kwargs}, "task": task, "data": data, "train": TRAIN}
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(raw))
    code = main(["train", "--config", str(tmp_path / "cfg.yaml"), "--workdir", str(tmp_path / "w")])
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2 and len(lines) == 1 and phrase in err and "Traceback" not in err, err
    assert not (tmp_path / "w").exists()


def test_export_to_a_torch_module_the_twin_does_not_fit_is_one_line(vit_twin, tmp_path, capsys):
    """The twin port's weights against a torch ViT of 3 encoder layers (model.torch edited in the
    checkpoint's model.yaml): the first missing leaf under jaxformer.interop's names and a count
    of the rest, exit 2, nothing written."""
    import shutil
    src = tmp_path / "ckpt"
    shutil.copytree(f"{vit_twin.workdir}/model/last", src)
    spec = yaml.safe_load((src / "model.yaml").read_text())
    spec["model"]["torch"] = f"{FACTORIES}:make_vit_3_layers"
    (src / "model.yaml").write_text(yaml.safe_dump(spec))
    code = main(["export", str(src), "--to", "torch", str(tmp_path / "w.safetensors")])
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2 and len(lines) == 2 and "Traceback" not in err, err
    assert "the NNX module does not fit the torch module (16 problems): missing: encoder.layers.2." in lines[0], err
    assert "jaxformer.interop's name" in lines[0] and "15 more line(s)" in lines[1], err
    assert not (tmp_path / "w.safetensors").exists()
