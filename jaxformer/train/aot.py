"""Ahead-of-time compilation of the trainer's own programs for a TPU slice, from any host:
`jaxformer compile` (jaxformer/cli/compile.py) and bench/tpu_plan.py.

With libtpu installed (the `tpu` and `test` extras), XLA's TPU compiler runs on a CPU host:
`jax.experimental.topologies.get_topology_desc` gives the devices of a slice ("v5p:4x4x4"),
a Mesh is built from them, and `jax.jit(step).lower(ShapeDtypeStructs with NamedShardings)
.compile()` returns the TPU executable, with its memory_analysis, its cost_analysis
(including `optimal_seconds`, the compiler's own estimate of the step time) and its HLO. No
weight is allocated: the state is `nnx.eval_shape`'s, placed by the trainer's own shardings.

What is compiled is what `jaxformer train` runs on a mesh: StepFns.train_step (optimizer,
precision, remat, scan, grad accumulation, MoE aux losses, LoRA), the same logical-axis rules,
jit with the state donated and its shardings out, traced under StepFns.tracing() with the
platform switch set to "tpu" (jaxformer/lowering.py), so every backend choice (the splash
kernel, ragged_dot, ragged_all_to_all) is the TPU's. `--step decode` compiles generation's
prefill and its one-token cached step (jaxformer.generation.lm_forward) the same way.

Every time and MFU figure here is an ESTIMATE, never a measurement: the compiler's
`optimal_seconds`, and a roofline of our own (compute, HBM traffic and collective bytes each
over the chip's peak rate from CHIPS). Neither runs the program.
"""
from __future__ import annotations

import collections
import contextlib
import dataclasses
import math
import os
import re
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jaxformer import lowering
from jaxformer.config import ConfigError
from jaxformer.config.module import MODULE
from jaxformer.train import costs, sharding, tasks
from jaxformer.train import init as init_lib
from jaxformer.train import lora as lora_lib
from jaxformer.train.config import RunConfig, check_sections
from jaxformer.train.optim import make_optax
from jaxformer.train.steps import StepFns

GiB = 1 << 30


@dataclasses.dataclass(frozen=True)
class Chip:
    """One accelerator's published per-chip figures: HBM bytes, peak dense bf16 FLOP/s, HBM
    bytes/s and bidirectional interconnect bytes/s (TPU: ICI, Google Cloud's TPU pages; NVIDIA:
    NVLink, NVIDIA's H100/H200 data sheets). A GPU also carries what XLA's GPU compiler needs
    to target it without one (gpu_target_config): streaming multiprocessors, clock (GHz), L2
    bytes, compute capability."""

    hbm_bytes: int
    peak_flops: float
    hbm_bytes_per_s: float
    ici_bytes_per_s: float
    platform: str = "tpu"
    name: str = ""
    sms: int = 0
    clock_ghz: float = 0.0
    l2_bytes: int = 0
    capability: tuple[int, int] = (0, 0)
    dcn_bytes_per_s: float = 0.0  # data-center network bytes/s per chip (multi-slice); 0: not published
    int8_ops: float = 0.0  # peak dense int8 OP/s (0: the bf16 rate)
    fp8_flops: float = 0.0  # peak dense fp8 FLOP/s (0: the bf16 rate; no fp8 units)

    def rate(self, kind: str) -> float:
        """Peak rate of a product whose operands are `kind` (costs.jaxpr_flops_by_type's)."""
        return {"int8": self.int8_ops, "fp8": self.fp8_flops}.get(kind) or self.peak_flops


# int8: Google Cloud's TPU pages (v4 has no faster int8 path: its int8 rate is its bf16 one);
# DCN per chip: the same pages (v5p 50 Gbps a chip; v5e two 100 Gbps NICs per 8-chip host);
# NVIDIA's data sheets, dense (without sparsity) for int8 and fp8; no TPU here has fp8 units
CHIPS = {
    "v4": Chip(32 * GiB, 275e12, 1200e9, 300e9, int8_ops=275e12),
    "v5e": Chip(16 * GiB, 197e12, 819e9, 400e9, int8_ops=394e12, dcn_bytes_per_s=25e9 / 8),
    "v5p": Chip(95 * GiB, 459e12, 2765e9, 1200e9, int8_ops=918e12, dcn_bytes_per_s=50e9 / 8),
    "v6e": Chip(32 * GiB, 918e12, 1640e9, 800e9, int8_ops=1836e12),
    "h100": Chip(80 * 10**9, 989e12, 3.35e12, 900e9, "gpu", "NVIDIA H100 80GB HBM3", 132, 1.98, 50 * 2**20, (9, 0),
                 int8_ops=1979e12, fp8_flops=1979e12),
    "h200": Chip(141 * 10**9, 989e12, 4.8e12, 900e9, "gpu", "NVIDIA H200 141GB HBM3e", 132, 1.98, 50 * 2**20, (9, 0),
                 int8_ops=1979e12, fp8_flops=1979e12),
}


# ----------------------------------------------------------------------------- the slice
def chip_of(topology: str) -> Chip:
    gen = topology.split(":")[0].lower()
    if gen not in CHIPS:
        raise ValueError(f"topology {topology!r}: unknown TPU generation or GPU {gen!r}; known: {', '.join(CHIPS)} "
                         "(e.g. v5p:4x4x4, v5e:16x16, v6e:16x16, v4:2x2x2, h100:8, h200:2x8)")
    return CHIPS[gen]


def devices_for(topology: str, slices: int = 1) -> list:
    """The compile-only devices of a TPU slice ("v5p:4x4x4"; `slices` of them joined by the
    data-center network) or of NVIDIA GPUs ("h200:8", "h100:2x8" = 2 hosts of 8)."""
    if chip_of(topology).platform == "gpu":
        if slices > 1:
            raise ValueError(f"--slices / parallel.slices is for TPU slices; {topology} names GPU hosts "
                             "(h100:2x8 = 2 hosts of 8, one mesh)")
        return gpu_devices(topology)
    return tpu_devices(topology, slices)


def gpu_target_config(chip: Chip) -> str:
    """XLA's GpuTargetConfigProto, as text, for a GPU described by `chip`: what the GPU compiler
    reads off a device when there is one (the per-SM limits are those of every Hopper GPU)."""
    major, minor = chip.capability
    return f"""gpu_device_info {{
  threads_per_block_limit: 1024
  threads_per_warp: 32
  shared_memory_per_block: 49152
  shared_memory_per_block_optin: 232448
  shared_memory_per_core: 233472
  threads_per_core_limit: 2048
  core_count: {chip.sms}
  fpus_per_core: 128
  block_dim_limit_x: 2147483647
  block_dim_limit_y: 65535
  block_dim_limit_z: 65535
  memory_bandwidth: {int(chip.hbm_bytes_per_s)}
  l2_cache_size: {chip.l2_bytes}
  clock_rate_ghz: {chip.clock_ghz}
  device_memory_size: {chip.hbm_bytes}
  registers_per_core_limit: 65536
  registers_per_block_limit: 65536
  cuda_compute_capability {{ major: {major} minor: {minor} }}
}}
platform_name: "CUDA"
device_description_str: "{chip.name}"
"""


def gpu_devices(topology: str) -> list:
    """Compile-only devices of `topology` ("h200:8": one host of 8; "h100:2x8": 2 hosts of 8)
    from jax's CUDA plugin and a target config (gpu_target_config): no GPU needed, but the
    plugin must load without one (JAX_PLATFORMS=cpu, which `jaxformer compile` sets) and XLA
    needs ptxas and libdevice (the nvidia-cuda-nvcc-cu12 wheel that jax[cuda12] brings)."""
    chip = chip_of(topology)
    shape = topology.split(":", 1)[1] if ":" in topology else ""
    parts = shape.split("x")
    if not shape or len(parts) > 2 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise ValueError(f"topology {topology!r}: name the GPUs as {topology.split(':')[0]}:N (one host of N) "
                         f"or {topology.split(':')[0]}:HxN (H hosts of N)")
    hosts, per_host = (1, int(parts[0])) if len(parts) == 1 else (int(parts[0]), int(parts[1]))
    try:
        from jax.experimental import topologies
        desc = topologies.get_topology_desc("", "cuda", target_config=gpu_target_config(chip),
                                            topology=f"1x{hosts}x{per_host}")
    except (NotImplementedError, RuntimeError, ValueError) as e:
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(f"compiling for {chip.name} needs jax's CUDA plugin, loaded with JAX_PLATFORMS=cpu "
                         f"(pip install 'jaxformer[cuda12]'): {msg}") from None
    return list(desc.devices)


@contextlib.contextmanager
def _quiet_fd2():
    """libtpu writes its host-discovery warnings ("could not determine TPU accelerator type",
    meaningless off a TPU VM) straight to file descriptor 2; they are dropped here, and shown
    only when the topology cannot be made."""
    saved = os.dup(2)
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield sink
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def tpu_devices(topology: str, slices: int = 1) -> list:
    """The devices of a TPU slice ("v5p:4x4x4"), or of `slices` such slices (each device's
    slice_index says which), for compiling without one (needs libtpu)."""
    chip_of(topology)
    # libtpu takes a machine-wide lock file (/tmp/libtpu_lockfile) meant for processes that
    # drive real chips; a compiler-only process needs none, and two compiles (two test workers,
    # a bench beside a CLI run) would otherwise refuse each other
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    try:
        from jax.experimental import topologies
        with _quiet_fd2():
            desc = topologies.get_topology_desc(platform="tpu", topology_name=topology,
                                                **({"num_slices": slices} if slices > 1 else {}))
    except ImportError as e:
        raise ValueError(f"compiling for TPU needs libtpu: pip install 'jaxformer[tpu]' ({e})") from None
    except (RuntimeError, ValueError) as e:
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        if "unknown backend" in msg.lower() or "no such file" in msg.lower() or "not found" in msg.lower():
            raise ValueError(f"compiling for TPU needs libtpu (pip install 'jaxformer[tpu]'): {msg}") from None
        raise ValueError(f"topology {topology!r}: {msg}") from None
    return list(desc.devices)


def mesh_for(cfg: RunConfig, devices: list):
    """The trainer's (data, fsdp, expert, context, tensor) mesh over `devices`, sized by
    parallel.mesh (data -1 takes the rest)."""
    m = cfg.parallel.mesh
    return sharding.make_mesh(m.data, m.fsdp, m.tensor, m.expert, devices=devices, context=m.context,
                              slices=cfg.parallel.slices, dcn_axis=cfg.parallel.dcn_axis, pipeline=m.pipeline)


def as_mesh_run(cfg: RunConfig) -> RunConfig:
    """A config as compiled for a slice: parallel.mode mesh (a config written for one device
    becomes data parallel over the slice, mesh.data -1), its mesh and rules otherwise as set."""
    if cfg.parallel.mode == "mesh":
        return cfg
    return dataclasses.replace(cfg, parallel=dataclasses.replace(cfg.parallel, mode="mesh", num_devices=None))


# ----------------------------------------------------------------------------- programs
@dataclasses.dataclass
class Program:
    """A lowered-and-compiled program with what the report needs beside it."""

    name: str
    compiled: object
    compile_s: float
    state_bytes: dict  # per chip: {"params": n, "opt_state": n, ...}
    kernels: list  # lowering.note_kernel's records while tracing
    largest: list  # the largest per-chip state leaves: (path, bytes)
    program_flops: float  # jaxpr_flops of the whole program (all chips)
    quantized_flops: dict = dataclasses.field(default_factory=dict)  # of them, int8 / fp8 products


def _itemsize(dtype) -> int:
    """Bytes per element; a PRNG key (threefry: two uint32 words) counts its key data."""
    if jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
        return 8
    return np.dtype(dtype).itemsize


def _shard_bytes(x) -> int:
    """Bytes one chip holds of an abstract leaf with a sharding (shards are equal, or replicated)."""
    shape = x.sharding.shard_shape(x.shape) if getattr(x, "sharding", None) is not None else x.shape
    return math.prod(shape) * _itemsize(x.dtype)


def _per_chip_bytes(tree) -> int:
    """Bytes one chip holds of an abstract tree of ShapeDtypeStructs with shardings."""
    return sum(_shard_bytes(x) for x in jax.tree.leaves(tree))


def _leaf_report(tree, top: int = 3) -> list[tuple[str, int]]:
    """The `top` largest per-chip leaves of an abstract sharded tree: (path, bytes)."""
    rows = [(sharding._key_of(path), _shard_bytes(x)) for path, x in jax.tree_util.tree_flatten_with_path(tree)[0]]
    return sorted(rows, key=lambda r: -r[1])[:top]


def _abstract_train(cfg: RunConfig, mesh):
    """(StepFns, the abstract state carrying its shardings, the shardings, the axis rules)."""
    from jaxformer.convert import scan_prefixes
    from jaxformer.train.jax_trainer import model_config_for_training, set_remat, unannotated_params
    tc = cfg.train
    model = init_lib.abstract_model(cfg.model_name, model_config_for_training(cfg), tc.seed, tc.lora)
    set_remat(model, tc.remat_policy if tc.remat else None)
    if cfg.model_name == MODULE:  # its call and logits against the task (one line when they do not fit)
        tasks.check_call(cfg, model, {k: jax.ShapeDtypeStruct((2,) + v.shape[2:], v.dtype)
                                      for k, v in batch_specs(cfg, mesh, cfg.parallel.logical_axis_rules()).items()})
    _, params, _, _ = lora_lib.split(model)
    tx, schedule = make_optax(tc, params, scan_prefixes(model))
    abstract = init_lib.abstract_state_of(model, tx)
    rules = cfg.parallel.logical_axis_rules()
    shardings = sharding.state_shardings(abstract, mesh, rules, unannotated_params(cfg))
    state = init_lib.with_shardings(abstract, shardings)
    fns = StepFns(cfg, model, tx, schedule)
    return fns, state, shardings, rules


def batch_specs(cfg: RunConfig, mesh, rules, packed: bool = False) -> dict:
    """The train step's batch as ShapeDtypeStructs [A, micro, T + 1] in the trainer's batch
    sharding; packed: with the segment ids a packed tokens dataset carries (data.packing)."""
    tc = cfg.train
    sh = sharding.batch_sharding(mesh, axes=rules["batch"])
    if cfg.family != "lm":  # a model.module of another task: the shapes of one of its data's examples
        from jaxformer.train import data as data_lib
        example = data_lib.load_sources(cfg.data_name, cfg.data, tc.seed)[0][0]
        return {k: jax.ShapeDtypeStruct((tc.grad_accum_steps, tc.micro_batch) + np.shape(v), np.asarray(v).dtype,
                                        sharding=sh) for k, v in example.items()}
    shape = (tc.grad_accum_steps, tc.micro_batch, cfg.data.seq_len + 1)
    out = {"tokens": jax.ShapeDtypeStruct(shape, jnp.int32, sharding=sh)}
    if packed:
        out["segment_ids"] = jax.ShapeDtypeStruct(shape, jnp.int32, sharding=sh)
    return out


class DoesNotFit(ValueError):
    """The TPU compiler refused the program: its buffers exceed the chip's HBM. `needed` is
    the compiler's figure for them (bytes), `state_bytes` the per-chip state."""

    def __init__(self, message: str, needed: float | None, state_bytes: dict, largest: list):
        super().__init__(message)
        self.needed, self.state_bytes, self.largest = needed, state_bytes, largest


_SIZE = re.compile(r"([\d.]+)([KMGTP]?)\b")


def _compiler_bytes(text: str) -> float | None:
    """"1.49T" -> bytes (the compiler's binary units)."""
    m = _SIZE.fullmatch(text.strip())
    if not m:
        return None
    return float(m.group(1)) * (1 << (10 * " KMGTP".index(m.group(2) or " ")))


def _compile(name: str, fn, args, mesh, state_bytes: dict, largest: list) -> tuple[object, float, list, float]:
    """Trace, lower and compile `fn` for the TPU mesh (traced for the TPU platform) ->
    (compiled, seconds, kernels, the jaxpr's FLOPs by operand type). A program over the chip's HBM raises
    DoesNotFit; any other memory the compiler runs out of (a Pallas kernel's VMEM) raises
    ValueError with the compiler's own message."""
    t0 = time.perf_counter()
    try:
        platform = "gpu" if mesh.devices.flat[0].platform in ("gpu", "cuda") else "tpu"
        with jax.set_mesh(mesh), lowering.recording_kernels() as kernels, lowering.tracing(platform=platform):
            traced = fn.trace(*args)
            compiled = traced.lower().compile()
    except jax.errors.JaxRuntimeError as e:
        text = str(e)
        if "RESOURCE_EXHAUSTED" not in text:
            raise
        if not re.search(r"\bhbm\b", text, re.IGNORECASE):  # another memory (a kernel's VMEM...): its own words
            raise ValueError(f"{name}: the {platform.upper()} compiler refused the program: "
                             f"{text.strip().split(': ', 1)[-1]}") from None
        m = re.search(r"required for [^(]*\(([^)]+)\) exceeds available HBM \(([^)]+)\)", text)
        needed = _compiler_bytes(m.group(1)) if m else None
        raise DoesNotFit(f"{name}: the TPU compiler ran out of HBM: {text.splitlines()[0].split(': ', 1)[-1]}",
                         needed, state_bytes, largest) from None
    return compiled, time.perf_counter() - t0, kernels, costs.jaxpr_flops_by_type(traced.jaxpr.jaxpr)


def _quantized(flops: dict) -> dict:
    return {k: v for k, v in flops.items() if k != "float" and v}


def compile_train(cfg: RunConfig, mesh, packed: bool = False) -> tuple[Program, dict]:
    """Compile the trainer's train step for `mesh` (TPU devices) -> (Program, facts about the
    model: param_count, active_params, tokens_per_step)."""
    fns, state, shardings, rules = _abstract_train(cfg, mesh)
    batch = batch_specs(cfg, mesh, rules, packed)
    replicated = NamedSharding(mesh, P())
    step = jax.jit(fns.train_step, donate_argnums=0, out_shardings=(shardings, replicated))
    state_bytes = {k: _per_chip_bytes(v) for k, v in state.items()}
    largest = _leaf_report({"params": state["params"], "opt_state": state["opt_state"]})
    compiled, secs, kernels, flops = _compile("train", step, (state, batch), mesh, state_bytes, largest)
    prog = Program("train", compiled, secs, state_bytes, kernels, largest, sum(flops.values()), _quantized(flops))
    return prog, costs.model_facts(cfg, state["params"])


def cache_shardings(cache, mesh, rules, scanned: bool):
    """KV cache leaves [(layers,) B, G, L, K] (MLA: [(layers,) B, L, C]): the batch split like
    the train batch, the key/value heads like the attention heads."""
    def f(x):
        axes = ("layers",) if scanned else ()
        axes += ("batch", "heads") + (None,) * (x.ndim - len(axes) - 2) if x.ndim - len(axes) >= 4 else \
            ("batch",) + (None,) * (x.ndim - len(axes) - 1)
        return NamedSharding(mesh, sharding.spec_for(x.shape, axes[:x.ndim], mesh, rules))
    return jax.tree.map(f, cache)


def compile_decode(cfg: RunConfig, mesh, prompt_len: int | None = None, cache_len: int | None = None):
    """Compile generation's prefill (a [B, prompt_len] prompt into an empty cache) and its
    one-token cached step, B = train.batch_size, for `mesh` -> ([Program, Program], facts)."""
    from jaxformer.generation import lm_forward
    from jaxformer.train.jax_trainer import model_config_for_training
    mcfg = model_config_for_training(cfg)
    b = cfg.train.batch_size
    p = prompt_len or cfg.data.seq_len
    length = cache_len or mcfg.max_len
    if p > length:
        raise ValueError(f"--prompt-len {p} exceeds the cache length {length} (--cache-len / model.max_len)")
    model = init_lib.abstract_model(cfg.model_name, mcfg, cfg.train.seed)
    model.eval()
    graphdef, state = nnx.split(model)
    rules = cfg.parallel.logical_axis_rules()
    params = nnx.split(model, nnx.Param, ...)[1]
    replicated = NamedSharding(mesh, P())
    by_path = dict(nnx.to_flat_state(sharding.param_shardings(params, mesh, rules)))

    def placed(path, v):  # params by their logical axes; RNG streams and buffers replicated
        sh = by_path[path].get_value() if path in by_path else replicated
        x = v.get_value()
        return path, v.replace(jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sh))
    state_in = nnx.from_flat_state([placed(path, v) for path, v in nnx.to_flat_state(state)])
    scanned = bool(getattr(mcfg, "scan_layers", False))
    cache = jax.eval_shape(lambda: nnx.merge(graphdef, state).init_cache(b, length))
    c_sh = cache_shardings(cache, mesh, rules, scanned)
    cache_in = jax.tree.map(lambda x, sh: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sh), cache, c_sh)
    row = sharding.batch_sharding(mesh, accum_axis=False, axes=rules["batch"])
    slot_mask = jax.ShapeDtypeStruct((b, length), jnp.int32, sharding=row)
    index = jax.ShapeDtypeStruct((), jnp.int32, sharding=replicated)

    def forward(state, ids, slot_mask, cache, cache_index):
        return lm_forward(graphdef, state, ids, slot_mask, cache, cache_index, elementwise=False)

    fn = jax.jit(forward, donate_argnums=(3,), out_shardings=(None, c_sh))
    state_bytes = {"params": _per_chip_bytes(state_in), "kv_cache": _per_chip_bytes(cache_in)}
    largest = _leaf_report({"params": state_in, "kv_cache": cache_in})
    progs = []
    for name, t in (("prefill", p), ("decode_step", 1)):
        ids = jax.ShapeDtypeStruct((b, t), jnp.int32, sharding=row)
        compiled, secs, kernels, flops = _compile(name, fn, (state_in, ids, slot_mask, cache_in, index), mesh,
                                                  state_bytes, largest)
        progs.append(Program(name, compiled, secs, state_bytes, kernels, largest, sum(flops.values()),
                             _quantized(flops)))
    facts = costs.model_facts(cfg, params)
    facts["tokens_per_step"] = {"prefill": b * p, "decode_step": b}
    return progs, facts


# ----------------------------------------------------------------------------- the report
def _cost(compiled) -> dict:
    ca = compiled.cost_analysis()
    ca = (ca[0] if ca else {}) if isinstance(ca, (list, tuple)) else (ca or {})
    return {"flops": float(ca.get("flops", 0.0)), "bytes_accessed": float(ca.get("bytes accessed", 0.0)),
            "optimal_seconds": float(ca.get("optimal_seconds", 0.0))}


def attention_kernel(kernels: list) -> str:
    """What the traced attention calls ran, most frequent first ("splash x32")."""
    if not kernels:
        return "none"
    return "; ".join(f"{k} x{n}" if n > 1 else k for k, n in collections.Counter(kernels).most_common())


_AUTO = re.compile(r"(.*) \[auto: (.*)\]")


def attention_choices(kernels: list) -> list[dict]:
    """Each distinct attention choice of the traced calls, most frequent first: {kernel, why,
    calls}. why: train.attention "auto"'s reason (layers/dispatch.py choose_attention), or
    "as train.attention asks" for an explicit setting. A scanned stack traces its layers once,
    so its calls count once."""
    out = []
    for entry, n in collections.Counter(kernels).most_common():
        m = _AUTO.fullmatch(entry)
        kernel, why = (m.group(1), m.group(2)) if m else (entry, "as train.attention asks")
        out.append({"kernel": kernel, "why": why, "calls": n})
    return out


def roofline_of(flops: float, hbm_bytes: float, collective_bytes: float, chip: Chip,
                quantized: dict | None = None, dcn_bytes: float = 0.0) -> dict:
    """One run of a program on one chip, each part at the chip's peak rate (perfect overlap):
    FLOPs over peak bf16 FLOP/s (of them, `quantized`'s int8 / fp8 products at the chip's int8 /
    fp8 rate: Chip.rate), HBM bytes over HBM bandwidth, collective bytes over ICI bandwidth,
    a multi-slice program's DCN bytes over the chip's DCN bandwidth (dcn_s; None where no
    figure is published: then not in the bound); bound_s is the largest, bound_by names it."""
    quantized = quantized or {}
    compute = (flops - sum(quantized.values())) / chip.peak_flops
    compute += sum(v / chip.rate(kind) for kind, v in quantized.items())
    roofline = {"compute_s": compute, "hbm_s": hbm_bytes / chip.hbm_bytes_per_s,
                "collective_s": collective_bytes / chip.ici_bytes_per_s}
    if dcn_bytes:
        roofline["dcn_s"] = dcn_bytes / chip.dcn_bytes_per_s if chip.dcn_bytes_per_s else None
    parts = [k for k, v in roofline.items() if v is not None]
    roofline["bound_s"] = max(roofline[k] for k in parts)
    roofline["bound_by"] = max(parts, key=roofline.get)[:-2]
    return roofline


def program_report(prog: Program, chip: Chip, chips: int, model_flops: float, tokens: int,
                   kernel_flops: float = 0.0) -> dict:
    """The figures of one compiled program, per chip.

    Two estimates of its time, neither a measurement:
      * the compiler's `optimal_seconds` (cost_analysis). It covers the whole program only
        when the program has no while loop: XLA counts a loop body once (a scanned model's
        figure is one layer's), and for some loops (MoE's ragged exchange, ring attention)
        it returns a negative number. est_step_s takes it where it is whole;
      * a roofline of our own, loop-aware: the program's matmul FLOPs (jaxpr_flops, split
        evenly over the chips) over the chip's peak bf16 rate (int8 / fp8 products at
        theirs: train.quantization), the HBM bytes of its top-level instructions
        (hlo_hbm_bytes) over HBM bandwidth, and its collectives' bytes (`collectives`) over
        ICI bandwidth; the bound is the largest of the three (perfect overlap). est_step_s
        takes it where the compiler's figure is not whole.
    """
    mem = prog.compiled.memory_analysis()
    cost = _cost(prog.compiled)
    hlo = prog.compiled.as_text()
    parsed = costs.parse(hlo)
    coll = costs.collectives(parsed)
    hbm_bytes, unknown_loops = costs.hlo_hbm_bytes(parsed)
    flops = (prog.program_flops + kernel_flops) / chips
    arg, out, alias, temp = (mem.argument_size_in_bytes, mem.output_size_in_bytes, mem.alias_size_in_bytes,
                             mem.temp_size_in_bytes)
    total = arg + out - alias + temp + mem.generated_code_size_in_bytes
    quantized = {k: v / chips for k, v in prog.quantized_flops.items()}
    dcn = costs.dcn_transfers(parsed)
    dcn_bytes = sum(v["bytes"] for v in dcn.values())
    roofline = roofline_of(flops, hbm_bytes, sum(v["bytes"] for v in coll.values()), chip, quantized, dcn_bytes)
    loops = len(re.findall(r" while\(", hlo))
    whole = cost["optimal_seconds"] > 0 and loops == 0
    est = cost["optimal_seconds"] if whole else roofline["bound_s"]
    if whole:
        source = "compiler (optimal_seconds)"
    elif cost["optimal_seconds"] <= 0:
        source = (f"roofline (the compiler's optimal_seconds is {cost['optimal_seconds']:.3g} s: on TPU it "
                  "costs no Pallas kernel and no ragged exchange; XLA's GPU compiler gives no cost analysis)")
    else:
        source = f"roofline (the compiler's optimal_seconds counts each of {loops} while loops once)"
    host = (mem.host_argument_size_in_bytes + mem.host_output_size_in_bytes - mem.host_alias_size_in_bytes
            + mem.host_temp_size_in_bytes)  # what the program keeps in host memory (remat offload)
    by = {**prog.state_bytes, "temp": int(temp), "code": int(mem.generated_code_size_in_bytes), "total": int(total)}
    if host:
        by["host_offload"] = int(host)  # not HBM: not in the total
    return {
        "bytes_per_chip": by,
        "compiler_flops_per_chip": cost["flops"],
        "compiler_optimal_seconds": cost["optimal_seconds"],
        "program_flops_per_chip": flops,
        **({"quantized_flops_per_chip": quantized} if quantized else {}),  # of them, int8 / fp8 products
        "hbm_bytes_per_chip": hbm_bytes,
        "model_flops_per_step": model_flops,
        "est_step_s": est,
        "est_source": source,
        "est_mfu": model_flops / (chips * chip.peak_flops * est) if est > 0 else None,
        "est_tokens_per_s_per_chip": tokens / est / chips if est > 0 else None,
        "roofline": roofline,
        "roofline_mfu": model_flops / (chips * chip.peak_flops * roofline["bound_s"]) if roofline["bound_s"] else None,
        "while_loops": loops,
        "unknown_trip_loops": unknown_loops,
        "collectives": coll,  # inside a slice (ICI)
        "dcn_bytes": dcn_bytes,  # between slices (the data-center network), per chip
        "dcn_transfers": dcn,
        "attention_kernel": attention_kernel(prog.kernels),
        "attention_choices": attention_choices(prog.kernels),
        "compile_s": round(prog.compile_s, 2),
        "largest": prog.largest,
    }


def compile_report(cfg: RunConfig, topology: str, step: str = "train", packed: bool = False,
                   prompt_len: int | None = None, cache_len: int | None = None) -> dict:
    """Compile `cfg`'s train step (or its decode programs) for `topology` and report it (the
    fields of `jaxformer compile --json`)."""
    if cfg.model_name not in ("lm", MODULE):
        raise ConfigError(f"jaxformer compile takes lm configs (LMs and MoE LMs) and model.module configs; "
                          f"model.name is {cfg.model_name!r}")
    if step not in ("train", "decode"):
        raise ValueError(f"--step must be train or decode, got {step!r}")
    if step == "decode" and cfg.model_name == MODULE:
        raise ConfigError("--step decode compiles jaxformer's KV-cache programs (lm configs); a model.module "
                          "compiles its train step (--step train)")
    cfg = as_mesh_run(cfg)
    chip = chip_of(topology)
    slices = cfg.parallel.slices
    devices = devices_for(topology, slices)
    mesh = mesh_for(cfg, devices)
    axes = cfg.parallel.logical_axis_rules()["batch"]
    shards = math.prod(mesh.shape[a] for a in axes)
    rows = cfg.train.micro_batch if step == "train" else cfg.train.batch_size
    if rows % shards:  # as the trainer refuses it (jax_trainer._setup_mesh)
        raise ValueError(f"{'train.batch_size / grad_accum_steps' if step == 'train' else 'train.batch_size'} = {rows} "
                         f"is not divisible by {' x '.join(axes)} = {shards} on {topology}: use a multiple of "
                         f"{shards * (cfg.train.grad_accum_steps if step == 'train' else 1)} (--set train.batch_size=N)")
    if step == "train":
        check_sections(cfg)
    head = {"model": cfg.model_name, "topology": topology, "chips": len(devices), "device_kind": devices[0].device_kind,
            "mesh": {k: int(v) for k, v in mesh.shape.items()}, "step": step, "slices": slices}
    if slices > 1:
        head["dcn_axis"] = cfg.parallel.dcn_axis
    if step == "train" and mesh.shape["pipeline"] > 1:  # GPipe's idle share of each stage's ticks
        from jaxformer.layers.kernels.pipeline import bubble
        head["pipeline_microbatches"] = cfg.parallel.microbatches
        head["pipeline_bubble"] = bubble(mesh.shape["pipeline"], cfg.parallel.microbatches)
    if step == "train":
        prog, facts = compile_train(cfg, mesh, packed)
        flops = costs.model_flops_per_step(cfg, facts)
        body = program_report(prog, chip, len(devices), flops, facts["tokens_per_step"],
                              kernel_flops=costs.splash_flops(cfg, prog.kernels))
        programs = None
    else:
        progs, facts = compile_decode(cfg, mesh, prompt_len, cache_len)
        programs = {}
        for prog in progs:
            tokens = facts["tokens_per_step"][prog.name]
            flops = 2.0 * facts["active_params"] * tokens  # forward only
            programs[prog.name] = program_report(prog, chip, len(devices), flops, tokens)
        body = dict(programs["decode_step"])
        body["compile_s"] = round(sum(p["compile_s"] for p in programs.values()), 2)
        body["bytes_per_chip"] = dict(body["bytes_per_chip"])
        body["bytes_per_chip"]["total"] = max(p["bytes_per_chip"]["total"] for p in programs.values())
        body["bytes_per_chip"]["temp"] = max(p["bytes_per_chip"]["temp"] for p in programs.values())
    report = {**head, "param_count": facts["param_count"], "active_params": facts["active_params"],
              "tokens_per_step": facts["tokens_per_step"], **body, "hbm_per_chip_bytes": chip.hbm_bytes,
              "peak_flops_per_chip": chip.peak_flops}
    report["fits"] = report["bytes_per_chip"]["total"] <= chip.hbm_bytes
    if programs is not None:
        report["programs"] = programs
    return report


def tips(cfg: RunConfig, step: str, chips: int, by: dict) -> list[tuple[str, list[str]]]:
    """The settings that would lower the bytes per chip (`by`: bytes_per_chip, temp may be the
    compiler's figure) of a config that does not fit: [(what to say, the --set overrides that
    apply it)]; an empty override list for advice no one setting expresses."""
    out = []
    cfg = as_mesh_run(cfg)
    tc, m = cfg.train, cfg.parallel.mesh
    if step == "train":
        keep_least = ("train.remat_policy=nothing_saveable (each layer recomputed, only its input kept)",
                      ["train.remat=true", "train.remat_policy=nothing_saveable"])
        scan = [] if getattr(cfg.model, "scan_layers", False) else ["model.scan_layers=true"]
        offload = ("train.remat_policy=offload_layer_inputs (each layer's input kept in host memory)",
                   ["train.remat=true", "train.remat_policy=offload_layer_inputs", *scan])
        if by.get("temp", 0) > by.get("params", 0) and not tc.remat:
            policy = tc.remat_policy if tc.remat_policy == "offload_layer_inputs" else "nothing_saveable"
            label = "train.remat=true with " + (f"train.remat_policy={tc.remat_policy}"
                                                if tc.remat_policy == "offload_layer_inputs" else keep_least[0])
            out.append((label, ["train.remat=true", f"train.remat_policy={policy}"]))
        elif tc.remat and tc.remat_policy not in ("nothing_saveable", "offload_layer_inputs"):
            out.append(keep_least)
        elif tc.remat and tc.remat_policy == "nothing_saveable":
            out.append(offload if not scan else ("model.scan_layers=true with " + offload[0], offload[1]))
        if m.fsdp != -1 and m.fsdp < chips:
            others = m.expert * m.context * m.tensor
            out.append(("a larger parallel.mesh.fsdp (params and optimizer state split over it)",
                        ["parallel.mode=mesh", "parallel.mesh.data=1", f"parallel.mesh.fsdp={max(1, chips // others)}"]))
        if tc.micro_batch > 1:
            out.append(("a smaller train.batch_size or more train.grad_accum_steps",
                        [f"train.grad_accum_steps={2 * tc.grad_accum_steps}"] if tc.micro_batch % 2 == 0 else []))
        if tc.precision != "bf16":
            out.append(("train.precision=bf16", ["train.precision=bf16"]))
        if tc.attention == "plain":
            out.append(("train.attention=splash (no [B, H, T, T] scores)", ["train.attention=splash"]))
    else:
        out.append(("a smaller train.batch_size, --cache-len or --prompt-len, or a larger parallel.mesh.tensor", []))
    return out


def advice(cfg: RunConfig, step: str, chips: int, by: dict) -> str:
    """tips' words, joined."""
    return ", ".join(label for label, _ in tips(cfg, step, chips, by)) or "more chips"
