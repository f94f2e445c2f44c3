"""The positive HF export check (jaxformer/hf/exports.py): each family declares the fields of
our configs it writes, requires, checks or ignores for a reason, and any field away from its
default that its declaration does not cover refuses the export by name. No model is built."""
from __future__ import annotations

import dataclasses

import pytest

from jaxformer import hf
from jaxformer.config import model_config_class
from jaxformer.config.models import LMConfig
from jaxformer.config.moe import MLAConfig, MoEConfig
from jaxformer.convert import ConversionError
from jaxformer.hf.exports import Sub, by_path
from jaxformer.hf.families import FAMILIES

CLASSES = {"moe": MoEConfig, "mla": MLAConfig}


def test_layer_scale_has_no_place_in_a_llama_export():
    """LayerScale adds weights only DINOv2 writes: a LLaMA-style LM with it is still claimed by
    LLaMA (its features), and refused there by name instead of failing at the weight rename."""
    cfg = LMConfig.tiny("llama", layer_scale=0.1)
    assert hf.exporter("lm", cfg.replace(layer_scale=None)) is hf.llama.FAMILY
    with pytest.raises(ConversionError, match=r"no llama HF equivalent: norms\.layer_scale=0\.1 "
                                              r"\(llama writes no such"):
        hf.exporter("lm", cfg)


def test_a_new_config_field_no_family_declares_is_refused():
    """A field added to the config (here by a subclass) exports at its default, and is refused
    by name away from it until a family declares it."""
    extended = dataclasses.make_dataclass("ExtendedLM", [("new_option", float, 0.0)], bases=(LMConfig,), frozen=True)
    llama, gpt2 = ({f.name: getattr(c, f.name) for f in dataclasses.fields(c)}
                   for c in (LMConfig.tiny("llama"), LMConfig.tiny("gpt2")))
    assert hf.exporter("lm", extended(**llama)) is hf.llama.FAMILY
    with pytest.raises(ConversionError, match=r"new_option=0\.5 \(llama writes no such option\)"):
        hf.exporter("lm", extended(**llama, new_option=0.5))
    assert hf.exporter("lm", extended(**gpt2)) is hf.gpt2.FAMILY
    with pytest.raises(ConversionError, match=r"new_option=0\.5 \(gpt2 writes"):  # whichever family claims it
        hf.exporter("lm", extended(**gpt2, new_option=0.5))


def test_a_refusal_names_the_families_that_write_the_field():
    cfg = LMConfig.tiny("llama", rotary_dim=4, qk_norm=True)  # Qwen3's q/k norms claim it
    with pytest.raises(ConversionError, match=r"positions\.rotary_dim=4 \(qwen writes no such option; only gpt_neox "
                                              r"and phi3 export it\)"):
        hf.exporter("lm", cfg)


@pytest.mark.parametrize("fam", FAMILIES, ids=lambda f: f.name)
def test_each_declaration_names_fields_of_its_config(fam):
    """A misspelt key would check nothing: every declared key is a field of the model's config
    class, a record field by its flat key or path (a nested config's, inside Sub)."""
    def check(exports, cls, where):
        exports = by_path(exports, cls)
        fields = {f.name for f in dataclasses.fields(cls)} | set(getattr(cls, "FLAT_PATHS", {}).values())
        assert set(exports) <= fields, f"{where}: {sorted(set(exports) - fields)} are not {cls.__name__} fields"
        for key, spec in exports.items():
            if isinstance(spec, Sub):
                check(spec.fields, CLASSES[key.split(".")[-1]], f"{where}.{key}")
    for name, exports in fam.exports.items():
        check(exports, model_config_class(name), f"{fam.name} {name}")
