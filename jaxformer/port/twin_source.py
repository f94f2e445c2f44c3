"""How a jaxformer twin is written (`--layers jaxformer`, jaxformer/port/twins.py): the
expression that builds it (its class and constructor arguments, config dataclasses spelled out
with the fields that differ from their defaults) and the one that calls it as torch called the
torch module: torch_ref's twins with the same arguments, torch.nn's batch-first with torch's
masks converted by the file's `torch_masks` helper (docs/numerics.md §42)."""
from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable

from jaxformer.port.twins import PLAIN, Entry, Twin, passed, same


def call_source(twin: Twin, entry: Entry, attr: str, arg: Callable[[str], str], wanted: list[int],
                helper: Callable[[str], None], imports: dict | None = None) -> str:
    """The expression that calls the twin at `attr` as `entry` called the torch module, whose
    value is the output leaves `wanted` (one, or a tuple). `arg(name)` renders the tensor passed
    as parameter `name`; `helper(name)` asks the file for a helper function; `imports` gets the
    jaxformer classes of record arguments (AttentionMask)."""
    if not twin.interop:
        return _mirror_call(twin, entry, attr, arg, wanted, {} if imports is None else imports)
    kind = type(twin.module).__name__
    return {"MultiheadAttention": _mha_call, "TransformerEncoderLayer": _layer_call,
            "TransformerDecoderLayer": _layer_call, "TransformerEncoder": _stack_call,
            "TransformerDecoder": _stack_call}[kind](twin, entry, attr, arg, wanted, helper)


def _pick(expr: str, spec, wanted: list[int], n: int) -> str:
    """The leaves `wanted` of `expr`, whose value has the torch output's structure `spec`."""
    if spec.is_leaf():
        return expr
    flat = spec.type in (tuple, list) and all(c.is_leaf() for c in spec.children()) and n == spec.num_leaves
    if flat and wanted == list(range(n)):
        return expr
    if len(wanted) == 1:
        return f"{expr}[{wanted[0]}]" if flat else f"jax.tree.leaves({expr})[{wanted[0]}]"
    pick = "" if flat else "jax.tree.leaves"
    return f"tuple({pick}({expr})[i] for i in {tuple(wanted)!r})"


def _mirror_call(twin: Twin, entry: Entry, attr: str, arg, wanted: list[int], imports: dict) -> str:
    from jaxformer.port.ops import float_repr
    from jaxformer.port.twins import record_twin
    parts = []
    for i, (k, v) in enumerate(passed(twin, entry.call).items()):
        if k in entry.names:
            text = arg(k)
        elif record_twin(v) is not None:
            text = _record_source(k, v, arg, entry.names, imports)
        else:
            text = float_repr(v) if isinstance(v, float) else repr(v)
        parts.append(text if i == 0 and k == next(iter(entry.call.arguments)) else f"{k}={text}")
    expr = f"{attr}({', '.join(parts)})"
    return _pick(expr, entry.call.out_spec, wanted, len(entry.call.tensors_out))


def _record_source(name: str, record, arg, tensors: list[str], imports: dict) -> str:
    """A torch_ref record argument (AttentionMask) as its jaxformer twin built in the file: tensor
    fields as the values passed, the others (the fields that differ from the defaults) as they are."""
    from jaxformer.port.ops import float_repr
    from jaxformer.port.twins import record_twin
    cls = record_twin(record)
    parts = []
    for f in dataclasses.fields(record):
        value = getattr(record, f.name)
        if f"{name}.{f.name}" in tensors:
            parts.append(f"{f.name}={arg(f'{name}.{f.name}')}")
        elif not (f.default is not dataclasses.MISSING and same(value, f.default)):
            parts.append(f"{f.name}={float_repr(value) if isinstance(value, float) else repr(value)}")
    return f"{imported(cls, imports)}({', '.join(parts)})"


def _seq(module) -> bool:
    """A torch.nn Transformer module that takes sequence-first (T, B, D) inputs."""
    attn = module if hasattr(module, "batch_first") else None
    if attn is None:
        layer = module.layers[0] if hasattr(module, "layers") else module
        attn = layer.self_attn
    return not attn.batch_first


def _swap(expr: str, seq: bool) -> str:
    return f"{expr}.swapaxes(0, 1)" if seq else expr


def _masks(entry: Entry, arg, helper, kpm: str, am: str | None, num_heads: int, prefix: str = "",
           sdpa_causal: bool = False, with_bias: bool = True, slots: int = 0) -> str:
    """`**torch_masks(...)` for one attention's torch masks, or '' when it has none. slots: the
    key slots nn.MultiheadAttention appends, which torch's SDPA causal mask hides."""
    a = entry.call.arguments
    given = [(k, name) for k, name in (("key_padding_mask", kpm), ("attn_mask", am))
             if name is not None and a.get(name) is not None]
    if not given and not sdpa_causal:
        return ""
    helper("torch_masks")
    parts = [f"{k}={arg(name)}" for k, name in given]
    if any(k == "attn_mask" and a[name].dim() == 3 for k, name in given):
        parts.append(f"num_heads={num_heads}")
    if sdpa_causal:
        parts.append("sdpa_causal=True")
    if sdpa_causal and slots:
        parts.append(f"slots={slots}")
    if prefix:
        parts.append(f"prefix={prefix!r}")
    if not with_bias:
        parts.append("with_bias=False")
    return f"**torch_masks({', '.join(parts)})"


def _mha_call(twin: Twin, entry: Entry, attr: str, arg, wanted: list[int], helper) -> str:
    m, a = twin.module, entry.call.arguments
    seq = not m.batch_first
    q = a["query"]
    args = [_swap(arg("query"), seq)]
    if a["key"] is not q:
        args.append(_swap(arg("key"), seq))
    if a["value"] is not a["key"]:
        args.append(f"value={_swap(arg('value'), seq)}")
    # torch's own flags pick the path: on SDPA's (is_causal, need_weights=False, no padding mask)
    # the causal mask spans the appended slots too and hides them
    sdpa = bool(a["is_causal"]) and a["key_padding_mask"] is None and not a["need_weights"]
    slots = int(m.bias_k is not None) + int(bool(m.add_zero_attn))
    masks = _masks(entry, arg, helper, "key_padding_mask", "attn_mask", m.num_heads, sdpa_causal=sdpa, slots=slots)
    if masks:
        args.append(masks)
    weights = a["need_weights"] and 1 in wanted
    if weights:
        args.append("return_weights=True")
    call = f"{attr}({', '.join(args)})"
    if not weights:
        return _swap(call, seq)
    helper("mha_outputs")
    full = f"mha_outputs({call}, seq_first={seq}, average={bool(a['average_attn_weights'])})"
    return full if wanted == [0, 1] else f"{full}[{wanted[0]}]"


def _layer_call(twin: Twin, entry: Entry, attr: str, arg, wanted: list[int], helper) -> str:
    m, a = twin.module, entry.call.arguments
    seq, heads = _seq(m), m.self_attn.num_heads
    decoder = "tgt" in a
    x = "tgt" if decoder else "src"
    args = [_swap(arg(x), seq)]
    if decoder:
        args.append(_swap(arg("memory"), seq))
        self_masks = _masks(entry, arg, helper, "tgt_key_padding_mask", "tgt_mask", heads,
                            sdpa_causal=bool(a["tgt_is_causal"]) and a["tgt_key_padding_mask"] is None)
        cross = _masks(entry, arg, helper, "memory_key_padding_mask", "memory_mask", heads, prefix="memory_")
        args += [s for s in (self_masks, cross) if s]
    else:
        masks = _masks(entry, arg, helper, "src_key_padding_mask", "src_mask", heads,
                       sdpa_causal=bool(a["is_causal"]) and a["src_key_padding_mask"] is None)
        if masks:
            args.append(masks)
    return _swap(f"{attr}({', '.join(args)})", seq)


def _stack_call(twin: Twin, entry: Entry, attr: str, arg, wanted: list[int], helper) -> str:
    m, a = twin.module, entry.call.arguments
    seq = _seq(m)
    heads = m.layers[0].self_attn.num_heads
    decoder = "tgt" in a
    if decoder:
        args = [_swap(arg("tgt"), seq), _swap(arg("memory"), seq)]
        masks = [("tgt_key_padding_mask", "tgt_mask", ""), ("memory_key_padding_mask", "memory_mask", "memory_")]
    else:
        args = [_swap(arg("src"), seq)]
        masks = [("src_key_padding_mask", "mask", "")]
    for kpm, am, prefix in masks:
        text = _masks(entry, arg, helper, kpm, am, heads, prefix=prefix, with_bias=False)
        if text:
            args.append(text)
    return _swap(f"{attr}({', '.join(args)})", seq)


# ----------------------------------------------------------------------------- the written constructor
def imported(cls: type, imports: dict[str, tuple[str, str]]) -> str:
    """The file's name for the jaxformer class `cls`: its own, or `Jaxformer<name>` where the
    file has a class of that name already (`imports` holds local name -> (module, name) and the
    taken names -> None)."""
    for local, where in imports.items():
        if where == (cls.__module__, cls.__name__):
            return local
    local = cls.__name__ if cls.__name__ not in imports else f"Jaxformer{cls.__name__}"
    imports[local] = (cls.__module__, cls.__name__)
    return local


def constructor_source(twin: Twin, imports: dict[str, tuple[str, str] | None]) -> str:
    """`Class(args..., rngs=rngs)`, the names it uses added to `imports` (`imported`)."""
    name = imported(twin.cls, imports)
    defaults = {k: p.default for k, p in inspect.signature(twin.cls.__init__).parameters.items()}
    parts = [source_of(v, imports) for v in twin.args]
    parts += [f"{k}={source_of(v, imports)}" for k, v in twin.kwargs.items()
              if not same(v, defaults.get(k, inspect.Parameter.empty))]
    return f"{name}({', '.join(parts + ['rngs=rngs'])})"


def source_of(value, imports: dict[str, tuple[str, str] | None]) -> str:
    """Python source for a constructor argument: plain values, tuples, lists, dicts and config
    dataclasses (their fields that differ from the defaults)."""
    from jaxformer.port.ops import float_repr
    if isinstance(value, float):
        return float_repr(value)
    if isinstance(value, PLAIN):
        return repr(value)
    if isinstance(value, tuple):
        items = [source_of(v, imports) for v in value]
        return f"({items[0]},)" if len(items) == 1 else f"({', '.join(items)})"
    if isinstance(value, list):
        return f"[{', '.join(source_of(v, imports) for v in value)}]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{source_of(k, imports)}: {source_of(v, imports)}" for k, v in value.items()) + "}"
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        cls = type(value)
        name = imported(cls, imports)
        fields = []
        for f in dataclasses.fields(value):
            if not f.init:
                continue
            v = getattr(value, f.name)
            default = f.default if f.default is not dataclasses.MISSING else (
                f.default_factory() if f.default_factory is not dataclasses.MISSING else dataclasses.MISSING)
            if default is dataclasses.MISSING or not same(v, default):
                fields.append(f"{f.name}={source_of(v, imports)}")
        return f"{name}({', '.join(fields)})"
    raise ValueError(f"a constructor argument of type {type(value).__name__} has no source form")
