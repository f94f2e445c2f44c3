"""LoRA fine-tuning in the JAX trainer (`train.lora:`, train/config.py TrainLoRAConfig): the
adapters are the train state's `params` (the only leaves with gradients and optimiser state),
the frozen base is its `frozen` entry (passed through every step untouched, so it stays
bit-identical), and everything else is `rest` as in full fine-tuning.

    state = {"params": LoRAParam leaves, "frozen": every other nnx.Param, "opt_state": over
             params only, "rest": RNG streams, "step"}

Weight decay and gradient clipping therefore act on the adapters alone (their global norm),
as in PEFT + torch, where the frozen parameters have no .grad. The base may be stored in bf16
or int8 (layers/lora.py quantize_base, QLoRA style); the adapters stay fp32. The torch trainer's
twin of `adapt` is torch_trainer.adapt_torch.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from jaxformer import lowering
from jaxformer.layers import lora as lora_lib
from jaxformer.layers.kernels import quant


def adapt(model: nnx.Module, lcfg, seed: int) -> nnx.Module:
    """Wrap the targets of `lcfg` (a TrainLoRAConfig) in LoRALinear layers with fresh adapters
    drawn from `seed`, and store their base in lcfg.base_dtype; in place (concrete, abstract or
    traced model) -> the model. A model that already has adapters is returned as it is."""
    if not lora_lib.has_adapters(model):
        with lowering.cheap_tracer_sharding():  # the adapters' draws, often under a trace
            lora_lib.apply_lora(model, lcfg.adapter(), nnx.Rngs(seed))
        if lcfg.base_dtype != "fp32":
            lora_lib.quantize_base(model, lcfg.base_dtype)
    return model


def split(model: nnx.Module):
    """-> (graphdef, params, frozen, rest): params are what trains (the adapters when the model
    has any, else every nnx.Param, and frozen is None), frozen the other nnx.Params."""
    wrt = lora_lib.trainable_filter(model)
    if wrt is nnx.Param:
        graphdef, params, rest = nnx.split(model, nnx.Param, ...)
        return graphdef, params, None, rest
    return nnx.split(model, wrt, nnx.Param, ...)


def merge(graphdef, params, frozen, rest) -> nnx.Module:
    return nnx.merge(graphdef, params, rest) if frozen is None else nnx.merge(graphdef, params, frozen, rest)


def is_quantized(x) -> bool:
    return isinstance(x, quant.QuantizedWeight)


def dequantize_base(model: nnx.Module) -> None:
    """Every reduced-precision LoRA base back to an fp32 [in, out] kernel holding the values
    it stands for (exact for bf16; int8's q * scale), in place: the model checkpoint a LoRA run
    writes stores fp32 bases, which any reader loads."""
    for m in lora_lib.lora_modules(model).values():
        k = m.kernel.get_value()
        if is_quantized(k):
            m.kernel.set_value(jnp.swapaxes(k.dequantized(), -1, -2))


def cast_frozen(frozen, dtype):
    """The frozen base in the compute dtype (bf16 precision); reduced-precision weights stay
    as stored (their product is computed in fp32, layers/kernels/quant.py)."""
    def f(x):
        if is_quantized(x) or not jnp.issubdtype(x.dtype, jnp.floating):
            return x
        return x.astype(dtype)
    return jax.tree.map(f, frozen, is_leaf=is_quantized)
