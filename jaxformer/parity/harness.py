"""Parity checks between a torch module and its Flax NNX twin: outputs and gradients.

    from jaxformer.parity import assert_parity
    report = assert_parity(torch_module, flax_module, {"x": x_np, "mask": mask_np})

The torch weights are converted into the flax module (strict), both run in fp32 eval mode with
JAX matmul precision 'highest' and TF32 off (restored afterwards), and the function compares,
leaf by leaf, with torch's value as the reference (docs/numerics.md §19):
  1. every output leaf:   max |out_jax - out_torch| <= atol + rtol * max |out_torch|
  2. the gradients of a scalar loss (a fixed random projection of every float output) with
     respect to every parameter and every float input, each leaf against its own scale:
                          max |g_jax - g_torch|     <= grad_atol + grad_rtol * max |g_torch|
     A torch parameter with requires_grad False (frozen) counts with gradient zero: the JAX
     twin's gradient for it must be zero within grad_atol.

Torch names that differ from the flax twin's attribute paths are mapped with `name_map` (a
callable, or regex rules applied in order) before the strict converter and the gradient match.
Parameters that differ by more than a name (torch.nn's fused in_proj_weight) are mapped by
`state_map`, a function of the whole {torch name: tensor} dict applied to the state dict and,
being slices and reshapes, to the gradients alike (jaxformer.interop.torch_state).
A float leaf past its tolerance is judged again against torch rerun in float64 (the referee,
docs/numerics.md §32): it passes when jaxformer is within tolerance of float64 and no farther
from it than torch fp32 is, and the report names the side that is off.
The settings are a ParityOptions. With `reference=True` the torch module also runs in float64
(a deep copy), and the report holds each framework's distance from that reference (`spread`):
how the defaults were measured.
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import inspect
import re
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from jaxformer.parity.locate import first_parting
from jaxformer.parity.results import (
    GRAD_TOL,
    OUT_TOL,
    TWIN64_TOL,
    LeafDiff,
    ParityError,
    ParityReport,
    Tolerance,
    _compare,
    judge,
)
from jaxformer.parity.trees import flatten, is_float


def setup_precision() -> None:
    """fp32 everywhere: JAX matmuls at 'highest', TF32 off in torch (docs/numerics.md §3).
    Global and permanent (test conftests); `parity_precision` is the scoped form."""
    import jax
    import torch
    jax.config.update("jax_default_matmul_precision", "highest")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")


@contextlib.contextmanager
def parity_precision() -> Iterator[None]:
    """setup_precision() for the duration of the block; the previous JAX matmul precision and
    torch TF32 / matmul-precision settings are restored on exit, even on error."""
    import jax
    import torch
    saved = (jax.config.jax_default_matmul_precision, torch.backends.cuda.matmul.allow_tf32,
             torch.backends.cudnn.allow_tf32, torch.get_float32_matmul_precision())
    setup_precision()
    try:
        yield
    finally:
        jax.config.update("jax_default_matmul_precision", saved[0])
        torch.backends.cuda.matmul.allow_tf32 = saved[1]
        torch.backends.cudnn.allow_tf32 = saved[2]
        torch.set_float32_matmul_precision(saved[3])


# ----------------------------------------------------------------------------- helpers
def name_mapper(rules) -> Callable[[str], str]:
    """torch key -> the key the converter expects (the flax attribute path, torch leaf names).

    rules: None (identity); a callable; a mapping {regex: replacement}; or a sequence of
    (regex, replacement) pairs or 'regex=replacement' strings, applied in order with re.sub."""
    if rules is None:
        return lambda k: k
    if callable(rules):
        return rules
    pairs = list(rules.items()) if isinstance(rules, Mapping) else list(rules)
    compiled = []
    for rule in pairs:
        if isinstance(rule, str):
            if "=" not in rule:
                raise ValueError(f"name-map rule {rule!r} is not 'torch_regex=flax_replacement'")
            rule = rule.split("=", 1)
        pattern, repl = rule
        try:
            compiled.append((re.compile(pattern), repl))
        except re.error as e:
            raise ValueError(f"name-map rule {pattern!r}: not a regular expression ({e})") from None

    def apply(key: str) -> str:
        for rx, repl in compiled:
            key = rx.sub(repl, key)
        return key
    return apply


def _split_inputs(inputs):
    if isinstance(inputs, Mapping):
        return (), dict(inputs)
    if isinstance(inputs, (tuple, list)):
        return tuple(inputs), {}
    return (inputs,), {}


def _projection(name: str, shape: tuple, seed: int) -> np.ndarray:
    """A fixed random cotangent per output leaf, so the loss sees every element."""
    h = zlib.crc32(f"{name}/{seed}".encode())  # stable across processes (unlike hash())
    return np.random.RandomState(h).standard_normal(shape).astype(np.float32)


def _is_nnx_module(m) -> bool:
    from flax import nnx
    return isinstance(m, nnx.Module)


@contextlib.contextmanager
def _float64_upcasts() -> Iterator[None]:
    """Inside the float64 reference run, `.float()` and torch_ref's "float32" compute dtype (the
    trees' "compute this in fp32") leave float64 as it is, so the reference stays float64."""
    import torch

    from torch_ref.models import common
    original, dtypes = torch.Tensor.float, dict(common.COMPUTE_DTYPES)

    def keep64(self, *a, **k):
        return self if self.dtype == torch.float64 else original(self, *a, **k)
    torch.Tensor.float = keep64
    common.COMPUTE_DTYPES["float32"] = torch.float64
    try:
        yield
    finally:
        torch.Tensor.float = original
        common.COMPUTE_DTYPES.update(dtypes)


def _map_state(state: Mapping[str, Any], rename, state_map) -> dict[str, Any]:
    """{torch name: tensor} -> {converter key: tensor}: state_map (if any), then rename."""
    state = state_map(dict(state)) if state_map is not None else state
    return {rename(k): v for k, v in state.items()}


def _torch_side(module, args, kwargs, float_pos, float_kw, *, grads: bool, seed: int, rename,
                float64: bool = False, state_map=None):
    """Torch outputs {leaf: np} and gradients {name: np} of loss = sum <proj, out>."""
    import torch
    is_mod = isinstance(module, torch.nn.Module)
    if float64:
        module = copy.deepcopy(module).double() if is_mod else module
        cast = lambda a: a.astype(np.float64) if is_float(a) else a
        args = tuple(cast(a) for a in args)
        kwargs = {k: (None if v is None else cast(v)) for k, v in kwargs.items()}
    t_args = [torch.tensor(a, requires_grad=grads and i in float_pos) for i, a in enumerate(args)]
    t_kwargs = {k: (None if v is None else torch.tensor(v, requires_grad=grads and k in float_kw))
                for k, v in kwargs.items()}
    with _float64_upcasts() if float64 else contextlib.nullcontext():
        t_out = flatten(module(*t_args, **t_kwargs))
        out_np = {k: v.detach().numpy() for k, v in t_out.items()}
        grad_np: dict[str, np.ndarray] = {}
        float_outs = [k for k in sorted(t_out) if torch.is_floating_point(t_out[k])]
        if grads and float_outs:
            loss = sum((t_out[k] * torch.from_numpy(_projection(k, tuple(out_np[k].shape), seed))
                        .to(t_out[k].dtype)).sum() for k in float_outs)
            params = {n: p for n, p in module.named_parameters() if p.requires_grad} if is_mod else {}
            leaves = dict(params)
            leaves.update({f"input {i}": t_args[i] for i in float_pos})
            leaves.update({f"input {k}": t_kwargs[k] for k in float_kw})
            got = torch.autograd.grad(loss, list(leaves.values()), allow_unused=True)
            got = {n: torch.zeros_like(leaf) if g is None else g for (n, leaf), g in zip(leaves.items(), got, strict=True)}
            grads_by_name = {n: got[n] for n in params}
            # a frozen parameter (requires_grad False: LoRA's base) has gradient zero by
            # definition; the JAX twin must give zero too (layers/lora.py's stop_gradient)
            grads_by_name.update({n: torch.zeros_like(p) for n, p in module.named_parameters()
                                  if not p.requires_grad} if is_mod else {})
            param_grads = _map_state(grads_by_name, rename, state_map)
            grad_np = {n: g.detach().numpy() for n, g in param_grads.items()}
            grad_np.update({n: got[n].numpy() for n in leaves if n not in params})
    return out_np, grad_np, float_outs


def _spread(x: Mapping[str, np.ndarray], ref: Mapping[str, np.ndarray]) -> float:
    """worst over leaves of max |x - ref| / max |ref| (leaves with ref all 0: absolute)."""
    worst = 0.0
    for k in set(x) & set(ref):
        if not is_float(np.asarray(ref[k])):
            continue
        r = np.asarray(ref[k], np.float64)
        d = float(np.abs(np.asarray(x[k], np.float64) - r).max(initial=0))
        worst = max(worst, d / max(float(np.abs(r).max(initial=0)), 1e-30) if d else 0.0)
    return worst


# XLA:CPU compile options for the harness's programs. Each is compiled to run once on tiny
# shapes, where compiling is nearly all the time: LLVM codegen at optimisation level 0 (the
# default level doubles the compile time and saves microseconds), and the loop fusions emitted
# by XLA's elemental IR emitter instead of its MLIR fusion emitters (2.5x less compile time;
# docs/numerics.md §43), and in one LLVM module instead of split for parallel codegen (a third
# less compile CPU; §39). The HLO, its fp32 arithmetic (no fast math either way) and the
# tolerances are unchanged. Only the CPU backend gets them.
_ONE_SHOT = {"xla_backend_optimization_level": 0, "xla_cpu_use_fusion_emitters": False,
             "xla_cpu_parallel_codegen_split_count": 1}


def _run_once(fn, *args):
    """jax.jit(fn)(*args), compiled for a single call (_ONE_SHOT)."""
    import jax
    compiled = jax.jit(fn).lower(*args)
    options = _ONE_SHOT if jax.default_backend() == "cpu" else None
    return compiled.compile(options)(*args)


# ----------------------------------------------------------------------------- main entry
@dataclasses.dataclass(frozen=True)
class ParityOptions:
    """check_parity's settings; the defaults: tolerances OUT_TOL and GRAD_TOL, weights converted,
    gradients compared, the referee and locate on.

    out_tol, grad_tol: per-leaf Tolerance(atol, rtol) for outputs and gradients.
    convert: copy torch's weights into the flax module first (strict converter).
    grads: also compare the gradients (False: outputs only).
    case: the report's name for the check.  seed: the loss projection's seed.
    name_map: torch key -> converter key (see `name_mapper`: None, a callable, or regex rules),
        when the names differ; `rename` is it as a function.
    reference: also run torch in float64 and fill `report.spread`.
    state_map: {torch name: tensor} -> {key: tensor}, applied before name_map to the state
        dict and to the parameter gradients (a fused tensor split into its parts).
    referee: when a float leaf fails against torch fp32, rerun torch in float64 and judge
        that leaf against it (docs/numerics.md §32): it passes when jaxformer is within
        tolerance of float64 and no farther from it than torch fp32 is. Only failing
        checks pay for the rerun; each judged leaf carries `LeafDiff.referee`.
    locate: on a failure, run both trees once more recording every submodule's output and
        name the first that parts (`report.parting`; jaxformer/parity/locate.py).
    twin64: a callable returning the flax module as a float64 twin (its weights torch's in
        float64), called inside `jax.enable_x64`. Where both fp32 answers of a leaf are past
        tolerance of float64 (ill-conditioned), the referee runs the twin and excuses the
        leaf when it gives torch's float64 answer (results.TWIN64_TOL; docs/numerics.md §44).
    """
    out_tol: Tolerance = OUT_TOL
    grad_tol: Tolerance = GRAD_TOL
    convert: bool = True
    grads: bool = True
    case: str = "custom"
    seed: int = 0
    name_map: Any = None
    reference: bool = False
    state_map: Callable | None = None
    referee: bool = True
    locate: bool = True
    twin64: Callable | None = None

    @functools.cached_property
    def rename(self) -> Callable[[str], str]:
        """name_map as a function (name_mapper); a bad rule raises ValueError."""
        return name_mapper(self.name_map)


def check_parity(torch_module: Callable, flax_module: Callable, inputs,
                 options: ParityOptions | None = None) -> ParityReport:
    """Run both modules on the same inputs and compare outputs and gradients (see module doc).

    Args:
        torch_module: a torch.nn.Module (or any callable on torch tensors).
        flax_module: its nnx.Module twin (or any callable on jax arrays).
        inputs: numpy arrays, as a dict of keyword arguments or a tuple of positional ones.
            Float arrays get gradients; integer/bool arrays are passed as they are.
        options: a ParityOptions (tolerances, conversion, name maps, referee, ...); None: its
            defaults.
    """
    opts = ParityOptions() if options is None else options
    _ = opts.rename  # name_map's rules checked before anything runs
    with parity_precision():
        return _check(torch_module, flax_module, inputs, opts)


@dataclasses.dataclass
class _Inputs:
    """The inputs as numpy: positional and keyword, and which of them are float (they get
    gradients on both sides)."""
    args: tuple
    kwargs: dict
    float_pos: list
    float_kw: list

    @classmethod
    def of(cls, inputs) -> _Inputs:
        args, kwargs = _split_inputs(inputs)
        args = tuple(np.asarray(a) for a in args)
        kwargs = {k: (np.asarray(v) if v is not None else None) for k, v in kwargs.items()}
        return cls(args, kwargs, [i for i, a in enumerate(args) if is_float(a)],
                   [k for k, v in kwargs.items() if v is not None and is_float(v)])


def _check(torch_module, flax_module, inputs, o: ParityOptions) -> ParityReport:
    """The phases: set both modules up, run torch, run JAX, compare, referee, locate."""
    import torch
    problems: list[str] = []
    notes: list[str] = []
    inp = _Inputs.of(inputs)
    is_torch_mod = isinstance(torch_module, torch.nn.Module)
    is_flax_mod = _is_nnx_module(flax_module)
    _set_up(torch_module, flax_module, is_torch_mod, is_flax_mod, o)
    t_out, t_grad, float_outs = _torch_side(torch_module, inp.args, inp.kwargs, inp.float_pos, inp.float_kw,
                                            grads=o.grads, seed=o.seed, rename=o.rename, state_map=o.state_map)
    j_out, g_all = _jax_side(flax_module, is_flax_mod, inp, t_out, float_outs if o.grads else [], o.seed)
    outputs = _compare_leaves(j_out, t_out, o.out_tol, "output", problems)
    j_grad, grad_leaves = {}, {}
    if g_all is not None:
        j_grad = _jax_grads(flax_module, is_flax_mod, inp, g_all)
        held = _held_frozen(torch_module, flax_module, j_grad, o) if is_torch_mod and is_flax_mod else []
        if held:  # frozen on both sides: no gradient to compare (a frozen Param still must give 0)
            t_grad = {k: v for k, v in t_grad.items() if k not in held}
            notes.append(f"frozen parameters held as non-trainable state by the flax module, gradient not compared: "
                         f"{', '.join(sorted(held.values()))}")
        if set(j_grad) != set(t_grad):
            problems.append(f"gradient keys differ: only jax {sorted(set(j_grad) - set(t_grad))}, "
                            f"only torch {sorted(set(t_grad) - set(j_grad))}")
        grad_leaves = _compare_leaves(j_grad, t_grad, o.grad_tol, "grad", problems)
    spread, referee_notes = _referee(torch_module, inp, o, float_outs, (outputs, j_out, t_out, o.out_tol),
                                     (grad_leaves, j_grad, t_grad, o.grad_tol))
    notes += referee_notes
    ok = not problems and all(d.ok for d in (*outputs.values(), *grad_leaves.values()))
    parting = None
    if not ok and o.locate and is_torch_mod and is_flax_mod:  # where outputs part first
        try:
            parting = first_parting(torch_module, flax_module, inp.args, inp.kwargs, o.out_tol, o.rename)
        except Exception as e:  # the trees could not run eagerly with recording: say so, keep the verdict
            notes.append(f"could not locate where outputs part: {type(e).__name__}: {e}")
    return ParityReport(o.case, ok, outputs, grad_leaves, problems, o.out_tol, o.grad_tol, spread, parting, notes)


def _held_frozen(torch_module, flax_module, j_grad: Mapping, o: ParityOptions) -> dict[str, str]:
    """{gradient key: torch name} of the torch parameters with requires_grad=False that the flax
    module holds as state outside nnx.Param (a ported file's `Frozen`): trained by neither side,
    so their gradient is not compared. A frozen parameter the flax side holds as an nnx.Param
    (LoRA's base under stop_gradient) is still compared: its gradient must be 0."""
    from flax import nnx

    from jaxformer import convert as conv
    frozen = [n for n, p in torch_module.named_parameters() if not p.requires_grad]
    if not frozen:
        return {}
    saved = {conv.torch_key(p) for p, v in conv.param_leaves(flax_module).items() if not isinstance(v, nnx.Param)}
    out = {}
    for name in frozen:
        key = next(iter(_map_state({name: None}, o.rename, o.state_map)), None)
        if key is not None and key not in j_grad and key in saved:
            out[key] = name
    return out


def _set_up(torch_module, flax_module, is_torch_mod: bool, is_flax_mod: bool, o: ParityOptions) -> None:
    """Both in eval mode; torch's weights copied into the flax module (strict converter)."""
    from jaxformer import convert as conv
    if is_torch_mod:
        torch_module.eval()
    if is_flax_mod:
        flax_module.eval()
        if o.convert:
            conv.load_torch_state_dict(flax_module, _map_state(torch_module.state_dict(), o.rename, o.state_map))
        _require_concrete(flax_module)


def _require_concrete(flax_module) -> None:
    """A flax module built abstractly (jaxformer.parity.cases.twin) runs once the load has
    filled every leaf; a leaf still abstract is named here, not deep inside the trace."""
    import jax
    from flax import nnx
    abstract = [".".join(map(str, p)) for p, v in nnx.to_flat_state(nnx.state(flax_module))
                if isinstance(v.get_value(), jax.ShapeDtypeStruct)]
    if abstract:
        raise ValueError(f"flax module has abstract leaves the torch weights did not fill: {abstract[:6]}"
                         + (f" (+{len(abstract) - 6} more)" if len(abstract) > 6 else ""))


def _jax_side(flax_module, is_flax_mod: bool, inp: _Inputs, t_out: dict, float_outs: list, seed: int):
    """JAX outputs {leaf: np}, and with float_outs the gradients of loss = sum <proj, out> with
    respect to (params, float args, float kwargs), from one jitted program (None without)."""
    import jax
    import jax.numpy as jnp
    from flax import nnx
    graphdef, params, rest = nnx.split(flax_module, nnx.Param, ...) if is_flax_mod else (None, {}, None)

    def run(params, f_args, f_kwargs):
        # fresh Variables at this trace level (NNX refuses mutations, e.g. RNG counts, of
        # Variables that were created outside jax.grad)
        model = nnx.merge(graphdef, params, jax.tree.map(lambda a: a, rest)) \
            if graphdef is not None else flax_module
        a = list(jnp.asarray(x) for x in inp.args)
        for i, v in zip(inp.float_pos, f_args, strict=True):
            a[i] = v
        kw = {k: (None if v is None else v.item() if v.ndim == 0 else jnp.asarray(v))
              for k, v in inp.kwargs.items()}  # 0-d: flags such as return_intermediates stay static
        kw.update(f_kwargs)
        return flatten(model(*a, **kw))

    f_args = [jnp.asarray(inp.args[i]) for i in inp.float_pos]
    f_kwargs = {k: jnp.asarray(inp.kwargs[k]) for k in inp.float_kw}
    # jitted, as users run it (and one compile instead of one per primitive: 10x faster here);
    # with gradients, outputs and gradients come from one program (value_and_grad, the outputs
    # as aux): one trace and one compile instead of a forward and a backward one
    if not float_outs:
        out = _run_once(run, params, f_args, f_kwargs)
        return {k: np.asarray(v) for k, v in out.items()}, None
    proj = {k: _projection(k, tuple(t_out[k].shape), seed) for k in float_outs}

    def loss(params, f_args, f_kwargs):
        out = run(params, f_args, f_kwargs)
        return sum((jnp.sum(out[k] * proj[k]) for k in float_outs if k in out), jnp.zeros((), jnp.float32)), out

    (_, out), g_all = _run_once(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True), params, f_args, f_kwargs)
    j_out = {k: np.asarray(v) for k, v in out.items()}
    return j_out, (g_all if any(k in j_out for k in float_outs) else None)


def _jax_grads(flax_module, is_flax_mod: bool, inp: _Inputs, g_all) -> dict[str, np.ndarray]:
    """The JAX gradients by torch name: parameters through the converter's key rules, inputs as
    "input i" / "input name"."""
    from flax import nnx

    from jaxformer import convert as conv
    g_params, g_args, g_kwargs = g_all
    j_grad: dict[str, np.ndarray] = {}
    if is_flax_mod:
        prefixes = conv.scan_prefixes(flax_module)
        for path, v in nnx.to_flat_state(g_params):
            x = np.asarray(v.get_value() if hasattr(v, "get_value") else v)
            j_grad.update(conv.flax_leaf_to_torch(tuple(path), x, prefixes))
    for i, g in zip(inp.float_pos, g_args, strict=True):
        j_grad[f"input {i}"] = np.asarray(g)
    for k, g in g_kwargs.items():
        j_grad[f"input {k}"] = np.asarray(g)
    return j_grad


def _compare_leaves(j: dict, t: dict, tol: Tolerance, kind: str, problems: list[str]) -> dict[str, LeafDiff]:
    """Each common leaf against its own scale (integer outputs exactly); mismatched structure,
    shapes and non-finite values go to `problems`."""
    if kind == "output" and set(j) != set(t):
        problems.append(f"output structure differs: jax {sorted(j)} vs torch {sorted(t)}")
    leaves: dict[str, LeafDiff] = {}
    for k in sorted(set(j) & set(t)):
        a, b = j[k], t[k]
        if a.shape != b.shape:
            problems.append(f"{kind} {k}: shape jax {a.shape} vs torch {b.shape}")
            continue
        if kind == "output" and (a.dtype == np.bool_ or not is_float(a)):  # exact: integer outputs
            leaves[k] = LeafDiff(float(np.abs(a.astype(np.int64) - b.astype(np.int64)).max(initial=0)), 0.0,
                                 float(np.abs(b.astype(np.int64)).max(initial=0)))
            continue
        if not (np.isfinite(a).all() and np.isfinite(b).all()):
            problems.append(f"output {k}: non-finite values (jax {int((~np.isfinite(a)).sum())}, "
                            f"torch {int((~np.isfinite(b)).sum())})" if kind == "output"
                            else f"grad {k}: non-finite values")
        leaves[k] = _compare(a, b, tol)
    return leaves


def _referee(torch_module, inp: _Inputs, o: ParityOptions, float_outs: list, *sides) -> tuple[dict[str, float], list[str]]:
    """The float64 referee (docs/numerics.md §32), run only where a float leaf failed (or for
    `reference`): judges each failing leaf in place. sides: (leaves, jax, torch, tol) for the
    outputs and the gradients. -> (spread, notes)."""
    failing = [(leaves, j, t, k, tol) for leaves, j, t, tol in sides for k, d in leaves.items()
               if d.diff > d.tol and is_float(t[k])]
    notes: list[str] = []
    r_out = r_grad = None
    if o.reference or (o.referee and failing):
        try:
            r_out, r_grad, _ = _torch_side(torch_module, inp.args, inp.kwargs, inp.float_pos, inp.float_kw,
                                           grads=o.grads, seed=o.seed, rename=o.rename, float64=True,
                                           state_map=o.state_map)
        except Exception as e:  # a torch callable that cannot run in float64: the leaves stay failed
            if o.reference:
                raise
            notes.append(f"float64 referee unavailable: {type(e).__name__}: {e}")
    spread: dict[str, float] = {}
    (_, j_out, t_out, _), (_, j_grad, t_grad, _) = sides
    if o.reference:
        spread = {"torch out": _spread(t_out, r_out), "jax out": _spread(j_out, r_out),
                  "torch grad": _spread(t_grad, r_grad), "jax grad": _spread(j_grad, r_grad)}
    if o.referee and r_out is not None:
        outputs = sides[0][0]
        for leaves, j, t, k, tol in failing:
            f64 = (r_out if leaves is outputs else r_grad).get(k)
            if f64 is not None and np.shape(f64) == j[k].shape:
                leaves[k] = dataclasses.replace(leaves[k], referee=judge(j[k], t[k], f64, tol))
        judged = [(leaves, k) for leaves, _, _, k, _ in failing if leaves[k].referee is not None
                  and not leaves[k].referee.excused]
        if o.twin64 is not None and any(leaves[k].referee.ill_conditioned for leaves, k in judged):
            # measured on every leaf still failing (it says whether the two compute the same
            # function); it excuses only the ill-conditioned ones (results.Referee.excused)
            _twin64(o, inp, float_outs, judged, outputs, r_out, r_grad, notes)
    return spread, notes


def _twin64(o: ParityOptions, inp: _Inputs, float_outs: list, ill: list, outputs: dict, r_out: dict, r_grad: dict,
            notes: list[str]) -> None:
    """The float64 twin's measurement of the leaves in `ill`, in place: the flax module rerun in
    float64 (o.twin64) against torch's float64 answer (results.TWIN64_TOL)."""
    import jax
    f64 = lambda a: a.astype(np.float64) if is_float(a) else a
    inp64 = _Inputs(tuple(f64(a) for a in inp.args), {k: None if v is None else f64(v) for k, v in inp.kwargs.items()},
                    inp.float_pos, inp.float_kw)
    try:
        with jax.enable_x64(True):
            twin = o.twin64()
            t_out = {k: r_out[k] for k in float_outs if k in r_out}
            j_out, g_all = _jax_side(twin, True, inp64, t_out, float_outs if o.grads else [], o.seed)
            j_grad = _jax_grads(twin, True, inp64, g_all) if g_all is not None else {}
    except Exception as e:  # the twin cannot run: the leaves stay failed, and the report says why
        notes.append(f"float64 twin unavailable: {type(e).__name__}: {_first_line(e)}")
        return
    for leaves, k in ill:
        ref, mine = (r_out, j_out) if leaves is outputs else (r_grad, j_grad)
        if k not in mine or np.shape(mine[k]) != np.shape(ref[k]):
            continue
        ref64 = np.asarray(ref[k], np.float64)
        err = float(np.abs(np.asarray(mine[k], np.float64) - ref64).max(initial=0))
        leaf = leaves[k]
        leaves[k] = dataclasses.replace(leaf, referee=dataclasses.replace(
            leaf.referee, twin_err=err, twin_tol=TWIN64_TOL.bound(float(np.abs(ref64).max(initial=0)))))


def _first_line(e: BaseException) -> str:
    lines = [ln for ln in str(e).splitlines() if ln.strip()]
    return lines[0][:300] if lines else type(e).__name__


def assert_parity(torch_module, flax_module, inputs, options: ParityOptions | None = None) -> ParityReport:
    """check_parity, raising ParityError (with the worst offenders named) when it fails."""
    r = check_parity(torch_module, flax_module, inputs, options)
    if not r.ok:
        raise ParityError(r.message())
    return r


def first_divergence(torch_inter: Mapping[str, Any], flax_inter: Mapping[str, Any],
                     tol: float | Tolerance = OUT_TOL, order: Sequence[str] | None = None) -> str | None:
    """Given named intermediates from both frameworks (return_intermediates=True), the first
    name in depth order whose max abs diff exceeds tol (a Tolerance: scaled by that
    intermediate's max |torch|; a float: absolute), as 'name (diff)'; None if they all
    agree. The models report sub-layers ("decoder.layers.1.attn", ".attn_residual", ".ffn",
    then "decoder.layers.1"; jaxformer/layers/transformer.py), so the name is the first
    sub-layer that parts, not only its layer. Depth order is `order`, else torch_inter's own
    (insertion) order: a jitted JAX dict comes back with sorted keys, so pass the torch side
    first, or pass `order`. A name missing on the flax side is a KeyError."""
    keys = list(order) if order is not None else list(torch_inter)
    for k in keys:
        d = max_abs_diff(torch_inter[k], flax_inter[k])
        bound = tol.bound(float(np.abs(to_numpy(torch_inter[k])).max(initial=0))) if isinstance(tol, Tolerance) else tol
        if d > bound:
            return f"{k} ({d:.3e})"
    return None


def accepts(fn: Callable, name: str) -> bool:
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


# ----------------------------------------------------------------------------- intermediates
def to_numpy(x) -> np.ndarray:
    """A torch tensor (detached) or any array -> numpy."""
    return x.detach().cpu().numpy() if hasattr(x, "detach") else np.asarray(x)


def max_abs_diff(a, b) -> float:
    """max |a - b| in float64 over two arrays of the same shape (torch or numpy/jax)."""
    a, b = to_numpy(a).astype(np.float64), to_numpy(b).astype(np.float64)
    if a.shape != b.shape:
        raise ValueError(f"shapes differ: {a.shape} vs {b.shape}")
    return float(np.abs(a - b).max(initial=0))


def intermediate_diffs(torch_inter: Mapping[str, Any], flax_inter: Mapping[str, Any]) -> dict[str, float]:
    """{name: max |torch - flax|} over the names both sides report, in torch_inter's (depth)
    order. ValueError naming the keys when the two sides report different names."""
    only_t, only_j = set(torch_inter) - set(flax_inter), set(flax_inter) - set(torch_inter)
    if only_t or only_j:
        raise ValueError(f"intermediates differ: only torch {sorted(only_t)}, only jax {sorted(only_j)}")
    return {k: max_abs_diff(torch_inter[k], flax_inter[k]) for k in torch_inter}
