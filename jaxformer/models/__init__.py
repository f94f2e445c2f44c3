"""Model registry: name -> Flax NNX class. The torch twins live under the same names in
torch_ref.models. Each class takes (cfg, *, rngs)."""
from __future__ import annotations

import importlib

from flax import nnx

MODELS: dict[str, str] = {
    "encoder": "jaxformer.models.encoder:TextEncoder",
    "classifier": "jaxformer.models.classifier:Classifier",
    "seq2seq": "jaxformer.models.seq2seq:Seq2Seq",
    "lm": "jaxformer.models.lm:LM",
    "vit": "jaxformer.models.vit:ViT",
    "swin": "jaxformer.models.swin:SwinTransformer",
    "timeseries": "jaxformer.models.timeseries:TCNTransformer",
}


def register_model(name: str, target: str) -> None:
    MODELS[name] = target


def model_class(name: str) -> type:
    if name not in MODELS:
        raise ValueError(f"model.name: unknown model {name!r}; known: {sorted(MODELS)}")
    module, cls = MODELS[name].split(":")
    return getattr(importlib.import_module(module), cls)


def build_model(name: str, cfg, *, seed: int = 0):
    return model_class(name)(cfg, rngs=nnx.Rngs(seed))


def abstract_model(name: str, cfg):
    """The model's structure with ShapeDtypeStruct leaves: no allocation (nnx.eval_shape)."""
    return nnx.eval_shape(lambda: build_model(name, cfg))
