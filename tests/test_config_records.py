"""The config records (TransformerConfig.attention, .positions, .feedforward, .norms, .bert) and
the one shim that still loads the flat keys of the configs before them: YAML (from_dict), Python
keywords, replace, --set overrides and old workdirs. No model is built."""
from __future__ import annotations

import dataclasses
import os

import pytest
import yaml

from jaxformer.config import ConfigError, TransformerConfig, from_dict, to_dict
from jaxformer.config.base import replace
from jaxformer.config.models import ClassifierConfig, LMConfig, Seq2SeqConfig
from jaxformer.config.transformer import AttentionOptions, FeedForwardOptions

FLAT = os.path.join(os.path.dirname(__file__), "data", "flat_configs")
PATHS = TransformerConfig.FLAT_PATHS


def test_every_flat_key_maps_to_exactly_one_record_field():
    records = {f.name: f.type for f in dataclasses.fields(TransformerConfig)}
    assert len(set(PATHS.values())) == len(PATHS)  # no two flat keys share a field
    fields = set()
    for rec in ("attention", "positions", "feedforward", "norms", "bert"):
        cls = type(getattr(TransformerConfig(), rec))
        fields |= {f"{rec}.{f.name}" for f in dataclasses.fields(cls)}
    assert set(PATHS.values()) == fields  # every record field has its flat key
    for cls in (TransformerConfig, LMConfig, ClassifierConfig, Seq2SeqConfig):  # a flat key is never a field
        assert not set(PATHS) & {f.name for f in dataclasses.fields(cls)}, cls.__name__
    assert {PATHS[k] for k in ("position", "ffn", "norm")} == {"positions.kind", "feedforward.kind", "norms.kind"}
    assert "attention" in records and "num_heads" not in records


def test_flat_keywords_build_the_records():
    cfg = LMConfig.tiny("llama", sliding_window=8, norm_eps=1e-5)
    assert cfg.attention.sliding_window == 8 and cfg.norms.norm_eps == 1e-5 and cfg.positions.kind == "rope"
    assert cfg == LMConfig.tiny("llama", attention={"sliding_window": 8}, norms={"norm_eps": 1e-5})
    with pytest.raises(AttributeError):
        cfg.sliding_window  # noqa: B018 (a missed read fails loudly)


def test_a_flat_yaml_and_its_nested_form_give_equal_configs():
    from jaxformer.train.config import load_config
    flat, nested = load_config(os.path.join(FLAT, "llama_flat.yaml")), load_config("llama")
    assert flat == nested and flat.to_dict() == nested.to_dict()
    assert "attention" in flat.to_dict()["model"] and "num_heads" not in flat.to_dict()["model"]  # writes nested
    assert load_config(os.path.join(FLAT, "moe_flat.yaml")) == load_config("moe")
    with open(os.path.join(FLAT, "llama_flat.yaml")) as f:
        model = yaml.safe_load(f)["model"]
    model.pop("name")
    assert from_dict(LMConfig, model) == from_dict(LMConfig, to_dict(from_dict(LMConfig, model)))


@pytest.mark.parametrize("override", ["model.rope_base=500.0", "model.positions.rope_base=500.0"])
@pytest.mark.parametrize("config", ["llama", os.path.join(FLAT, "llama_flat.yaml")], ids=["nested", "flat"])
def test_a_set_override_applies_in_either_form(config, override):
    from jaxformer.train.config import load_config
    cfg = load_config(config, [override, "model.norm=layernorm"])
    assert cfg.model.positions.rope_base == 500.0 and cfg.model.norms.kind == "layernorm"
    assert cfg.model.attention.num_kv_heads == 2  # the rest of the record kept


def test_a_flat_key_with_its_nested_form_is_refused_by_name():
    with pytest.raises(ConfigError, match=r"^model\.sliding_window and model\.attention\.sliding_window "
                                          r"given together"):
        from_dict(LMConfig, {"sliding_window": 4, "attention": {"sliding_window": 4}}, prefix="model.")
    with pytest.raises(ConfigError, match=r"^sliding_window and attention\.sliding_window given together"):
        LMConfig(sliding_window=4, attention=AttentionOptions())
    with pytest.raises(ConfigError, match=r"^d_ff and feedforward\.d_ff given together"):
        replace(LMConfig(), d_ff=8, **{"feedforward.d_ff": 16})
    with pytest.raises(ConfigError, match=r"^ffn and feedforward\.kind given together"):  # the old whole-record way
        dataclasses.replace(LMConfig(), ffn="gelu")
    from jaxformer.config.rules import explain
    assert explain(LMConfig, {"norm": "rmsnorm", "norms": {"kind": "rmsnorm"}}, prefix="model.") == [
        "model.norm and model.norms.kind given together; write one of them (the nested form)"]


def test_replace_takes_flat_keys_paths_and_partial_records():
    cfg = LMConfig.tiny("llama")
    a = cfg.replace(sliding_window=4, d_ff=48, num_layers=3)
    b = cfg.replace(**{"attention.sliding_window": 4}, feedforward={"d_ff": 48}, num_layers=3)
    assert a == b and a.attention.num_kv_heads == 2 and a.feedforward.kind == "swiglu"
    assert cfg.replace(feedforward=FeedForwardOptions(kind="gelu", d_ff=48)).feedforward.kind == "gelu"
    with pytest.raises(ConfigError, match=r"^attention\.sliding_window: must be a positive int"):
        cfg.replace(sliding_window=0)


def test_rules_and_explain_name_the_record_path():
    from jaxformer.config.rules import explain
    with pytest.raises(ConfigError, match=r"^attention\.sliding_window: must be a positive int, got 0$"):
        LMConfig.tiny(sliding_window=0)
    assert explain(LMConfig, {"sliding_window": 0}, prefix="model.") == [
        "model.attention.sliding_window: must be a positive int, got 0 [sliding_window_positive]"]
    with pytest.raises(ConfigError, match=r"unknown config key\(s\) model\.attention\.sliding_windw "
                                          r"for AttentionOptions"):
        from_dict(LMConfig, {"attention": {"sliding_windw": 4}}, prefix="model.")


def test_an_old_flat_workdir_config_resumes(tmp_path):
    """A workdir written before the records holds a flat config.yaml: resume accepts it (the
    same run compares equal) and names a changed field by its path."""
    from jaxformer.train import workdir as workdir_lib
    from jaxformer.train.config import config_changes, load_config
    with open(os.path.join(FLAT, "llama_flat.yaml")) as f:
        old = yaml.safe_load(f)
    new = load_config("llama")
    assert config_changes(old, new) == ([], [])
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(old))
    lock, allowed = workdir_lib.open_workdir(str(tmp_path), new, resume=True, overwrite=False, has_checkpoint=True)
    assert allowed == []
    lock.release()
    changed = load_config("llama", ["model.num_kv_heads=4"])
    assert config_changes(old, changed)[0] == ["model.attention.num_kv_heads: 2 -> 4"]
