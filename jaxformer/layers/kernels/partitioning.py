"""Logical axes on parameters: flax NNX's partitioning metadata, set where a parameter is defined.

No torch twin: the metadata only says how the JAX trainer lays a parameter out over a device
mesh; values and checkpoint keys are unchanged.

Each parameter carries its dims' *logical* names as flax's `out_sharding` metadata (what
`nnx.with_partitioning` sets and `nnx.get_partition_spec` reads). One table in
jaxformer/train/config.py (`LOGICAL_AXIS_RULES`, overridable by `parallel.axis_rules`) maps the
logical names to mesh axes; jaxformer/train/sharding.py applies it. None names a dim that is
never split.

    logical   dim
    embed     the model width D
    heads     attention heads x head dim (q/k/v out, o in)
    mlp       the FFN hidden width F
    vocab     embedding rows / LM head outputs
    norm      norm scales and biases (1-D)
    layers    the stacked layer axis of scanned layers (added by nnx.vmap; see
              layers/transformer.py make_layers)
    expert    the stacked expert axis E of a mixture of experts (layers/moe.py: router rows,
              expert weights and biases)

The metadata is kept lazy (`eager_sharding=False`): a model built outside a mesh (every
single-device use, the parity suite) is unaffected, and the trainer places parameters itself.
"""
from __future__ import annotations

from flax import nnx

LAYERS_AXIS = "layers"


def metadata(axes: tuple | None) -> dict:
    """nnx.Variable metadata giving a parameter's logical axes (none when axes is None)."""
    if axes is None:
        return {}
    return {"out_sharding": tuple(axes), "eager_sharding": False}


def param(value, axes: tuple | None) -> nnx.Param:
    """nnx.Param(value) with logical axes `axes` (one name or None per dim)."""
    if axes is not None and len(axes) != value.ndim:
        raise ValueError(f"logical axes {axes} do not match a {value.ndim}-D parameter")
    return nnx.Param(value, **metadata(axes))


def logical_axes(var: nnx.Variable) -> tuple | None:
    """A parameter's logical axes, or None when it has no annotation."""
    axes = var.get_metadata().get("out_sharding")
    return tuple(axes) if axes is not None else None
