"""The parity case record and the helpers the cases_*.py modules build cases with: `case`
registers a case in CASES; `mirror` / `mirror_fn` / `model_pair` build both trees' modules with
the same arguments; `normal` / `ids` / `padding` make inputs; `run_case` checks one case. The
registry (registry.py) imports the case modules; they import only this module.
"""
from __future__ import annotations

import dataclasses
import importlib
import inspect
from collections.abc import Callable
from typing import Any

import numpy as np

from jaxformer.parity.results import GRAD_TOL, OUT_TOL, Tolerance


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    component: str  # for the per-component report
    build: Callable[[int], tuple[Any, Any]]  # seed -> (torch module/callable, flax module/callable)
    inputs: Callable[[np.random.RandomState], Any]  # -> dict of kwargs or tuple of args (numpy)
    out_tol: Tolerance = OUT_TOL
    grad_tol: Tolerance = GRAD_TOL
    grads: bool = True
    note: str = ""
    # jaxformer.lowering switches the JAX side is traced under (e.g. attention="blockwise");
    # the torch side runs as it is (its plain path)
    lowering: tuple[tuple[str, Any], ...] = ()
    # (torch module, {torch name: tensor}) -> {converter key: tensor}, where the torch names are
    # not jaxformer's (a torch.nn module and its jaxformer.interop twin); None: the same names
    state_map: Callable | None = None

    def torch_state(self, torch_module) -> dict:
        """The torch module's state dict under the converter's keys."""
        sd = dict(torch_module.state_dict())
        return sd if self.state_map is None else self.state_map(torch_module, sd)


CASES: dict[str, Case] = {}


def register(case: Case) -> Case:
    if case.name in CASES:
        raise ValueError(f"duplicate parity case {case.name!r}")
    CASES[case.name] = case
    return case


def case(name: str, component: str, build, inputs, **kw) -> Case:
    return register(Case(name, component, build, inputs, **kw))


def _resolve(root: str, dotted: str):
    module, _, name = dotted.rpartition(".")
    return getattr(importlib.import_module(f"{root}.{module}"), name)


def twin(make: Callable[[], Any], seed: int):
    """The flax module make() builds, built abstractly (nnx.eval_shape): run_case's harness loads
    torch's weights into every parameter and saved buffer, so the initial values are never
    drawn (eagerly, each new parameter shape cost a compile: most of a case's build time). The
    RNG streams (dropout's, which parity's eval mode never draws from) get keys from the seed
    and their module path (a scanned stack's, one per layer split from that key: building
    such a model eagerly instead cost seconds of initialiser compiles). A module holding other state that the load would not fill is built
    by make() as it is. Until the load (jaxformer.convert.load_torch_state_dict, which the
    harness, tests/test_convert.py and the report run) its parameters are abstract."""
    import zlib

    import jax
    import jax.numpy as jnp
    from flax import nnx

    from jaxformer import convert
    from jaxformer.lowering import cheap_tracer_sharding
    with cheap_tracer_sharding():
        model = nnx.eval_shape(make)
    loaded = set(convert.param_leaves(model))
    rest = [(tuple(p), v) for p, v in nnx.to_flat_state(nnx.state(model)) if tuple(p) not in loaded]
    if any(not isinstance(v, (nnx.RngKey, nnx.RngCount)) for _, v in rest):
        return make()
    root = jax.random.key(seed)
    for path, var in rest:
        shape, dtype = var.get_value().shape, var.get_value().dtype
        if isinstance(var, nnx.RngKey):
            key = jax.random.fold_in(root, zlib.crc32(repr(path).encode()) & 0x7FFFFFFF)
            if shape and key.dtype == dtype:  # a scanned stack's stream: one key per layer
                key = jax.random.split(key, shape)
            if (key.shape, key.dtype) != (shape, dtype):
                return make()
            var.set_value(key)
        else:
            var.set_value(jnp.zeros(shape, dtype))
    return model


def mirror(dotted: str, *args, **kwargs) -> Callable[[int], tuple[Any, Any]]:
    """Builder for a mirrored class, e.g. mirror("layers.ffn.FeedForward", 32, 64, kind="relu"):
    torch_ref.<dotted>(*args, **kwargs) seeded by torch.manual_seed(seed), and
    jaxformer.<dotted>(*args, **kwargs, rngs=nnx.Rngs(seed)) when it takes rngs."""
    def build(seed: int):
        import torch
        from flax import nnx
        torch.manual_seed(seed)
        t = _resolve("torch_ref", dotted)(*args, **kwargs)
        jcls = _resolve("jaxformer", dotted)
        takes_rngs = "rngs" in inspect.signature(jcls.__init__).parameters
        return t, twin(lambda: jcls(*args, **kwargs, **({"rngs": nnx.Rngs(seed)} if takes_rngs else {})), seed)
    return build


def mirror_fn(dotted: str, **fixed) -> Callable[[int], tuple[Any, Any]]:
    """Builder for a mirrored function with fixed keyword arguments."""
    def build(seed: int):
        tf, jf = _resolve("torch_ref", dotted), _resolve("jaxformer", dotted)
        return (lambda *a, **k: tf(*a, **fixed, **k)), (lambda *a, **k: jf(*a, **fixed, **k))
    return build


def sdpa_fn(**fixed) -> Callable[[int], tuple[Any, Any]]:
    """Builder for layers.attention.dot_product_attention in each tree with fixed keyword
    arguments; the score modifiers (scale, softcap, sinks), fixed here or among the case's
    inputs, go into that tree's ScoreMods record."""
    def build(seed: int):
        def call(root: str):
            attention = importlib.import_module(f"{root}.layers.attention")

            def f(*a, **k):
                k = {**fixed, **k}
                scores = attention.ScoreMods(**{n: k.pop(n) for n in ("scale", "softcap", "sinks") if n in k})
                return attention.dot_product_attention(*a, scores=scores, **k)
            return f
        return call("torch_ref"), call("jaxformer")
    return build


def model_pair(name: str, cfg) -> Callable[[int], tuple[Any, Any]]:
    """Builder for a registered model: torch_ref.models.build_model / jaxformer.models.build_model."""
    def build(seed: int):
        from jaxformer.models import build_model as jbuild
        from torch_ref.models import build_model as tbuild
        return tbuild(name, cfg, seed=seed), twin(lambda: jbuild(name, cfg, seed=seed), seed)
    build.model = name  # the registered model this builder covers (tests/test_convert.py)
    build.cfg = cfg
    return build


def run_case(c: Case, seed: int = 0, reference: bool = False, locate: bool = True):
    """check_parity on one case; reference=True also measures each side against float64;
    locate=False skips naming the submodule where a failing case parts first."""
    from jaxformer import lowering
    from jaxformer.parity.harness import ParityOptions, check_parity
    torch_module, flax_module = c.build(seed)
    inputs = c.inputs(np.random.RandomState(seed))
    state_map = None if c.state_map is None else (lambda sd: c.state_map(torch_module, sd))
    with lowering.tracing(**dict(c.lowering)):  # check_parity traces the JAX side inside
        return check_parity(torch_module, flax_module, inputs,
                            ParityOptions(out_tol=c.out_tol, grad_tol=c.grad_tol, grads=c.grads, case=c.name,
                                          seed=seed, reference=reference, locate=locate, state_map=state_map))


# ----------------------------------------------------------------------------- input makers
def normal(*shape: int, scale: float = 1.0, offset: float = 0.0):
    return lambda rng: (rng.standard_normal(shape) * scale + offset).astype(np.float32)


def ids(batch: int, length: int, vocab: int, low: int = 1):
    return lambda rng: rng.randint(low, vocab, size=(batch, length)).astype(np.int32)


def padding(batch: int, length: int, lengths: list[int]):
    """[B, T] int32 validity: row b has lengths[b] real tokens then padding."""
    m = np.zeros((batch, length), np.int32)
    for b, n in enumerate(lengths):
        m[b, :n] = 1
    return m
