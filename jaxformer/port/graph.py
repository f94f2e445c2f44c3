"""The exported graph as a tree of module calls, and who owns each weight.

torch.export flattens the model into one graph of aten ops; every op node carries
`nn_module_stack`, the chain of modules that were running when it was recorded. Replaying
those chains rebuilds the calls: a `Call` is one run of one submodule, holding its ops and its
own sub-calls in order. Its inputs are the values it reads from outside, its outputs the values
read outside it. Weights are graph inputs; `State` maps each one to the torch module that owns
it (the first name `named_parameters` gives a tied weight) and says what kind it is."""
from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

from jaxformer.port.source import frames, user_frames

SKIPPED = {"aten._assert_tensor_metadata", "aten._assert_scalar", "aten.sym_constrain_range_for_size",
           "aten._assert_async", "aten.sym_constrain_range"}  # runtime checks with no value


@dataclasses.dataclass(eq=False)
class Call:
    """One call of one torch module: `items` are fx nodes (its own ops) and Calls (its
    submodules' calls) in the order they ran."""
    path: str  # the module's torch path, '' for the model itself
    module: Any  # the torch module
    key: str  # nn_module_stack's key for this call
    parent: Call | None
    items: list = dataclasses.field(default_factory=list)
    inputs: list = dataclasses.field(default_factory=list)  # nodes read from outside, first use first
    outputs: list = dataclasses.field(default_factory=list)  # nodes read outside, definition order

    def nodes(self) -> Iterator[Any]:
        """Every op node in this call and its sub-calls."""
        for item in self.items:
            if isinstance(item, Call):
                yield from item.nodes()
            else:
                yield item

    def calls(self) -> Iterator[Call]:
        """This call and every sub-call, depth first."""
        yield self
        for item in self.items:
            if isinstance(item, Call):
                yield from item.calls()


def op_name(node) -> str:
    """'aten.view' for an aten op node, 'operator.getitem' / 'torch.sym_float' for the rest."""
    target = node.target
    name = getattr(target, "_name", None) or getattr(target, "__name__", str(target))
    overload = getattr(target, "overloadpacket", None)
    if overload is not None:
        return f"{overload._qualified_op_name.replace('::', '.')}"
    module = getattr(target, "__module__", "") or ""
    return f"{module.split('.')[0] if module else 'builtins'}.{name}".replace("_operator.", "operator.")


def source_line(node) -> tuple[str, int, str] | None:
    """(file name, line number, code) of the source line an op came from: its innermost stack
    frame outside torch's own package (source.user_frames), or None when the trace kept none."""
    found = user_frames(frames(node))
    if not found:
        return None
    path, line, _, code = found[-1]
    return path.rsplit("/", 1)[-1], line, code


def where(node, path: str) -> str:
    """'module path (file:line: code)', for refusals."""
    src = source_line(node)
    at = f"{src[0]}:{src[1]}: {src[2]}" if src else "no source line recorded"
    return f"in module `{path or '(top level)'}` ({at})"


def _chain(node) -> list[tuple[str, str]] | None:
    stack = node.meta.get("nn_module_stack")
    if stack is None:
        return None
    return [(key, value[0]) for key, value in stack.items()][1:]  # the model itself is the root


def live(program) -> set:
    """The op nodes the outputs depend on. Runtime checks (asserts, and the `.item()` and
    comparisons that feed only them) are not."""
    out, todo = set(), [n for n in program.graph.nodes if n.op == "output"]
    while todo:
        node = todo.pop()
        for src in node.all_input_nodes:
            if src not in out and not (src.op == "call_function" and op_name(src) in SKIPPED):
                out.add(src)
                todo.append(src)
    return out


def build_calls(program, model, weights: dict[str, Weight], layer=None) -> Call:
    """The root Call of `program`'s graph, every live op node placed in the call that ran it.
    `layer(module)`: whether a module is written as one layer (emit.Port.flax_layer's modules):
    views that open its call move out of it."""
    root = Call("", model, "", None)
    stack = [root]
    needed = live(program)
    for node in program.graph.nodes:
        if node.op != "call_function" or node not in needed:
            continue
        chain = _chain(node)
        if chain is not None:
            depth = 0
            while depth < len(chain) and depth + 1 < len(stack) and stack[depth + 1].key == chain[depth][0]:
                depth += 1
            del stack[depth + 1:]
            for key, path in chain[depth:]:
                call = Call(path, model.get_submodule(path), key, stack[-1])
                stack[-1].items.append(call)
                stack.append(call)
        stack[-1].items.append(node)
    for call in list(root.calls()):
        if layer is not None and call.parent is not None and layer(call.module):
            _hoist_views(call)
    _wire(root, weights, needed)
    return root


VIEWS = {"aten.expand", "aten.view", "aten.reshape", "aten._unsafe_view", "aten.permute", "aten.transpose",
         "aten.unsqueeze", "aten.squeeze", "aten.slice", "aten.select", "aten.alias", "aten.contiguous",
         "aten.clone", "aten.flatten", "aten.unflatten"}


def _hoist_views(call: Call) -> None:
    """A layer's call that begins with views of its input (functionalization replays a view where
    it is read: timm ConViT's `pos_proj(rel_indices.expand(B, ...))` has its expand inside
    `pos_proj`): those views move to the caller, before the call, so the layer holds its op alone."""
    at = call.parent.items.index(call)
    while call.items and not isinstance(call.items[0], Call) and op_name(call.items[0]) in VIEWS:
        call.parent.items.insert(at, call.items.pop(0))
        at += 1


def owned(weight: Weight, path: str) -> bool:
    """The weight belongs to the module at `path` or one below it."""
    return not path or weight.fqn.startswith(path + ".")


def _wire(root: Call, weights: dict[str, Weight], needed: set) -> None:
    """Fill every call's inputs and outputs. Weights of the called module (and below) are read
    as its attributes; another module's weight is an input. A value only dead code reads (an
    output of a multi-output op that nothing uses) is not an output."""
    for call in root.calls():
        inside = set(call.nodes())
        seen = set()
        for node in call.nodes():
            for src in node.all_input_nodes:
                mine = src.name in weights and owned(weights[src.name], call.path)
                if src not in inside and src not in seen and not mine and not _size(src):
                    seen.add(src)
                    call.inputs.append(src)
        # a size is never returned: its reader writes it from a live value's shape (or takes it as a
        # size argument), so every call of a module returns the same values
        call.outputs = [n for n in call.nodes() if not _size(n)
                        and any(u not in inside and (u in needed or u.op == "output") for u in n.users)]


@dataclasses.dataclass
class Weight:
    """One weight the graph reads: a parameter, a buffer or a tensor constant."""
    fqn: str  # the owner's name: the first torch name of the tensor
    kind: str  # "param", "buffer" (persistent), "constant" (non-persistent buffer, tensor attribute), "literal" (made in forward)
    value: Any  # the torch tensor
    aliases: tuple[str, ...] = ()  # other names of the same tensor (tied weights)


def _size(node) -> bool:
    """A symbolic size: written from the shapes of the values that carry it, never passed."""
    import torch
    return isinstance(node.meta.get("val"), (torch.SymInt, torch.SymFloat, torch.SymBool, int, float))


def weights(program, model) -> dict[str, Weight]:
    """{graph input name: Weight} for every weight input of the program."""
    sig = program.graph_signature
    firsts: dict[int, str] = {}
    names: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        firsts.setdefault(id(p), name)
        names.setdefault(id(p), []).append(name)
    persistent = set(model.state_dict())
    out: dict[str, Weight] = {}
    for inp, target in sig.inputs_to_parameters.items():
        p = model.get_parameter(target)
        first = firsts[id(p)]
        out[inp] = Weight(first, "param", p, tuple(n for n in names[id(p)] if n != first))
    for inp, target in sig.inputs_to_buffers.items():
        out[inp] = Weight(target, "buffer" if target in persistent else "constant", model.get_buffer(target))
    for inp, target in sig.inputs_to_lifted_tensor_constants.items():
        kind = "constant" if _attribute(model, target) else "literal"  # a tensor made in forward
        out[inp] = Weight(target, kind, program.constants[target])
    return out


def _attribute(model, fqn: str) -> bool:
    obj = model
    for part in fqn.split("."):
        if not hasattr(obj, part):
            return False
        obj = getattr(obj, part)
    return True
