"""Torch twin of jaxformer/train/init.py: the named init schemes applied to a torch_ref module,
drawing the same arrays (`init.init_array`, jax.random) key by key, so both frameworks start
bit-identical. The torch trainer itself starts from the JAX trainer's init converted to torch
layout (torch_trainer.build_torch_model); this per-key form serves modules built on their own."""
from __future__ import annotations

import numpy as np

from jaxformer.train.init import init_array


def init_torch(module, scheme: str, seed: int) -> None:
    """Re-initialise a torch_ref module's params in place, bit-identical to init_flax."""
    if scheme == "default":
        return
    import torch

    from torch_ref.layers.conv import _ConvNd
    from torch_ref.layers.embedding import Embedding
    from torch_ref.layers.norm import LayerNorm, RMSNorm
    from torch_ref.layers.positional import LearnedPositionalEmbedding
    kinds = {}
    for mname, m in module.named_modules():
        prefix = f"{mname}." if mname else ""
        for pname, p in m.named_parameters(recurse=False):
            if isinstance(m, (torch.nn.Linear, _ConvNd)) and pname == "weight":
                kind = "kernel"
            elif isinstance(m, (Embedding, LearnedPositionalEmbedding)) or (
                    isinstance(m, torch.nn.Embedding) and pname == "weight"):
                kind = "embedding"
            elif isinstance(m, (LayerNorm, RMSNorm, torch.nn.LayerNorm)) and pname == "weight":
                kind = "scale"
            elif (pname == "bias" and p.dim() == 1) or pname.endswith("_bias"):  # MoE experts' biases
                kind = "bias"
            else:
                kind = "other"
            kinds[prefix + pname] = kind
    with torch.no_grad():
        for name, p in module.named_parameters():
            x = np.asarray(init_array(scheme, kinds[name], tuple(p.shape), name, seed))
            p.copy_(torch.from_numpy(x.copy()))
