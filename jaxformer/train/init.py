"""Named init schemes, identical in both frameworks (docs/numerics.md §9, §25), and the train
state created directly in its shardings.

Every parameter is drawn with jax.random from the key fold_in(key(seed), crc32 of its torch
key), in torch layout, then laid out for flax (one draw per layer of a scanned stack). So
`init: xavier_uniform` gives the same bits in JAX and in torch (torch/init.py copies these
arrays), not just the same distribution, and scanned == unscanned. JAX's threefry is
partitionable (`jax_threefry_partitionable`, on by default since JAX 0.5): element i of a draw
depends only on the key and i, so inside a jitted init each device computes only its shard and
the values do not depend on the mesh.

    kind       xavier_uniform                          normal_0.02
    kernel     U(+-sqrt(6 / (fan_in + fan_out)))       N(0, 0.02)
    embedding  N(0, D^-0.5)                            N(0, 0.02)
    scale      1                                       1
    bias       0  (also the MoE experts' *_bias)        0
    other      N(0, 0.02)  (cls tokens, bias tables,   N(0, 0.02)
               stacked MoE experts [E, out, in], as HF)
`default` keeps each framework's own constructor init (which differ).

`create_state` builds nothing on the host: the model is abstract (nnx.eval_shape), and jitted
functions with the state's shardings as `out_shardings` create each param (one program per
distinct shape and sharding), the optimiser state and the RNG streams.
"""
from __future__ import annotations

import functools
import math
import zlib
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxformer import convert, lowering
from jaxformer.memory import available_bytes, check_bytes, check_fits  # noqa: F401 (re-exported: the trainers' names)
from jaxformer.models import build_model
from jaxformer.train import lora


def draw(scheme: str, kind: str, torch_shape: tuple, rng) -> jax.Array:
    """One parameter in torch layout from its key `rng` (traceable)."""
    if kind == "bias":
        return jnp.zeros(torch_shape, jnp.float32)
    if kind == "scale":
        return jnp.ones(torch_shape, jnp.float32)
    if scheme == "normal_0.02" or kind == "other":
        return _normal(rng, torch_shape) * 0.02
    if kind == "embedding":
        return _normal(rng, torch_shape) * torch_shape[-1] ** -0.5
    # kernel, torch layout [out, in, *k]
    receptive = math.prod(torch_shape[2:]) if len(torch_shape) > 2 else 1
    fan_out, fan_in = torch_shape[0] * receptive, torch_shape[1] * receptive
    a = math.sqrt(6.0 / (fan_in + fan_out))
    return jax.random.uniform(rng, torch_shape, jnp.float32, -a, a)


def init_array(scheme: str, kind: str, torch_shape: tuple, key: str, seed: int) -> jax.Array:
    """One parameter (one torch key) in torch layout."""
    return _draw_fn(scheme, kind, tuple(torch_shape), None, False, None)(*_key_args(seed, [key]))


def _key_args(seed: int, torch_keys: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """The host arguments of a draw: the seed and the crc32 of each torch key (plain numpy, the
    same in every process, so a multi-process jit takes them as replicated values)."""
    return (np.asarray(seed, np.uint32),
            np.asarray([zlib.crc32(k.encode()) for k in torch_keys], np.uint32))


def _normal(rng, shape: tuple) -> jax.Array:
    """N(0, 1) draws behind an optimization barrier: inside a larger jitted program XLA would
    otherwise fold the caller's scale into jax.random.normal's own sqrt(2) (one rounding instead
    of two), and the same draw would differ by an ulp between programs (docs/numerics.md §25)."""
    return jax.lax.optimization_barrier(jax.random.normal(rng, shape, jnp.float32))


@functools.cache
def _draw_fn(scheme: str, kind: str, torch_shape: tuple, leaf: str | None, stacked: bool, sharding):
    """The jitted draw of one flax leaf from (seed, crc32 of each of its torch keys): torch
    layout, then flax layout (`leaf`), stacked over the keys when `stacked`, computed directly
    in `sharding`. Cached per shape, so a stack of equal layers compiles once."""
    axes = convert.torch_to_flax_axes(leaf, len(torch_shape)) if leaf else None

    def one(seed, crc):
        x = draw(scheme, kind, torch_shape, jax.random.fold_in(jax.random.key(seed), crc))
        return jnp.transpose(x, axes) if axes else x

    def f(seed, crcs):
        return jax.vmap(one, in_axes=(None, 0))(seed, crcs) if stacked else one(seed, crcs[0])
    return jax.jit(f, out_shardings=sharding)


def _kind_from_flax_leaf(leaf: str, ndim: int) -> str:
    if leaf == "kernel":
        return "kernel"
    if leaf == "embedding":
        return "embedding"
    if leaf == "scale":
        return "scale"
    if (leaf == "bias" and ndim == 1) or leaf.endswith("_bias"):  # MoE experts' [E, F] biases too
        return "bias"
    return "other"


def init_params(model, scheme: str, seed: int, shardings=None) -> dict:
    """{param path: array} of a (concrete or abstract) model's params drawn by a named scheme,
    each array jitted straight into its sharding (`shardings`: a tree like the model's
    nnx.Param state with a sharding per leaf; None: the default device)."""
    prefixes = convert.scan_prefixes(model)
    sh = None
    if shardings is not None:
        sh = {tuple(p): v.get_value() for p, v in nnx.to_flat_state(shardings)}
    out = {}
    for path, var in convert.param_leaves(model).items():
        if sh is not None and path not in sh:  # a Buffer (score_bias): it lives in `rest`
            continue
        leaf = str(path[-1])
        shape = tuple(var.shape)
        torch_shape = convert.torch_shape_of(path, shape, prefixes)
        kind = _kind_from_flax_leaf(leaf, len(torch_shape))
        # one key per torch key (per layer when scanned), so scanned == unscanned == torch
        args = _key_args(seed, convert.torch_keys_for(path, shape, prefixes))
        stacked = convert.stacked_prefix(path, prefixes) is not None
        out[path] = _draw_fn(scheme, kind, torch_shape, leaf, stacked, sh[path] if sh else None)(*args)
    return out


def init_flax(model, scheme: str, seed: int) -> None:
    """Re-initialise a jaxformer model's params in place (on the default device)."""
    if scheme == "default":
        return
    leaves = convert.param_leaves(model)
    for path, x in init_params(model, scheme, seed).items():
        leaves[path].set_value(x)


# ----------------------------------------------------------------------------- the train state
def _build(name: str, model_cfg, seed: int, lora_cfg=None):
    """The model, with LoRA adapters (train/lora.py) when `lora_cfg` (train.lora) is given."""
    model = build_model(name, model_cfg, seed=seed)
    return model if lora_cfg is None else lora.adapt(model, lora_cfg, seed)


def abstract_model(name: str, model_cfg, seed: int = 0, lora_cfg=None):
    """The model with ShapeDtypeStruct values and its partitioning metadata: no allocation."""
    return nnx.eval_shape(lambda: _build(name, model_cfg, seed, lora_cfg))


def _split(name: str, model_cfg, seed: int):
    return nnx.split(build_model(name, model_cfg, seed=seed), nnx.Param, ...)


def abstract_state_of(model, tx) -> dict:
    """The train state {params, opt_state, rest, step} of a (concrete or abstract) model as
    ShapeDtypeStructs; params keep their nnx.Param wrappers and partitioning metadata. A LoRA
    model's params are its adapters, and its base is `frozen` (train/lora.py)."""
    _, params, frozen, rest = lora.split(model)

    def f(p, fr, r):
        out = {"params": p, "opt_state": tx.init(p), "rest": r, "step": jnp.zeros((), jnp.int32)}
        return out if fr is None else {**out, "frozen": fr}
    return jax.eval_shape(f, params, frozen, rest)


# available_bytes, check_fits, check_bytes: jaxformer/memory.py (the HF import and the CLI use them too)


def abstract_state(name: str, model_cfg, seed: int, tx, lora_cfg=None) -> dict:
    """abstract_state_of the registered model `name`: no allocation."""
    return abstract_state_of(abstract_model(name, model_cfg, seed, lora_cfg), tx)


def with_shardings(abstract, shardings):
    """ShapeDtypeStructs carrying `shardings` (a matching tree): orbax's restore targets."""
    return jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), abstract, shardings)


def single_device(abstract):
    """Shardings putting a whole (abstract) tree on this process's first device."""
    dev = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    return jax.tree.map(lambda _: dev, abstract)


def _jit(fn, shardings):
    """jax.jit with out_shardings, or with none (uncommitted arrays on the default device, which
    pmap and plain jit take anywhere) when `shardings` is None."""
    return jax.jit(fn) if shardings is None else jax.jit(fn, out_shardings=shardings)


# The unsharded init programs of this process's recent models, by what they are traced from:
# another trainer of the same model (a resume, a test's second run) neither traces nor compiles
# them again. Sharded ones (their shardings are trees) are built per call.
_PROGRAMS: dict[tuple, object] = {}
_PROGRAMS_KEPT = 8


def _program(kind: str, name: str, model_cfg, seed: int, lora_cfg, shardings, fn, jit=jax.jit):
    """_jit(fn, shardings), reused for the same (kind, model, seed, LoRA, lowering) when
    unsharded; `jit` makes the unsharded program (jax.jit, or a partial of it with options)."""
    if shardings is not None:
        return _jit(fn, shardings)
    key = (kind, name, repr(model_cfg), seed, repr(lora_cfg), lowering.active())
    if key not in _PROGRAMS:
        _PROGRAMS[key] = jit(fn)
        while len(_PROGRAMS) > _PROGRAMS_KEPT:
            _PROGRAMS.pop(next(iter(_PROGRAMS)))
    return _PROGRAMS[key]


def create_rest(name: str, model_cfg, seed: int, sharding=None, lora_cfg=None):
    """The model's non-parameter state (dropout RNG streams), jitted into `sharding` (a tree);
    the constructor's parameter draws are dead code there and never computed."""
    return _program("rest", name, model_cfg, seed, lora_cfg, sharding,
                    lambda: lora.split(_build(name, model_cfg, seed, lora_cfg))[-1])()


def create_params(name: str, model_cfg, scheme: str, seed: int, abstract_params, shardings=None):
    """The initial params (an nnx.State like `abstract_params`), each created in its sharding
    (None: the default device): named schemes draw per leaf (init_params); `default` runs the
    constructors under jit."""
    if scheme == "default":
        return _program("params", name, model_cfg, seed, None, shardings, lambda: _split(name, model_cfg, seed)[1])()
    arrays = init_params(abstract_model(name, model_cfg, seed), scheme, seed, shardings)
    return nnx.from_flat_state([(p, v.replace(arrays[tuple(p)]))
                                for p, v in nnx.to_flat_state(abstract_params)])


def _zeros():
    return jnp.zeros((), jnp.int32)


def zero_step(sharding=None):
    """The step counter 0 in `sharding` (made by a jitted program: valid across processes)."""
    return _program("step", "", None, 0, None, sharding, _zeros)()


@dataclass(frozen=True)
class StartFrom:
    """What create_state starts from besides a fresh init. params: init_from's, already placed
    (under train.lora the base's); rest: init_from's saved buffers, placed; abstract_params: the
    abstract state's params when the caller has them (else built here)."""
    params: Any = None
    rest: Any = None
    abstract_params: Any = None


def create_state(name: str, model_cfg, scheme: str, seed: int, tx, shardings=None, lora_cfg=None,
                 base_shardings=None, start: StartFrom = StartFrom()) -> dict:
    """The train state {params, opt_state, rest, step} created directly in `shardings` (a tree
    like abstract_state's; None: the default device). No host ever holds a whole tensor of a
    sharded leaf, and the values do not depend on the shardings. `start.params` given: the
    state starts from them. `lora_cfg` (train.lora): those params (or the init) are the base,
    in `base_shardings`, and adapt_state turns it into the LoRA state. `start.rest` given: the
    state's rest. `start.abstract_params`: spares building the abstract state here."""
    params, rest, abstract_params = start.params, start.rest, start.abstract_params
    if lora_cfg is not None:
        if params is None:
            base = nnx.split(abstract_model(name, model_cfg, seed), nnx.Param, ...)[1]
            params = create_params(name, model_cfg, scheme, seed, base, base_shardings)
        return adapt_state(name, model_cfg, seed, tx, lora_cfg, params, shardings, rest)
    sh = shardings or {"params": None, "opt_state": None, "rest": None, "step": None}
    if params is None:
        if abstract_params is None:
            abstract_params = abstract_state(name, model_cfg, seed, tx)["params"]
        params = create_params(name, model_cfg, scheme, seed, abstract_params, sh["params"])
    return {"params": params, "opt_state": _jit(tx.init, sh["opt_state"])(params),
            "rest": create_rest(name, model_cfg, seed, sh["rest"]) if rest is None else rest,
            "step": zero_step(sh["step"])}


def adapt_state(name: str, model_cfg, seed: int, tx, lora_cfg, base_params, shardings=None, rest=None) -> dict:
    """A LoRA run's train state from the base params (placed, e.g. sharded): one jitted program
    wraps the targets (train/lora.py adapt: the adapters drawn, the base reduced to
    lora_cfg.base_dtype) and writes adapters, frozen base and RNG streams straight into
    `shardings`. The base params are donated (an fp32 base is passed through, not copied).
    Unsharded, the program is reused like the other init programs (_program)."""
    sh = shardings or {"params": None, "frozen": None, "opt_state": None, "rest": None, "step": None}

    def f(base, rest):
        graphdef = nnx.split(abstract_model(name, model_cfg, seed), nnx.Param, ...)[0]  # at trace time only
        _, params, frozen, rest = lora.split(lora.adapt(nnx.merge(graphdef, base, rest), lora_cfg, seed))
        return params, frozen, rest
    out = None if shardings is None else (sh["params"], sh["frozen"], sh["rest"])
    jitted = jax.jit(f, donate_argnums=0, out_shardings=out) if out is not None else \
        _program("adapt", name, model_cfg, seed, lora_cfg, None, f, functools.partial(jax.jit, donate_argnums=0))
    params, frozen, rest = jitted(base_params, create_rest(name, model_cfg, seed) if rest is None else rest)
    return {"params": params, "frozen": frozen, "opt_state": _jit(tx.init, sh["opt_state"])(params),
            "rest": rest, "step": zero_step(sh["step"])}
