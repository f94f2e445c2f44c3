"""LoRA: low-rank adapters on Linear layers (Hu et al. 2021), as PEFT computes them.
Twin: torch_ref/layers/lora.py. Config: jaxformer/config/lora.py.

    y = x @ W + b + lora_B(lora_A(dropout(x))) * scaling     W, b frozen

Checkpoint keys. A LoRALinear keeps the wrapped layer's `kernel` and `bias` under the same names,
so the base keys stay decoder.layers.0.self_attn.q_proj.kernel; the adapter adds
`q_proj.lora_A.kernel` [in, r] and `q_proj.lora_B.kernel` [r, out], which the converter's kernel
rule turns into torch's (and PEFT's) lora_A.weight [r, in] and lora_B.weight [out, r].

Training only the adapter. The adapter weights are `LoRAParam`s (an nnx.Param subclass); the
base stays nnx.Param and its values pass through stop_gradient, so its gradient is exactly zero
(torch's requires_grad=False; the parity suite checks it). A trainer builds its gradient and its
optimiser over `trainable_filter(model)` only, so the base gets no gradient buffer and no
optimiser state and stays bit-identical:

    wrt = lora.trainable_filter(model)            # LoRAParam when the model has adapters
    optimizer = nnx.Optimizer(model, tx, wrt=wrt)
    grads = nnx.grad(loss_fn, argnums=nnx.DiffState(0, wrt))(model, batch)

Stacked weights (PEFT's target_parameters, its ParamWrapper): a ParamLoRA adapts an MoE's
expert weights [E, out, in] (one (A, B) pair per expert) or the router's weight [E, D] in place:
the owner (layers/moe.py Experts.weight, Router) multiplies by W + scaling * B @ A with W frozen,
as PEFT's parametrization does. It sits beside the weight as `<name>_lora` (experts.gate_up_proj_lora
adapts the gate and up weights as one [E, 2F, D] stack, gate rows first, transformers' fused
gate_up_proj), holding lora_A [E, r, in] and lora_B [E, out, r] in torch's layout in both trees
(the converter copies them as they are).

Frozen base in reduced precision (QLoRA style): `quantize_base(model, "bf16" | "int8")` stores
every adapted layer's kernel as a quant.QuantizedWeight (the decode weights of
jaxformer/layers/kernels/quant.py); the adapter stays fp32.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from jaxformer.config.lora import LoRAConfig, lora_scaling, select_parameters, select_targets
from jaxformer.layers.kernels import partitioning, quant
from jaxformer.layers.linear import Linear
from jaxformer.layers.moe import Experts, Router

# the attributes of nnx.Linear besides its parameters, copied from the wrapped layer
_LINEAR_ATTRS = ("in_features", "out_features", "use_bias", "dtype", "param_dtype", "precision",
                 "dot_general", "promote_dtype", "preferred_element_type")


class LoRAParam(nnx.Param):
    """An adapter weight: the only parameters a LoRA model trains."""


def _kaiming_uniform(key, shape, dtype=jnp.float32):
    """torch's nn.Linear init (kaiming-uniform, a = sqrt(5)) of a [in, out] kernel:
    U(-1/sqrt(in), 1/sqrt(in)), as variance_scaling(1/3, fan_in, uniform) draws it."""
    return nnx.initializers.variance_scaling(1.0 / 3.0, "fan_in", "uniform")(key, shape, dtype)


def adapter_inits(init: str, r: int):
    """(A's, B's) initializers of LoRAConfig.init: PEFT's reset_lora_parameters."""
    a = _kaiming_uniform if init == "kaiming" else nnx.initializers.normal(stddev=1.0 / r)
    return a, nnx.initializers.zeros_init()


def _adapter(in_features: int, out_features: int, init, axes, rngs: nnx.Rngs) -> Linear:
    """A bias-free fp32 Linear whose kernel is a LoRAParam."""
    layer = Linear(in_features, out_features, use_bias=False, kernel_init=init, param_dtype=jnp.float32,
                   axes=axes, rngs=rngs)
    layer.kernel = LoRAParam(layer.kernel.get_value(), **layer.kernel.get_metadata())
    return layer


class LoRALinear(Linear):
    """A Linear layer (its own kernel and bias, frozen) plus a trainable low-rank update.

    Args:
        base: the Linear to wrap; its kernel/bias Variables are taken over as they are.
        r: rank.  alpha: lora_alpha.  dropout: on the adapter's input only.
        use_rslora: scaling alpha / sqrt(r).  init: "kaiming" | "gaussian" (LoRAConfig.init).
    Shapes: x [..., in] -> [..., out]; lora_A.kernel [in, r], lora_B.kernel [r, out].
    Logical axes: lora_A (base in-axis, None), lora_B (None, base out-axis): r is never split.
    """

    def __init__(self, base: Linear, *, r: int, alpha: float, dropout: float = 0.0, use_rslora: bool = False,
                 init: str = "kaiming", rngs: nnx.Rngs):
        if isinstance(base, LoRALinear):
            raise ValueError("this Linear already has a LoRA adapter")
        kernel = base.kernel.get_value()
        if isinstance(kernel, quant.QuantizedWeight) or kernel.ndim != 2:
            raise ValueError(f"LoRA wraps an fp32/bf16 [in, out] kernel, got {type(kernel).__name__} "
                             f"of shape {kernel.shape} (apply LoRA before quantize_base; scanned layers: "
                             f"build the model with scan_layers false)")
        self.kernel, self.bias = base.kernel, base.bias
        for name in _LINEAR_ATTRS:
            setattr(self, name, getattr(base, name))
        axes = partitioning.logical_axes(base.kernel)
        init_a, init_b = adapter_inits(init, r)
        self.r = r
        self.scaling = lora_scaling(alpha, r, use_rslora)
        self.lora_A = _adapter(self.in_features, r, init_a, None if axes is None else (axes[0], None), rngs)
        self.lora_B = _adapter(r, self.out_features, init_b, None if axes is None else (None, axes[1]), rngs)
        self.lora_dropout = nnx.Dropout(dropout, rngs=rngs)

    def __call__(self, x: jax.Array, stop_bias_gradient: bool = False) -> jax.Array:
        """x [..., in] -> [..., out]; the base term as Linear computes it (its key-bias cut
        included), with the frozen kernel and bias behind stop_gradient."""
        bias = None if self.bias is None else jax.lax.stop_gradient(self.bias.get_value())
        result = self.project(x, jax.lax.stop_gradient(self.kernel.get_value()), bias, stop_bias_gradient)
        # PEFT's order: dropout on the adapter input only, then A, B, then the scaling
        return result + (self.lora_B(self.lora_A(self.lora_dropout(x))) * self.scaling).astype(result.dtype)

    def delta(self) -> jax.Array:
        """scaling * A @ B: the [in, out] update merge_lora adds to the kernel."""
        return (self.lora_A.kernel[...] @ self.lora_B.kernel[...]) * self.scaling


class ParamLoRA(nnx.Module):
    """A low-rank update of a stacked weight W [..., out, in] (PEFT's ParamWrapper): the owner
    multiplies by W + delta(), W frozen. One (A, B) pair per leading index (per expert).

    Args: shape of W; axes: W's logical axes (or None); r, alpha, use_rslora, init as LoRALinear.
    Params: lora_A [..., r, in] (kaiming: U(-1/sqrt(in), 1/sqrt(in)), torch's nn.Linear init of
    PEFT's lora_A; gaussian: N(0, 1/r^2)), lora_B [..., out, r] zeros; both LoRAParam, fp32.
    """

    def __init__(self, shape: tuple, axes: tuple | None, *, r: int, alpha: float, use_rslora: bool = False,
                 init: str = "kaiming", rngs: nnx.Rngs):
        *lead, out, inn = shape
        key = rngs.params()
        if init == "kaiming":
            a = jax.random.uniform(key, (*lead, r, inn), jnp.float32, -1.0, 1.0) / jnp.sqrt(inn)
        else:
            a = jax.random.normal(key, (*lead, r, inn), jnp.float32) / r
        lead_axes = None if axes is None else tuple(axes[:-2])
        self.r = r
        self.scaling = lora_scaling(alpha, r, use_rslora)
        self.lora_A = LoRAParam(a, **partitioning.metadata(None if axes is None else (*lead_axes, None, axes[-1])))
        self.lora_B = LoRAParam(jnp.zeros((*lead, out, r), jnp.float32),
                                **partitioning.metadata(None if axes is None else (*lead_axes, axes[-2], None)))

    def delta(self) -> jax.Array:
        """scaling * B @ A: [..., out, in], float32."""
        return (self.lora_B[...] @ self.lora_A[...]) * self.scaling


# ----------------------------------------------------------------------------- model surgery
def _dotted(path: tuple) -> str:
    return ".".join(str(p) for p in path)


def _set_child(model: nnx.Module, path: tuple, child) -> None:
    parent = model
    for p in path[:-1]:
        parent = parent[p] if isinstance(p, int) else getattr(parent, p)
    if isinstance(path[-1], int):
        parent[path[-1]] = child
    else:
        setattr(parent, path[-1], child)


def find_targets(model: nnx.Module, cfg: LoRAConfig) -> dict[str, tuple]:
    """{dotted path: path tuple} of the Linear layers cfg.target_modules selects
    (config.lora.select_targets: same matching and errors as the torch twin)."""
    modules = {_dotted(p): (p, m) for p, m in nnx.iter_modules(model) if p}
    chosen = select_targets(cfg, {k: isinstance(m, Linear) for k, (_, m) in modules.items()})
    return {k: modules[k][0] for k in chosen}


def parameter_candidates(model: nnx.Module) -> dict[str, tuple | str]:
    """{dotted weight path: (owner path, attribute, shape, logical axes) when a ParamLoRA can
    adapt it, else why not}: every Experts' and Router's weight, and each Linear's (which
    target_modules adapts)."""
    out = {}
    for path, m in nnx.iter_modules(model):
        dotted = _dotted(path)
        if isinstance(m, (Experts, Router)) and (m.up_proj if isinstance(m, Experts) else m.weight).ndim != \
                (3 if isinstance(m, Experts) else 2):  # stacked by scan_layers
            for name in ("gate_up_proj", "up_proj", "down_proj") if isinstance(m, Experts) else ("weight",):
                out[f"{dotted}.{name}"] = "a scanned layer's (leading layer axis): build with scan_layers false"
        elif isinstance(m, Experts):
            gated = m.gate_proj is not None
            for name in ("gate_proj", "up_proj", "down_proj") if gated else ("up_proj", "down_proj"):
                out[f"{dotted}.{name}"] = "the gated experts' gate and up weights take one adapter: gate_up_proj" \
                    if gated and name != "down_proj" else (path, name, m.stacked_shape(name), m.stacked_axes(name))
            if gated:
                out[f"{dotted}.gate_up_proj"] = (path, "gate_up_proj", m.stacked_shape("gate_up_proj"),
                                                 m.stacked_axes("gate_up_proj"))
        elif isinstance(m, Router):
            out[f"{dotted}.weight"] = (path, "weight", m.weight.shape, partitioning.logical_axes(m.weight))
        elif isinstance(m, Linear) and path:
            out[f"{dotted}.weight"] = "a Linear layer's weight: name the layer in target_modules"
    return out


def apply_lora(model: nnx.Module, cfg: LoRAConfig, rngs: nnx.Rngs) -> list[str]:
    """Wrap every targeted Linear of `model` in a LoRALinear and give every targeted stacked
    weight (cfg.target_parameters) a ParamLoRA, in place; -> the adapted dotted paths, sorted
    (Linear layers, then weights). The base parameters stay nnx.Param (train
    `trainable_filter(model)` only). Each adapter's r and alpha: cfg.rank_of / scaling_of."""
    if has_adapters(model):
        raise ValueError("the model already has LoRA adapters")
    targets = find_targets(model, cfg)
    candidates = parameter_candidates(model)
    chosen = select_parameters(cfg, {p: c if isinstance(c, str) else None for p, c in candidates.items()})
    modules = dict(nnx.iter_modules(model))
    for dotted, path in targets.items():
        _set_child(model, path, LoRALinear(modules[path], r=cfg.rank_of(dotted), alpha=cfg.alpha_of(dotted),
                                           dropout=cfg.dropout, use_rslora=cfg.use_rslora, init=cfg.init, rngs=rngs))
    for dotted in chosen:
        owner, name, shape, axes = candidates[dotted]
        setattr(modules[owner], f"{name}_lora", ParamLoRA(shape, axes, r=cfg.rank_of(dotted), alpha=cfg.alpha_of(dotted),
                                                          use_rslora=cfg.use_rslora, init=cfg.init, rngs=rngs))
    return list(targets) + chosen


def lora_modules(model: nnx.Module) -> dict[str, LoRALinear]:
    """{dotted path: LoRALinear} of the model."""
    return {_dotted(p): m for p, m in nnx.iter_modules(model) if isinstance(m, LoRALinear)}


def parameter_adapters(model: nnx.Module) -> dict[str, ParamLoRA]:
    """{dotted path of the adapted weight (decoder.layers.0.ffn.experts.gate_up_proj): ParamLoRA}."""
    out = {}
    for p, m in nnx.iter_modules(model):
        if isinstance(m, ParamLoRA):
            *owner, attr = p
            out[_dotted((*owner, attr.removesuffix("_lora")))] = m
    return out


def has_adapters(model: nnx.Module) -> bool:
    return bool(lora_modules(model) or parameter_adapters(model))


def trainable_filter(model: nnx.Module):
    """The nnx filter of the parameters to train: the adapters (LoRAParam) when the model has
    any, else every nnx.Param (full fine-tuning)."""
    return LoRAParam if has_adapters(model) else nnx.Param


def merge_lora(model: nnx.Module) -> list[str]:
    """Fold every adapter into its base, kernel += scaling * A @ B, and turn each LoRALinear back
    into a plain Linear (same kernel/bias Variables, so the keys are the base model's); in
    place; -> the merged paths."""
    merged = {_dotted(p): (p, m) for p, m in nnx.iter_modules(model) if isinstance(m, LoRALinear)}
    for dotted, (path, m) in merged.items():
        kernel = m.kernel.get_value()
        if isinstance(kernel, quant.QuantizedWeight):
            raise ValueError(f"{dotted}: cannot merge an adapter into a {len(kernel.shape)}-D reduced-precision "
                             f"base (quantize_base); merge into the fp32 weights")
        m.kernel.set_value((kernel.astype(jnp.float32) + m.delta()).astype(kernel.dtype))
        plain = nnx.eval_shape(lambda: Linear(1, 1, use_bias=False, rngs=nnx.Rngs(0)))
        plain.kernel, plain.bias = m.kernel, m.bias
        for name in _LINEAR_ATTRS:
            setattr(plain, name, getattr(m, name))
        _set_child(model, path, plain)
    return sorted(merged) + _merge_parameters(model)


def _merge_parameters(model: nnx.Module) -> list[str]:
    """merge_lora of the ParamLoRAs: each weight += its update (Experts.weight's), the adapter removed."""
    owners = {_dotted(p): m for p, m in nnx.iter_modules(model)}
    merged = parameter_adapters(model)
    for dotted in merged:
        owner_path, name = dotted.rsplit(".", 1)
        owner = owners[owner_path]
        names = ("gate_proj", "up_proj") if name == "gate_up_proj" else (name,)
        new = {n: owner.weight(n) if isinstance(owner, Experts) else owner.effective_weight() for n in names}
        for n, w in new.items():
            getattr(owner, n).set_value(w.astype(getattr(owner, n).get_value().dtype))
        setattr(owner, f"{name}_lora", None)
    return sorted(merged)


def quantize_base(model: nnx.Module, weights_dtype: str) -> None:
    """Store every LoRALinear's frozen kernel as a bf16 or int8 quant.QuantizedWeight [out, in]
    (QLoRA style: the adapter stays fp32), in place. Same rounding and scales as the twin."""
    for m in lora_modules(model).values():
        m.kernel.set_value(quant.reduce_weight(jnp.swapaxes(m.kernel.get_value(), -1, -2), weights_dtype))


__all__ = ["LoRAParam", "LoRALinear", "ParamLoRA", "apply_lora", "find_targets", "lora_modules",
           "parameter_adapters", "parameter_candidates", "has_adapters", "trainable_filter", "merge_lora",
           "quantize_base", "adapter_inits"]
