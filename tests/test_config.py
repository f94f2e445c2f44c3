"""Config validation: every error names the field."""
import pytest

from jaxformer.config import ConfigError, TransformerConfig, from_dict, model_config_from_dict


@pytest.mark.parametrize("kw, field", [
    (dict(d_model=30, num_heads=4), "d_model"),
    (dict(num_layers=0), "num_layers"),
    (dict(d_ff=-1), "d_ff"),
    (dict(ffn="swish"), "ffn"),
    (dict(norm_position="middle"), "norm_position"),
    (dict(num_kv_heads=3), "num_kv_heads"),
    (dict(dropout=1.5), "dropout"),
    (dict(norm_eps=0.0), "norm_eps"),
    (dict(position="rope", d_model=36, num_heads=4), "head_dim"),
    (dict(pad_id=1000), "pad_id"),
])
def test_invalid_values_name_the_field(kw, field):
    with pytest.raises(ConfigError, match=f"^{field}:"):
        TransformerConfig(**kw)


def test_unknown_key_is_named():
    with pytest.raises(ConfigError, match="model.d_modle"):
        model_config_from_dict({"name": "encoder", "d_modle": 64})


def test_bad_type_is_named():
    with pytest.raises(ConfigError, match="model.num_layers: expected an int"):
        model_config_from_dict({"name": "encoder", "num_layers": "two"})
    with pytest.raises(ConfigError, match="model.bias: expected a bool"):
        model_config_from_dict({"name": "encoder", "bias": "yes"})


def test_unknown_model_name():
    with pytest.raises(ConfigError, match="unknown model 'gpt5'"):
        model_config_from_dict({"name": "gpt5"})


def test_configs_are_frozen_and_yaml_floats_parse():
    cfg = from_dict(TransformerConfig, {"norm_eps": "1e-6", "num_kv_heads": None})
    assert cfg.norm_eps == 1e-6
    with pytest.raises(Exception):
        cfg.d_model = 8
