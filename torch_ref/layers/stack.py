"""How a stack runs its layers, and what each layer sows (named intermediates, the MoE's
auxiliary outputs), collected per layer by sow.capture. The stacks in transformer.py call
these. Twin: jaxformer/layers/stack.py (which also scans stacked layers and remats them; torch
loops).

A layer is run as call(layer, x, local), `local` saying whether it is a sliding-window layer
(layer_flags). When the stack's caller wants intermediates or aux outputs, each call runs under
sow.capture; the layer sows its sub-layer outputs (SUBLAYERS) and a sparse layer's MoE its AUX
outputs.
"""
from __future__ import annotations

import torch

from jaxformer.config import TransformerConfig
from torch_ref.layers import sow

# the sub-layer intermediates of one layer in depth order (transformer.py's docstring): output
# name -> the name the layer sows it under (a sub-layer's output as "<name>_output": the bare
# names "cross_attn" and "ffn" are the layer's submodules', sow.py)
SUBLAYERS = {"attn_weights": "attn_weights", "attn": "attn_output", "attn_residual": "attn_residual",
             "cross_attn_weights": "cross_attn_weights", "cross_attn": "cross_attn_output",
             "cross_attn_residual": "cross_attn_residual", "ffn": "ffn_output"}
# what a sparse layer's MoE sows (models/lm.py return_aux)
AUX = ("router_logits", "expert_load")


def layer_flags(cfg: TransformerConfig) -> tuple[bool, ...]:
    """Per layer, is it a sliding-window layer."""
    return cfg.local_layers()


def run_layers(stack, x, call, intermediates: dict | None, aux: dict | None = None):
    """x -> call(layer, x, local) for every layer of `stack` (its `layers` and `cfg`). With
    intermediates (a dict), each layer's sown sub-layer outputs go to it as "layers.i.<name>"
    (SUBLAYERS order) before "layers.i". With `aux` (a dict), the sparse layers' sown AUX
    outputs go to it, stacked in layer order ([n_sparse, ...])."""
    run = sow.capture(call) if intermediates is not None or aux is not None else lambda *a: (call(*a), {})
    flags = layer_flags(stack.cfg)
    layer_aux = []
    for i, layer in enumerate(stack.layers):
        x, layer_sown = run(layer, x, flags[i])
        if intermediates is not None:
            store_layer(intermediates, f"layers.{i}", layer_sown, x)
        layer_aux.append(aux_of(layer_sown))
    for k in AUX if aux is not None else ():
        found = [a[k] for a in layer_aux if k in a]
        if found:
            aux[k] = torch.stack(found)
    return x


def store_layer(intermediates: dict, prefix: str, sown: dict, x) -> None:
    """prefix.<sub-layer> from the layer's sown values in SUBLAYERS (depth) order, then prefix
    (e.g. "layers.3") itself: x."""
    for name, sown_as in SUBLAYERS.items():
        if sown_as in sown:
            intermediates[f"{prefix}.{name}"] = sown[sown_as]
    intermediates[prefix] = x


def aux_of(sown: dict) -> dict:
    """The AUX outputs among a layer's sown values, in AUX order, by their own names (the MoE's
    "ffn.router_logits" -> "router_logits")."""
    by_name = {k.rsplit(".", 1)[-1]: v for k, v in sown.items()}
    return {k: by_name[k] for k in AUX if k in by_name}
