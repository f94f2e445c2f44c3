"""Model builders: name -> torch class, the twins of jaxformer.models, by the one registry table
jaxformer.config.MODELS. Each class takes (cfg)."""
from __future__ import annotations

import importlib

import torch

from jaxformer.config import model_module


def model_class(name: str) -> type:
    """The class registered under `name` in jaxformer.config.MODELS."""
    module, cls = model_module(name)
    return getattr(importlib.import_module(f"{__name__}.{module}"), cls)


def build_model(name: str, cfg, *, seed: int = 0):
    torch.manual_seed(seed)
    return model_class(name)(cfg)
