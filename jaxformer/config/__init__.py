"""Frozen, validated configs shared by jaxformer (JAX) and torch_ref (PyTorch).

Imports neither jax nor torch. Each model config names itself with `name`, and
`model_config_from_dict` picks the class by that name.
"""
from __future__ import annotations

import importlib
from typing import Any, Mapping

from jaxformer.config.base import ConfigError, from_dict, replace, to_dict
from jaxformer.config.transformer import TransformerConfig

# model name -> "module:ConfigClass". Lazily imported so that one model's file
# can be added without touching the others.
MODEL_CONFIGS: dict[str, str] = {
    "encoder": "jaxformer.config.transformer:TransformerConfig",
    "decoder": "jaxformer.config.transformer:TransformerConfig",
    "classifier": "jaxformer.config.models:ClassifierConfig",
    "seq2seq": "jaxformer.config.models:Seq2SeqConfig",
    "lm": "jaxformer.config.models:LMConfig",
    "vit": "jaxformer.config.vision:ViTConfig",
    "swin": "jaxformer.config.vision:SwinConfig",
    "timeseries": "jaxformer.config.vision:TimeSeriesConfig",
}


def register_model_config(name: str, target: str) -> None:
    MODEL_CONFIGS[name] = target


def model_config_class(name: str) -> type:
    if name not in MODEL_CONFIGS:
        raise ConfigError(f"model.name: unknown model {name!r}; known: {sorted(MODEL_CONFIGS)}")
    module, cls = MODEL_CONFIGS[name].split(":")
    return getattr(importlib.import_module(module), cls)


def model_config_from_dict(data: Mapping[str, Any]) -> tuple[str, Any]:
    """{'name': 'lm', ...fields} -> ('lm', LMConfig(...))."""
    data = dict(data)
    if "name" not in data:
        raise ConfigError("model.name: missing; it selects the model")
    name = data.pop("name")
    return name, from_dict(model_config_class(name), data, prefix="model.")


__all__ = ["ConfigError", "TransformerConfig", "from_dict", "to_dict", "replace",
           "MODEL_CONFIGS", "register_model_config", "model_config_class",
           "model_config_from_dict"]
