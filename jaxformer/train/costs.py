"""What a training step costs, counted without running it: the model's FLOPs (6 x active
params x tokens plus attention, as MaxText counts them), and, read off a jaxpr and an optimized
HLO text, the matmul FLOPs the program runs and the bytes each run of it reads and writes in HBM
and sends in collectives, loop trip counts applied (XLA's cost_analysis counts a while loop's
body once). jaxformer/train/aot.py's roofline reads its figures from here; nothing here compiles
or runs a program.
"""
from __future__ import annotations

import math
import re

from flax import nnx

from jaxformer.train.config import RunConfig

COLLECTIVES = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all", "collective-permute",
               "ragged-all-to-all")

_DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "f8e4m3fn": 1, "f8e5m2": 1, "f8e4m3": 1, "f8e5m2fnuz": 1,
                "f8e4m3fnuz": 1, "s4": 0.5, "u4": 0.5, "bf16": 2, "f16": 2, "s16": 2, "u16": 2,
                "f32": 4, "s32": 4, "u32": 4, "f64": 8, "s64": 8, "u64": 8, "c64": 8, "c128": 16}
_SHAPE = re.compile(r"\b(" + "|".join(_DTYPE_BYTES) + r")\[([\d,]*)\]")
_COMP = re.compile(r"^(ENTRY )?%?([\w.\-]+) (?:\(|\{)")
_COLLECTIVE = re.compile(r"^\s*(?:ROOT )?%([\w.\-]+) = (.*?) (" + "|".join(COLLECTIVES) + r")(?:-start)?\(")
_CALLEES = re.compile(r"(?:calls|to_apply|body|condition|branch_computations)=\{?(%[^}\s]*(?:, %[^}\s]*)*)")
_TRIP = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')


def _shape_bytes(text: str) -> float:
    return sum(_DTYPE_BYTES[d] * math.prod(int(n) for n in dims.split(",") if n) for d, dims in _SHAPE.findall(text))


def _group_size(line: str) -> int:
    """Devices in one replica group of a collective (`mesh[...] {'axis'}` or {{0,1,..}})."""
    m = re.search(r"replica_groups=mesh\[([^\]]*)\]\s*\{([^}]*)\}", line)
    if m:
        sizes = dict((k.strip("' "), int(v)) for k, v in (kv.split("=") for kv in m.group(1).split(",")))
        return math.prod(sizes.get(a.strip("' "), 1) for a in m.group(2).split(",") if a.strip())
    m = re.search(r"replica_groups=\{\{([\d,]*)\}", line)
    return len(m.group(1).split(",")) if m else 1


def _computations(hlo: str) -> tuple[dict[str, list[str]], str | None]:
    """The optimized HLO text -> ({computation name: its instruction lines}, the entry's name)."""
    comps: dict[str, list[str]] = {}
    entry, cur = None, None
    for line in hlo.splitlines():
        m = _COMP.match(line)
        if m and not line.startswith(" "):
            cur = m.group(2)
            comps[cur] = []
            if m.group(1):
                entry = cur
        elif cur is not None:
            comps[cur].append(line)
    return comps, entry


def _trip_count(comps: dict[str, list[str]], line: str) -> int | None:
    """A while instruction's trip count: its known_trip_count annotation (CPU, GPU), else read
    off its condition when that is `counter < constant` (TPU's optimized HLO carries no
    annotation; jax's scan and fori loops count from 0 in tuple element 0). None if neither."""
    m = _TRIP.search(line)
    if m:
        return int(m.group(1))
    cond = re.search(r"condition=%([\w.\-]+)", line)
    body = comps.get(cond.group(1), []) if cond else []
    consts = dict(re.findall(r"%([\w.\-]+) = s32\[\][^ ]* constant\((\d+)\)", "\n".join(body)))
    for ln in body:
        m = re.search(r"ROOT %[\w.\-]+ = pred\[\][^ ]* compare\(%([\w.\-]+), %([\w.\-]+)\), direction=LT", ln)
        if m and m.group(2) in consts and any(f"%{m.group(1)} = s32[]" in b and "index=0" in b for b in body):
            return int(consts[m.group(2)])
    return None


def _executions(comps: dict[str, list[str]], entry: str | None) -> tuple[dict[str, float], set[str]]:
    """How often one run of the program executes each computation (a while loop's body its
    trip count times per run of its caller, _trip_count), and which computations are fusion bodies
    (their values stay on chip). The parts of TPU's asynchronous collectives other than their
    start (the `async_collective_fusion` continuations, which run the same collective
    interleaved with compute, and the fusion of `async-collective-done`) are left out, so that
    each collective counts once."""
    runs: dict[str, float] = {}
    fused: set[str] = set()

    def visit(name: str, times: float, depth: int) -> None:
        if name not in comps or runs.get(name, 0) >= times or depth > 64:
            return
        runs[name] = times
        for line in comps[name]:
            if line.lstrip().startswith(("%async-collective-done", "ROOT %async-collective-done")):
                continue
            trip = _trip_count(comps, line) if " while(" in line else None
            is_fusion = " fusion(" in line
            for group in _CALLEES.findall(line):
                for callee in re.findall(r"%([\w.\-]+)", group):
                    if callee.startswith("async_collective_fusion"):
                        continue
                    if is_fusion or "to_apply=" in line:
                        fused.add(callee)
                    k = trip if trip and f"body=%{callee}" in line else 1
                    visit(callee, times * k, depth + 1)
    if entry is not None:
        visit(entry, 1, 0)
    return runs, fused


_DEF = re.compile(r"^\s*(?:ROOT )?%([\w.\-]+) = (\(.*?\)|[\w\[\],{}:()\d]+?) ([\w\-]+)\((.*)$")
_NO_TRAFFIC = ("parameter", "get-tuple-element", "tuple", "bitcast", "constant", "while", "call", "conditional",
               "after-all", "partition-id", "replica-id", "iota", "opt-barrier")


_SLICING = ("dynamic-slice", "slice", "gather")


def _fusion_traffic(body: list[str]) -> tuple[dict[int, float], float | None]:
    """What a fusion reads of its operands and writes, where that is less than their whole
    buffers: {operand index: bytes read} for a parameter used only through slices (a scan step
    reading its layer's slice of the stacked weights), and the bytes written when the root
    updates a parameter in place (dynamic-update-slice: the update, not the whole stack)."""
    params, shapes, uses = {}, {}, {}
    root = None
    for line in body:
        m = _DEF.match(line)
        if not m:
            continue
        var, shape, op, rest = m.groups()
        shapes[var] = shape
        if op == "parameter":
            params[var] = int(re.match(r"(\d+)", rest).group(1))
            continue
        operands = re.findall(r"%([\w.\-]+)", rest.split("), ")[0])
        for i, o in enumerate(operands):
            uses.setdefault(o, []).append((op, i, shape))
        if line.lstrip().startswith("ROOT"):
            root = (op, operands)
    reads = {}
    for var, index in params.items():
        found = uses.get(var, [])
        if found and all(op in _SLICING and i == 0 for op, i, _ in found):
            reads[index] = sum(_shape_bytes(shape) for _, _, shape in found)
    written = None
    if root and root[0] == "dynamic-update-slice" and root[1] and root[1][0] in params:
        reads[params[root[1][0]]] = 0.0  # updated in place: its other rows are not touched
        written = _shape_bytes(shapes.get(root[1][1], ""))
    return reads, written


def parse(hlo: str) -> tuple[dict[str, list[str]], dict[str, float], set[str]]:
    """(computations, how often each runs, the fusion bodies) of an optimized HLO text."""
    comps, entry = _computations(hlo)
    return (comps, *_executions(comps, entry))


def hlo_hbm_bytes(hlo) -> tuple[float, int]:
    """Per chip, one run of the program, loop trip counts applied (XLA's cost_analysis counts a
    while loop's body once, so a scanned model's figures there are one layer's): the bytes the
    top-level instructions read and write (operands and results of each fusion, copy,
    collective, custom call...; fusion bodies work on chip), and the number of while loops
    without a known trip count (counted once: the bytes are then a lower bound). A slice reads
    only its slice and an in-place update writes only the update (_fusion_traffic): a scanned
    layer reads its own weights out of the stack, not the stack. `hlo`: the text or parse's."""
    comps, runs, fused = parse(hlo) if isinstance(hlo, str) else hlo
    traffic: dict[str, tuple] = {}
    hbm = 0.0
    unknown = 0
    for name, times in runs.items():
        shapes: dict[str, str] = {}
        for line in comps[name]:
            m = _DEF.match(line)
            if not m:
                continue
            var, shape, op, rest = m.groups()
            shapes[var] = shape
            if op == "while" and _trip_count(comps, line) is None:
                unknown += 1
            if name in fused or op in _NO_TRAFFIC:
                continue
            operands = re.findall(r"%([\w.\-]+)", rest.split("), ")[0])
            sizes = [_shape_bytes(shapes.get(o, "")) for o in operands]
            out = _shape_bytes(shape)
            if op in ("dynamic-slice", "slice"):
                sizes = [out]
            elif op == "dynamic-update-slice" and len(sizes) > 1:
                sizes, out = [sizes[1]], sizes[1]
            elif op in ("dynamic-slice-start", "dynamic-update-slice-start"):  # async (host offload):
                sizes, out = sizes[1:2] if op == "dynamic-update-slice-start" else [], 0.0  # the update moves
            elif op == "dynamic-update-slice-done":
                sizes, out = [], 0.0
            elif op == "dynamic-slice-done":  # the slice arrives
                sizes = []
            elif op == "fusion":
                callee = re.search(r"calls=%([\w.\-]+)", line)
                if callee and callee.group(1) in comps:
                    if callee.group(1) not in traffic:
                        traffic[callee.group(1)] = _fusion_traffic(comps[callee.group(1)])
                    reads, written = traffic[callee.group(1)]
                    sizes = [reads.get(i, b) for i, b in enumerate(sizes)]
                    out = out if written is None else written
            hbm += times * (out + sum(sizes))
    return hbm, unknown


def jaxpr_flops(jaxpr) -> float:
    """The matmul FLOPs of a (closed) jaxpr, the whole program's, every device's together: 2 x
    the multiply-adds of each dot_general and ragged_dot, a scan's body times its length, a
    while loop's body once, the larger branch of a cond, a rematerialised forward where the
    backward recomputes it. (XLA's HLO of a TPU program hides its dots inside convolutions
    with dilations and strides, and its cost_analysis counts loop bodies once; the jaxpr says
    what the program multiplies.) A shard_map body's FLOPs count once per device it runs on."""
    return sum(jaxpr_flops_by_type(jaxpr).values())


def _operand_type(dtypes) -> str:
    """A dot's rate class by its operands: "int8" (both 8-bit integers), "fp8" (both 8-bit
    floats: e4m3 / e5m2), else "float"."""
    names = {str(d) for d in dtypes}
    if names <= {"int8", "uint8"}:
        return "int8"
    if all(n.startswith("float8") for n in names):
        return "fp8"
    return "float"


def jaxpr_flops_by_type(jaxpr) -> dict[str, float]:
    """jaxpr_flops split by the operands' type ("float", "int8", "fp8"; _operand_type): a chip
    runs int8 and fp8 products at their own peak rates (aot.Chip; train.quantization)."""
    from jax.extend import core as jcore
    total = {"float": 0.0, "int8": 0.0, "fp8": 0.0}

    def add(part: dict, times: float = 1.0) -> None:
        for k, v in part.items():
            total[k] += times * v

    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        if name == "dot_general":
            (lc, _), _ = eqn.params["dimension_numbers"]
            lhs = eqn.invars[0].aval.shape
            kind = _operand_type(v.aval.dtype for v in eqn.invars[:2])
            total[kind] += 2.0 * math.prod(eqn.outvars[0].aval.shape) * math.prod(lhs[d] for d in lc)
            continue
        if name in ("ragged_dot_general", "ragged_dot"):
            m, k = eqn.invars[0].aval.shape[0], eqn.invars[0].aval.shape[-1]
            total[_operand_type(v.aval.dtype for v in eqn.invars[:2])] += 2.0 * m * k * eqn.outvars[0].aval.shape[-1]
            continue
        subs = [v for v in eqn.params.values() if isinstance(v, (jcore.ClosedJaxpr, jcore.Jaxpr))]
        subs += [b for v in eqn.params.values() if isinstance(v, (tuple, list))
                 for b in v if isinstance(b, (jcore.ClosedJaxpr, jcore.Jaxpr))]
        inner = [jaxpr_flops_by_type(b.jaxpr if isinstance(b, jcore.ClosedJaxpr) else b) for b in subs]
        if not inner:
            continue
        if name == "scan":
            for part in inner:
                add(part, eqn.params["length"])
        elif name == "shard_map":  # its body's shapes are one device's: times the devices it runs on
            mesh = eqn.params["mesh"]
            axes = eqn.params.get("newly_manual_axes") or eqn.params.get("manual_axes") or mesh.axis_names
            for part in inner:
                add(part, math.prod(mesh.shape[a] for a in axes))
        elif name == "cond":
            add(max(inner, key=lambda part: sum(part.values())))
        else:
            for part in inner:
                add(part)
    return total


def collectives(hlo) -> dict:
    """Count and bytes per kind of the collectives one run of the program executes, per chip,
    read from the optimized HLO (_executions says what runs how often). Bytes: the buffer the
    collective produces, for a reduce-scatter its input (output x group). TPU lowers a
    reduce-scatter as an all-reduce inside an `all-reduce-scatter` fusion: counted as one.
    `hlo`: the text or parse's."""
    comps, runs, _ = parse(hlo) if isinstance(hlo, str) else hlo
    out = {k: {"count": 0, "bytes": 0} for k in COLLECTIVES}
    for name, times in runs.items():
        for line in comps[name]:
            m = _COLLECTIVE.match(line)
            if not m:
                continue
            kind = "reduce-scatter" if name.startswith("all-reduce-scatter") else m.group(3)
            nbytes = _shape_bytes(m.group(2))
            if m.group(3) == "reduce-scatter":
                nbytes *= _group_size(line)
            out[kind]["count"] += int(times)
            out[kind]["bytes"] += int(times * nbytes)
    return out


_DCN = re.compile(r'^\s*(?:ROOT )?%[\w.\-]+ = \((.*?), u32\[\], token\[\]\) send\(.*'
                  r'_xla_megascale_transfer_type="(\w+)"')


def dcn_transfers(hlo) -> dict:
    """Count and bytes per kind of the transfers between slices one run of a multi-slice TPU
    program makes, per chip. XLA's TPU compiler partitions such a program per slice (the
    collectives above stay inside a slice, on ICI) and moves data between slices with
    host-transfer sends to its megascale runtime over the data-center network, each tagged
    with its kind (ALL_REDUCE, ALL_GATHER, ...): bytes are each send's buffer."""
    comps, runs, _ = parse(hlo) if isinstance(hlo, str) else hlo
    out: dict[str, dict] = {}
    for name, times in runs.items():
        for line in comps[name]:
            m = _DCN.match(line)
            if m:
                kind = out.setdefault(m.group(2).lower().replace("_", "-"), {"count": 0, "bytes": 0})
                kind["count"] += int(times)
                kind["bytes"] += int(times * _shape_bytes(m.group(1)))
    return out


# ----------------------------------------------------------------------------- the model's FLOPs
def _is_embedding_table(path: str) -> bool:
    return bool(re.search(r"(^|\.)(embed_tokens|wte|wpe|embed_positions|position_embedding)\.embedding$", path))


def model_facts(cfg: RunConfig, params) -> dict:
    """param_count (every parameter), active_params (those one token's forward multiplies by:
    the lookup tables left out unless the LM head is the tied table; each MoE expert weight
    scaled by top_k / num_experts) and tokens_per_step."""
    m = cfg.model
    moe = getattr(getattr(m, "feedforward", None), "moe", None)
    total = active = 0
    tied = getattr(m, "tie_embeddings", False)
    for path, v in nnx.to_flat_state(params):
        key = ".".join(str(p) for p in path)
        n = math.prod(v.get_value().shape) if hasattr(v, "get_value") else math.prod(v.shape)
        total += n
        if _is_embedding_table(key):
            active += n if (tied and "embed_tokens" in key) else 0
        elif moe is not None and re.search(r"experts\.(gate_proj|up_proj|down_proj)", key):
            active += n * moe.top_k / moe.num_experts
        else:
            active += n
    tc = cfg.train
    return {"param_count": int(total), "active_params": int(active),
            "tokens_per_step": tc.batch_size * _items_per_example(cfg)}


def _items_per_example(cfg: RunConfig) -> int:
    """Tokens per example the model trains on (an image or a series counts one)."""
    if cfg.family == "seq2seq":
        return getattr(cfg.data, "tgt_len", 1)
    return getattr(cfg.data, "seq_len", 1)


def attention_flops(cfg: RunConfig, batch: int, t: int) -> float:
    """Training FLOPs of the attention scores and weighted sum, as MaxText counts them: 4 B T^2
    heads head_dim per layer forward (two matmuls), x3 for forward + backward, halved under a
    causal mask; a sliding-window layer attends to at most `window` keys."""
    m = cfg.model
    att = getattr(m, "attention", m)  # a stack config's record, else a vision config's own fields
    if not hasattr(att, "num_heads"):  # a model.module: its attention's shapes are its own, not counted
        return 0.0
    head_dim = getattr(att, "head_dim", None) or m.d_model // att.num_heads
    total = 0.0
    local = m.local_layers() if hasattr(m, "local_layers") else [False] * m.num_layers
    for is_local in local:
        keys = min(t, att.sliding_window) if is_local and att.sliding_window else t
        total += 4 * batch * t * keys * att.num_heads * head_dim * (0.5 if keys == t else 1.0)
    return 3 * total


def model_flops_per_step(cfg: RunConfig, facts: dict) -> float:
    """6 x active params x tokens (forward 2, backward 4) plus attention_flops."""
    tc = cfg.train
    return 6.0 * facts["active_params"] * facts["tokens_per_step"] + attention_flops(cfg, tc.batch_size,
                                                                                   _items_per_example(cfg))


def splash_flops(cfg: RunConfig, kernels: list) -> float:
    """The FLOPs of a train step's splash-attention kernels, every chip's together. A Pallas call
    shows the jaxpr no FLOPs (splash declares no cost estimate), so jaxpr_flops misses them:
    counted here as the kernel runs them, over the blocks a causal (or windowed) mask leaves
    visible (attention_flops' half, as MaxText counts): its forward's two matmuls, again in the
    backward under remat (jax.checkpoint recomputes the layer), and the backward's five (scores
    and dP recomputed, dq, dk, dv). attention_flops is 3 x the forward's."""
    runs = [k for k in kernels if k.split(" ")[0] == "splash"]  # as asked, or attention auto's choice
    if not runs:
        return 0.0
    share = len(runs) / len(kernels)  # the layers whose attention splash ran
    forward = attention_flops(cfg, cfg.train.batch_size, cfg.data.seq_len) / 3
    matmuls = 2 + 5 + (2 if cfg.train.remat else 0)
    return share * forward * matmuls / 2
