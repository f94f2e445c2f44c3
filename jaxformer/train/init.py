"""Named init schemes, identical in both frameworks (docs/numerics.md §9).

Every parameter is drawn in numpy from a generator seeded by (seed, crc32 of its torch key),
in torch layout, then laid out for its framework. So `init: xavier_uniform` gives bit-identical
weights in JAX and in torch, not just the same distribution.

    kind       xavier_uniform                          normal_0.02
    kernel     U(+-sqrt(6 / (fan_in + fan_out)))       N(0, 0.02)
    embedding  N(0, D^-0.5)                            N(0, 0.02)
    scale      1                                       1
    bias       0                                       0
    other      N(0, 0.02)  (cls tokens, bias tables)   N(0, 0.02)
`default` keeps each framework's own constructor init (which differ).
"""
from __future__ import annotations

import math
import zlib

import numpy as np

from jaxformer import convert


def init_array(scheme: str, kind: str, torch_shape: tuple, key: str, seed: int) -> np.ndarray:
    rng = np.random.default_rng([seed, zlib.crc32(key.encode())])
    if kind == "bias":
        return np.zeros(torch_shape, np.float32)
    if kind == "scale":
        return np.ones(torch_shape, np.float32)
    if scheme == "normal_0.02" or kind == "other":
        return (rng.standard_normal(torch_shape) * 0.02).astype(np.float32)
    if kind == "embedding":
        return (rng.standard_normal(torch_shape) * torch_shape[-1] ** -0.5).astype(np.float32)
    # kernel, torch layout [out, in, *k]
    receptive = math.prod(torch_shape[2:]) if len(torch_shape) > 2 else 1
    fan_out, fan_in = torch_shape[0] * receptive, torch_shape[1] * receptive
    a = math.sqrt(6.0 / (fan_in + fan_out))
    return rng.uniform(-a, a, torch_shape).astype(np.float32)


def _kind_from_flax_leaf(leaf: str, ndim: int) -> str:
    if leaf == "kernel":
        return "kernel"
    if leaf == "embedding":
        return "embedding"
    if leaf == "scale":
        return "scale"
    if leaf == "bias" and ndim == 1:
        return "bias"
    return "other"


def init_flax(model, scheme: str, seed: int) -> None:
    """Re-initialise a jaxformer model's params in place."""
    if scheme == "default":
        return
    import jax.numpy as jnp
    prefixes = convert.scan_prefixes(model)
    for path, var in convert.param_leaves(model).items():
        leaf = str(path[-1])
        shape = tuple(var.shape)
        torch_shape = convert.torch_shape_of(path, shape, prefixes)
        kind = _kind_from_flax_leaf(leaf, len(torch_shape))
        # one draw per torch key (per layer when scanned), so scanned == unscanned == torch
        parts = [convert.torch_to_flax_layout(leaf, init_array(scheme, kind, torch_shape, key, seed))
                 for key in convert.torch_keys_for(path, shape, prefixes)]
        x = parts[0] if convert.stacked_prefix(path, prefixes) is None else np.stack(parts)
        var.set_value(jnp.asarray(x))
