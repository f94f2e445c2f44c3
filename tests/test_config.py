"""Config validation: every error names the field."""
import dataclasses

import pytest
import yaml

from jaxformer.config import ConfigError, TransformerConfig, from_dict, model_config_from_dict, to_dict


@pytest.mark.parametrize("kw, field", [
    (dict(d_model=30, num_heads=4), "d_model"),
    (dict(num_layers=0), "num_layers"),
    (dict(d_ff=-1), "feedforward.d_ff"),
    (dict(ffn="swish"), "feedforward.kind"),
    (dict(norm_position="middle"), "norms.norm_position"),
    (dict(num_kv_heads=3), "attention.num_kv_heads"),
    (dict(dropout=1.5), "dropout"),
    (dict(norm_eps=0.0), "norms.norm_eps"),
    (dict(position="rope", d_model=36, num_heads=4), "attention.head_dim"),
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
    assert cfg.norms.norm_eps == 1e-6
    with pytest.raises(dataclasses.FrozenInstanceError):
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
    assert LMConfig.tiny("llama", num_kv_heads=1, max_len=64).attention.num_kv_heads == 1
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
    moe = load_config("moe").model.feedforward.moe
    assert moe.aux_loss_coef > 0 and moe.z_loss_coef > 0  # the aux losses are on


# One override per rule of the text models' configs that breaks that rule (the base config is
# LMConfig.tiny("llama") unless the entry names another class). A rule added without an entry
# fails test_every_rule_has_a_breaking_example.
_MLA = dict(kv_lora_rank=8, qk_nope_head_dim=4, qk_rope_head_dim=4, v_head_dim=8)
_RULE_BREAKERS = {
    "vocab_size_positive": dict(vocab_size=0), "d_model_positive": dict(d_model=-1),
    "num_heads_positive": dict(num_heads=0), "d_ff_positive": dict(d_ff=0), "num_layers_positive": dict(num_layers=0),
    "max_len_positive": dict(max_len=0), "rel_num_buckets_positive": dict(rel_num_buckets=0),
    "rel_max_distance_positive": dict(rel_max_distance=0), "ffn_choice": dict(ffn="mish"),
    "norm_choice": dict(norm="batchnorm"), "norm_position_choice": dict(norm_position="middle"),
    "position_choice": dict(position="xpos"), "dropout_probability": dict(dropout=1.0),
    "attn_dropout_probability": dict(attn_dropout=-0.1), "ffn_dropout_probability": dict(ffn_dropout=2.0),
    "embed_dropout_probability": dict(embed_dropout=1.5), "norm_eps_positive": dict(norm_eps=0.0),
    "rope_base_positive": dict(rope_base=-1.0), "attn_scale_positive_or_null": dict(attn_scale=0.0),
    "one_score_scale": dict(attn_scale=1.0, query_pre_attn_scalar=8.0),
    "heads_divide_width": dict(d_model=30), "head_dim_positive": dict(head_dim=0),
    "num_kv_heads_positive": dict(num_kv_heads=0), "kv_heads_divide_heads": dict(num_kv_heads=3),
    "rope_even_head": dict(head_dim=7), "t5_buckets": dict(position="t5", rel_num_buckets=2),
    "t5_max_distance": dict(position="t5", rel_num_buckets=8, rel_max_distance=4),
    "sliding_window_positive": dict(sliding_window=0), "layer_types_per_layer": dict(layer_types=["full_attention"]),
    "sliding_layers_need_window": dict(layer_types=["sliding_attention", "full_attention"]),
    "attn_logit_softcap_positive_or_null": dict(attn_logit_softcap=-5.0),
    "query_pre_attn_scalar_positive_or_null": dict(query_pre_attn_scalar=0.0),
    "rotary_dim_under_rope": dict(position="learned", rotary_dim=4), "rotary_dim_even": dict(rotary_dim=3),
    "one_qk_norm": dict(qk_norm=True, qk_norm_full=True), "qk_norm_full_without_mla": dict(qk_norm_full=True, mla=_MLA),
    "parallel_residual_pre_norm": dict(parallel_residual=True, norm_position="post"),
    "parallel_residual_plain": dict(parallel_residual=True, layer_scale=0.1),
    "rope_scaling_under_rope": dict(position="learned", rope_scaling=dict(rope_type="linear", factor=2.0)),
    "dynamic_rope_width": dict(rotary_dim=2, rope_scaling=dict(rope_type="dynamic", factor=2.0, original_max_len=16)),
    "longrope_short_factor_per_frequency": dict(rope_scaling=dict(
        rope_type="longrope", factor=2.0, original_max_len=16, short_factor=[1.0], long_factor=[1.0] * 4)),
    "longrope_long_factor_per_frequency": dict(rope_scaling=dict(
        rope_type="longrope", factor=2.0, original_max_len=16, short_factor=[1.0] * 4, long_factor=[1.0])),
    "positions_from_padding_absolute": dict(positions_from_padding=True),
    "positions_from_padding_fit": dict(position="learned", positions_from_padding=True, pad_id=40, vocab_size=64,
                                       max_len=32),
    "rope_local_base_positive": dict(rope_local_base=-1.0), "rope_local_base_under_rope": dict(
        position="learned", rope_local_base=100.0),
    "first_attn_norm_pre": dict(first_attn_norm=False, norm_position="post"),
    "rope_local_scaling_needs_base": dict(rope_local_scaling=dict(rope_type="linear", factor=2.0)),
    "dynamic_rope_local_width": dict(rotary_dim=2, rope_local_base=100.0, rope_local_scaling=dict(
        rope_type="dynamic", factor=2.0, original_max_len=16)),
    "type_vocab_size_int": dict(type_vocab_size=-1), "pad_id_in_vocab": dict(pad_id=64),
    "layer_scale_number": dict(layer_scale="big"), "layer_scale_not_sandwich": dict(
        layer_scale=0.1, norm_position="sandwich"),
    "dense_layers_in_stack": dict(moe=dict(num_experts=4, top_k=2, router="softmax_topk", d_expert=16, dense_layers=[5])),
    "mla_rope": dict(position="learned", mla=_MLA), "mla_no_kv_groups": dict(mla=_MLA),  # llama: 2 kv heads
    "mla_no_head_dim": dict(num_kv_heads=None, head_dim=8, mla=_MLA),
    "mla_no_sliding_window": dict(num_kv_heads=None, sliding_window=4, mla=_MLA),
    "mla_no_layer_types": dict(num_kv_heads=None, layer_types=["full_attention"] * 2, mla=_MLA),
    "mla_no_qk_norm": dict(num_kv_heads=None, qk_norm=True, mla=_MLA),
    "mla_no_local_rope": dict(num_kv_heads=None, rope_local_base=100.0, mla=_MLA),
    "mla_dynamic_rope_width": dict(num_kv_heads=None, mla={**_MLA, "qk_rope_head_dim": 2},
                                   rope_scaling=dict(rope_type="dynamic", factor=2.0, original_max_len=16)),
    "final_logit_softcap_positive_or_null": dict(final_logit_softcap=0.0), "bos_id_meta_token": dict(bos_id=-1),
    "eos_id_meta_token": dict(eos_id=[]), "dtype_choice": dict(dtype="float16"), "pooler_encoder_only": dict(pooler=True),
    ("classifier", "num_classes_positive"): dict(num_classes=0),
    ("classifier", "classifier_dropout_probability"): dict(classifier_dropout=1.0),
    ("classifier", "pooling_choice"): dict(pooling="max"), ("classifier", "pooler_act_choice"): dict(
        pooler=True, pooler_act="softmax"),
    ("classifier", "pooler_options_need_pooler"): dict(pooler_act="gelu"),
    ("seq2seq", "num_decoder_layers_positive"): dict(num_decoder_layers=0),
    ("seq2seq", "tgt_vocab_size_positive"): dict(tgt_vocab_size=0),
    ("seq2seq", "shared_embeddings_one_vocab"): dict(tgt_vocab_size=100),
    ("seq2seq", "bos_id_target_token"): dict(bos_id=64), ("seq2seq", "eos_id_target_token"): dict(eos_id=-1),
    ("seq2seq", "pad_id_target_token"): dict(share_embeddings=False, tgt_vocab_size=8, pad_id=9, bos_id=1, eos_id=2),
}


_TYPED_BY_YAML = {"layer_scale_number"}


def _rule_case(key):
    from jaxformer.config.models import LLAMA_FLAVOUR, TINY_SIZES, ClassifierConfig, LMConfig, Seq2SeqConfig
    model, name = key if isinstance(key, tuple) else ("lm", key)
    base = {**TINY_SIZES, **{k: v for k, v in LLAMA_FLAVOUR.items() if k != "tie_embeddings"}} if model == "lm" \
        else dict(TINY_SIZES)
    cls = {"lm": LMConfig, "classifier": ClassifierConfig, "seq2seq": Seq2SeqConfig}[model]
    return cls, name, {**base, **_RULE_BREAKERS[key]}


def test_every_rule_has_a_breaking_example():
    from jaxformer.config.models import ClassifierConfig, LMConfig, Seq2SeqConfig
    from jaxformer.config.rules import rules_of
    have = {k if isinstance(k, tuple) else ("lm", k) for k in _RULE_BREAKERS}
    shared = {r.name for r in rules_of(LMConfig.__mro__[1])}  # TransformerConfig's, exercised on lm
    for model, cls in (("lm", LMConfig), ("classifier", ClassifierConfig), ("seq2seq", Seq2SeqConfig)):
        names = [r.name for r in rules_of(cls)]
        assert len(names) == len(set(names)), f"{cls.__name__}: duplicate rule names"
        missing = [n for n in names if (model, n) not in have and n not in shared and ("lm", n) not in have]
        assert not missing, f"{cls.__name__}: rules without a breaking example: {missing}"


@pytest.mark.parametrize("key", list(_RULE_BREAKERS), ids=lambda k: "-".join(k) if isinstance(k, tuple) else k)
def test_each_rule_is_named_by_explain_and_refused_by_the_config(key):
    """The config refuses the example naming the rule's field, and --explain's lister names the rule."""
    from jaxformer.config.base import ConfigError, from_dict
    from jaxformer.config.rules import explain, rules_of
    cls, name, data = _rule_case(key)
    rule = next(r for r in rules_of(cls) if r.name == name)
    lines = explain(cls, data)
    if name in _TYPED_BY_YAML:  # YAML's type check refuses first; the rule guards Python callers
        flat = {v: k for k, v in TransformerConfig.FLAT_PATHS.items()}.get(rule.field, rule.field)
        assert lines == [f"{rule.field}: expected a float, got {data[flat]!r}"]
    else:
        assert any(line.endswith(f"[{name}]") for line in lines), lines
    nested = any(isinstance(v, dict) for v in data.values())
    with pytest.raises(ConfigError) as e:
        from_dict(cls, data) if nested else cls(**data)
    assert str(e.value).split(":")[0].endswith(rule.field.split(".")[-1]), (str(e.value), rule.field)


def test_config_cli_explains_every_broken_rule_and_prints_a_valid_config(capsys):
    from jaxformer.cli import main
    rc = main(["config", "--config", "llama", "--set", "model.num_kv_heads=3", "--set", "model.position=t5",
               "--set", "model.rel_num_buckets=2", "--explain"])
    out = capsys.readouterr().out.splitlines()
    assert rc == 1
    assert out == ["model.attention.num_kv_heads: num_heads=4 must be a multiple of num_kv_heads=3 "
                   "[kv_heads_divide_heads]",
                   "model.positions.rel_num_buckets: T5 buckets need >= 4, got 2 [t5_buckets]", "2 broken rule(s)"]
    assert main(["config", "--config", "llama", "--explain"]) == 0
    assert capsys.readouterr().out.strip() == "the config breaks no rule"
    assert main(["config", "--config", "llama", "--set", "train.steps=7"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["train"]["steps"] == 7 and printed["model"]["name"] == "lm"
    assert main(["config", "--config", "llama", "--set", "data.seq_len=0", "--explain"]) == 1
    assert capsys.readouterr().out.splitlines()[0].startswith("data.seq_len")
