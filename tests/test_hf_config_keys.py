"""config.json keys that published checkpoints carry besides the model's own options
(jaxformer/hf/common.py): generation settings and PretrainedConfig housekeeping are accepted as
transformers accepts them; the options that change a model only away from a neutral value are
accepted at that value and refused by name otherwise. No model is built: config_from_hf only."""
from __future__ import annotations

import contextlib
import importlib
import json
import os
from pathlib import Path

import pytest

from jaxformer.config import ConfigError
from jaxformer.hf import gemma2

# google/gemma-2-2b's config.json as published (transformers 4.42): hidden_act beside
# hidden_activation, and the generation setting cache_implementation
GEMMA_2_2B = {
    "architectures": ["Gemma2ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "attn_logit_softcapping": 50.0, "bos_token_id": 2, "cache_implementation": "hybrid", "eos_token_id": 1,
    "final_logit_softcapping": 30.0, "head_dim": 256, "hidden_act": "gelu_pytorch_tanh",
    "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 2304, "initializer_range": 0.02,
    "intermediate_size": 9216, "max_position_embeddings": 8192, "model_type": "gemma2",
    "num_attention_heads": 8, "num_hidden_layers": 26, "num_key_value_heads": 4, "pad_token_id": 0,
    "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06, "rope_theta": 10000.0, "sliding_window": 4096,
    "torch_dtype": "float32", "transformers_version": "4.42.4", "use_cache": True, "vocab_size": 256000,
}


def test_published_gemma2_config_imports_as_without_its_extra_keys():
    _, cfg, _ = gemma2.config_from_hf(GEMMA_2_2B, "Gemma2ForCausalLM")
    bare = {k: v for k, v in GEMMA_2_2B.items() if k not in ("hidden_act", "cache_implementation")}
    assert cfg == gemma2.config_from_hf(bare, "Gemma2ForCausalLM")[1]
    assert cfg.feedforward.kind == "geglu_tanh" and cfg.attention.query_pre_attn_scalar == 256


def test_gemma2_hidden_act_that_disagrees_is_refused_by_name():
    with pytest.raises(ConfigError, match="hidden_act='gelu' .*hidden_activation"):
        gemma2.config_from_hf({**GEMMA_2_2B, "hidden_act": "gelu"}, "Gemma2ForCausalLM")


FAMILIES = ["gpt2", "llama", "mistral", "qwen", "gemma2", "t5", "bert", "vision", "dinov2", "mixtral",
            "qwen_moe", "deepseek", "gpt_oss", "phi3", "roberta", "modernbert",
            "gpt_neox", "olmo2"]
# keys real config.json files carry that never change the maths
HOUSEKEEPING = dict(use_cache=True, torch_dtype="bfloat16", dtype="bfloat16", transformers_version="4.44.0",
                    initializer_range=0.02, attn_implementation="eager", cache_implementation="hybrid",
                    _attn_implementation_autoset=True, problem_type="single_label_classification",
                    pruned_heads={}, add_cross_attention=False)


def _archs():
    for name in FAMILIES:
        fam = importlib.import_module(f"jaxformer.hf.{name}").FAMILY
        for arch in fam.architectures:
            yield fam, arch


def _raw(fam, arch, **extra):
    return {"architectures": [arch], "model_type": fam.model_types[arch], **extra}


@pytest.mark.parametrize("fam,arch", list(_archs()), ids=lambda x: x if isinstance(x, str) else "")
def test_housekeeping_keys_are_accepted_and_change_nothing(fam, arch):
    plain = fam.config_from_hf(_raw(fam, arch), arch)[1]
    assert fam.config_from_hf(_raw(fam, arch, **HOUSEKEEPING), arch)[1] == plain


@pytest.mark.parametrize("key,value", [("pruned_heads", {"0": [1]}), ("add_cross_attention", True)])
@pytest.mark.parametrize("fam,arch", [(importlib.import_module(f"jaxformer.hf.{n}").FAMILY, a) for n, a in
                                      [("llama", "LlamaForCausalLM"), ("vision", "ViTForImageClassification")]])
def test_neutral_only_options_are_refused_by_name_away_from_neutral(fam, arch, key, value):
    with pytest.raises(ConfigError, match=f"{key}=.* is not supported"):
        fam.config_from_hf(_raw(fam, arch, **{key: value}), arch)


# ----------------------------------------------------------------------------- export types
def _flipped(cfg):
    """cfg with every number of a float-typed field written as the other JSON type (30 for
    30.0 as a hand-written model.yaml holds it, 20.0 for 20 as a YAML round trip of an HF
    import may), in nested configs too (rope scaling, MoE, MLA)."""
    import dataclasses
    for f in dataclasses.fields(cfg):
        v = getattr(cfg, f.name)
        if dataclasses.is_dataclass(v):
            new = _flipped(v)
        elif "float" not in str(f.type) or isinstance(v, bool) or not isinstance(v, (int, float)):
            continue
        elif isinstance(v, float) and v.is_integer() and abs(v) < 2 ** 31:
            new = int(v)
        elif isinstance(v, int):
            new = float(v)
        else:
            continue
        with contextlib.suppress(ConfigError, TypeError, ValueError):
            cfg = dataclasses.replace(cfg, **{f.name: new})
    return cfg


def _exportable(fam, arch):
    raw = _raw(fam, arch)
    if fam.name == "gemma2":
        raw["query_pre_attn_scalar"] = 20
    if fam.name == "phi3":  # longrope: exported as Phi3ForCausalLM (else it is a LLaMA)
        raw["rope_parameters"] = dict(rope_type="longrope", short_factor=[1.0] * 48, long_factor=[2.0] * 48)
    name, cfg, _ = fam.config_from_hf(raw, arch)
    return name, _flipped(cfg)


@pytest.mark.parametrize("fam,arch", list(_archs()), ids=lambda x: x if isinstance(x, str) else "")
def test_export_writes_the_types_transformers_validates(fam, arch):
    """Every family's config.json passes transformers' strict config validation (int where it
    types int, float where it types float) whatever number types our config holds."""
    T = pytest.importorskip("transformers")
    from jaxformer import hf
    name, cfg = _exportable(fam, arch)
    hf_config = json.loads(json.dumps(hf.config_to_hf(name, cfg)))
    cls = T.CONFIG_MAPPING[hf_config["model_type"]]
    loaded = cls(**{k: v for k, v in hf_config.items() if k != "model_type"})  # raises on a wrong type
    assert loaded.architectures == hf_config["architectures"]


def test_cli_round_trip_of_a_gemma2_import_loads_in_transformers(tmp_path):
    """convert --from hf, a model.yaml that holds query_pre_attn_scalar as 20.0 (transformers
    types it int), then convert --from flax --to hf and `jaxformer export DIR --to hf` (the
    writer a fine-tuned run's export uses): both load in transformers' Gemma2 class."""
    import contextlib
    import io

    import yaml

    from jaxformer import cli
    T = pytest.importorskip("transformers")
    cfg = T.Gemma2Config(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=8, query_pre_attn_scalar=20,
                         sliding_window=4, max_position_embeddings=32)
    T.Gemma2ForCausalLM(cfg).save_pretrained(tmp_path / "hf")
    flax = str(tmp_path / "flax")
    with contextlib.redirect_stdout(io.StringIO()):
        assert cli.main(["convert", "--from", "hf", str(tmp_path / "hf"), "--to", "flax", flax]) == 0
    spec_file = os.path.join(flax, "model.yaml")
    spec = yaml.safe_load(Path(spec_file).read_text())
    spec["model"]["attention"]["query_pre_attn_scalar"] = 20.0
    Path(spec_file).write_text(yaml.safe_dump(spec))
    outs = [str(tmp_path / "back"), str(tmp_path / "exported")]
    with contextlib.redirect_stdout(io.StringIO()):
        assert cli.main(["convert", "--from", "flax", flax, "--to", "hf", outs[0]]) == 0
        assert cli.main(["export", flax, "--to", "hf", outs[1]]) == 0
    for out in outs:
        back = T.AutoModelForCausalLM.from_pretrained(out)
        assert type(back) is T.Gemma2ForCausalLM and back.config.query_pre_attn_scalar == 20


@pytest.mark.parametrize("fam,arch", list(_archs()), ids=lambda x: x if isinstance(x, str) else "")
def test_each_family_exports_what_it_imports(fam, arch):
    """The exporter's ordered table (hf/families.py) picks, for a config imported from a family's
    default config.json, that family again: no row above it claims the config."""
    from jaxformer import hf
    name, cfg, _ = fam.config_from_hf(_raw(fam, arch), arch) if fam.name not in ("gemma2", "phi3") else \
        (*_exportable(fam, arch), None)
    assert hf.exporter(name, cfg) is fam


def test_family_records_cover_the_registry():
    """One registry (hf/families.py FAMILIES), read by import and export alike: every family
    module's record is in it once, and exports every model it imports."""
    import pkgutil

    from jaxformer import hf
    from jaxformer.hf.common import Family
    from jaxformer.hf.families import FAMILIES
    modules = [importlib.import_module(f"jaxformer.hf.{m.name}") for m in pkgutil.iter_modules(hf.__path__)]
    records = {m.__name__.rsplit(".", 1)[-1]: m.FAMILY for m in modules
               if isinstance(getattr(m, "FAMILY", None), Family)}
    assert set(records.values()) == set(FAMILIES) and len(set(FAMILIES)) == len(FAMILIES) == len(records)
    assert all(f.name == name for name, f in records.items())
    for f in FAMILIES:  # the defaults cover each architecture
        assert set(f.hf_defaults) == set(f.architectures) == set(f.model_types), f.name
        assert set(f.exports) == set(f.architectures.values()), f.name
    assert FAMILIES[-1].name == "t5"
