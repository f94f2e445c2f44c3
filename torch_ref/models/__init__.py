"""Model builders: name -> torch class, the twins of jaxformer.models, by the one registry table
jaxformer.config.MODELS. Each class takes (cfg)."""
from __future__ import annotations

import importlib

import torch

from jaxformer.config import model_module
from jaxformer.config.module import MODULE


def model_class(name: str) -> type:
    """The class registered under `name` in jaxformer.config.MODELS."""
    module, cls = model_module(name)
    return getattr(importlib.import_module(f"{__name__}.{module}"), cls)


def build_model(name: str, cfg, *, seed: int = 0):
    torch.manual_seed(seed)
    if name == MODULE:  # any torch module, from model.torch's factory (models/module.py)
        from torch_ref.models.module import build_module
        return build_module(cfg)
    return model_class(name)(cfg)
