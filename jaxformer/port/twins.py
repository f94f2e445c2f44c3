"""`--layers jaxformer`: torch modules the port writes as jaxformer's own classes (their twins).

Two families have a twin:
  * torch.nn's Transformer modules that jaxformer.interop imports: nn.MultiheadAttention,
    nn.TransformerEncoderLayer / DecoderLayer, nn.TransformerEncoder / Decoder. The twin is the
    class and constructor arguments interop.from_torch builds (interop.twin_spec); the torch
    weights load through interop.torch_state (in_proj split into q/k/v_proj, linear1 ->
    ffn.up_proj, ...), then jaxformer.convert's leaf rules.
  * torch_ref's modules (the PyTorch mirror of jaxformer/layers and jaxformer/models): the class
    of the same name in the mirror module, built with the torch module's constructor arguments
    (RECOVER reads them back; a fresh torch_ref module built with them must equal the given one
    in every attribute and tensor shape). Attribute paths are the same in both trees, so the
    torch weights load through jaxformer.convert as they are.
Only the outermost such module is a twin, and never the ported model itself. A module whose
twin cannot be built or called exactly (interop refuses its configuration, a float mask on a
stack, an argument that is not a tensor or a plain value) is not a twin: the port writes it op
by op as without the option, its own submodules still candidates, and the file's header names
it and why (docs/numerics.md §42).

torch.export never traces a twin: during the export its forward is one call of the custom op
`jaxformer_port::twin`, whose fake kernel gives the output shapes (those recorded by one eager
run, each dimension that matches the first tensor argument's following it), so a twin may hold
what torch.export cannot trace (torch_ref's MoE expert loop). How a twin is written, its
construction and its call: jaxformer/port/twin_source.py."""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import inspect
import itertools
from collections.abc import Callable
from typing import Any

PLAIN = (type(None), bool, int, float, str)
INTEROP = ("MultiheadAttention", "TransformerEncoderLayer", "TransformerDecoderLayer", "TransformerEncoder",
           "TransformerDecoder")


# ----------------------------------------------------------------------------- torch_ref constructors
def _moe(m):
    return (m.router.weight.shape[1], m.cfg), {"dropout": m.dropout.p}


def _ffn(m):
    return (m.up_proj.in_features, m.up_proj.out_features), {
        "kind": m.kind, "bias": m.up_proj.bias is not None, "inner_dropout": m.inner_dropout.p,
        "dropout": m.dropout.p}


def _layer(m):
    kw = {"sparse": type(m.ffn).__name__ == "MoE", "attn_norm": m.attn_norm is not None}
    if hasattr(m, "cross_attn"):
        kw["cross_attention"] = m.cross_attn is not None
    return [((m.cfg,), dict(kw, local=local)) for local in (False, True)]


def _decoder(m):
    cross = bool(len(m.layers)) and m.layers[0].cross_attn is not None
    return (m.cfg,), {"cross_attention": cross, "causal": m.causal}


def _norm(m):
    kw = {"eps": m.eps}
    if type(m).__name__ == "LayerNorm":
        kw["bias"] = m.bias is not None
    else:
        kw["unit_offset"] = m.unit_offset
    return (m.weight.shape[0],), kw


def _config_only(m):
    return (m.cfg,), {}


# torch_ref class name -> its constructor arguments read back from the module: (args, kwargs),
# or a list of candidates (the first that rebuilds the module is the one)
RECOVER: dict[str, Callable[[Any], Any]] = {
    "MoE": _moe, "FeedForward": _ffn, "EncoderLayer": _layer, "DecoderLayer": _layer,
    "Encoder": _config_only, "Decoder": _decoder, "LayerNorm": _norm, "RMSNorm": _norm,
    "LM": _config_only, "Classifier": _config_only, "TextEncoder": _config_only, "Seq2Seq": _config_only,
    "ViT": _config_only, "SwinTransformer": _config_only, "TCNTransformer": _config_only,
}


def _is_mirror(module) -> bool:
    return type(module).__module__.split(".")[0] == "torch_ref"


def is_interop(module) -> bool:
    import torch
    return type(module).__name__ in INTEROP and type(module) is getattr(torch.nn, type(module).__name__)


def _shape_of(module) -> tuple:
    """What a module is made of: its class, its plain attributes and the shapes and dtypes of
    its tensors, recursively (two modules built with the same arguments have the same)."""
    import torch
    parts: list = [type(module)]
    for k, v in sorted(vars(module).items()):
        if k.startswith("_") or k == "training":
            continue
        parts.append((k, ("tensor", tuple(v.shape), v.dtype) if isinstance(v, torch.Tensor) else repr(v)))
    for table in (module._parameters, module._buffers):
        parts += [(k, None if t is None else (tuple(t.shape), t.dtype)) for k, t in table.items()]
    parts += [(k, None if c is None else _shape_of(c)) for k, c in module._modules.items()]
    return tuple(parts)


def _mirror_spec(module) -> tuple[type, tuple, dict]:
    """(jaxformer class, args, kwargs) of a torch_ref module's twin; ValueError why not."""
    import torch
    name = type(module).__name__
    if name not in RECOVER:
        raise ValueError(f"no jaxformer twin is built for torch_ref's {name}")
    twin_module = importlib.import_module("jaxformer" + type(module).__module__.removeprefix("torch_ref"))
    cls = getattr(twin_module, name, None)
    if cls is None:
        raise ValueError(f"{twin_module.__name__} has no {name}")
    candidates = RECOVER[name](module)
    want = _shape_of(module)
    for args, kwargs in candidates if isinstance(candidates, list) else [candidates]:
        with torch.random.fork_rng(), torch.device("meta"):
            try:
                rebuilt = type(module)(*args, **kwargs)
            except Exception:  # a candidate the constructor refuses is not the one
                continue
        if _shape_of(rebuilt) == want:
            return cls, args, kwargs
    raise ValueError(f"the constructor arguments of torch_ref's {name} could not be read back from the module")


# ----------------------------------------------------------------------------- one twin
@dataclasses.dataclass
class Call:
    """One eager call of a twin: its arguments (tensors by identity, plain values as they are)
    and what it returned."""
    arguments: dict[str, Any]  # forward's parameter -> the value (defaults filled in)
    out_spec: Any  # torch pytree spec of the output
    out_leaves: list  # [(shape, dtype)] of the output tensors, None for a None in the output

    @property
    def tensors_out(self) -> list:
        return [leaf for leaf in self.out_leaves if leaf is not None]


@dataclasses.dataclass
class Twin:
    path: str
    module: Any  # the torch module
    cls: type  # the jaxformer class
    args: tuple
    kwargs: dict
    interop: bool  # an nn.* module imported as jaxformer.interop does (its weights renamed)
    calls: list[Call] = dataclasses.field(default_factory=list)
    _real: Any = dataclasses.field(default=None, repr=False)

    @property
    def drops(self) -> bool:
        """Whether the module drops anything in train mode (a dropout rate above 0)."""
        import torch
        for m in self.module.modules():
            if isinstance(m, torch.nn.Dropout) and m.p > 0:
                return True
            if isinstance(m, torch.nn.MultiheadAttention) and m.dropout > 0:
                return True
            if any("drop" in k and isinstance(v, float) and v > 0 for k, v in vars(m).items()):
                return True
        return False

    def real_copy(self, make: bool = False):
        """A copy of the torch module (real weights, forward unpatched), in the module's current
        mode: the custom op's real kernel runs it. Made (`make`) before an export that runs that
        kernel (draft_export's), as the export swaps fake weights into the module itself."""
        import copy
        if self._real is None:
            if not make:
                raise RuntimeError(f"`{self.path}`: the real kernel ran without a copy of the module")
            self._real = copy.deepcopy(self.module)
        return self._real.train(self.module.training)

    def abstract(self):
        """The twin built abstractly (nnx.eval_shape): its parameter paths and shapes."""
        from flax import nnx
        return nnx.eval_shape(lambda: self.cls(*self.args, **self.kwargs, rngs=nnx.Rngs(0)))


def spec(module) -> tuple[type, tuple, dict, bool]:
    """(jaxformer class, args, kwargs, interop) of `module`'s twin; ValueError why it has none."""
    if is_interop(module):
        from jaxformer import interop
        cls, args, kwargs = interop.twin_spec(module)
        return cls, args, kwargs, True
    if _is_mirror(module):
        return (*_mirror_spec(module), False)
    raise ValueError(f"{type(module).__name__} has no jaxformer twin")


def torch_state(twin_module, state: dict, interop: bool) -> dict:
    """`state` (under the torch module's own names) under the twin's converter keys."""
    if not interop:
        return dict(state)
    from jaxformer import interop as interop_
    return interop_.torch_state(twin_module, state)


def _check_weights(twin: Twin) -> None:
    """The torch module's state_dict loads strictly into the abstract twin (ValueError if not)."""
    from jaxformer import convert
    convert.torch_to_flax_arrays(torch_state(twin.module, twin.module.state_dict(), twin.interop), twin.abstract())


# ----------------------------------------------------------------------------- which modules are twins
def find(model, inputs: dict) -> tuple[dict[str, Twin], list[str]]:
    """The twins of `model` (outermost first, never the model itself) and the header's notes on
    the modules that could have one and are written op by op instead, with why. One eager run
    at `inputs` (torch tensors) records each candidate's calls."""
    candidates: dict[str, Twin] = {}
    notes: list[str] = []
    for path, module in model.named_modules():
        if not path or not (is_interop(module) or _is_mirror(module) and type(module).__name__ in RECOVER):
            continue
        try:
            cls, args, kwargs, interop = spec(module)
        except ValueError as e:
            notes.append(f"`{path}` ({type(module).__name__}) written op by op: {e}")
            continue
        candidates[path] = Twin(path, module, cls, args, kwargs, interop)
    if not candidates:
        return {}, notes
    try:
        _record(model, inputs, candidates)
    except Exception as e:  # the default port does not need this run: it writes them op by op
        why = f"recording their calls failed ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
        return {}, notes + [f"{_listed_paths(candidates)} written op by op: {why}"]
    twins: dict[str, Twin] = {}
    for path, twin in candidates.items():
        if any(path.startswith(p + ".") for p in twins):
            continue
        why = _unsupported(twin)
        if why is None:
            try:
                _check_weights(twin)
            except ValueError as e:
                why = f"its weights do not load into {twin.cls.__name__} ({str(e).splitlines()[0]})"
        if why is None:
            twins[path] = twin
        else:
            notes.append(f"`{path}` ({type(twin.module).__name__}) written op by op: {why}")
    notes = [n for n in notes if not any(n.startswith(f"`{p}.") for p in twins)]
    return twins, notes


def _listed_paths(candidates: dict[str, Twin]) -> str:
    paths = [f"`{p}`" for p in candidates if not any(p.startswith(q + ".") for q in candidates)]
    return ", ".join(paths[:3]) + (f" and {len(paths) - 3} more" if len(paths) > 3 else "")


def _record(model, inputs: dict, candidates: dict[str, Twin]) -> None:
    """Run `model` once (eval, no grad) recording every call of every candidate."""
    import torch
    from torch.utils import _pytree as pytree
    handles = []

    def pre(twin):
        def hook(module, args, kwargs):
            bound = inspect.signature(module.forward).bind(*args, **kwargs)
            bound.apply_defaults()
            twin.calls.append(Call(dict(bound.arguments), None, []))
        return hook

    def post(twin):
        def hook(module, args, kwargs, output):
            leaves, out_spec = pytree.tree_flatten(output)
            call = twin.calls[-1]
            call.out_spec = out_spec
            call.out_leaves = [(tuple(t.shape), t.dtype) if isinstance(t, torch.Tensor) else t for t in leaves]
        return hook

    for twin in candidates.values():
        handles.append(twin.module.register_forward_pre_hook(pre(twin), with_kwargs=True))
        handles.append(twin.module.register_forward_hook(post(twin), with_kwargs=True))
    was_training = model.training
    fast = torch.backends.mha.get_fastpath_enabled()
    saved = {name: b.clone() for name, b in model.named_buffers()}  # a forward that updates a buffer: undone
    try:
        model.eval()
        # torch.nn's fast path (nested tensors for a padding mask, fused kernels) is what the
        # eager run takes and torch.export never does: the calls recorded are the export's
        torch.backends.mha.set_fastpath_enabled(False)
        with torch.no_grad():
            model(**inputs)
    finally:
        with torch.no_grad():
            for name, b in model.named_buffers():
                b.copy_(saved[name])
        torch.backends.mha.set_fastpath_enabled(fast)
        model.train(was_training)
        for h in handles:
            h.remove()


def _unsupported(twin: Twin) -> str | None:
    """Why the twin cannot stand in for the torch module's recorded calls, or None."""
    import torch
    for call in twin.calls:
        for name, value in call.arguments.items():
            if not isinstance(value, (torch.Tensor, *PLAIN)) and record_twin(value) is None:
                return (f"its argument `{name}` is a {type(value).__name__}, not a tensor, a plain value or a "
                        "torch_ref record with a jaxformer twin")
        if any(leaf is not None and not isinstance(leaf, tuple) for leaf in call.out_leaves):
            return "it returns something other than tensors"
        tensors = tensor_names(call.arguments)
        if not tensors:
            return "it is called without a tensor argument"
        why = (_interop_unsupported if twin.interop else _mirror_unsupported)(twin, call)
        if why is not None:
            return why
    return None


def _mirror_unsupported(twin: Twin, call: Call) -> str | None:
    params = inspect.signature(twin.cls.__call__).parameters
    missing = [k for k in passed(twin, call) if k not in params]
    if missing:
        return f"{twin.cls.__name__} takes no argument {missing[0]!r}"
    return None


def _interop_unsupported(twin: Twin, call: Call) -> str | None:
    import torch
    a = call.arguments
    kind = type(twin.module).__name__
    first = next(iter(a.values()))
    if not isinstance(first, torch.Tensor) or first.dim() != 3:
        return f"an input that is not [B, T, D] or [T, B, D]; jaxformer's {twin.cls.__name__} takes [B, T, D]"
    masks = [v for k, v in a.items() if "mask" in k and isinstance(v, torch.Tensor)]
    if kind in ("TransformerEncoder", "TransformerDecoder") and any(m.is_floating_point() for m in masks):
        return f"a float (additive) mask: jaxformer's {twin.cls.__name__} takes a boolean mask only"
    if kind == "TransformerEncoder" and a.get("is_causal"):
        return "is_causal=True"
    if kind == "TransformerDecoder" and (a.get("tgt_is_causal") or a.get("memory_is_causal")):
        return "tgt_is_causal / memory_is_causal"
    if kind == "TransformerDecoderLayer" and a.get("memory_is_causal"):
        return "memory_is_causal=True"
    return None


def record_twin(value):
    """The jaxformer class of a torch_ref record passed as an argument (a dataclass whose fields
    are tensors or plain values, such as layers/masks.py's AttentionMask: the same module path
    under jaxformer, the same name and fields), or None for any other value."""
    import torch
    cls = type(value)
    if not dataclasses.is_dataclass(value) or isinstance(value, type) or not cls.__module__.startswith("torch_ref."):
        return None
    try:
        module = importlib.import_module("jaxformer." + cls.__module__[len("torch_ref."):])
    except ImportError:
        return None
    twin = getattr(module, cls.__name__, None)
    if twin is None or not dataclasses.is_dataclass(twin):
        return None
    fields = [f.name for f in dataclasses.fields(value)]
    if set(fields) - {f.name for f in dataclasses.fields(twin)}:
        return None
    return twin if all(isinstance(getattr(value, f), (torch.Tensor, *PLAIN)) for f in fields) else None


def tensor_names(arguments: dict) -> list[str]:
    """The tensors a call passes, by name: an argument, or `arg.field` of a record argument."""
    import torch
    names = []
    for k, v in arguments.items():
        if isinstance(v, torch.Tensor):
            names.append(k)
        elif record_twin(v) is not None:
            names += [f"{k}.{f.name}" for f in dataclasses.fields(v) if isinstance(getattr(v, f.name), torch.Tensor)]
    return names


def tensor_value(arguments: dict, name: str):
    k, _, field = name.partition(".")
    return getattr(arguments[k], field) if field else arguments[k]


def with_tensors(arguments: dict, tensors: dict) -> dict:
    """`arguments` with the tensors named as tensor_names names them replaced by `tensors`'."""
    out = {}
    for k, v in arguments.items():
        if k in tensors:
            out[k] = tensors[k]
        elif record_twin(v) is not None:
            out[k] = dataclasses.replace(v, **{n.partition(".")[2]: t for n, t in tensors.items()
                                               if n.startswith(k + ".")})
        else:
            out[k] = v
    return out


def _plain_fields(record) -> dict | None:
    import torch
    if not dataclasses.is_dataclass(record):
        return None
    return {f.name: getattr(record, f.name) for f in dataclasses.fields(record)
            if not isinstance(getattr(record, f.name), torch.Tensor)}


def passed(twin: Twin, call: Call) -> dict[str, Any]:
    """The recorded arguments that differ from forward's defaults (tensors always)."""
    import torch
    params = inspect.signature(twin.module.forward).parameters
    out = {}
    for k, v in call.arguments.items():
        default = params[k].default
        if isinstance(v, torch.Tensor) or not (v is default or (type(v) is type(default) and v == default)):
            out[k] = v
    return out


# ----------------------------------------------------------------------------- the export
_REGISTRY: dict[int, Entry] = {}
_KEYS = itertools.count()


@dataclasses.dataclass
class Entry:
    """One traced call of a twin: what the custom op's kernels need, and what the writer needs."""
    twin: Twin
    call: Call  # the eager call it stands for
    names: list[str]  # the parameter of each tensor the op takes, in order
    run: Callable  # real tensors -> the output leaves


@functools.cache
def _op():
    """The custom op `jaxformer_port::twin(key, tensors) -> tensors`, defined once."""
    import torch

    @torch.library.custom_op("jaxformer_port::twin", mutates_args=(), schema="(int key, Tensor[] xs) -> Tensor[]")
    def twin(key, xs):
        # the real kernel (draft_export propagates real values) runs the torch module eagerly,
        # outside the export's fake-tensor and tracing modes
        from torch.utils._python_dispatch import _disable_current_modes
        with _disable_current_modes(), torch.no_grad():
            return [t.clone() for t in _REGISTRY[key].run(xs)]

    @twin.register_fake
    def _(key, xs):
        entry = _REGISTRY[key]
        first = tensor_value(entry.call.arguments, entry.names[0])
        return [xs[0].new_empty(_out_shape(first, xs[0], shape), dtype=dtype)
                for shape, dtype in entry.call.tensors_out]
    return torch.ops.jaxformer_port.twin.default


def _out_shape(first_eager, first, shape: tuple) -> tuple:
    """An output's shape in the export: where a dimension matches the first tensor argument's
    (same index, same size in the eager run), that argument's (symbolic) size; else the size."""
    return tuple(first.shape[i] if i < first.dim() and first_eager.shape[i] == n else n
                 for i, n in enumerate(shape))


@contextlib.contextmanager
def opaque(twins: dict[str, Twin], entries: dict[int, Entry], real: bool = False):
    """Inside, each twin's forward is one call of the custom op (each call registered in
    `entries` under the key the graph node carries). `real`: the export runs the op's real
    kernel too (draft_export propagates real values)."""
    import torch
    from torch.utils import _pytree as pytree
    op = _op()
    patched = []  # (module, its own instance-level forward or None)

    def wrapper(twin: Twin, forward):
        counter = itertools.count()

        def forward_(*args, **kwargs):
            index = next(counter)
            if index >= len(twin.calls):
                raise RuntimeError(f"`{twin.path}` is called more often than in the eager run")
            bound = inspect.signature(forward).bind(*args, **kwargs)
            bound.apply_defaults()
            call = twin.calls[index]
            names = tensor_names(bound.arguments)
            statics = {k: v for k, v in bound.arguments.items()
                       if not isinstance(v, torch.Tensor) and record_twin(v) is None}
            changed = [k for k, v in statics.items() if not same(v, call.arguments.get(k))]
            changed += [k for k, v in bound.arguments.items() if record_twin(v) is not None
                        and _plain_fields(v) != _plain_fields(call.arguments.get(k))]
            if changed or names != tensor_names(call.arguments):
                raise RuntimeError(f"`{twin.path}` is called with other arguments than in the eager run "
                                   f"({', '.join(changed) or 'tensors'})")

            def run(xs):  # real tensors: on a copy of the module (the export swaps in fake weights)
                real = twin.real_copy()
                out = real(**with_tensors(bound.arguments, dict(zip(names, xs, strict=True))))
                return [t for t in pytree.tree_leaves(out) if t is not None]
            key = next(_KEYS)
            entry = Entry(twin, call, names, run)
            _REGISTRY[key] = entries[key] = entry
            tensors = iter(op(key, [tensor_value(bound.arguments, k) for k in names]))
            leaves = [None if leaf is None else next(tensors) for leaf in call.out_leaves]
            return pytree.tree_unflatten(leaves, call.out_spec)
        return forward_

    try:
        for twin in twins.values():
            if real:
                twin.real_copy(make=True)
            patched.append((twin.module, twin.module.__dict__.get("forward")))
            twin.module.forward = wrapper(twin, twin.module.forward)
        yield
    finally:
        for module, own in patched:
            del module.forward
            if own is not None:
                module.forward = own
        for key in entries:
            _REGISTRY.pop(key, None)


@contextlib.contextmanager
def registered(entries: dict[int, Entry]):
    """The twin op calls of an exported graph (`entries`, filled by `opaque`) registered again
    while the graph is retraced (trace.functional: the op's fake kernel reads its entry)."""
    _REGISTRY.update(entries)
    try:
        yield
    finally:
        for key in entries:
            _REGISTRY.pop(key, None)


def same(value, default) -> bool:
    """`value` is `default` (the same object, or an equal value of the same type)."""
    return value is default or (type(value) is type(default) and value == default)
