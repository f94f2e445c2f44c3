"""Writing one module's `__call__` from its call in the graph: one statement per op, named
locals, the torch source line above each block, submodule calls as `self.attr(...)`.

Values are named after what the torch line assigned (`q, k, v = ...`), else after the op.
A name is reused only when the value it held is dead; symbolic sizes are written as
`x.shape[i]` of a live local that carries them, so the function stays shape-polymorphic."""
from __future__ import annotations

import math
import re
from typing import Any

from jaxformer.port import layers, ops, symbolic
from jaxformer.port.graph import SKIPPED, Call, op_name
from jaxformer.port.helpers import HELPERS
from jaxformer.port.source import assigned_names, identifier, line_for, module_file
from jaxformer.port.trace import PortError

RESERVED = {"self", "jnp", "jax", "nnx", "np", "rngs", "Buffer", "scaled_dot_product_attention",
            "layer_norm", "rms_norm", "conv", "torch_masks", "mha_outputs", "int", "float", "len", "range", "max", "min", "sum",
            "tuple", "list", "dict", "input", "type", "print", "slice", "abs", "all", "any", "pow",
            "round", "iter", "map", "zip", "id", "hash", "format", "object", "bool", "str", "set",
            "logical"} | set(HELPERS)
# the names the written code itself reads (modules, builtins in sizes, helpers): no local may shadow them
READ = {"self", "jnp", "jax", "nnx", "np", "rngs", "Buffer", "Frozen", "Constant", "int", "float", "len", "range",
        "max", "min", "sum", "tuple", "list", "dict", "slice", "abs", "round", "bool", "logical"} | set(HELPERS)
SYMBOL = re.compile(r"\b[su]\d+\b")
DTYPES = {"float32": "jnp.float32", "float64": "jnp.float64", "float16": "jnp.float16", "bfloat16": "jnp.bfloat16",
          "int64": "jnp.int32", "int32": "jnp.int32", "int16": "jnp.int16", "int8": "jnp.int8", "uint8": "jnp.uint8",
          "bool": "jnp.bool_", "complex64": "jnp.complex64", "complex128": "jnp.complex128"}
INLINE_SYM = {"aten.sym_size", "operator.mul", "operator.add", "operator.sub", "operator.floordiv",
              "operator.mod", "operator.truediv", "operator.neg", "operator.pow", "torch.sym_float", "math.trunc",
              "torch.sym_int", "torch.sym_max", "torch.sym_min", "torch.sym_sqrt", "aten.sym_numel",
              "aten.sym_stride", "operator.eq", "operator.ne", "operator.ge", "operator.gt",
              "operator.le", "operator.lt", "torch.sym_not", "math.ceil", "math.floor", "math.sqrt",
              "torch._sym_sqrt", "builtins.sym_float"}


def dtype_name(dtype) -> str:
    return DTYPES.get(str(dtype).replace("torch.", ""), f"jnp.{str(dtype).replace('torch.', '')}")


def attr_path(rel: str) -> str:
    """'transformer.h.0.attn' -> 'self.transformer.h[0].attn'."""
    out = "self"
    for part in rel.split(".") if rel else []:
        out += f"[{part}]" if part.isdigit() else f".{identifier(part)}"
    return out


def relative(path: str, base: str) -> str | None:
    """`path` below `base` ('' = the root), or None when it is not below it."""
    if not base:
        return path
    if path == base:
        return ""
    return path[len(base) + 1:] if path.startswith(base + ".") else None


class Body:
    """The `__call__` of one module, written from `call`. `port` is the port-wide state
    (jaxformer/port/emit.py's Port: weights, dropout rates, signatures, helpers)."""

    def __init__(self, port, call: Call, caller: Body | None = None):
        self.port, self.call, self.caller = port, call, caller
        self.lines: list[str] = []
        self.names: dict[Any, str] = {}  # node -> local name
        self.holder: dict[str, Any] = {}  # name -> the node it holds now
        self.aliases: dict[str, list] = {}  # name -> other nodes with the same value (no-op ops)
        self.params: list[str] = []  # __call__'s parameters after self
        self.dim_params: list[str] = []  # symbolic sizes passed in: their sympy text
        self.dropouts: list[tuple[str, float]] = []  # (attribute, rate) for functional dropouts
        self.out = None  # the node being written
        self.last_source = None
        self.items = list(self._flat(call))
        self.pos = {}
        for i, item in enumerate(self.items):
            for node in (item.nodes() if isinstance(item, Call) else [item]):
                self.pos[node] = i
        self.here = -1

    # ------------------------------------------------------------------ structure
    def _flat(self, call: Call):
        """The call's items, with containers and parameterless torch.nn modules inlined."""
        for item in call.items:
            if isinstance(item, Call) and (layers.container(item.module) or layers.parameterless_builtin(item.module)):
                yield from self._flat(item)
            else:
                yield item

    def _last_use(self, node) -> float:
        """Position of the last read of `node` in this function (inf: read after it)."""
        last = -1.0
        for user in node.users:
            if user.op == "output" or user not in self.pos:
                return math.inf
            if op_name(user) in INLINE_SYM:  # written inline: its own readers read `node`
                last = max(last, self._last_use(user))
            last = max(last, self.pos[user])
        return last

    def bind(self, node, preferred: str, reserved: set = RESERVED) -> str:
        base = identifier(preferred)
        if base in reserved or base in self.port.imports:
            base += "_"
        name, n = base, 1
        while name in self.holder and self._live(name):
            name, n = f"{base}_{n}", n + 1
        self.holder[name] = node
        self.aliases[name] = []
        self.names[node] = name
        return name

    def _live(self, name: str) -> bool:
        held = [self.holder[name], *self.aliases.get(name, [])]
        return any(self._last_use(n) > self.here for n in held)

    def alias(self, node, expr: str) -> None:
        """`node` has the value `expr` already has (contiguous, clone, a same-dtype cast)."""
        self.names[node] = expr
        if expr in self.holder:
            self.aliases[expr].append(node)

    # ------------------------------------------------------------------ rendering values
    def val(self, x):
        return x.meta.get("val") if hasattr(x, "meta") else x

    def ndim(self, x) -> int:
        return len(self.val(x).shape)

    def is_float(self, x) -> bool:
        return self.val(x).dtype.is_floating_point

    def dtype_of(self, x) -> str:
        return dtype_name(self.val(x).dtype)

    def finfo_eps(self, x) -> float:
        import torch
        return torch.finfo(self.val(x).dtype).eps

    def paren(self, expr: str) -> str:
        """`expr` wrapped in parentheses unless it is a number or a postfix chain (a.b(c)[d])."""
        if re.fullmatch(r"[\d.e+-]+", expr) and not expr.startswith("-"):
            return expr
        depth = 0
        for ch in expr:
            depth += ch in "([{"
            depth -= ch in ")]}"
            if depth == 0 and ch in " +-*/@<>=!&|^%~,:":
                return f"({expr})"
        return expr

    def r(self, x) -> str:
        import torch
        if isinstance(x, torch.fx.Node):
            return self._node(x)
        if isinstance(x, (list, tuple)):
            items = [self.r(v) for v in x]
            return f"({items[0]},)" if len(items) == 1 else f"({', '.join(items)})"
        if isinstance(x, bool) or x is None or isinstance(x, (int, str)):
            return repr(x)
        if isinstance(x, float):
            return ops.float_repr(x)
        if isinstance(x, torch.dtype):
            return dtype_name(x)
        if isinstance(x, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            return self.dim(x)
        if isinstance(x, (torch.device, torch.layout, torch.memory_format)):
            return "None"
        raise ops.Unsupported(f"argument of type {type(x).__name__}")

    def _node(self, node) -> str:
        import torch
        if node in self.names:
            return self.names[node]
        weight = self.port.weights.get(node.name)
        if weight is not None:
            return self.port.weight_ref(weight, self.call.path)
        v = self.val(node)
        if isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            return self.dim(v)
        if isinstance(v, (int, float, bool)):
            return self.r(v)
        raise ops.Unsupported(f"value {node.name} is not defined here")

    def shape_of(self, x) -> str:
        return self.r(tuple(self.val(x).shape))

    def arg(self, x) -> str:
        """`x` as a call argument: an inlined expression without its own parentheses."""
        text = self.r(x)
        if text.startswith("(") and symbolic.encloses(text) and self.paren(text[1:-1]) == text:
            return text[1:-1]  # `(a + b)` -> `a + b`; never `(a @ b).T` -> `a @ b).T`
        return text

    def recv(self, x) -> str:
        """`x` as the receiver of a method call."""
        return self.paren(self.r(x))

    def view_shape(self, x) -> str:
        """The shape of a reshape's result, with -1 for the one size (if any) that no live
        value's shape carries, as torch code writes it."""
        dims = []
        for d in self.val(x).shape:
            try:
                dims.append(self.dim(d, passed=False) if not isinstance(d, int) else str(d))
            except ops.Unsupported:
                dims.append(None)
        if dims.count(None) > 1:
            dims = [self.r(d) for d in self.val(x).shape]
        return f"({', '.join(d if d is not None else '-1' for d in dims)}{',' if len(dims) == 1 else ''})"

    def dim(self, sym, passed: bool = True) -> str:
        """A symbolic size as an expression over live locals' shapes (jaxformer/port/symbolic.py
        writes torch's sympy functions: `max(0, 1 - x.shape[1])`); with `passed`, a size no
        live value carries becomes a parameter of the function, else it is Unsupported."""
        expr = sym.node.expr if hasattr(sym, "node") else None
        text = str(expr) if expr is not None else str(sym)
        if not SYMBOL.search(text):
            return text
        exact = self._shape_of_expr(text)
        if exact is not None:
            return exact
        parts = {}
        for s in dict.fromkeys(SYMBOL.findall(text)):  # first use first: the same file in every process
            found = self._shape_of_expr(s)
            if found is None and not passed:
                raise ops.Unsupported(f"no live value carries the size {s}")
            parts[s] = found if found is not None else self._dim_param(s)
        if expr is None:  # a bare symbol's name (a submodule's size argument)
            return parts[text] if text in parts else SYMBOL.sub(lambda m: parts[m.group(0)], text)
        try:
            out = symbolic.python_source(expr, parts.__getitem__)
        except symbolic.NoPythonForm as e:
            raise ops.Unsupported(f"symbolic size {text} has no Python form ({e})") from None
        return out

    def _shape_of_expr(self, text: str) -> str | None:
        for name, node in self.holder.items():
            shape = getattr(self.val(node), "shape", None)
            for i, d in enumerate(shape or ()):
                if str(d) == text:
                    return f"{name}.shape[{i}]"
        return None

    def _dim_param(self, symbol: str) -> str:
        name = self.port.dim_name(symbol)
        if symbol not in self.dim_params:
            self.dim_params.append(symbol)
            self.params.append(name)
        return name

    # ------------------------------------------------------------------ helpers for ops
    def helper(self, name: str) -> None:
        self.port.helpers.add(name)

    def dropout(self, p_eval: float) -> str | None:
        """The nnx.Dropout attribute for the op being written when train mode drops, else None."""
        p = self.port.train_rate(self.out, p_eval)
        if not p:
            return None
        attr = self.port.dropout_attr(self, p)
        return f"self.{attr}"

    # ------------------------------------------------------------------ statements
    def comment(self, src) -> None:
        if src is not None and src != self.last_source:
            self.lines.append(f"# {src[0]}:{src[1]}: {src[2]}")
            self.last_source = src

    def source(self, node, below=()):
        return line_for(node, list(below), module_file(self.call.module))

    def write(self) -> None:
        """Parameters, then every statement, then the return."""
        self._parameters()
        for here, item in enumerate(self.items):
            self.here = here
            if isinstance(item, Call):
                self._submodule(item)
            else:
                self._op(item)
        self._return()

    def _parameters(self) -> None:
        names = self.port.input_names(self.call, self.caller)
        # the model's own arguments keep forward's names (callers pass them by keyword: `input`,
        # `type`), renamed only where the written code reads that name itself
        reserved = READ if self.call.parent is None else RESERVED
        for node, name in zip(self.port.ordered_inputs(self.call), names, strict=False):
            self.params.append(self.bind(node, name, reserved))

    def _below(self, node) -> list:
        """The modules on `node`'s chain below this function's module (opaque or inlined)."""
        chain = [v[0] for v in (node.meta.get("nn_module_stack") or {}).values()][1:]
        base = self.call.path
        return [self.port.model.get_submodule(p) for p in chain if relative(p, base) not in (None, "")]

    def _name_for(self, node, src, fallback: str) -> str:
        """What the torch line called this value: its assignment target when the value is the
        line's last (or, for a tuple target, its element), else `fallback`."""
        targets = assigned_names(src[2]) if src else None
        if targets is None:
            return fallback
        if op_name(node) == "operator.getitem" and len(targets) > 1 and isinstance(node.args[1], int):
            idx = node.args[1]
            return targets[idx] if idx < len(targets) else fallback
        if len(targets) != 1:
            return fallback
        later = [u for u in node.users if u in self.pos and self.source(u, self._below(u)) == src
                 and op_name(u) not in INLINE_SYM]
        return targets[0] if not later else fallback

    def _op(self, node) -> None:
        name = op_name(node)
        if name in INLINE_SYM or name in SKIPPED:
            return
        if not node.users:  # dead: nothing reads it, and (functional graph) it writes nothing
            return
        if name == "operator.getitem":
            return self._getitem(node)
        self.out = node
        below = self._below(node)
        src = self.source(node, below)
        if name == "aten.clone" and self.port.train_rate(node, 0.0):
            name = "dropout"  # a functional graph's eval dropout, which torch's train graph draws
        try:
            expr = f"{self.dropout(0.0)}({self.r(node.args[0])})" if name == "dropout" else ops.translate(self, node, name)
        except ops.Unsupported as e:
            raise PortError(f"cannot port aten op {name} ({e}) {where_line(node, self.call.path, src)}") from None
        if ops.is_identity(name) or (node.args and expr == self.r(node.args[0])):
            self.alias(node, expr)
            return
        if isinstance(self.val(node), (tuple, list)):
            self.comment(src)
            return self._unpack(node, expr, src)
        fallback = name.split(".")[-1].lstrip("_")
        preferred = self._name_for(node, src, fallback)
        if preferred == fallback and self._inlinable(node, src):
            self.names[node] = self.paren(expr)
            return
        self.comment(src)
        self.lines.append(f"{self.bind(node, preferred)} = {expr}")

    def _inlinable(self, node, src) -> bool:
        """A value read once, by the next statement, from the same torch line: written inside
        that statement (`k = k.reshape(...).swapaxes(1, 2)`), not as a local of its own."""
        if len(node.users) != 1:
            return False
        user = next(iter(node.users))
        at = self.pos.get(user)
        if at is None or at <= self.here or op_name(user) in INLINE_SYM or op_name(user) == "operator.getitem":
            return False
        between = self.items[self.here + 1:at]
        if any(isinstance(i, Call) or op_name(i) not in INLINE_SYM | SKIPPED for i in between):
            return False
        reader = self.items[at]
        if isinstance(reader, Call):
            return self.source(next(reader.nodes()), [reader.module]) == src
        return self.source(user, self._below(user)) == src

    def _unpack(self, node, expr: str, src) -> None:
        items = [u for u in node.users if op_name(u) == "operator.getitem"]
        if len(items) != len(node.users):
            target = self.bind(node, self._name_for(node, src, op_name(node).split(".")[-1]))
            self.lines.append(f"{target} = {expr}")
            return
        count = len(self.val(node))
        by_index = {u.args[1]: u for u in items}
        names = []
        for i in range(count):
            user = by_index.get(i)
            names.append(self.bind(user, self._name_for(user, src, f"part{i}")) if user is not None else "_")
        self.lines.append(f"{', '.join(names)} = {expr}")

    def _getitem(self, node) -> None:
        if node in self.names:
            return
        parent, index = node.args
        self.comment(self.source(node, self._below(node)))
        target = self.bind(node, self._name_for(node, self.source(node, self._below(node)), "item"))
        self.lines.append(f"{target} = {self.r(parent)}[{index}]")

    def _submodule(self, call: Call) -> None:
        first = next(call.nodes(), None)
        if first is None:
            return
        below = [call.module]
        src = self.source(first, below)
        expr = self.port.call_expr(self, call)
        if not call.outputs:
            return
        self.comment(src)
        attr = call.path.rsplit(".", 1)[-1]
        fallback = attr if not attr.isdigit() else "hidden"
        returned = self._returned(call)  # what the module's function returns: its first call's outputs
        if len(returned) == 1:
            out = call.outputs[0]
            self.lines.append(f"{self.bind(out, self._name_for_call(out, src, fallback))} = {expr}")
            return
        targets = [self.bind(o, f"{fallback}_{i}") if o is not None else "_" for i, o in enumerate(returned)]
        self.lines.append(f"{', '.join(targets)} = {expr}")

    def _returned(self, call: Call) -> list:
        """This call's outputs in the order the module's function returns them (written from the
        module's first call): a later call of the same module, whose graph repeats the first's op
        by op, may read fewer of them (None where it reads none)."""
        first = self.port.first_call.get(call.path, call)
        if first is call:
            return list(call.outputs)
        ops = lambda c: [n for n in c.nodes() if op_name(n) not in INLINE_SYM | SKIPPED]  # sizes are shared
        mine, theirs = ops(call), ops(first)
        if len(mine) != len(theirs) or any(op_name(a) != op_name(b) for a, b in zip(mine, theirs, strict=True)):
            raise PortError(f"cannot port the calls of `{call.path}`: its calls run different ops, and the port "
                            "writes one function per module")
        at = {theirs[mine.index(o)]: o for o in call.outputs}
        if any(node not in first.outputs for node in at):
            raise PortError(f"cannot port the calls of `{call.path}`: a later call reads a value its first call "
                            "does not return")
        return [at.get(node) for node in first.outputs]

    def _name_for_call(self, out, src, fallback: str) -> str:
        targets = assigned_names(src[2]) if src else None
        if targets is None or len(targets) != 1:
            return fallback
        later = [u for u in out.users if u in self.pos and self.pos[u] > self.here
                 and self.source(u, self._below(u)) == src and op_name(u) not in INLINE_SYM]
        return targets[0] if not later else fallback

    def _return(self) -> None:
        if self.call.parent is None:
            self.lines.append(f"return {self.port.root_outputs(self)}")
            return
        outs = [self.r(o) for o in self.call.outputs]
        self.lines.append(f"return {', '.join(outs)}")


def where_line(node, path: str, src) -> str:
    at = f"{src[0]}:{src[1]}: {src[2]}" if src else "no source line recorded"
    return f"in module `{path or '(top level)'}` ({at})"
