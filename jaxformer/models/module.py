"""Any Flax NNX module as a model (`model: {module: FILE.py:CLASS, ...}`, jaxformer/config/module.py):
a file `jaxformer port` wrote, or your own class. build_model("module", cfg) builds it here, for
training, compiling, loading, generating and exporting alike.

What the build adds to the class: the dropout rate of every nnx.Dropout (cfg.dropout), and the
logical axes of the parameters that cfg.axes names (flax's `out_sharding` metadata, as
jaxformer/layers/kernels/partitioning.py sets it on our own layers; null: replicated). A pattern
that names no parameter is an error, as is an axes list that does not fit the parameter's rank.
"""
from __future__ import annotations

import inspect
import re

from flax import nnx

from jaxformer.config import ConfigError
from jaxformer.config.module import ModuleConfig, load_object
from jaxformer.layers.kernels.partitioning import metadata


def module_class(cfg: ModuleConfig) -> type:
    """The nnx.Module class model.module names (ConfigError when it is not one)."""
    cls = load_object(cfg.module, "model.module")
    if not (isinstance(cls, type) and issubclass(cls, nnx.Module)):
        raise ConfigError(f"model.module: {cfg.module} is {type(cls).__name__ if not isinstance(cls, type) else cls}, "
                          "not a flax.nnx.Module class")
    return cls


def build_module(cfg: ModuleConfig, *, rngs: nnx.Rngs) -> nnx.Module:
    """CLASS(**cfg.kwargs, rngs=rngs), with cfg.dropout and cfg.axes applied."""
    cls = module_class(cfg)
    init = inspect.signature(cls.__init__)
    try:
        init.bind(None, **cfg.kwargs, rngs=rngs)
    except TypeError as e:
        shown = str(init.replace(parameters=list(init.parameters.values())[1:]))  # without self
        raise ConfigError(f"model.kwargs: {cls.__name__}{shown} cannot take "
                          f"{sorted(cfg.kwargs) + ['rngs']}: {e}") from None
    model = cls(**cfg.kwargs, rngs=rngs)
    if cfg.dropout is not None:
        for _, node in nnx.iter_graph(model):
            if isinstance(node, nnx.Dropout):
                node.rate = cfg.dropout
    set_axes(model, cfg.axes)
    return model


def set_axes(model, axes: dict) -> None:
    """Each parameter whose path (dotted, e.g. `transformer.h.0.attn.c_attn.kernel`) a pattern
    of `axes` finds (re.search; the first pattern that does) takes that pattern's logical axes."""
    if not axes:
        return
    used = set()
    problems = []
    for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        key = ".".join(str(p) for p in path)
        pattern = next((p for p in axes if re.search(p, key)), None)
        if pattern is None:
            continue
        used.add(pattern)
        names = axes[pattern]
        if names is not None and len(names) != len(var.shape):
            problems.append(f"model.axes: {pattern!r} gives {list(names)} to {key}, a {len(var.shape)}-D "
                            f"parameter {tuple(var.shape)}")
            continue
        for k, v in metadata(tuple(names) if names is not None else (None,) * len(var.shape)).items():
            var.set_metadata(k, v)
    unused = [p for p in axes if p not in used]
    if unused:
        problems.append(f"model.axes: {', '.join(repr(p) for p in unused)} names no parameter of "
                        f"{type(model).__name__} (parameter paths look like "
                        f"{_example_path(model)})")
    if problems:
        raise ConfigError("; ".join(problems))


def _example_path(model) -> str:
    paths = [".".join(str(p) for p in path) for path, _ in nnx.to_flat_state(nnx.state(model, nnx.Param))]
    return ", ".join(paths[:2]) + (", ..." if len(paths) > 2 else "") if paths else "(it has none)"
