"""The converter: matching key sets, bit-exact round trips, and every kind of bad input."""
import collections
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
import yaml

from jaxformer import models as jmodels
from jaxformer.config import MODELS, TransformerConfig, model_config_class, model_module, to_dict
from jaxformer.convert import (
    ConversionError,
    convert_file,
    flax_key,
    load_torch_state_dict,
    param_leaves,
    scan_prefixes,
    to_torch_state_dict,
    torch_keys_for,
    write_safetensors,
)
from jaxformer.models import build_model as jbuild
from jaxformer.parity.cases import twin
from jaxformer.parity.registry import CASES, load_all
from torch_ref import models as tmodels
from torch_ref.models import build_model as tbuild

load_all()
CFG = TransformerConfig(vocab_size=40, d_model=32, num_heads=4, d_ff=64, num_layers=2, max_len=16,
                        norm_position="pre", position="learned")


def test_every_registered_model_is_mirrored_and_has_parity_cases():
    """The key-set and round-trip test below runs over the parity cases; this keeps those
    cases in step with the one model registry (jaxformer.config.MODELS): every buildable model
    resolves to a class in both trees and a config class, and at least one case builds it."""
    buildable = {n for n, (_, model) in MODELS.items() if model}
    for name in buildable:
        assert jmodels.model_class(name).__name__ == tmodels.model_class(name).__name__ == model_module(name)[1]
        model_config_class(name)
    covered = {getattr(c.build, "model", None) for c in CASES.values()}
    assert buildable <= covered, f"no parity case builds {sorted(buildable - covered)}"


def _config_of(name):
    b = CASES[name].build
    return repr((b.model, b.cfg)) if getattr(b, "model", None) else None


_SHARED = {k for k, n in collections.Counter(map(_config_of, CASES)).items() if k and n > 1}
_BUILT = {}


def _build(name):
    """CASES[name].build(0); the cases that build the same registered model config (they differ
    in their inputs only: lm_gpt2, lm_gpt2_left_padding, ...) share one build per process. The
    key set and the round trip depend on the model alone, and a reload of the same state dict
    rewrites the same values."""
    key = _config_of(name)
    if key not in _SHARED:
        return CASES[name].build(0)
    if key not in _BUILT:
        _BUILT[key] = CASES[name].build(0)
    return _BUILT[key]


# every case, chosen without building it: building all of them at collection time (to keep
# only the modules with weights) cost each xdist worker minutes before its first test
@pytest.mark.parametrize("name", sorted(CASES))
def test_same_key_set_and_exact_round_trip(name):
    """Both trees name the same weights, and they round-trip bit-exactly; a function case or a
    module without weights has none on either side."""
    from flax import nnx
    t, j = _build(name)
    sd = CASES[name].torch_state(t) if isinstance(t, torch.nn.Module) else {}
    prefixes = scan_prefixes(j) if isinstance(j, nnx.Module) else ()  # a scanned stack: one torch key per layer
    flax_keys = ({k for p, v in param_leaves(j).items() for k in torch_keys_for(p, tuple(v.shape), prefixes)}
                 if isinstance(j, nnx.Module) else set())
    assert flax_keys == set(sd), (sorted(flax_keys ^ set(sd)))
    if not sd:
        return
    load_torch_state_dict(j, sd)
    back = to_torch_state_dict(j)
    assert set(back) == set(sd)
    for k in sd:
        assert back[k].dtype == sd[k].dtype and back[k].shape == sd[k].shape
        assert torch.equal(back[k], sd[k]), k  # bit-exact


def _pair():
    """The encoder in both trees; the flax one abstract (parity.cases.twin): the tests load
    torch weights into it, so its own weights are never drawn (eagerly, a compile per shape)."""
    return tbuild("encoder", CFG, seed=0), twin(lambda: jbuild("encoder", CFG, seed=0), 0)


def test_all_problems_reported_in_one_error():
    t, j = _pair()
    sd = dict(t.state_dict())
    del sd["encoder.layers.0.self_attn.q_proj.weight"]  # missing
    sd["encoder.layers.9.ffn.up_proj.weight"] = torch.zeros(3)  # unexpected
    sd["encoder.layers.1.ffn.up_proj.weight"] = torch.zeros(64, 31)  # mis-shaped
    sd["encoder.final_norm.weight"] = torch.ones(32, dtype=torch.int32)  # dtype
    nan = sd["embed.embed_tokens.weight"].clone()
    nan[3, 4] = float("nan")
    nan[5, 1] = float("inf")
    sd["embed.embed_tokens.weight"] = nan
    with pytest.raises(ConversionError) as e:
        load_torch_state_dict(j, sd)
    msg = str(e.value)
    assert "missing: encoder.layers.0.self_attn.q_proj.weight" in msg
    assert "unexpected: encoder.layers.9.ffn.up_proj.weight" in msg
    assert "shape: encoder.layers.1.ffn.up_proj.weight has torch shape (64, 31), expected (64, 32)" in msg
    assert "dtype: encoder.final_norm.weight is int32" in msg
    assert "non-finite: embed.embed_tokens.weight has 2 NaN/inf" in msg
    assert len(e.value.problems) == 5


def test_lossy_downcast_is_reported():
    t, j = _pair()
    sd = {k: v.double() for k, v in t.state_dict().items()}
    with pytest.raises(ConversionError, match="would lose precision"):
        load_torch_state_dict(j, sd)
    load_torch_state_dict(j, sd, allow_downcast=True)


def test_failed_model_build_with_wrong_config_reports_shapes():
    t = tbuild("encoder", CFG, seed=0)  # the torch side alone: no JAX model to build
    j = twin(lambda: jbuild("encoder", CFG.replace(d_ff=48), seed=0), 0)
    with pytest.raises(ConversionError) as e:
        load_torch_state_dict(j, t.state_dict())
    # up_proj.weight, up_proj.bias and down_proj.weight of each layer, nothing else
    assert len(e.value.problems) == 3 * CFG.num_layers
    assert all(p.startswith("shape:") for p in e.value.problems)


def _write_torch_file(path, sd, meta=None):
    write_safetensors(str(path), {k: v.numpy() for k, v in sd.items()}, meta or {"format": "pt"})


def _config_yaml(path):
    path.write_text(yaml.safe_dump({"model": {"name": "encoder", **to_dict(CFG)}}))
    return str(path)


def test_file_round_trip_is_exact(tmp_path):
    t = tbuild("encoder", CFG, seed=0)  # the torch side alone: no JAX model to build
    src, mid, back = tmp_path / "t.safetensors", tmp_path / "f.safetensors", tmp_path / "b.safetensors"
    _write_torch_file(src, t.state_dict())
    convert_file(str(src), str(mid), to="flax", name="encoder", cfg=CFG)
    convert_file(str(mid), str(back), to="torch")  # config from the file's metadata
    from safetensors.numpy import load_file
    a, b = load_file(str(src)), load_file(str(back))
    assert set(a) == set(b) and all(np.array_equal(a[k], b[k]) for k in a)
    flax_side = load_file(str(mid))
    assert "encoder.layers.0.self_attn.q_proj.kernel" in flax_side
    np.testing.assert_array_equal(flax_side["encoder.layers.0.self_attn.q_proj.kernel"],
                                  a["encoder.layers.0.self_attn.q_proj.weight"].T)


def test_torch_file_input_and_overwrite(tmp_path):
    """A .pt state_dict (also wrapped as {"state_dict": ...}) converts exactly like the same
    weights in safetensors; an existing output is replaced only with overwrite=True, and the
    input never is."""
    from safetensors.numpy import load_file
    t = tbuild("encoder", CFG, seed=0)  # the torch side alone: no JAX model to build
    st, pt = tmp_path / "t.safetensors", tmp_path / "t.pt"
    _write_torch_file(st, t.state_dict())
    torch.save({"state_dict": t.state_dict(), "step": torch.tensor(3)}, pt)
    a, b = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    convert_file(str(st), str(a), to="flax", name="encoder", cfg=CFG)
    convert_file(str(pt), str(b), to="flax", name="encoder", cfg=CFG)
    fa, fb = load_file(str(a)), load_file(str(b))
    assert set(fa) == set(fb) and all(np.array_equal(fa[k], fb[k]) for k in fa)
    with pytest.raises(FileExistsError, match="pass --overwrite"):
        convert_file(str(pt), str(b), to="flax", name="encoder", cfg=CFG)
    b.write_bytes(b"old")
    convert_file(str(pt), str(b), to="flax", name="encoder", cfg=CFG, overwrite=True)
    assert load_file(str(b)).keys() == fa.keys()
    with pytest.raises(ValueError, match="is the input file"):
        convert_file(str(st), str(st), to="flax", name="encoder", cfg=CFG, overwrite=True)


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "jaxformer", "convert", *args], capture_output=True, text=True)


def _cli_here(capsys, *args):
    """`jaxformer convert ARGS` in this process (cli.main) -> (exit code, stderr): the error
    paths need no fresh interpreter (test_cli_round_trip_and_truncated_file starts a real one)."""
    from jaxformer import cli
    capsys.readouterr()
    try:
        code = cli.main(["convert", *args])
    except SystemExit as e:
        code = e.code
    return code, capsys.readouterr().err


def test_cli_failed_conversion_writes_nothing(tmp_path, capsys):
    t = tbuild("encoder", CFG, seed=0)  # the torch side alone: no JAX model to build
    sd = dict(t.state_dict())
    del sd["encoder.final_norm.bias"]
    src, dst = tmp_path / "bad.safetensors", tmp_path / "out.safetensors"
    _write_torch_file(src, sd)
    code, err = _cli_here(capsys, str(src), str(dst), "--to", "flax", "--config", _config_yaml(tmp_path / "c.yaml"))
    assert code == 2
    assert "missing: encoder.final_norm.bias" in err
    assert not dst.exists()
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".tmp")]


def test_cli_round_trip_and_truncated_file(tmp_path, capsys):
    t = tbuild("encoder", CFG, seed=0)  # the torch side alone: no JAX model to build
    src, mid = tmp_path / "t.safetensors", tmp_path / "f.safetensors"
    _write_torch_file(src, t.state_dict())
    r = _cli(str(src), str(mid), "--to", "flax", "--config", _config_yaml(tmp_path / "c.yaml"))
    assert r.returncode == 0, r.stderr
    data = src.read_bytes()
    trunc = tmp_path / "trunc.safetensors"
    trunc.write_bytes(data[: len(data) // 2])
    code, err = _cli_here(capsys, str(trunc), str(tmp_path / "x.safetensors"), "--to", "flax", "--config",
                          str(tmp_path / "c.yaml"))
    assert code == 2 and "unreadable safetensors" in err
    assert not (tmp_path / "x.safetensors").exists()


def test_pickle_bin_is_loaded_weights_only(tmp_path, capsys):
    """A .bin whose pickle would run code is refused and the code does not run (docs/numerics.md §14)."""
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    bad = tmp_path / "evil.bin"
    torch.save({"x": Evil()}, str(bad))
    code, err = _cli_here(capsys, str(bad), str(tmp_path / "o.safetensors"), "--to", "flax", "--config",
                          _config_yaml(tmp_path / "c.yaml"))
    assert code != 0
    assert "Weights only load failed" in err or "weights_only" in err
    assert not marker.exists()
    assert not (tmp_path / "o.safetensors").exists()


def test_flax_keys_are_attribute_paths():
    _, j = _pair()
    keys = {flax_key(p) for p in param_leaves(j)}
    assert "encoder.layers.1.ffn.down_proj.kernel" in keys
    assert "embed.embed_positions.embedding" in keys
    assert "encoder.final_norm.scale" in keys
