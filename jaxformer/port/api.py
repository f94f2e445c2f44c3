"""The port's Python API: source text, the live NNX module with torch's weights, the check.

Weights load through jaxformer.convert, strictly: every torch parameter (a tied weight under its
first name) onto the NNX leaf at the same path. Buffers, which the converter does not carry, are
copied by path (`load_torch_weights`); both fail with every missing or unexpected name listed.

`layers`: "flax" (the default) writes a self-contained file (jax, flax and numpy only; torch.nn's
Linear, Embedding, LayerNorm, RMSNorm, Conv1d/2d and Dropout as flax layers, everything else op by
op); "jaxformer" also writes the modules that have a jaxformer twin as jaxformer's classes (the
file then imports jaxformer; jaxformer/port/twins.py), the weights of torch.nn's Transformer
modules renamed as jaxformer.interop names them."""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from jaxformer.port.emit import RENAMED_LEAVES, Port
from jaxformer.port.trace import PortError, trace
from jaxformer.port.verify import load_source, verify


@dataclasses.dataclass
class PortResult:
    source: str  # the written file
    class_name: str  # its top-level class
    notes: list[str]  # what the header notes (static shapes, train mode)

    def build(self, seed: int = 0):
        """A fresh instance of the written module (random weights)."""
        from flax import nnx
        return load_source(self.source, self.class_name)(rngs=nnx.Rngs(seed))


def port(torch_module, inputs: Mapping[str, Any], *, class_name: str | None = None,
         layers: str = "flax") -> PortResult:
    """Trace `torch_module` at `inputs` (numpy arrays keyed by forward's argument names) and
    write its NNX port (`layers`: the module docstring). PortError names what cannot be ported."""
    import torch
    if not isinstance(torch_module, torch.nn.Module):
        raise PortError(f"port takes a torch.nn.Module, got {type(torch_module).__name__}")
    if class_name is not None and not class_name.isidentifier():
        raise PortError(f"class name {class_name!r} is not a Python identifier")
    traced = trace(torch_module, inputs, layers)
    writer = Port(traced, torch_module, class_name)
    source = writer.source()
    verify(source, writer.class_name, traced)  # it runs at the traced and the free sizes, with torch's shapes
    return PortResult(source, writer.class_name, list(traced.notes))


def port_source(torch_module, inputs: Mapping[str, Any], *, class_name: str | None = None,
                layers: str = "flax") -> str:
    """The NNX source of `torch_module`, traced at `inputs` (see `port`)."""
    return port(torch_module, inputs, class_name=class_name, layers=layers).source


def converter_state(torch_state: Mapping[str, Any], flax_module, torch_module=None) -> dict[str, Any]:
    """`torch_state` (a state_dict, or the harness's gradients) under the keys jaxformer.convert
    reads `flax_module` from: a custom module's `scale` / `embedding` parameter under `weight`;
    with `torch_module`, the subtree of each torch.nn Transformer module written as its
    jaxformer twin under jaxformer.interop's names (in_proj split, ...); every other key as it is."""
    from jaxformer import convert
    if torch_module is not None:
        torch_state = _twin_state(torch_state, torch_module, flax_module)
    expected = {convert.torch_key(path) for path in convert.param_leaves(flax_module)}
    out = {}
    for key, value in torch_state.items():
        prefix, _, leaf = key.rpartition(".")
        renamed = f"{prefix}.weight" if prefix else "weight"
        out[renamed if leaf in RENAMED_LEAVES and renamed in expected else key] = value
    return out


def _twin_state(state: Mapping[str, Any], torch_module, flax_module) -> dict[str, Any]:
    """`state` with the keys of every torch.nn Transformer module that `flax_module` holds as
    its jaxformer twin (a jaxformer class at the same path) renamed by jaxformer.interop."""
    from jaxformer.port import twins
    out = dict(state)
    done: list[str] = []
    for path, module in torch_module.named_modules():
        if not path or any(path.startswith(p + ".") for p in done) or not twins.is_interop(module):
            continue
        flax_sub = _flax_attr(flax_module, path)
        if flax_sub is None or not type(flax_sub).__module__.startswith("jaxformer."):
            continue
        prefix = path + "."
        sub = {k[len(prefix):]: out.pop(k) for k in [k for k in out if k.startswith(prefix)]}
        out.update({prefix + k: v for k, v in twins.torch_state(module, sub, interop=True).items()})
        done.append(path)
    return out


def _flax_attr(module, path: str):
    obj = module
    for part in path.split("."):
        try:
            obj = obj[int(part)] if part.isdigit() else getattr(obj, part)
        except (AttributeError, IndexError, KeyError, TypeError):
            return None
    return obj


def state_map(torch_module, flax_module):
    """The harness's state_map for a port: torch names (state dict and gradients) -> the
    converter's keys (converter_state)."""
    return lambda state: converter_state(state, flax_module, torch_module)


def load_torch_weights(flax_module, torch_module):
    """Copy `torch_module`'s state_dict into the ported `flax_module` through jaxformer.convert
    (strict: parameters, buffers, a tied weight once; torch.nn's modules written as jaxformer's
    under interop's names), then its tensors outside the state_dict (non-persistent buffers, the
    file's `Constant`s) by path: jaxformer.module_weights.load_from_torch, which the trainer's
    torch side uses too. Returns `flax_module`."""
    from jaxformer import module_weights
    return module_weights.load_from_torch(flax_module, torch_module)


def _is_constant(path, value) -> bool:
    return type(value).__name__ == "Constant" and hasattr(value, "get_value")


def check(torch_module, flax_module, inputs: Mapping[str, Any], *, case: str = "port",
          result: PortResult | None = None):
    """check_parity of the port against torch: outputs and every parameter's gradient, a leaf
    past tolerance judged by the float64 referee and, given the port's `result`, by its float64
    twin where both fp32 answers are off float64 (docs/numerics.md §44)."""
    from jaxformer.parity.harness import ParityOptions, check_parity
    twin = None if result is None else (lambda: twin64(result, torch_module))
    return check_parity(torch_module, flax_module, dict(inputs),
                        ParityOptions(case=case, state_map=state_map(torch_module, flax_module), twin64=twin))


def twin64(result: PortResult, torch_module):
    """The port's float64 twin, for the referee: the written file with its float32 made float64,
    built with every float leaf in float64 and torch's weights loaded in float64 (a copy of the
    torch module, `.double()`), in eval mode. Call inside `jax.enable_x64`."""
    import copy

    import jax
    import jax.numpy as jnp
    from flax import nnx
    source = result.source.replace("jnp.float32", "jnp.float64")
    model = load_source(source, result.class_name, "jaxformer port, float64 twin")(rngs=nnx.Rngs(0))
    wide = lambda x: x.astype(jnp.float64) if jnp.issubdtype(x.dtype, jnp.floating) else x
    nnx.update(model, jax.tree.map(wide, nnx.state(model)))
    for _, layer in nnx.iter_modules(model):  # flax layers compute in their `dtype` (nnx.Embed's is float32)
        for attr in ("dtype", "param_dtype"):
            if getattr(layer, attr, None) == jnp.float32:
                setattr(layer, attr, jnp.float64)
    load_torch_weights(model, copy.deepcopy(torch_module).double())
    model.eval()
    return model


def from_torch(torch_module, inputs: Mapping[str, Any], *, check: bool = False, class_name: str | None = None,
               layers: str = "flax"):
    """The NNX port of `torch_module` with its weights loaded, in torch's train/eval mode
    (`layers`: the module docstring). With check=True the parity harness runs on `inputs` and
    prints its row; a failure raises ParityError with the report (where the two first part)."""
    result = port(torch_module, inputs, class_name=class_name, layers=layers)
    model = _loaded(result, torch_module)
    if check:
        _checked(torch_module, model, inputs, result.class_name, result)
    model.train() if torch_module.training else model.eval()
    return model


# XLA:CPU codegen optimisation off for the one-shot program that computes a module's RNG state:
# integer key arithmetic, the same at every level (as the parity harness's _ONE_SHOT)
_ONE_SHOT = {"xla_backend_optimization_level": 0}


def _loaded(result: PortResult, torch_module, seed: int = 0):
    """`load_torch_weights(result.build(seed), torch_module)` without drawing the initial values
    the load replaces (eager, a compile per parameter shape): the module is built abstractly
    (nnx.eval_shape), the state the load does not fill (dropout's RNG streams) is computed by
    the same constructor under jit (integer key arithmetic: the same keys), then the load fills
    the rest. Where a leaf would stay abstract, it is built and loaded as before."""
    import jax
    from flax import nnx

    from jaxformer import convert
    from jaxformer.lowering import cheap_tracer_sharding
    cls = load_source(result.source, result.class_name)
    make = lambda: cls(rngs=nnx.Rngs(seed))
    with cheap_tracer_sharding():  # the abstract build and the RNG program's trace
        model = nnx.eval_shape(make)
    loaded = set(convert.param_leaves(model)) | {tuple(p) for p, _ in nnx.to_flat_state(nnx.state(model, _is_constant))}
    rest = [(tuple(p), v) for p, v in nnx.to_flat_state(nnx.state(model)) if tuple(p) not in loaded]
    if rest:
        paths = [p for p, _ in rest]

        def values():
            state = dict((tuple(p), v) for p, v in nnx.to_flat_state(nnx.state(make())))
            return [state[p].get_value() for p in paths]
        with cheap_tracer_sharding():
            lowered = jax.jit(values).lower()
        compiled = lowered.compile(_ONE_SHOT if jax.default_backend() == "cpu" else None)
        for (_, var), value in zip(rest, compiled(), strict=True):
            var.set_value(value)
    model = load_torch_weights(model, torch_module)
    if any(isinstance(v.get_value(), jax.ShapeDtypeStruct) for _, v in nnx.to_flat_state(nnx.state(model))):
        return load_torch_weights(result.build(seed), torch_module)
    return model


def _checked(torch_module, model, inputs, case: str, result: PortResult | None = None):
    from jaxformer.parity.harness import ParityError
    was_training = torch_module.training
    report = globals()["check"](torch_module, model, inputs, case=case, result=result)
    torch_module.train(was_training)
    print(report.row())
    if not report.ok:
        raise ParityError(report.message())
    return report
