"""How a stack runs its layers, and what each layer records (named intermediates, the MoE's
auxiliary outputs). The stacks in transformer.py call these. Twin: jaxformer/layers/stack.py
(which also scans stacked layers and remats them; torch loops).

A layer is run as call(layer, x, record, local): `record` is None or a dict the layer fills with
its sub-layer outputs (SUBLAYERS) and an MoE's AUX outputs; `local` says whether it is a
sliding-window layer (layer_flags).
"""
from __future__ import annotations

import torch

from jaxformer.config import TransformerConfig

# the sub-layer intermediates of one layer, in depth order (transformer.py's docstring)
SUBLAYERS = ("attn_weights", "attn", "attn_residual", "cross_attn_weights", "cross_attn",
             "cross_attn_residual", "ffn")
# what a sparse layer's MoE puts in its record (models/lm.py return_aux)
AUX = ("router_logits", "expert_load")


def layer_flags(cfg: TransformerConfig) -> tuple[bool, ...]:
    """Per layer, is it a sliding-window layer."""
    return cfg.local_layers()


def run_layers(stack, x, call, intermediates: dict | None, aux: dict | None = None):
    """x -> call(layer, x, record, local) for every layer of `stack` (its `layers` and `cfg`).
    With intermediates, call fills `record` (else None) with the layer's sub-layer outputs,
    stored as "layers.i.<name>" (SUBLAYERS order) before "layers.i". With `aux` (a dict), the
    sparse layers' AUX records go to it, stacked in layer order ([n_sparse, ...])."""
    flags = layer_flags(stack.cfg)
    records = []
    for i, layer in enumerate(stack.layers):
        record = None if intermediates is None and aux is None else {}
        x = call(layer, x, record, flags[i])
        if intermediates is not None:
            store_layer(intermediates, i, record, x)
        records.append(record)
    for k in AUX if aux is not None else ():
        found = [r[k] for r in records if k in r]
        if found:
            aux[k] = torch.stack(found)
    return x


def store_layer(intermediates: dict, i: int, record: dict, x) -> None:
    """layers.i.<sub-layer> in SUBLAYERS (depth) order, then layers.i itself."""
    for name in SUBLAYERS:
        if name in record:
            intermediates[f"layers.{i}.{name}"] = record[name]
    intermediates[f"layers.{i}"] = x
