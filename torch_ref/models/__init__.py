"""Model registry: name -> torch class, the twins of jaxformer.models. Each takes (cfg)."""
from __future__ import annotations

import importlib

import torch

MODELS: dict[str, str] = {
    "encoder": "torch_ref.models.encoder:TextEncoder",
    "classifier": "torch_ref.models.classifier:Classifier",
    "seq2seq": "torch_ref.models.seq2seq:Seq2Seq",
    "lm": "torch_ref.models.lm:LM",
    "vit": "torch_ref.models.vit:ViT",
    "swin": "torch_ref.models.swin:SwinTransformer",
    "timeseries": "torch_ref.models.timeseries:TCNTransformer",
}


def register_model(name: str, target: str) -> None:
    MODELS[name] = target


def model_class(name: str) -> type:
    if name not in MODELS:
        raise ValueError(f"model.name: unknown model {name!r}; known: {sorted(MODELS)}")
    module, cls = MODELS[name].split(":")
    return getattr(importlib.import_module(module), cls)


def build_model(name: str, cfg, *, seed: int = 0):
    torch.manual_seed(seed)
    return model_class(name)(cfg)
