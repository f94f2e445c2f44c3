"""Frozen, validated configs shared by jaxformer (JAX) and torch_ref (PyTorch).

Imports neither jax nor torch. Each model config names itself with `name`, and
`model_config_from_dict` picks the class by that name.
"""
from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from jaxformer.config.attention import Dropouts, Projections, QKNorm, Rope, Scores  # noqa: F401 (re-exported)
from jaxformer.config.base import ConfigError, from_dict, replace, to_dict
from jaxformer.config.lora import LoRAConfig
from jaxformer.config.moe import MLAConfig, MoEConfig
from jaxformer.config.transformer import RopeScaling, TransformerConfig

# The model registry, one table for both trees: name -> (config "module:Class" under
# jaxformer.config, model "module:Class" under each tree's models package, i.e.
# jaxformer.models.<module> and its twin torch_ref.models.<module>; None for a config that
# only serves as a part of others). Imported lazily, so one model's file can be added
# without touching the others.
MODELS: dict[str, tuple[str, str | None]] = {
    "encoder": ("transformer:TransformerConfig", "encoder:TextEncoder"),
    "decoder": ("transformer:TransformerConfig", None),
    "classifier": ("models:ClassifierConfig", "classifier:Classifier"),
    "seq2seq": ("models:Seq2SeqConfig", "seq2seq:Seq2Seq"),
    "lm": ("models:LMConfig", "lm:LM"),
    "vit": ("vision:ViTConfig", "vit:ViT"),
    "swin": ("vision:SwinConfig", "swin:SwinTransformer"),
    "timeseries": ("vision:TimeSeriesConfig", "timeseries:TCNTransformer"),
    # any Flax NNX module (a file `jaxformer port` wrote, or your own class): `model: {module:
    # FILE.py:CLASS, ...}` (config/module.py); built by jaxformer.models.build_model, not a registry class
    "module": ("module:ModuleConfig", None),
}


def register_model(name: str, config: str, model: str | None) -> None:
    """Add a model: register_model("mine", "mymodule:MyConfig", "mine:MyModel")."""
    MODELS[name] = (config, model)


def _entry(name: str) -> tuple[str, str | None]:
    if name not in MODELS:
        raise ConfigError(f"model.name: unknown model {name!r}; known: {sorted(MODELS)}")
    return MODELS[name]


def model_config_class(name: str) -> type:
    module, cls = _entry(name)[0].split(":")
    return getattr(importlib.import_module(f"{__name__}.{module}"), cls)


def model_module(name: str) -> tuple[str, str]:
    """-> (module, class) of a buildable model, the same names in both trees' models packages."""
    target = _entry(name)[1]
    if target is None:
        raise ConfigError(f"model.name: {name!r} is a part of other models, not a model of its own; "
                          f"models: {sorted(n for n, (_, m) in MODELS.items() if m)}")
    module, cls = target.split(":")
    return module, cls


def model_config_from_dict(data: Mapping[str, Any]) -> tuple[str, Any]:
    """{'name': 'lm', ...fields} -> ('lm', LMConfig(...))."""
    data = dict(data)
    if "name" not in data and "module" in data:  # model: {module: FILE.py:CLASS, ...}
        data["name"] = "module"
    if "name" not in data:
        raise ConfigError("model.name: missing; it selects the model (or model.module: FILE.py:CLASS, any NNX module)")
    name = data.pop("name")
    return name, from_dict(model_config_class(name), data, prefix="model.")


__all__ = ["ConfigError", "TransformerConfig", "RopeScaling", "MoEConfig", "MLAConfig", "LoRAConfig", "from_dict", "to_dict", "replace",
           "MODELS", "register_model", "model_config_class", "model_module",
           "model_config_from_dict"]
