"""Model builders: name -> Flax NNX class, by the one registry table jaxformer.config.MODELS
(torch_ref.models resolves the same names to the torch twins). Each class takes (cfg, *, rngs)."""
from __future__ import annotations

import importlib

from flax import nnx

from jaxformer.config import model_module


def model_class(name: str) -> type:
    """The class registered under `name` in jaxformer.config.MODELS."""
    module, cls = model_module(name)
    return getattr(importlib.import_module(f"{__name__}.{module}"), cls)


def build_model(name: str, cfg, *, seed: int = 0):
    return model_class(name)(cfg, rngs=nnx.Rngs(seed))


def abstract_model(name: str, cfg):
    """The model's structure with ShapeDtypeStruct leaves: no allocation (nnx.eval_shape)."""
    return nnx.eval_shape(lambda: build_model(name, cfg))
