"""Torch twin of jaxformer/models/module.py: the torch module a model given by model.module
stands for, from its factory (`model: {module: ..., torch: FILE.py:FUNC}`; FUNC() returns it)."""
from __future__ import annotations

import torch

from jaxformer.config import ConfigError
from jaxformer.config.module import ModuleConfig, load_object


def build_module(cfg: ModuleConfig) -> torch.nn.Module:
    """cfg.torch's FUNC(), with cfg.dropout set on every nn.Dropout."""
    if cfg.torch is None:
        raise ConfigError(f"model.torch: not set; the torch side of model.module {cfg.module} needs it: "
                          "a function FILE.py:FUNC (or package.module:FUNC) that returns the torch module")
    factory = load_object(cfg.torch, "model.torch")
    if not callable(factory):
        raise ConfigError(f"model.torch: {cfg.torch} is not callable")
    module = factory()
    if not isinstance(module, torch.nn.Module):
        raise ConfigError(f"model.torch: {cfg.torch}() returned {type(module).__name__}, not a torch.nn.Module")
    if cfg.dropout is not None:
        for m in module.modules():
            if isinstance(m, torch.nn.Dropout):
                m.p = cfg.dropout
    return module
