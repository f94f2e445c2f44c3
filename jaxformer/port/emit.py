"""Writing the port: one NNX class per torch module class, nested as in torch, in one file.

`Port(traced, model, class_name).source()` returns the formatted file. Attribute paths are the
torch state_dict keys: known torch.nn layers become flax layers (jaxformer/port/layers.py),
containers become `nnx.List` / `nnx.Dict`, every other module a class of its own whose
`__call__` is written op by op (jaxformer/port/body.py). Parameters are `nnx.Param`, buffers a
`Buffer` variable declared in the file (state that no optimiser trains). With layers="jaxformer"
the modules with a jaxformer twin are built from jaxformer's classes (jaxformer/port/twins.py),
which the file then imports. The header, imports and declared classes around them:
jaxformer/port/filetext.py."""
from __future__ import annotations

import re

from jaxformer.port import axes, graph, layers, twin_source, values
from jaxformer.port.body import INLINE_SYM, Body, attr_path, relative
from jaxformer.port.filetext import FileText, _class_text, _format, _model_output, _render_tree
from jaxformer.port.helpers import HELPERS
from jaxformer.port.source import identifier
from jaxformer.port.trace import PortError, Traced

RENAMED_LEAVES = {"scale": "weight", "embedding": "weight"}  # flax leaf names jaxformer.convert renames
# names the file may define itself: a torch class of the same name is written as NameModule
RESERVED_CLASSES = ("Buffer", "Frozen", "Constant", "ModelOutput", "logical", *HELPERS, *layers.CLASSES)
class Port(FileText):
    def __init__(self, traced: Traced, model, class_name: str | None = None):
        self.traced, self.model = traced, model
        self.program = traced.eval_program
        self.weights = graph.weights(self.program, model)
        self.by_fqn = {w.fqn: w for w in self.weights.values()}
        self.axes, self.width = axes.infer(model, self.program, self.weights)  # torch name -> logical axes
        self.uses_logical = False  # the file defines `logical` (LOGICAL_HELPER)
        self.annotated: set[str] = set()  # the parameters the file writes axes for
        self.root = graph.build_calls(self.program, model, self.weights, layers.known)
        self.first_call: dict[str, graph.Call] = {}
        for call in self.root.calls():
            self.first_call.setdefault(call.path, call)
        self.train_nodes = _align(self.program, traced.train_program,
                                  {p for p, m in model.named_modules() if layers.modes_itself(m)})
        self.arg_names = _argument_names(self.program, model)
        self.class_name = class_name or identifier(type(model).__name__, "Model")
        if class_name is None and self.class_name in RESERVED_CLASSES:
            self.class_name += "Module"
        self.helpers: set[str] = set()
        self.layer_classes: set[str] = set()  # layers.CLASSES the file defines (BatchNorm)
        self.batch_stats: set[str] = set()  # paths of layers that compute train mode themselves
        self.output_classes: dict = {}  # transformers ModelOutput type -> the file's class name
        self.classes: list[tuple[str, str]] = []  # (name, text), dependencies first
        self.class_of: dict[str, str] = {}  # module path -> class name
        self.takes_rngs: dict[str, bool] = {}  # class name -> whether its constructor takes rngs
        self.orders: dict[str, list[int]] = {}  # module path -> argument order (first-use indices)
        self._abstract: dict[str, dict] = {}  # twin path -> its abstract param leaves
        self.dim_args: dict[str, list[str]] = {}  # module path -> symbolic sizes it takes
        self.variables: set[str] = set()  # "Buffer" / "Frozen" / "Constant" when the file declares them
        self.renames: dict[str, str] = {}  # torch key -> converter key (a custom 'scale' leaf)
        self.twins = traced.twins  # path -> twins.Twin (layers="jaxformer")
        # the file's names for jaxformer's classes: local name -> (module, name); the top-level
        # class's name is taken (None)
        self.imports: dict[str, tuple[str, str] | None] = {self.class_name: None}
        for twin in self.twins.values():
            twin_source.constructor_source(twin, self.imports)
        self.drops: set[str] = set()  # what drops in train mode: the header's train-mode line

    # ------------------------------------------------------------------ classes
    def source(self) -> str:
        self._check_twin_ties()
        self.module_class("")
        return _format(self._file())

    def module_class(self, path: str, caller: Body | None = None) -> str:
        """The class name written for the custom module at `path` (writing it first)."""
        if path in self.class_of:
            return self.class_of[path]
        module = self.model.get_submodule(path)
        body = None
        if path in self.first_call:
            body = Body(self, self.first_call[path], caller)
            body.write()
            self.dim_args[path] = list(body.dim_params)
        init = self._init_lines(path, module, body)
        base = self.class_name if not path else identifier(type(module).__name__, "Module")
        if path and base in RESERVED_CLASSES:
            base += "Module"
        text = _class_text(init, body, root=not path, base="nnx.List" if not path and _listed_root(module) else "nnx.Module")
        name = next((n for n, t in self.classes if t == text and (n == base or re.fullmatch(base + r"\d+", n))), None)
        if name is None:
            taken = {n for n, _ in self.classes} | {n for n, where in self.imports.items() if where}
            name, k = base, 2
            while name in taken:
                name, k = f"{base}{k}", k + 1
            self.classes.append((name, text))
            self.takes_rngs[name] = "rngs" in text.split("def __call__")[0]
        self.class_of[path] = name
        return name

    def _init_lines(self, path: str, module, body: Body | None) -> list[str]:
        if not path and _listed_root(module):  # a top-level nn.Sequential: the class is an nnx.List
            items = [self._constructor(_join(path, k), m) if m is not None else None for k, m in module._modules.items()]
            return [f"super().__init__([{', '.join(item or 'None' for item in items)}])"]
        lines = []
        for name, child in module._modules.items():
            expr = None if child is None else self._constructor(_join(path, name), child)
            if expr is not None:
                lines.append(f"self.{self._attr(path, name)} = {expr}")
        lines += self._own_weights(path, module)
        for attr, p in (body.dropouts if body else []):
            lines.append(f"self.{attr} = nnx.Dropout({p!r}, rngs=rngs)")
        return lines

    def _attr(self, path: str, name: str) -> str:
        if not name.isidentifier():
            raise PortError(f"cannot port attribute {name!r} of module `{path or '(top level)'}`: "
                            "not a Python identifier, so no NNX attribute can have its torch name")
        return name

    def _constructor(self, path: str, module) -> str | None:
        """The expression that builds the submodule at `path`, None when it needs no attribute."""
        if path in self.twins:
            return twin_source.constructor_source(self.twins[path], self.imports)
        if layers.container(module):
            return self._container(path, module)
        if layers.parameterless_builtin(module):
            return None
        if self.flax_layer(path):
            if self._tied_away(path):
                return None
            self.layer_classes.update({layers.file_class(module)} - {None})
            if layers.modes_itself(module):
                self.batch_stats.add(path)
            return self._with_axes(path, module, layers.constructor(module))
        if path not in self.first_call and not _has_state(module):
            return None
        name = self.module_class(path)
        return f"{name}(rngs=rngs)" if self.takes_rngs[name] else f"{name}()"

    def _container(self, path: str, module) -> str | None:
        import torch
        items = {k: self._constructor(_join(path, k), m) for k, m in module._modules.items() if m is not None}
        if all(v is None for v in items.values()):
            return None
        if isinstance(module, torch.nn.ModuleDict) or not all(k.isdigit() for k in items):
            for k in items:
                self._attr(path, k)
            return "nnx.Dict({" + ", ".join(f"{k!r}: {v}" for k, v in items.items() if v is not None) + "})"
        values = [items[k] or "None" for k in items]
        if len(set(values)) == 1 and len(values) > 1:
            return f"nnx.List([{values[0]} for _ in range({len(values)})])"
        return f"nnx.List([{', '.join(values)}])"

    def _own_weights(self, path: str, module) -> list[str]:
        lines = []
        for leaf, p in module._parameters.items():
            w = self.by_fqn.get(_join(path, leaf))
            if p is None or w is None:
                continue  # None, or a tied weight under its second name: passed in (flax_layer)
            kind = "nnx.Param" if p.requires_grad else "Frozen"  # requires_grad=False: state, never trained
            self.variables.update({kind} - {"nnx.Param"})
            meta = self._logical(_join(path, leaf))
            lines.append(f"self.{self._param_attr(path, leaf, module)} = {kind}({values.init_expr(p)}"
                         + (f", **{meta})" if meta else ")"))
        for leaf, b in list(module._buffers.items()) + self._constants(path):
            w = self.by_fqn.get(_join(path, leaf))
            if b is None or w is None:
                continue
            kind = "Buffer" if w.kind == "buffer" else "Constant"
            self.variables.add(kind)
            lines.append(f"self.{self._attr(path, leaf)} = {kind}({values.buffer_expr(b, literal=kind == 'Constant')})")
        return lines

    def _logical(self, fqn: str, flax_axes=None) -> str | None:
        """`logical(...)` of a parameter's inferred axes (jaxformer/port/axes.py), or None."""
        found = self.axes.get(fqn) if flax_axes is None else flax_axes
        if found is None:
            return None
        self.uses_logical = True
        self.annotated.add(fqn)
        return f"logical({', '.join(repr(a) for a in found)})"

    def _with_axes(self, path: str, module, text: str) -> str:
        """A flax layer's constructor with each parameter's axes as its `*_metadata` argument."""
        kwargs = []
        for leaf, arg in layers.METADATA.get(type(module).__name__, {}).items():
            fqn = _join(path, leaf)
            if fqn in self.axes:
                kwargs.append(f"{arg}={self._logical(fqn, axes.flax_axes(module, leaf, self.axes[fqn]))}")
        if not kwargs or not text.endswith("rngs=rngs)"):
            return text
        return text[: -len("rngs=rngs)")] + ", ".join(kwargs) + ", rngs=rngs)"

    def _constants(self, path: str) -> list[tuple[str, object]]:
        """Plain tensor attributes the graph reads (export lifts them as constants)."""
        out = []
        for w in self.weights.values():
            owner, _, leaf = w.fqn.rpartition(".")
            if w.kind == "constant" and owner == path and leaf not in self.model.get_submodule(path)._buffers:
                out.append((leaf, w.value))
        return out

    def _param_attr(self, path: str, leaf: str, module) -> str:
        """The NNX attribute of a custom module's parameter: its torch name. jaxformer.convert
        reads the flax leaves `scale`/`embedding` as torch `weight`, so those load renamed;
        `kernel` (which it would transpose) is refused."""
        name = self._attr(path, leaf)
        if name == "kernel":
            raise PortError(f"cannot port parameter `{_join(path, leaf)}`: jaxformer.convert reads a flax "
                            "leaf named `kernel` as a transposed torch `weight`")
        if name in RENAMED_LEAVES:
            if "weight" in module._parameters or "weight" in module._buffers:
                raise PortError(f"cannot port parameter `{_join(path, leaf)}` beside `{_join(path, 'weight')}`: "
                                f"jaxformer.convert reads a flax leaf `{name}` as torch `weight`")
            self.renames[_join(path, leaf)] = _join(path, "weight")
        return name

    def flax_layer(self, path: str) -> bool:
        """The module at `path` is written as a flax layer (jaxformer/port/layers.py): a torch.nn
        module the port knows that holds each of its parameters itself, all trainable. One that reads a weight
        another module holds (a tied weight under its second name: a BERT-style MLM head with a
        bias, an Embedding sharing a table) is written op by op instead, the weight passed in
        from the module that holds it, so a shared weight is held once and used by each; except
        a bias-free Linear tied to an Embedding (GPT-2's head), the Embed's `attend`."""
        module = self.model.get_submodule(path)
        if not layers.known(module):
            return False
        own = {leaf: p for leaf, p in module._parameters.items() if p is not None}
        if not all(p.requires_grad for p in own.values()):
            return False  # a frozen parameter is written as a Frozen variable, op by op
        if not set(own) <= set(layers.KNOWN[type(module).__name__][2]):
            return False  # parameters the flax layer has no place for (weight_norm's weight_g, weight_v)
        return self._tied_away(path) or all(self._first_name(p) in (None, _join(path, leaf)) for leaf, p in own.items())

    def _tied_away(self, path: str) -> bool:
        """A bias-free Linear whose weight is a flax Embed's (GPT-2's tied head): written as the
        embedding's `attend`, with no module of its own."""
        import torch
        module = self.model.get_submodule(path)
        if type(module) is not torch.nn.Linear or module.bias is not None:
            return False
        first = self._first_name(module.weight)
        if first is None or first == _join(path, "weight"):
            return False
        owner = self.model.get_submodule(first.rpartition(".")[0])
        return type(owner) is torch.nn.Embedding and layers.known(owner)

    def _own_tied(self, node, path: str) -> bool:
        """`node` is a weight that the module at `path` holds under a second name (tied)."""
        w = self.weights.get(node.name)
        return w is not None and any(a.rpartition(".")[0] == path for a in w.aliases)

    def _first_name(self, tensor) -> str | None:
        """The name the graph reads `tensor` under (a tied weight's first name), None if unread."""
        return next((w.fqn for w in self.weights.values() if w.value is tensor), None)

    def _check_twin_ties(self) -> None:
        """A weight tied across the boundary of a module written as its jaxformer twin (which
        holds its weights under its own names) is refused; one tied inside a twin is its own."""
        for w in self.weights.values():
            for alias in w.aliases:
                inside = {self._twin_of(w.fqn), self._twin_of(alias)}
                if len(inside) > 1:
                    raise PortError(f"cannot port the tied weight `{alias}` (= `{w.fqn}`): it is tied across "
                                    "a module written as its jaxformer twin")

    # ------------------------------------------------------------------ what bodies ask
    def weight_ref(self, weight: graph.Weight, base: str) -> str:
        if weight.kind == "literal":  # a tensor the forward makes from Python values
            return values.literal(weight.value.detach())
        owner, _, leaf = weight.fqn.rpartition(".")
        rel = relative(owner, base)
        if rel is None:
            raise PortError(f"weight `{weight.fqn}` is read outside its module")
        if self._twin_of(weight.fqn) is not None:
            return self._twin_weight(weight.fqn, base)
        module = self.model.get_submodule(owner)
        if self.flax_layer(owner):
            flax_leaf, layout = layers.leaf(module, leaf)
            return layout.format(f"{attr_path(rel)}.{flax_leaf}[...]")
        return f"{attr_path(rel)}.{identifier(leaf)}[...]"

    def _twin_of(self, fqn: str) -> str | None:
        """The path of the twin that holds the tensor `fqn`, or None."""
        return next((p for p in self.twins if fqn.startswith(p + ".")), None)

    def _twin_weight(self, fqn: str, base: str) -> str:
        """A twin's weight read by the module at `base`: its flax leaf, in torch's layout."""
        from jaxformer import convert
        path = self._twin_of(fqn)
        twin = self.twins[path]
        if twin.interop:
            raise PortError(f"cannot port the read of `{fqn}` outside {type(twin.module).__name__}: the "
                            f"jaxformer twin of `{path}` holds its weights under other names")
        key = fqn[len(path) + 1:]
        abstract = self._abstract.get(path)
        if abstract is None:
            abstract = self._abstract[path] = convert.param_leaves(twin.abstract())
        leaf = next((p for p in abstract if convert.torch_key(p) == key), None)
        if leaf is None:
            raise PortError(f"cannot port the read of `{fqn}`: the jaxformer twin of `{path}` has no leaf for it")
        expr = attr_path(relative(path, base)) + "".join(f"[{p}]" if isinstance(p, int) or str(p).isdigit()
                                                         else f".{p}" for p in leaf) + "[...]"
        axes = convert.torch_to_flax_axes(str(leaf[-1]), len(abstract[leaf].shape))
        inverse = tuple(axes.index(i) for i in range(len(axes)))  # flax layout -> torch's
        if inverse == tuple(range(len(axes))):
            return expr
        return f"{expr}.T" if len(axes) == 2 else f"{expr}.transpose{inverse}"

    def train_rate(self, node, p_eval: float) -> float:
        """Dropout rate of `node` in train mode (0 when the train graph does not drop)."""
        t = self.train_nodes.get(node) if self.train_nodes else None
        if t is None:
            return 0.0
        from jaxformer.port.ops import bind
        a = bind(t)
        if graph.op_name(t) in ("aten.dropout", "aten.native_dropout"):
            return float(a["p"]) if a["train"] else 0.0
        return float(a.get("dropout_p") or 0.0)

    def dropout_attr(self, body: Body, p: float) -> str:
        for attr, rate in body.dropouts:
            if rate == p:
                return attr
        taken = set(body.call.module._modules) | set(body.call.module._parameters) | {a for a, _ in body.dropouts}
        self.drops.add(f"a functional dropout in `{body.call.path or '(top level)'}`")
        attr, k = "dropout", 1
        while attr in taken:
            attr, k = f"dropout_{k}", k + 1
        body.dropouts.append((attr, p))
        return attr

    def dim_name(self, symbol: str) -> str:
        where = self.traced.symbols.get(symbol, symbol).split(" ")[0]
        return identifier(where.replace(".shape[", "_dim").replace("]", ""), "size")

    def ordered_inputs(self, call: graph.Call) -> list:
        if call.parent is None:
            return [self._placeholder(n) for n in self.traced.input_names]
        if call.path not in self.orders:
            position = _positions(call.module)
            keyed = [(position.get(self.arg_names.get(n.name), 1000 + i), i) for i, n in enumerate(call.inputs)]
            self.orders[call.path] = [i for _, i in sorted(keyed)]
        return [call.inputs[i] for i in self.orders[call.path]]

    def _placeholder(self, name: str):
        specs = [s for s in self.program.graph_signature.input_specs if s.kind.name == "USER_INPUT"]
        given = [n for n in self.traced.input_names if self.traced.values[n] is not None]
        nodes = {n.name: n for n in self.program.graph.nodes if n.op == "placeholder"}
        for spec, input_name in zip(specs, given, strict=False):
            if input_name == name:
                return nodes.get(getattr(spec.arg, "name", None)) or _Absent(name)
        return _Absent(name)

    def input_names(self, call: graph.Call, caller: Body | None) -> list[str]:
        """__call__'s parameter names: forward's argument names where torch.export kept the
        call signature, else the caller's names for the values."""
        if call.parent is None:
            return list(self.traced.input_names)
        names = []
        for node in self.ordered_inputs(call):
            w = self.weights.get(node.name)
            name = self.arg_names.get(node.name) or (w.fqn.rpartition(".")[2] if w else None)
            if name is None and caller is not None and node in caller.names:
                name = caller.names[node]
            names.append(name or "x")
        return names

    def call_expr(self, body: Body, call: graph.Call) -> str:
        """The expression that calls submodule `call` from `body`'s module."""
        rel = relative(call.path, body.call.path)
        if call.path in self.twins:
            return self._twin_call(body, call, rel)
        if self.flax_layer(call.path):
            return self._known_call(body, call, rel)
        self.module_class(call.path, body)
        args = [body.arg(n) for n in self.ordered_inputs(call)]
        args += [body.dim(_Sym(s)) for s in self.dim_args.get(call.path, [])]
        return f"{attr_path(rel)}({', '.join(args)})"

    def _twin_call(self, body: Body, call: graph.Call, rel: str) -> str:
        """The call of a twin: the jaxformer module called as torch called its twin, the
        expression's value the call's outputs (twin_source.call_source)."""
        node = next(n for n in call.nodes() if graph.op_name(n) == "jaxformer_port.twin")
        entry = self.traced.entries[node.args[0]]
        tensors = dict(zip(entry.names, node.args[1], strict=False))
        twin = self.twins[call.path]
        wanted = [o.args[1] for o in call.outputs]
        if twin.drops:
            self.drops.add(f"`{call.path}` ({twin.cls.__name__})")
        return twin_source.call_source(twin, entry, attr_path(rel), lambda name: body.arg(tensors[name]), wanted,
                                       body.helper, self.imports)

    def _known_call(self, body: Body, call: graph.Call, rel: str) -> str:
        # the layer's one op; sizes computed beside it (a conv's output length) and the parts of a
        # multi-output op are not ops of their own
        core = [n for n in call.nodes() if graph.op_name(n) not in graph.SKIPPED | INLINE_SYM | {"operator.getitem"}]
        wanted = layers.CORE_OPS[type(call.module).__name__]
        want = next((w for w in wanted if [graph.op_name(n) for n in core] == [w]), wanted[0])
        # the value it is called on: the forward's data, or a buffer or weight of another module
        # (CLIP's `position_embedding(self.position_ids)`, DeBERTa's norm of a position table)
        tensors = [n for n in call.inputs if not self._own_tied(n, call.path)]
        if len(core) != 1 or graph.op_name(core[0]) != want or len(tensors) != 1:
            ops_seen = ", ".join(graph.op_name(n) for n in core)
            inputs = f"{len(tensors)} inputs" if len(tensors) != 1 else "1 input"
            raise PortError(f"cannot port the call of `{call.path}` ({type(call.module).__name__}): "
                            f"expected one {want} on one input, the graph has {ops_seen or 'nothing'} on {inputs} "
                            f"{graph.where(core[0] if core else tensors[0], call.path)}")
        x = body.arg(tensors[0])
        if type(call.module).__name__ == "Dropout" and call.module.p > 0:
            self.drops.add(f"`{call.path}`")
        if self._tied_away(call.path):
            owner = self._first_name(call.module.weight).rpartition(".")[0]
            return f"{attr_path(relative(owner, body.call.path))}.attend({x})"
        conv = type(call.module).__name__.startswith("Conv")  # the input is a method's receiver
        expr = layers.call(call.module, attr_path(rel), body.paren(x) if conv else x)
        pad = getattr(call.module, "padding_idx", None)
        if pad is not None:  # torch gives the padding row no gradient
            return f"jnp.where(({body.paren(x)} == {pad})[..., None], jax.lax.stop_gradient({expr}), {expr})"
        return expr

    def root_outputs(self, body: Body) -> str:
        """The top-level return: forward's outputs in torch's structure. A buffer that forward
        writes (a functional graph's BUFFER_MUTATION output) is written back into its
        Variable first, so the next call sees it as torch's next call does; a write into an
        input (USER_INPUT_MUTATION) has no JAX counterpart (arrays are immutable) and is noted
        in the header; any other kind of output is refused."""
        nodes = {n.name: n for n in self.program.graph.nodes}
        leaves = []
        for s in self.program.graph_signature.output_specs:
            kind, name = s.kind.name, getattr(s.arg, "name", None)
            if kind == "USER_OUTPUT":
                leaves.append(body.r(nodes[name]) if name in nodes else repr(getattr(s.arg, "value", None)))
            elif kind == "BUFFER_MUTATION":
                owner, _, leaf = s.target.rpartition(".")
                body.lines.append(f"{attr_path(owner)}.{identifier(leaf)}[...] = {body.arg(nodes[name])}")
                self.traced.notes.append(f"forward updates the buffer `{s.target}` in place: the port writes its new value "
                                  "into the Variable")
            elif kind == "USER_INPUT_MUTATION":
                self.traced.notes.append(f"forward writes into its input `{s.target}` in place: the port returns the same "
                                  "outputs and leaves its input unchanged (JAX arrays are immutable)")
            else:
                raise PortError(f"cannot port {type(self.model).__name__}: its forward updates "
                                f"{s.target or 'a value'} in place ({kind.lower().replace('_', ' ')})")
        return _render_tree(self.program.call_spec.out_spec, iter(leaves), self._output_class)

    def _output_class(self, cls) -> str | None:
        """The file's class for a transformers ModelOutput type forward returns (declared once,
        a subclass of the file's ModelOutput: helpers.MODEL_OUTPUT), or None for other types."""
        if not _model_output(cls):
            return None
        if cls not in self.output_classes:
            taken = {n for n, _ in self.classes} | {n for n, w in self.imports.items() if w} | set(
                self.output_classes.values()) | set(RESERVED_CLASSES) | {self.class_name}
            name, k = identifier(cls.__name__, "Output"), 2
            while name in taken:
                name, k = f"{identifier(cls.__name__, 'Output')}{k}", k + 1
            self.output_classes[cls] = name
        return self.output_classes[cls]

class _Absent:
    """A forward argument the graph never reads (None, or a Python scalar baked in)."""

    def __init__(self, name: str):
        self.name = name
        self.meta: dict = {}
        self.users: dict = {}
        self.op = "placeholder"


class _Sym:
    def __init__(self, text: str):
        self.text = text

    def __str__(self) -> str:
        return self.text


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _has_state(module) -> bool:
    return any(True for _ in module.parameters()) or any(True for _ in module.buffers())


def _positions(module) -> dict[str, int]:
    import inspect
    try:
        params = list(inspect.signature(module.forward).parameters)
    except (TypeError, ValueError):
        return {}
    return {p: i for i, p in enumerate(params)}


def _argument_names(program, model) -> dict[str, str]:
    """{graph node name: forward argument name} for every submodule call whose signature
    torch.export kept (preserve_module_call_signature)."""
    out: dict[str, str] = {}
    for entry in program.module_call_graph:
        sig = entry.signature
        if not entry.fqn or sig is None:
            continue
        try:
            module = model.get_submodule(entry.fqn.split("@")[0])
        except AttributeError:
            continue
        params = list(_positions(module))
        args_spec, kwargs_spec = sig.in_spec.children()
        names = []
        for i, child in enumerate(args_spec.children()):
            names += [params[i] if i < len(params) else f"arg{i}"] * child.num_leaves
        for key, child in zip(kwargs_spec.context, kwargs_spec.children(), strict=False):
            names += [key] * child.num_leaves
        for arg, name in zip(sig.inputs, names, strict=False):
            if getattr(arg, "name", None) and arg.name not in out:
                out[arg.name] = name
    return out


def _align(eval_program, train_program, own_modes: set[str] = frozenset()) -> dict | None:
    """{eval node: train node}, op by op, when the two graphs run the same ops; else None. The
    ops of the modules in `own_modes` (paths of layers whose class computes both modes itself,
    a BatchNorm) are left out on both sides: their train-mode ops are theirs."""
    if train_program is None:
        return None

    def inside(n) -> bool:
        chain = [v[0] for v in (n.meta.get("nn_module_stack") or {}).values()]
        return any(p in own_modes for p in chain)

    def ops_of(p):
        return [n for n in p.graph.nodes if n.op == "call_function" and graph.op_name(n) not in graph.SKIPPED
                and not inside(n)]
    e, t = ops_of(eval_program), ops_of(train_program)
    out, j = {}, 0
    for node in e:  # op by op; in a functional graph (trace.functional) eval's dropout is a clone
        if j >= len(t):
            return None
        name, other = graph.op_name(node), graph.op_name(t[j])
        if name == other:
            out[node], j = t[j], j + 1
        elif name == "aten.clone" and other == "aten.native_dropout":
            out[node], j = t[j], j + 1
            while j < len(t) and graph.op_name(t[j]) == "operator.getitem" and t[j].args[0] is out[node]:
                j += 1  # the drawn output and its mask
        else:
            return None
    return out if j == len(t) else None


def _listed_root(module) -> bool:
    """A top-level nn.Sequential / nn.ModuleList: its children are `0`, `1`, ... (the state_dict
    keys `0.weight`), which only an nnx.List holds as paths, so the file's class is one."""
    import torch
    return isinstance(module, (torch.nn.Sequential, torch.nn.ModuleList)) and not module._parameters \
        and not module._buffers
