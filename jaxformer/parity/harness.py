"""Parity checks between a torch module and its Flax NNX twin: outputs and gradients.

    from jaxformer.parity import assert_parity
    report = assert_parity(torch_module, flax_module, {"x": x_np, "mask": mask_np})

The torch weights are converted into the flax module (strict), both run in fp32 eval mode with
JAX matmul precision 'highest' and TF32 off, and the function compares
  1. every output leaf:                     max |out_jax - out_torch| <= tol
  2. the gradients of a scalar loss (a fixed random projection of every float output) with
     respect to every parameter and every float input:
                                            max |g_jax - g_torch| <= grad_tol * max(1, max |g|)
"""
from __future__ import annotations

import dataclasses
import inspect
import zlib
from typing import Any, Callable, Mapping, Sequence

import numpy as np


def setup_precision() -> None:
    """fp32 everywhere: JAX matmuls at 'highest', TF32 off in torch (docs/numerics.md §3)."""
    import jax
    import torch
    jax.config.update("jax_default_matmul_precision", "highest")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")


@dataclasses.dataclass
class ParityReport:
    case: str
    max_abs_out: float
    max_abs_grad: float
    grad_scale: float  # max(1, max |grad|)
    tol: float
    grad_tol: float
    ok: bool
    outputs: dict[str, float] = dataclasses.field(default_factory=dict)  # per output leaf
    grads: dict[str, float] = dataclasses.field(default_factory=dict)  # per param / input
    problems: list[str] = dataclasses.field(default_factory=list)

    def row(self) -> dict:
        return {"case": self.case, "max_abs_out": self.max_abs_out, "max_abs_grad": self.max_abs_grad,
                "tol": self.tol, "ok": self.ok}

    def worst(self, n: int = 3) -> str:
        items = sorted({**{f"out {k}": v for k, v in self.outputs.items()},
                        **{f"grad {k}": v for k, v in self.grads.items()}}.items(), key=lambda kv: -kv[1])
        return ", ".join(f"{k}={v:.2e}" for k, v in items[:n])


class ParityError(AssertionError):
    pass


# ----------------------------------------------------------------------------- helpers
def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """Nested tuples/lists/dicts -> {"0", "1.attn", ...: leaf}. None leaves are dropped."""
    if tree is None:
        return {}
    if isinstance(tree, Mapping):
        out = {}
        for k in tree:
            out.update(flatten(tree[k], f"{prefix}{k}."))
        return out
    if isinstance(tree, (tuple, list)):
        out = {}
        for i, v in enumerate(tree):
            out.update(flatten(v, f"{prefix}{i}."))
        return out
    return {prefix.rstrip(".") or "out": tree}


def _is_float_np(x: np.ndarray) -> bool:
    return np.issubdtype(x.dtype, np.floating)


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


# ----------------------------------------------------------------------------- main entry
def check_parity(torch_module: Callable, flax_module: Callable, inputs, *, tol: float = 1e-5,
                 grad_tol: float = 1e-5, convert: bool = True, grads: bool = True,
                 case: str = "custom", seed: int = 0) -> ParityReport:
    """Run both modules on the same inputs and compare outputs and gradients (see module doc).

    Args:
        torch_module: a torch.nn.Module (or any callable on torch tensors).
        flax_module: its nnx.Module twin (or any callable on jax arrays).
        inputs: numpy arrays, as a dict of keyword arguments or a tuple of positional ones.
            Float arrays get gradients; integer/bool arrays are passed as they are.
        convert: copy torch's weights into the flax module first (strict converter).
    """
    import jax
    import jax.numpy as jnp
    import torch
    from flax import nnx

    from jaxformer import convert as conv

    setup_precision()
    problems: list[str] = []
    args, kwargs = _split_inputs(inputs)
    args = tuple(np.asarray(a) for a in args)
    kwargs = {k: (np.asarray(v) if v is not None else None) for k, v in kwargs.items()}
    is_torch_mod = isinstance(torch_module, torch.nn.Module)
    is_flax_mod = _is_nnx_module(flax_module)
    if is_torch_mod:
        torch_module.eval()
    if is_flax_mod:
        flax_module.eval()
        if convert:
            conv.load_torch_state_dict(flax_module, torch_module.state_dict())

    # float inputs get gradients on both sides
    float_pos = [i for i, a in enumerate(args) if _is_float_np(a)]
    float_kw = [k for k, v in kwargs.items() if v is not None and _is_float_np(v)]

    # ---- torch forward + backward
    t_args = [torch.tensor(a, requires_grad=grads and i in float_pos) for i, a in enumerate(args)]
    t_kwargs = {k: (None if v is None else torch.tensor(v, requires_grad=grads and k in float_kw))
                for k, v in kwargs.items()}
    t_out = flatten(torch_module(*t_args, **t_kwargs))
    t_out_np = {k: v.detach().numpy() for k, v in t_out.items()}

    # ---- jax forward as a pure function of (params, float inputs)
    if is_flax_mod:
        graphdef, params, rest = nnx.split(flax_module, nnx.Param, ...)
    else:
        graphdef, params, rest = None, {}, None

    def run(params, f_args, f_kwargs):
        # fresh Variables at this trace level (NNX refuses mutations, e.g. RNG counts, of
        # Variables that were created outside jax.grad)
        model = nnx.merge(graphdef, params, jax.tree.map(lambda a: a, rest)) \
            if graphdef is not None else flax_module
        a = list(jnp.asarray(x) for x in args)
        for i, v in zip(float_pos, f_args):
            a[i] = v
        kw = {k: (None if v is None else v.item() if v.ndim == 0 else jnp.asarray(v))
              for k, v in kwargs.items()}  # 0-d: flags such as return_intermediates stay static
        kw.update(f_kwargs)
        return flatten(model(*a, **kw))

    f_args = [jnp.asarray(args[i]) for i in float_pos]
    f_kwargs = {k: jnp.asarray(kwargs[k]) for k in float_kw}
    # jitted, as users run it (and one compile instead of one per primitive: 10x faster here)
    j_out = jax.jit(run)(params, f_args, f_kwargs)

    # ---- outputs
    out_diffs: dict[str, float] = {}
    if set(j_out) != set(t_out_np):
        problems.append(f"output structure differs: jax {sorted(j_out)} vs torch {sorted(t_out_np)}")
    for k in sorted(set(j_out) & set(t_out_np)):
        a, b = np.asarray(j_out[k]), t_out_np[k]
        if a.shape != b.shape:
            problems.append(f"output {k}: shape jax {a.shape} vs torch {b.shape}")
            continue
        if a.dtype == np.bool_ or not _is_float_np(a):
            out_diffs[k] = float(np.abs(a.astype(np.int64) - b.astype(np.int64)).max(initial=0))
            continue
        if not (np.isfinite(a).all() and np.isfinite(b).all()):
            problems.append(f"output {k}: non-finite values (jax {int((~np.isfinite(a)).sum())}, "
                            f"torch {int((~np.isfinite(b)).sum())})")
        out_diffs[k] = float(np.abs(a.astype(np.float64) - b.astype(np.float64)).max(initial=0))
    max_out = max(out_diffs.values(), default=0.0)

    # ---- gradients of loss = sum_leaf <w_leaf, out_leaf>
    grad_diffs: dict[str, float] = {}
    grad_scale = 1.0
    max_grad = 0.0
    float_outs = [k for k in sorted(t_out) if k in j_out and torch.is_floating_point(t_out[k])]
    if grads and float_outs:
        proj = {k: _projection(k, tuple(t_out_np[k].shape), seed) for k in float_outs}
        t_loss = sum((t_out[k] * torch.from_numpy(proj[k])).sum() for k in float_outs)
        t_params = dict(torch_module.named_parameters()) if is_torch_mod else {}
        t_leaves = list(t_params.values()) + [t_args[i] for i in float_pos] + [t_kwargs[k] for k in float_kw]
        t_leaves = [x for x in t_leaves if x.requires_grad]
        t_grads = torch.autograd.grad(t_loss, t_leaves, allow_unused=True)
        t_grad = {}
        names = [n for n, p in t_params.items() if p.requires_grad] + \
            [f"input {i}" for i in float_pos] + [f"input {k}" for k in float_kw]
        for n, leaf, g in zip(names, t_leaves, t_grads):
            t_grad[n] = np.zeros(tuple(leaf.shape), np.float32) if g is None else g.numpy()

        def loss(params, f_args, f_kwargs):
            out = run(params, f_args, f_kwargs)
            return sum(jnp.sum(out[k] * proj[k]) for k in float_outs)

        g_params, g_args, g_kwargs = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(params, f_args, f_kwargs)
        j_grad = {}
        if is_flax_mod:
            prefixes = conv.scan_prefixes(flax_module)
            for path, v in nnx.to_flat_state(g_params):
                x = np.asarray(v.get_value() if hasattr(v, "get_value") else v)
                j_grad.update(conv.flax_leaf_to_torch(tuple(path), x, prefixes))
        for i, g in zip(float_pos, g_args):
            j_grad[f"input {i}"] = np.asarray(g)
        for k, g in g_kwargs.items():
            j_grad[f"input {k}"] = np.asarray(g)
        if set(j_grad) != set(t_grad):
            problems.append(f"gradient keys differ: only jax {sorted(set(j_grad) - set(t_grad))}, "
                            f"only torch {sorted(set(t_grad) - set(j_grad))}")
        for k in sorted(set(j_grad) & set(t_grad)):
            a, b = j_grad[k], t_grad[k]
            if a.shape != b.shape:
                problems.append(f"grad {k}: shape jax {a.shape} vs torch {b.shape}")
                continue
            if not (np.isfinite(a).all() and np.isfinite(b).all()):
                problems.append(f"grad {k}: non-finite values")
            grad_diffs[k] = float(np.abs(a.astype(np.float64) - b.astype(np.float64)).max(initial=0))
            grad_scale = max(grad_scale, float(np.abs(b).max(initial=0)))
        max_grad = max(grad_diffs.values(), default=0.0)

    ok = not problems and max_out <= tol and max_grad <= grad_tol * grad_scale
    return ParityReport(case, max_out, max_grad, grad_scale, tol, grad_tol, ok, out_diffs, grad_diffs,
                        problems)


def assert_parity(torch_module, flax_module, inputs, **kw) -> ParityReport:
    """check_parity, raising ParityError (with the worst offenders named) when it fails."""
    r = check_parity(torch_module, flax_module, inputs, **kw)
    if not r.ok:
        raise ParityError(
            f"parity failed for {r.case}: max |out| diff {r.max_abs_out:.3e} (tol {r.tol:.0e}), "
            f"max |grad| diff {r.max_abs_grad:.3e} (tol {r.grad_tol:.0e} x {r.grad_scale:.3g}); "
            f"worst: {r.worst()}; problems: {r.problems}")
    return r


def first_divergence(torch_inter: Mapping[str, Any], flax_inter: Mapping[str, Any], tol: float = 1e-5,
                     order: Sequence[str] | None = None) -> str | None:
    """Given named intermediates from both frameworks (return_intermediates=True), the first
    name in depth order whose max abs diff exceeds tol, as 'name (diff)'; None if they all
    agree. The models report sub-layers ("decoder.layers.1.attn", ".attn_residual", ".ffn",
    then "decoder.layers.1"; jaxformer/layers/transformer.py), so the name is the first
    sub-layer that parts, not only its layer. Depth order is `order`, else torch_inter's own
    (insertion) order: a jitted JAX dict comes back with sorted keys, so pass the torch side
    first, or pass `order`. A name missing on the flax side is a KeyError."""
    keys = list(order) if order is not None else list(torch_inter)
    for k in keys:
        d = max_abs_diff(torch_inter[k], flax_inter[k])
        if d > tol:
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
