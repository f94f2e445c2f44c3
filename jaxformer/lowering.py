"""How jaxformer's maths is lowered for speed, in one place: the trace-time switches, the
XLA:CPU compiler options of the decode programs and the kernel copies they decode with.

Nothing here changes the function a model computes, only which XLA ops compute it (fp32 sums
may run in another order, ~1e-7 relative). Model code asks one question, `active()`, at trace
time; `tracing(...)` sets the answer, a frozen `Lowering`:
  * transposed_kernels: every `Linear` reads its kernel as [..., out, in] and multiplies with
    the weight as the row-major left operand (jaxformer/layers/linear.py). Decoding multiplies
    a few rows by every weight matrix, and XLA:CPU streams a weight far faster in that form.
  * elementwise_attention: a one-token query over a head-major KV cache takes its scores and
    its weighted sum as a broadcast multiply and a sum over the cache axis
    (jaxformer/layers/attention.py). As two dots, XLA:CPU copies and transposes the cache at
    every step; this form reads it in place.
  * fused_attention: the kernel of the fused attention path (`fused_attention` below): None =
    "auto" (cuDNN flash attention on an NVIDIA GPU where it takes the inputs, else XLA's),
    "xla", "cudnn" (jax.nn.dot_product_attention's implementations) or "tokamax".
  * attention: how self-attention without a cache is computed (ATTENTION). "plain": the
    [B, H, T, S] scores and the fused path (as above), memory O(T^2). "blockwise": the online
    softmax over key blocks in lax ops with a recomputing backward pass
    (jaxformer/layers/kernels/blockwise.py), O(T) memory on every backend; the stacks then keep their
    masks as `AttentionMask` parts and never build a [B, 1, T, S] boolean. "splash": the Pallas
    splash-attention kernel on TPU (blockwise elsewhere). "auto": per call, the fastest kernel
    that takes it on the platform (jaxformer/layers/dispatch.py choose_attention: splash on TPU,
    cuDNN flash on GPU, blockwise from AUTO_BLOCKWISE_MIN_KEYS keys on, plain below), each
    choice noted with its reason (`recording_kernels`). attention_blocks = (query block, key
    block) of the blockwise path, and the most splash's blocks may be (multiples of 128).
  * loss_chunk_bytes: the most bytes of float32 logits one chunk of a token loss may hold per
    device (jaxformer/layers/kernels/chunked_loss.py: the output head and the cross-entropy run
    over sequence chunks in a scan, forward and backward); None (the default, train.loss_chunk_mib
    unset) = one piece, the [B, T, V] logits whole.
  * context_axis: the mesh axis the sequence is split over (context parallelism), None = not
    split; self-attention then runs as ring attention over it (jaxformer/layers/kernels/ring.py), whose
    steps run the blockwise kernel whatever `attention` says (blocks at most half a shard).
  * platform: the backend the program is compiled for ("cpu", "gpu", "tpu"), None = the
    default backend of this process. Ahead-of-time compilation for a TPU slice from a CPU host
    (jaxformer/train/aot.py, `jaxformer compile`) traces with "tpu", so every backend choice
    below (`platform()`) is the TPU's, not the host's.
  * pipeline_stages / pipeline_microbatches: a scanned stack's layers run in that many stages
    over the mesh's `pipeline` axis, the batch in that many microbatches, in GPipe's schedule
    (jaxformer/layers/kernels/pipeline.py); 1 = not pipelined. The same function per
    microbatch; only the sums' shapes change.
  * batch_axes / head_axes: the mesh axes the batch and the attention heads are split over
    (the trainer's logical-axis rules "batch" and "heads"), for the kernels that run per
    device under jax.shard_map (a Pallas kernel is one custom call XLA cannot partition).

`cheap_tracer_sharding()` makes model builds under a trace cheaper (an unread error message).

`recording_kernels()` collects which attention kernel each traced call ran, and why a kernel
was passed over (`note_kernel`), for reports such as `jaxformer compile`'s attention_kernel.

For expert parallelism (jaxformer/layers/kernels/moe_parallel.py): `expert_all_to_all`, the exchange
of token rows between the devices of the `expert` mesh axis, as ragged_all_to_all or as
all_to_all of fixed-size buffers by backend (`ragged_exchange`).

For decoding (jaxformer.generation): `DecodeLayout` (the kernel layout generate decodes with,
"auto" = transposed on the CPU backend, and whether the [out, in] copies are kept with the
model), `kernel_copies` / `release_decode_weights` (the kept copies), `decoding(...)` (the
switches of a decode program) and `decode_jit` (XLA:CPU with YNNPACK limited to dots, so the
elementwise attention's reductions go through XLA's own emitter). Measured figures:
bench/README.md, "Decode layout on CPU".

Imports only jax (and jaxformer.tables' constant), never jaxformer.layers, so the layers may ask it without an
arrow going up.
"""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import weakref
from collections.abc import Iterator
from dataclasses import dataclass

import jax
import jax.numpy as jnp

from jaxformer.tables import AUTO_BLOCKWISE_MIN_KEYS  # noqa: F401  (attention "auto"'s length rule)

# ----------------------------------------------------------------------------- trace-time switches
ATTENTION = ("plain", "blockwise", "splash", "auto")
PLATFORMS = ("cpu", "gpu", "tpu")


@dataclass(frozen=True)
class Lowering:
    """The trace-time switches (module docstring); the defaults are the plain forms."""

    transposed_kernels: bool = False
    elementwise_attention: bool = False
    fused_attention: str | None = None
    attention: str = "plain"
    attention_blocks: tuple[int, int] = (512, 512)
    context_axis: str | None = None
    platform: str | None = None
    batch_axes: tuple[str, ...] = ()
    head_axes: tuple[str, ...] = ()
    loss_chunk_bytes: int | None = None
    pipeline_stages: int = 1
    pipeline_microbatches: int = 1

    def __post_init__(self) -> None:
        if self.platform not in (None,) + PLATFORMS:
            raise ValueError(f"platform must be one of {PLATFORMS} or None, got {self.platform!r}")
        if self.attention not in ATTENTION:
            raise ValueError(f"attention must be one of {ATTENTION}, got {self.attention!r}")


_ACTIVE: contextvars.ContextVar[Lowering] = contextvars.ContextVar("jaxformer_lowering", default=Lowering())  # noqa: B039 (a frozen dataclass)


def active() -> Lowering:
    """The switches in force while tracing."""
    return _ACTIVE.get()


@contextlib.contextmanager
def tracing(**switches):
    """While tracing inside this context, the given `Lowering` fields take these values (the
    others keep theirs). A jitted function reads them at its trace, so enter the context
    around the call that traces it."""
    token = _ACTIVE.set(dataclasses.replace(_ACTIVE.get(), **switches))
    try:
        yield
    finally:
        _ACTIVE.reset(token)


_KERNEL_LOG: contextvars.ContextVar[list | None] = contextvars.ContextVar("jaxformer_kernel_log", default=None)


@contextlib.contextmanager
def recording_kernels():
    """Within: every attention call traced appends what ran to the yielded list (note_kernel)."""
    log: list[str] = []
    token = _KERNEL_LOG.set(log)
    try:
        yield log
    finally:
        _KERNEL_LOG.reset(token)


_AUTO_REASON: contextvars.ContextVar[str | None] = contextvars.ContextVar("jaxformer_auto_reason", default=None)


@contextlib.contextmanager
def chosen_because(why: str):
    """Within: the kernels noted are attention "auto"'s choice, for this reason (note_kernel
    writes "<kernel> [auto: <why>]")."""
    token = _AUTO_REASON.set(why)
    try:
        yield
    finally:
        _AUTO_REASON.reset(token)


def note_kernel(what: str) -> None:
    """Record, at trace time, the attention kernel a call ran (e.g. "splash", "blockwise
    (splash refused: attention bias)", "splash [auto: the TPU kernel takes this call]");
    nothing when no recording is open."""
    log = _KERNEL_LOG.get()
    if log is not None:
        why = _AUTO_REASON.get()
        log.append(what if why is None else f"{what} [auto: {why}]")


def platform() -> str:
    """The backend being traced for: the `platform` switch, else this process's default."""
    return _ACTIVE.get().platform or jax.default_backend()


def on_cpu() -> bool:
    return platform() == "cpu"


def decoding(transposed_kernels: bool, elementwise_attention: bool | None = None):
    """`tracing` for a decode program: [out, in] kernels when transposed_kernels; the one-token
    attention form, None = elementwise on the CPU backend."""
    return tracing(transposed_kernels=transposed_kernels,
                   elementwise_attention=on_cpu() if elementwise_attention is None else elementwise_attention)


# ----------------------------------------------------------------------------- traced model builds
@contextlib.contextmanager
def cheap_tracer_sharding() -> Iterator[None]:
    """Inside, reading `.sharding` off a jit tracer raises a bare AttributeError. nnx's
    Variable.set_value compares `getattr(value, "sharding", None)` on every update, so each
    RngStream draw while a module is built under a trace (nnx.eval_shape, or a jitted init
    program) asks a tracer; JAX's AttributeError then pretty-prints the jaxpr equations behind
    the tracer for its message, which getattr discards: a third of an abstract model build's
    time, and of a parity case's. Values and traced programs are the same; only that unread
    message is not written. jaxformer.models.build_model and train/lora.py's adapt enter it;
    it nests, and a concrete build never reads a tracer."""
    from jax._src.interpreters import partial_eval as pe
    cls = pe.DynamicJaxprTracer
    if "sharding" in vars(cls):  # entered already (or a JAX whose tracer defines its own)
        yield
        return

    def sharding(self):
        raise AttributeError("sharding")
    cls.sharding = property(sharding)
    try:
        yield
    finally:
        del cls.sharding


# ----------------------------------------------------------------------------- fused attention
FUSED_ATTENTION = ("auto", "xla", "cudnn", "tokamax")


def on_nvidia_gpu() -> bool:
    if platform() != "gpu" or jax.default_backend() != "gpu":
        return False
    device = jax.devices()[0]
    return "nvidia" in device.device_kind.lower() or "cuda" in device.client.platform_version.lower()


def fused_attention(q, k, v, *, bias=None, mask=None, scale=None, backend: str | None = None, is_causal: bool = False,
                    local_window_size: tuple[int, int] | None = None):
    """softmax(q k^T * scale + bias, masked) v by the fused kernel `backend` picks.
    q [B, T, H, K], k/v [B, S, G, K], as jax.nn.dot_product_attention takes them.

    backend None or "auto": on an NVIDIA GPU, cuDNN flash attention
        (jax.nn.dot_product_attention(implementation="cudnn")) where it takes the inputs; it
        refuses at trace time what it cannot run (fp32, head dims it lacks kernels for, no
        cuDNN), and XLA's form runs instead. Elsewhere (CPU, TPU) XLA's form, which is what
        jax's own default (implementation=None) runs today.
    "xla" / "cudnn": that implementation of jax.nn.dot_product_attention (cudnn raises where
        it cannot run).
    "tokamax": tokamax.dot_product_attention (pip tokamax; its Pallas Mosaic-GPU and Triton
        flash kernels, falling back to XLA's on any platform).
    is_causal / local_window_size: the mask as jax.nn.dot_product_attention's own causal
        pattern and (left, right) window, no dense mask (attention "auto"'s cuDNN calls,
        layers/dispatch.py).
    Why cuDNN and not tokamax for "auto": cuDNN comes with jax[cuda12] (no new dependency)
    and is the kernel jax itself selects by name; tokamax is a 0.0.x package and no GPU has
    measured the two here. bench/gpu.sh times both (gpu_train.py --attention), so the default
    can follow figures.
    No backend takes attention sinks (gpt-oss): layers with sinks never call this and run
    jaxformer/layers/attention.py's explicit path instead (docs/numerics.md §28).
    Packed documents (LM segment_ids) reach every backend as part of the boolean `mask`
    ([B, 1, T, S], layers/attention.py make_segment_mask): cuDNN takes it as the additive bias
    jax.nn.dot_product_attention makes of any mask (combine_bias_and_mask), tokamax and XLA as
    a mask. cuDNN's own packed layout (q_offsets / kv_offsets, no dense mask) is not reachable
    through jax.nn.dot_product_attention's arguments, so it is not used.
    """
    backend = backend or "auto"
    if backend not in FUSED_ATTENTION:
        raise ValueError(f"fused attention backend must be one of {FUSED_ATTENTION}, got {backend!r}")
    kw = dict(bias=bias, mask=mask, scale=scale)
    if is_causal or local_window_size is not None:  # the mask as the kernels' own pattern (attention "auto")
        kw.update(is_causal=is_causal, local_window_size=local_window_size)
    if backend == "tokamax":
        try:
            import tokamax
        except ImportError as e:
            raise ImportError("fused attention backend 'tokamax' needs the tokamax package "
                              "(pip install tokamax)") from e
        return tokamax.dot_product_attention(q, k, v, **kw)
    if backend == "auto":
        if on_nvidia_gpu():
            try:
                return jax.nn.dot_product_attention(q, k, v, **kw, implementation="cudnn")
            except (ValueError, NotImplementedError, RuntimeError):
                pass  # cuDNN refused these inputs at trace time
        backend = "xla"
    return jax.nn.dot_product_attention(q, k, v, **kw, implementation=backend)


# ----------------------------------------------------------------------------- expert all-to-all
def ragged_exchange() -> bool:
    """Whether expert parallelism moves its rows with ragged_all_to_all (only the filled rows
    of each buffer travel) or with all_to_all of whole fixed-size buffers. Ragged on GPU and TPU
    backends; fixed on the CPU backend, which has no ragged-all-to-all ("UNIMPLEMENTED: HLO
    opcode ragged-all-to-all is not supported by XLA:CPU")."""
    return not on_cpu()


def expert_all_to_all(x: jax.Array, send_sizes: jax.Array, recv_sizes: jax.Array, axis_name: str) -> jax.Array:
    """Inside shard_map over `axis_name` (size S): x [S, C, ...], x[j] the rows for device j
    (the first send_sizes[j] of them filled, the rest zeros) -> [S, C, ...], out[i] the rows
    device i sent here (recv_sizes[i] filled, the rest zeros). The same function either way
    (ragged_exchange); its transpose is the exchange back. The ragged form is untested here
    (no GPU/TPU mesh in CI): it sends send_sizes[j] rows of block j to block `me` of device
    j's zero-filled output."""
    if not ragged_exchange():
        return jax.lax.all_to_all(x, axis_name, 0, 0)
    s, c = x.shape[:2]
    flat = x.reshape((s * c,) + x.shape[2:])
    me = jax.lax.axis_index(axis_name)
    offsets = jnp.arange(s, dtype=jnp.int32) * c
    out = jax.lax.ragged_all_to_all(flat, jnp.zeros_like(flat), offsets, send_sizes.astype(jnp.int32),
                                    jnp.full((s,), me * c, jnp.int32), recv_sizes.astype(jnp.int32),
                                    axis_name=axis_name)
    return out.reshape(x.shape)


# ----------------------------------------------------------------------------- decode layout
LAYOUTS = ("auto", "stored", "transposed")


@dataclass(frozen=True)
class DecodeLayout:
    """The linear-kernel layout jaxformer.generation decodes with.

    kernels: "transposed" decodes with [out, in] copies of the linear kernels (the
        transposed_kernels switch), at the cost of a second copy of those weights; "stored"
        uses the kernels as they are; "auto" = transposed on the CPU backend only.
    keep_weights: True keeps the copies with the model for later calls while its kernels stay
        the same arrays (a serving loop transposes once; `release_decode_weights` frees them);
        False makes them for one call only.
    """

    kernels: str = "auto"
    keep_weights: bool = True

    def __post_init__(self) -> None:
        if self.kernels not in LAYOUTS:
            raise ValueError(f"DecodeLayout.kernels must be one of {LAYOUTS}, got {self.kernels!r}")

    @classmethod
    def of(cls, layout: DecodeLayout | str) -> DecodeLayout:
        """A DecodeLayout, or the name of its kernel layout (the copies kept)."""
        return layout if isinstance(layout, DecodeLayout) else cls(kernels=layout)

    def transposed(self) -> bool:
        if self.kernels == "auto":
            return on_cpu()
        return self.kernels == "transposed"


_KEPT_KERNELS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> (source refs, copies, tag)
_swap_last = jax.jit(lambda kernels: [jnp.swapaxes(k, -1, -2) for k in kernels])


def kernel_copies(model, kernels: list, keep: bool, make=None, tag: str = "fp32"):
    """[out, in] copies (last two axes swapped) of `kernels`, the model's linear kernels in a
    fixed order; make(kernels) -> copies builds other ones (the reduced-precision decode
    weights of jaxformer.generation, `tag` naming them). Kept copies of the model are reused
    while its kernels are the same arrays and the tag is the same: a training step or a weight
    load sets new arrays, and the next call makes copies of those. With keep the copies stay
    with the model (a weak reference) until it dies or `release_decode_weights`; without, any
    kept ones are dropped."""
    hit = _KEPT_KERNELS.pop(model, None)
    if (hit is not None and hit[2] == tag and len(hit[0]) == len(kernels)
            and all(r() is a for r, a in zip(hit[0], kernels, strict=True))):
        copies = hit[1]
    else:
        hit = None  # free the old copies before making new ones
        copies = (make or _swap_last)(kernels)
    if keep:
        _KEPT_KERNELS[model] = ([weakref.ref(a) for a in kernels], copies, tag)
    return copies


def release_decode_weights(model=None) -> None:
    """Free the kept [out, in] kernel copies of `model` (None: of every model)."""
    if model is None:
        _KEPT_KERNELS.clear()
    else:
        _KEPT_KERNELS.pop(model, None)


# ----------------------------------------------------------------------------- reduced-precision weights
def widen_each_step() -> bool:
    """Whether a bf16/int8 decode weight is widened to fp32 inside every decode step, next to
    its product (jaxformer/layers/kernels/quant.py), or once per generate call (XLA hoists the
    loop-invariant widening out of the decode loop). In the step wherever the compiler can
    fuse the widening into the dot (GPU, TPU), so each token reads the reduced bytes. Once
    per call on the CPU backend: XLA:CPU fuses no widening into a dot, so a step would write
    and read back a full fp32 copy of every weight, 2-3x slower than reading fp32 weights
    (bench/README.md, "Reduced-precision decode on CPU")."""
    return not on_cpu()


# ----------------------------------------------------------------------------- rematerialisation
LAYER_INPUT = "layer_input"  # the checkpoint_name of each layer's input (layers/transformer.py)


def remat_policy(name: str | None):
    """The jax.checkpoint policy of train.remat_policy: one of jax.checkpoint_policies' names,
    or "offload_layer_inputs": recompute everything in the backward pass (nothing_saveable),
    and keep the one thing that must be kept, each layer's input, in the host's memory instead
    of the accelerator's (MaxText's decoder_layer_input offload). A scanned model then holds
    no [layers, B, T, D] stack of inputs in HBM (Llama-3.1-70B at one 8192-token sequence per
    v6e chip: 21 GB of float32 residuals). On the CPU backend the host is the device: the same
    as nothing_saveable."""
    if name is None:
        return None
    if name != "offload_layer_inputs":
        return getattr(jax.checkpoint_policies, name)
    if on_cpu():
        return jax.checkpoint_policies.nothing_saveable
    return jax.checkpoint_policies.save_and_offload_only_these_names(
        names_which_can_be_saved=(), names_which_can_be_offloaded=(LAYER_INPUT,),
        offload_src="device", offload_dst="pinned_host")


# ----------------------------------------------------------------------------- compiler options
# XLA:CPU options of the decode programs and the training steps: YNNPACK fuses dots only.
# Decode: the reductions of the elementwise attention and of the norms go through XLA's own
# emitter (YNNPACK's reductions made that attention slower than the dots). Training
# (jaxformer/train/jax_trainer.py): YNNPACK's fusions of a dot with the reductions and
# elementwise ops around it run on buffers outside XLA's buffer assignment, which the schedule
# neither shares nor frees early: in the long-context bench's step they added ~6 KB per token to
# the peak resident memory beyond XLA's own temporaries, and their fusion boundaries ~5 KB per
# token to those (§38).
CPU_COMPILER_OPTIONS = {"xla_cpu_experimental_ynn_fusion_type": "LIBRARY_FUSION_TYPE_DOT"}


def train_compiler_options() -> dict | None:
    """compiler_options for jax.jit of a train step: CPU_COMPILER_OPTIONS on the CPU backend,
    else none."""
    return CPU_COMPILER_OPTIONS if on_cpu() else None


@functools.cache
def decode_jit(fn, static_argnums=(), static_argnames=(), donate_argnums=()):
    """jax.jit of a decode program, with CPU_COMPILER_OPTIONS on the CPU backend (built at the
    first call, so importing a module that uses it initializes no backend)."""
    return jax.jit(fn, static_argnums=static_argnums, static_argnames=static_argnames,
                   donate_argnums=donate_argnums, compiler_options=CPU_COMPILER_OPTIONS if on_cpu() else None)
