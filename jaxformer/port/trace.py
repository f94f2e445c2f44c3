"""Tracing a torch module for the port: `torch.export` at the factory's inputs, eval and train.

Every dimension of every tensor input is exported as `Dim.AUTO`: it stays symbolic unless the
graph pins it (a weight's width, a size-1 axis), so batch and sequence length stay free
wherever the model allows. Python control flow is resolved at the traced inputs. The module is
exported twice, in eval mode (the graph that is written) and in train mode (where dropout's
rates come from); the two graphs are lined up op by op (jaxformer/port/graph.py)."""
from __future__ import annotations

import contextlib
import dataclasses
import inspect
from collections.abc import Mapping
from typing import Any

import numpy as np


class PortError(ValueError):
    """A module that cannot be ported, named: the aten op, the torch module path and the
    source line (one line)."""


@dataclasses.dataclass
class Traced:
    eval_program: Any  # torch.export.ExportedProgram, eval mode
    train_program: Any | None  # the same in train mode (None: the train graph failed to export)
    input_names: tuple[str, ...]  # forward's argument names, in the inputs' order
    values: dict[str, Any]  # the traced inputs (torch tensors, Python scalars or None)
    symbols: dict[str, str]  # symbol -> "idx.shape[1], 2..16": the dims that stay free
    notes: list[str]  # what the header should say (static fallback, train graph problems)
    twins: dict = dataclasses.field(default_factory=dict)  # path -> twins.Twin (layers="jaxformer")
    entries: dict = dataclasses.field(default_factory=dict)  # a twin op node's key -> its twins._Entry
    reference: Any = None  # with twins: the plain export, whose output shapes are torch's (_pinned)


def torch_inputs(module, inputs: Mapping[str, Any]) -> dict[str, Any]:
    """{name: torch tensor (or a Python scalar)} from the factory's numpy inputs, checked
    against `forward`'s parameters."""
    import torch
    if not isinstance(inputs, Mapping):
        raise PortError("inputs must be a dict of numpy arrays keyed by forward's argument names, "
                        f"got {type(inputs).__name__}")
    params = inspect.signature(module.forward).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    unknown = [k for k in inputs if k not in params and not takes_any]
    if unknown:
        raise PortError(f"input {unknown[0]!r} is not an argument of {type(module).__name__}.forward "
                        f"(it takes {', '.join(params)})")
    out = {}
    for k, v in inputs.items():
        if v is None or isinstance(v, (bool, int, float)):
            out[k] = v
        else:
            out[k] = torch.from_numpy(np.ascontiguousarray(np.asarray(v)))
    return out


def _dynamic_shapes(kwargs: Mapping[str, Any], pinned: frozenset = frozenset()) -> dict[str, Any]:
    from torch.export import Dim
    return {k: ({i: Dim.AUTO for i in range(v.dim()) if (k, i) not in pinned} if hasattr(v, "dim") else None)
            for k, v in kwargs.items() if v is not None}


def _pinned(module, kwargs) -> tuple[frozenset, Any]:
    """({(input, axis)} of the dims the module's own graph fixes (a Linear's width), and the
    plain export they are read off, or None). A jaxformer twin traced as one opaque op fixes none
    of its inputs' dims and guesses its outputs' (twins.py's fake kernel), so with twins these
    dims are pinned by hand and the plain graph is the reference for the output shapes
    (port/verify.py); without a plain export, none are pinned (every dim is tried)."""
    import torch
    program = None
    for draft in (False, True):  # draft: past a value check (nn.Transformer compares masks' values)
        try:
            program = _export(module, kwargs, dynamic=True, preserve=(), draft=draft, stack_traces=False)
            break
        except Exception as e:  # torch.export raises many types: the twins may be what makes it export
            if draft or not _draft_helps(e):
                return frozenset(), None
    out = set()
    for node in program.graph.nodes:
        if node.op == "placeholder" and node.name in kwargs:
            for i, d in enumerate(getattr(node.meta.get("val"), "shape", ())):
                if not (isinstance(d, torch.SymInt) and d.node.expr.free_symbols):  # an int, or a SymInt of one
                    out.add((node.name, i))
    return frozenset(out), program


def _export(module, kwargs, *, dynamic: bool, preserve: tuple[str, ...], draft: bool = False,
            twins_: Mapping | None = None, entries: dict | None = None, stack_traces: bool = True,
            pinned: frozenset = frozenset()):
    """torch.export.export, or draft_export's trace, which resolves data-dependent Python control
    flow (an id-range check, a loop over the experts a router picked) at the traced values.
    `twins_` (layers="jaxformer") are traced as one opaque op each (jaxformer/port/twins.py),
    their calls registered in `entries`. stack_traces=False: the nodes carry no
    meta["stack_trace"] (torch.fx records one per node, a tenth of an export's time)."""
    import torch

    from jaxformer.port import twins
    # fresh tensors: an attempt marks its inputs' dims dynamic, and the marks would stay
    kwargs = {k: (v.clone() if hasattr(v, "clone") else v) for k, v in kwargs.items() if v is not None}
    shapes = _dynamic_shapes(kwargs, pinned) if dynamic else None
    if twins_:
        preserve = tuple(p for p in preserve if not any(p == t or p.startswith(t + ".") for t in twins_))
    # FakeTensor's dispatch cache off: one export rarely repeats an op on the same symbolic
    # shapes, and making its entries cost more than they saved (corpus ports: 78 s -> 66 s CPU,
    # every written file the same)
    with (twins.opaque(twins_, {} if entries is None else entries, real=draft) if twins_ else contextlib.nullcontext(),
          torch._dynamo.config.patch(fake_tensor_cache_enabled=False), _quiet(),
          contextlib.nullcontext() if stack_traces else _no_stack_traces()):
        if not draft:
            return torch.export.export(module, (), kwargs, strict=False, dynamic_shapes=shapes,
                                       preserve_module_call_signature=preserve)
        return _draft_export(module, kwargs, shapes, preserve)


@contextlib.contextmanager
def _quiet():
    """torch.export's warnings (a dim specialised) and the partial graph it prints to stderr on a
    failed attempt off while the port tries its exports: what matters reaches the header's notes
    or the refusal."""
    import io
    import logging
    previous = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        logging.disable(previous)


@contextlib.contextmanager
def _no_stack_traces():
    """torch.fx's tracers record no stack trace on the nodes they make, inside."""
    from torch.fx import config
    saved = config.do_not_emit_stack_traces
    config.do_not_emit_stack_traces = True
    try:
        yield
    finally:
        config.do_not_emit_stack_traces = saved


def _draft_export(module, kwargs, shapes, preserve: tuple[str, ...]):
    """torch.export.draft_export's graph without its report. draft_export traces with real
    values propagated beside the fake ones (a data-dependent value is read, not guessed) under a
    structured-log capture that records a stack trace for every symbolic-shape operation (its
    report: 80% of its time here). The graph is the same without the capture, except where the
    report names a custom op with a missing or mismatched fake kernel (draft_export then guards
    its calls): a graph calling a custom op is traced again with draft_export itself."""
    import logging

    import torch
    logging.disable(logging.ERROR)  # both log every value they resolve (draft_export its graphs too)
    try:
        with torch._functorch.config.patch(fake_tensor_propagate_real_tensors=True,
                                           generate_fake_kernels_from_real_mismatches=True):
            program = torch.export.export(module, (), kwargs, strict=False, dynamic_shapes=shapes,
                                          preserve_module_call_signature=preserve)
        if not any(_custom_op(n) for n in program.graph.nodes):
            return program
        return torch.export.draft_export(module, (), kwargs, dynamic_shapes=shapes,
                                         preserve_module_call_signature=preserve)
    finally:
        logging.disable(logging.NOTSET)


def _custom_op(node) -> bool:
    """An op node whose target is an operator outside torch's own namespaces (torch.library)."""
    namespace = getattr(node.target, "namespace", None)
    return node.op == "call_function" and namespace is not None and namespace not in ("aten", "prims", "jaxformer_port")


ATTEMPTS = (  # (draft, dynamic, keep call signatures), tried in turn
    (False, True, True), (False, True, False), (True, True, True), (True, True, False),
    (False, False, False), (True, False, False))


def _export_any(module, kwargs, notes: list[str], twins_=None, entries=None, pinned: frozenset = frozenset()):
    """Export with the first of ATTEMPTS that works. -> (program, draft, dynamic). A draft
    attempt (real values propagated) runs only where a plain one of the same dynamism failed for
    a reason it can fix (`_draft_helps`): a data-dependent value, an op without a fake kernel.
    An attempt without call signatures runs only where the one with them may have failed
    because of them (`_signatures_may_fail`)."""
    paths = tuple(n for n, _ in module.named_modules() if n)
    first = deepest = None
    helps = {True: False, False: False}  # dynamic -> a plain attempt failed for a draft-fixable reason
    same = set()  # (draft, dynamic) whose attempt with call signatures failed as it would without
    for draft, dynamic, keep in ATTEMPTS:
        if (draft and not helps[dynamic]) or (not keep and (draft, dynamic) in same):
            continue
        try:
            program = _export(module, kwargs, dynamic=dynamic, preserve=paths if keep else (), draft=draft,
                              twins_=twins_, entries=entries, pinned=pinned)
        except Exception as e:  # torch.export raises many types
            first = first or e  # why the free dims did not export
            deepest = e if draft and dynamic else deepest  # past value checks, and (the last) past signatures
            helps[dynamic] = helps[dynamic] or (not draft and _draft_helps(e))
            if keep and not _signatures_may_fail(e, module):
                same.add((draft, dynamic))
            continue
        if draft:
            notes.append("data-dependent Python control flow resolved at the traced inputs "
                         "(torch.export.draft_export); runtime checks on values are dropped")
        if not dynamic:
            notes.append(f"static shapes: the graph does not export with free dims "
                         f"({type(first).__name__}: {_first_line(first)})")
        return program, draft, dynamic
    reason = deepest or first
    op = failing_op(reason) or failing_op(first)
    op = op or "no aten op (a Python-level failure: no op was being traced)"
    raise PortError(f"cannot port {type(module).__name__}: {op} {_user_frame(reason, module)}: torch.export "
                    f"failed: {type(reason).__name__}: {_first_line(reason)}")


def _draft_helps(e: BaseException) -> bool:
    """Whether draft_export's trace could get past `e`: a guard on a data-dependent value, a
    symbol a data-dependent op made, or an op without a fake kernel (draft_export makes one)."""
    text = f"{type(e).__name__}: {e}".lower()
    return any(k in text for k in ("datadependent", "data-dependent", "data dependent", "unbacked", "fake impl",
                                   "fake kernel", "meta kernel"))


def _signatures_may_fail(e: BaseException, model) -> bool:
    """Whether an export that kept the submodules' call signatures may have failed because of
    them. Keeping them adds a forward pre- and post-hook to each submodule (torch/_export/
    wrappers.py) whose `_export_tracepoint` op records the call's inputs and outputs and hands
    the same tensor objects on (its fake kernel returns its arguments). A failure raised inside
    the forward of one of the model's modules (in the traceback) and outside those hooks
    therefore happens the same way without them: the same Python on the same tensors. Any other
    failure (in a hook, in torch's processing after the trace) may be theirs."""
    import os
    import traceback

    from torch._export import wrappers
    hooks = os.path.splitext(wrappers.__file__)[0]
    frames = traceback.extract_tb(e.__traceback__)
    if any(os.path.splitext(f.filename)[0] == hooks for f in frames):
        return True
    modules = {type(m): m for m in model.modules()}.values()  # one per class: _holds reads the class
    return not any(_holds(m, f) for f in frames for m in modules)


def failing_op(e: BaseException) -> str | None:
    """The operator a failed export was tracing: 'aten.where' (its overload packet), or None
    when no op can be determined. Read from the traceback: the innermost frame holding the op
    being dispatched; else, for a guard on a data-dependent size, the op of the graph being
    traced whose output carries the guarded symbol."""
    import operator
    import re

    import torch
    op, graphs = None, []
    tb = e.__traceback__
    while tb is not None:  # outermost first: the last op found is the innermost
        for value in list(tb.tb_frame.f_locals.values()):
            if isinstance(value, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
                op = _packet(value)
            elif isinstance(value, torch.fx.Tracer) and isinstance(getattr(value, "graph", None), torch.fx.Graph):
                graphs.append(value.graph)
        tb = tb.tb_next
    if op is not None:
        return op
    guard = re.search(r"data-dependent expression (.*)", str(e))
    symbols = set(re.findall(r"\bu\d+\b", guard.group(1) if guard else ""))
    for graph in graphs:
        for node in graph.nodes:
            val = node.meta.get("val")
            carried = {str(s) for s in _symbols(val)}
            if symbols & carried:
                while node.target is operator.getitem and node.args:
                    node = node.args[0]  # one output of a multi-output op
                if isinstance(node.target, torch._ops.OpOverload):
                    return _packet(node.target)
    return None


def _packet(op) -> str:
    return getattr(op, "overloadpacket", op)._qualified_op_name.replace("::", ".")


def _symbols(val) -> set:
    """The free symbols of a traced value's sizes (a tensor, a SymInt, or a tuple of them)."""
    import torch
    if isinstance(val, (list, tuple)):
        return set().union(*(_symbols(v) for v in val)) if val else set()
    if isinstance(val, torch.SymInt):
        return set(val.node.expr.free_symbols)
    if isinstance(val, torch.Tensor):
        return set().union(*(_symbols(d) for d in val.shape)) if val.dim() else set()
    return set()


def _user_frame(e: BaseException, model) -> str:
    """'in module `path` (file:line: code)': the innermost frame of the model's own code in
    the traceback of a failed export (not torch's), and the module whose forward holds it."""
    import os
    import traceback

    import torch
    library = os.path.dirname(torch.__file__)
    frames = [f for f in traceback.extract_tb(e.__traceback__) if not f.filename.startswith(library)
              and os.sep + "jaxformer" + os.sep + "port" + os.sep not in f.filename]
    if not frames:
        return "in module `(top level)` (no source line recorded)"
    f = frames[-1]
    path = next((name for name, m in reversed(list(model.named_modules())) if _holds(m, f)), "")
    return f"in module `{path or '(top level)'}` ({os.path.basename(f.filename)}:{f.lineno}: {(f.line or '').strip()})"


def _holds(module, frame) -> bool:
    import inspect
    fn = inspect.unwrap(getattr(type(module), "forward", None) or (lambda: None))
    code = getattr(fn, "__code__", None)
    if code is None or code.co_filename != frame.filename:
        return False
    last = max((ln for _, _, ln in code.co_lines() if ln is not None), default=code.co_firstlineno)
    return code.co_firstlineno <= frame.lineno <= last


def _first_line(e: BaseException) -> str:
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return (lines[0] if lines else type(e).__name__)[:300]


def free_symbols(program, kwargs: Mapping[str, Any]) -> dict[str, str]:
    """{symbol: 'name.shape[i] in lo..hi'} for each input dim that is symbolic in the exported
    graph: the placeholders' sizes after the export, a size that a later op fixed (its symbol
    replaced by a number) not among them, whatever dims were asked to stay free."""
    import torch
    ranges = {str(k): v for k, v in program.range_constraints.items()}
    out: dict[str, str] = {}
    user = [n for n in program.graph.nodes if n.op == "placeholder" and n.name in kwargs]
    for node in user:
        val = node.meta.get("val")
        for i, d in enumerate(getattr(val, "shape", ())):
            if isinstance(d, torch.SymInt) and d.node.expr.free_symbols and str(d) not in out:
                r = ranges.get(str(d))
                hi = "" if r is None or str(r.upper) in ("int_oo", "oo") else str(r.upper)
                lo = "" if r is None else str(r.lower)
                bounds = f" in {lo}..{hi}" if hi else f" >= {lo}"
                out[str(d)] = f"{node.name}.shape[{i}]" + (bounds if r is not None else "")
    return out


LAYERS = ("flax", "jaxformer")  # what known modules are written as (port's `layers`)


def trace(module, inputs: Mapping[str, Any], layers: str = "flax") -> Traced:
    """Export `module` at `inputs` (numpy, keyed by forward's argument names) in eval and in
    train mode. The module's own mode is restored afterwards. Where the eval export never read
    a module's `training` flag (and `train()` only sets that flag), train mode runs the same
    Python, so its graph is the eval graph and is not exported again (`mode_blind`). With
    layers="jaxformer" the modules that have a jaxformer twin are found first and traced opaque."""
    from jaxformer.port import twins
    if layers not in LAYERS:
        raise PortError(f"layers must be one of {', '.join(LAYERS)}, got {layers!r}")
    kwargs = torch_inputs(module, inputs)
    notes: list[str] = []
    twins_, entries = {}, {}
    if layers == "jaxformer":
        twins_, notes = twins.find(module, {k: v for k, v in kwargs.items() if v is not None})
    was_training = module.training
    try:
        module.eval()
        reads: list[str] = []
        with _training_reads(reads) as recording:
            pinned, reference = _pinned(module, kwargs) if twins_ else (frozenset(), None)
            program, draft, dynamic = _export_any(module, kwargs, notes, twins_, entries, pinned)
        train = program if recording and not reads and mode_blind(module) else None
        try:
            if train is None:
                module.train()
                # the train graph is read for its ops and their arguments only (emit.py's
                # _align, train_rate): no source lines, so no stack traces to record
                train = _export_train(module, kwargs, dynamic, draft, twins_, entries)
        except Exception as e:
            notes.append(f"train mode not ported: its graph does not export ({type(e).__name__}: "
                         f"{_first_line(e)}); dropout stays off")
    finally:
        module.train(was_training)
    with twins.registered(entries):
        written = functional(program)
    if train is not None and train is not program:
        try:  # the same form as the eval graph, for _align
            with twins.registered(entries):
                train = functional(train) if written is not program else train
            inline_no_grad(train)
        except Exception as e:
            notes.append(f"train mode not ported: its graph does not export ({type(e).__name__}: "
                         f"{_first_line(e)}); dropout stays off")
            train = None
    elif train is program:
        train = written
    program = written
    inline_no_grad(program)
    return Traced(program, train, tuple(kwargs), kwargs, free_symbols(program, kwargs), notes, twins_, entries,
                  reference)


def _export_train(module, kwargs, dynamic: bool, draft: bool, twins_, entries):
    """The train-mode graph, read for its ops and their arguments only (emit.py's _align,
    train_rate): no source lines, so no stack traces to record. Where the plain export meets a
    value that train mode reads (BatchNorm's cumulative average reads its batch count), the
    draft trace, which reads it, is tried too."""
    try:
        return _export(module, kwargs, dynamic=dynamic, preserve=(), draft=draft, twins_=twins_,
                       entries=entries, stack_traces=False)
    except Exception as e:
        if draft or not _draft_helps(e):
            raise
    return _export(module, kwargs, dynamic=dynamic, preserve=(), draft=True, twins_=twins_, entries=entries,
                   stack_traces=False)


def mode_blind(module) -> bool:
    """Whether switching `module` to train mode changes nothing but the `training` flags: no
    module in its tree overrides `train` or defines `training` on its class."""
    import torch
    for m in module.modules():
        cls = type(m)
        if cls.train is not torch.nn.Module.train or cls.eval is not torch.nn.Module.eval:
            return False
        if any("training" in vars(c) for c in cls.__mro__ if c is not torch.nn.Module):
            return False
    return True


@contextlib.contextmanager
def _training_reads(reads: list[str]):
    """Record in `reads` every read of any nn.Module's `training` flag while inside (yields
    True), through a data descriptor on nn.Module (which the instance attribute cannot shadow).
    Two reads are not recorded, as neither can change a traced graph: torch.fx copying a root's
    flag into a new GraphModule, and nn.Dropout's forward at p = 0 (its op is the same in both
    modes, and drops nothing). Yields False, recording nothing, where nn.Module already has a
    `training` class attribute."""
    import sys

    import torch
    from torch.fx.graph_module import GraphModule
    if "training" in vars(torch.nn.Module):
        yield False
        return
    harmless = GraphModule.__init__.__code__
    dropout = torch.nn.Dropout.forward.__code__

    def get(obj):
        try:
            value = obj.__dict__["training"]
        except KeyError:
            raise AttributeError("training") from None
        code = sys._getframe(1).f_code
        if code is not harmless and not (code is dropout and type(obj) is torch.nn.Dropout and obj.p == 0):
            reads.append(f"{type(obj).__name__} ({code.co_filename}:{code.co_name})")
        return value

    def set_(obj, value):
        obj.__dict__["training"] = value

    torch.nn.Module.training = property(get, set_)
    try:
        yield True
    finally:
        del torch.nn.Module.training


# ops that write their running statistics in place in training form, though their schema says not
_STAT_UPDATES = {"aten::batch_norm": ("training", "running_mean"), "aten::instance_norm": ("use_input_stats", "running_mean")}


def mutating(node) -> bool:
    """An op node that writes into one of its arguments: its aten schema says so (`copy_`,
    `index_put_`, `add_` on a view, an `out=` overload), or it is a norm in training form given
    running statistics, which it updates in place."""
    schema = getattr(node.target, "_schema", None)
    if node.op != "call_function" or schema is None:
        return False
    if schema.is_mutable:
        return True
    flag = _STAT_UPDATES.get(schema.name)
    if flag is None:
        return False
    from jaxformer.port.ops import bind
    args = bind(node)
    return bool(args.get(flag[0])) and args.get(flag[1]) is not None


def functional(program):
    """`program` with every in-place op and every write through a view made functional, the
    same computation: `buf[:, 1] = x` becomes `buf = select_scatter(buf, x, 1, 1)`, a write
    into a view of `y` a scatter into `y` that every later read of `y` sees (torch's own
    functionalization, `run_decompositions` with an empty table, which decomposes nothing
    else). A graph without such an op is returned as it is. Writes that outlive the call (into
    a buffer, an input) become outputs of the functional graph (`Port.root_outputs`)."""
    def writes(p):
        return [n for m in p.graph_module.modules() if hasattr(m, "graph") for n in m.graph.nodes if mutating(n)]
    found = writes(program)
    if not found:
        return program
    for node in found:
        _check_overlap(node)
    # the submodules' kept call signatures name graph nodes that functionalization renames (and
    # torch's verifier then refuses the program): they go, and the written functions take their
    # argument names from the calling code instead (emit.Port.input_names)
    for entry in program.module_call_graph:
        if entry.fqn:
            entry.signature = None
    program = program.run_decompositions({})
    left = writes(program)
    if left:  # never dropped silently: a write nothing reads is still a write
        from jaxformer.port.graph import op_name, where
        raise PortError(f"cannot port in-place aten op {op_name(left[0])}: torch's functionalization left it in "
                        f"the graph {where(left[0], '')}")
    return program


def _check_overlap(node) -> None:
    """Refuse an in-place op that reads memory it writes elsewhere (`h[:, 1:] += h[:, :-1]`): torch
    runs it element by element in memory order, each write seen by later reads (here a running
    sum), and its functional form (each read before any write) computes something else. A read
    of exactly the memory written (`h.add_(h)`) is safe."""
    import torch
    written = node.args[0].meta.get("val") if node.args and hasattr(node.args[0], "meta") else None
    if not isinstance(written, torch.Tensor):
        return
    for arg in node.args[1:]:
        read = arg.meta.get("val") if hasattr(arg, "meta") else None
        if not isinstance(read, torch.Tensor) or read.numel() == 0 or written.numel() == 0:
            continue
        try:
            overlaps = torch._C._overlaps(written, read)
        except Exception:  # no storage to compare (a value made by another op): no overlap
            continue
        same = (written.storage_offset(), tuple(written.shape), tuple(written.stride())) == \
            (read.storage_offset(), tuple(read.shape), tuple(read.stride()))
        if overlaps and not same:
            from jaxformer.port.graph import op_name, where
            raise PortError(f"cannot port in-place aten op {op_name(node)}: it reads memory it also writes at other "
                            f"places, so torch's result depends on the order its kernel visits memory; write it "
                            f"out of place {where(node, '')}")


def inline_no_grad(program) -> None:
    """Replace each `torch.no_grad()` region (the wrap_with_set_grad_enabled higher-order op,
    a subgraph) by its ops, in place, each output detached: no gradient flows out of it."""
    import torch
    graph = program.graph
    for node in list(graph.nodes):
        if node.op != "call_function" or "wrap_with_set_grad_enabled" not in str(node.target):
            continue
        enabled, sub, *operands = node.args
        body = getattr(program.graph_module, sub.target)
        env = dict(zip([n for n in body.graph.nodes if n.op == "placeholder"], operands, strict=False))
        with graph.inserting_before(node):
            for inner in body.graph.nodes:
                if inner.op in ("call_function", "call_method"):
                    env[inner] = graph.node_copy(inner, lambda n, env=env: env[n])
                elif inner.op == "output":
                    results = [env[r] for r in inner.args[0]]
            if not enabled:
                results = [_detached(graph, r) if isinstance(r.meta.get("val"), torch.Tensor) else r
                           for r in results]
        for user in list(node.users):
            user.replace_all_uses_with(results[user.args[1]])
            graph.erase_node(user)
        graph.erase_node(node)
        if not sub.users:
            graph.erase_node(sub)


def _detached(graph, node):
    import torch
    out = graph.call_function(torch.ops.aten.detach.default, (node,))
    out.meta = dict(node.meta)
    return out
