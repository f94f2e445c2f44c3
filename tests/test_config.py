"""Config validation: every error names the field."""
import pytest

from jaxformer.config import ConfigError, TransformerConfig, from_dict, model_config_from_dict, to_dict


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


# ----------------------------------------------------------------------------- presets
# The field values the parity cases and tests were written against, spelled out here so that a
# change to a preset shows up as a failure, not as silently different models.
_TINY = dict(vocab_size=64, d_model=32, num_heads=4, d_ff=64, num_layers=2, max_len=32, pad_id=0)
_GPT2 = dict(position="learned", norm="layernorm", norm_eps=1e-5, ffn="gelu_tanh", norm_position="pre",
             bias=True, scale_embedding=False, tie_embeddings=True)
_LLAMA = dict(position="rope", norm="rmsnorm", norm_eps=1e-6, ffn="swiglu", norm_position="pre",
              bias=False, num_kv_heads=2, scale_embedding=False, tie_embeddings=False, final_norm=True)


def test_tiny_presets_have_the_expected_fields():
    from jaxformer.config.models import ClassifierConfig, LMConfig, Seq2SeqConfig
    assert to_dict(LMConfig.tiny("gpt2")) == to_dict(LMConfig(**_TINY, **_GPT2))
    assert to_dict(LMConfig.tiny("llama")) == to_dict(LMConfig(**_TINY, **_LLAMA))
    assert to_dict(LMConfig.tiny()) == to_dict(LMConfig(**_TINY))
    assert to_dict(ClassifierConfig.tiny()) == to_dict(ClassifierConfig(**_TINY))
    assert to_dict(Seq2SeqConfig.tiny()) == to_dict(Seq2SeqConfig(**_TINY))
    # overrides win, flavours too
    assert LMConfig.tiny("llama", num_kv_heads=1, max_len=64).num_kv_heads == 1
    assert LMConfig.tiny("gpt2", max_len=64).max_len == 64
    with pytest.raises(ConfigError, match="^flavour:"):
        LMConfig.tiny("gpt3")


def test_gpt2_small_preset_is_gpt2_small():
    from jaxformer.config.models import LMConfig
    expected = LMConfig(vocab_size=50257, d_model=768, num_heads=12, d_ff=3072, num_layers=12,
                        max_len=1024, position="learned", norm="layernorm", norm_eps=1e-5,
                        ffn="gelu_tanh", norm_position="pre", bias=True, scale_embedding=False,
                        tie_embeddings=True, final_norm=True, pad_id=0, bos_id=50256, eos_id=50256)
    assert to_dict(LMConfig.gpt2_small()) == to_dict(expected)
    assert LMConfig.gpt2_small(max_len=256).max_len == 256


def test_lm_flavour_presets_match_the_shipped_yaml():
    """configs/lm.yaml and configs/llama.yaml are the gpt2 and llama presets at other sizes."""
    import os

    import yaml

    from jaxformer.config.models import LMConfig
    root = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "jaxformer", "configs")

    def load(name):
        with open(os.path.join(root, name)) as f:
            return model_config_from_dict(yaml.safe_load(f)["model"])[1]

    sizes = dict(vocab_size=259, d_model=128, num_heads=4, num_layers=4, max_len=256)
    assert to_dict(load("lm.yaml")) == to_dict(LMConfig.gpt2(
        **sizes, d_ff=512, dropout=0.1, attn_dropout=0.1, embed_dropout=0.1))
    assert to_dict(load("llama.yaml")) == to_dict(LMConfig.llama(**sizes, d_ff=344))


def test_every_packaged_config_parses():
    from jaxformer.train.config import load_config, packaged_configs
    names = packaged_configs()
    assert {"lm", "llama", "moe"} <= set(names)
    for name in names:
        assert load_config(name).model_name
    moe = load_config("moe").model.moe
    assert moe.aux_loss_coef > 0 and moe.z_loss_coef > 0  # the aux losses are on
