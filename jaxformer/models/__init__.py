"""Model builders: name -> Flax NNX class, by the one registry table jaxformer.config.MODELS
(torch_ref.models resolves the same names to the torch twins). Each class takes (cfg, *, rngs)."""
from __future__ import annotations

import importlib

from flax import nnx

from jaxformer import lowering
from jaxformer.config import model_module
from jaxformer.config.module import MODULE


def model_class(name: str) -> type:
    """The class registered under `name` in jaxformer.config.MODELS."""
    module, cls = model_module(name)
    return getattr(importlib.import_module(f"{__name__}.{module}"), cls)


def build_model(name: str, cfg, *, seed: int = 0):
    """The model `name` (a registry name, or "module": any NNX module, models/module.py)."""
    with lowering.cheap_tracer_sharding():  # cheaper under a trace (abstract and jitted builds)
        if name == MODULE:
            from jaxformer.models.module import build_module
            return build_module(cfg, rngs=nnx.Rngs(seed))
        return model_class(name)(cfg, rngs=nnx.Rngs(seed))


def abstract_model(name: str, cfg):
    """The model's structure with ShapeDtypeStruct leaves: no allocation (nnx.eval_shape)."""
    return nnx.eval_shape(lambda: build_model(name, cfg))


PARAM_DTYPES = ("float32", "bfloat16")


def cast_params(model, dtype: str) -> None:
    """Store every floating-point nnx.Param of `model` (concrete or abstract) as `dtype`, in
    place. The layers compute in their config's `dtype` whatever the storage dtype, so a
    bfloat16 checkpoint can stay bfloat16 in memory (half the bytes) without changing the
    model code."""
    import jax
    import jax.numpy as jnp
    if dtype not in PARAM_DTYPES:
        raise ValueError(f"param dtype {dtype!r}: expected one of {', '.join(PARAM_DTYPES)}")
    for _, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        value = var.get_value()
        if not jnp.issubdtype(value.dtype, jnp.floating) or value.dtype == jnp.dtype(dtype):
            continue
        if isinstance(value, jax.ShapeDtypeStruct):
            var.set_value(jax.ShapeDtypeStruct(value.shape, jnp.dtype(dtype), sharding=value.sharding))
        else:
            var.set_value(value.astype(dtype))
