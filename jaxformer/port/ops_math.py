"""Table entries for elementwise maths, activations, torch.special, the add* family
(baddbmm, addmm, addcmul, lerp, ...), creation ops, dropout's other forms and the ops refused
by name (randomness, data-dependent shapes). Each formula is the one torch's CPU kernel
computes (docs/numerics.md §46)."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from jaxformer.port.ops_base import Unsupported


def _u(fn: str):
    return lambda c, a: f"{fn}({c.r(a['self'])})"


def _b(fn: str, second: str = "other"):
    return lambda c, a: f"{fn}({c.r(a['self'])}, {c.r(a[second])})"


def _scaled(c, value, expr: str) -> str:
    """`value * expr`, or `expr` where value is 1."""
    return expr if value in (1, None) else f"{c.r(value)} * {c.paren(expr)}"


# ----------------------------------------------------------------------------- the add* family
def _beta_plus(c, a, product: str) -> str:
    """beta * self + alpha * product; beta 0 reads nothing of self (torch ignores even NaN there)."""
    beta = a.get("beta", 1)
    prod = _scaled(c, a.get("alpha", 1), product)
    if beta == 0:  # the product has the output's shape already: self only broadcasts to it
        return prod
    return f"{_scaled(c, beta, c.r(a['self']))} + {c.paren(prod)}"


def _mm(op1: str, op2: str):
    return lambda c, a: _beta_plus(c, a, f"{c.paren(c.r(a[op1]))} @ {c.paren(c.r(a[op2]))}")


def _addbmm(c, a):
    return _beta_plus(c, a, f"({c.paren(c.r(a['batch1']))} @ {c.paren(c.r(a['batch2']))}).sum(axis=0)")


def _addr(c, a):
    return _beta_plus(c, a, f"jnp.outer({c.r(a['vec1'])}, {c.r(a['vec2'])})")


def _addcmul(c, a):
    """self + value * t1 * t2, in torch's order ((value * t1) * t2)."""
    t1, t2 = c.paren(c.r(a["tensor1"])), c.paren(c.r(a["tensor2"]))
    return f"{c.r(a['self'])} + {_scaled(c, a.get('value', 1), t1)} * {t2}"


def _addcdiv(c, a):
    t1, t2 = c.paren(c.r(a["tensor1"])), c.paren(c.r(a["tensor2"]))
    return f"{c.r(a['self'])} + {_scaled(c, a.get('value', 1), t1)} / {t2}"


def _lerp(c, a):
    """torch's lerp: self + w (end - self) where |w| < 0.5, else end - (end - self) (1 - w)."""
    x, end, w = c.r(a["self"]), c.r(a["end"]), a["weight"]
    diff = f"({c.paren(end)} - {c.paren(x)})"
    if not hasattr(w, "meta"):
        return f"{x} + {c.r(w)} * {diff}" if abs(w) < 0.5 else f"{end} - {diff} * {c.r(1 - w)}"
    w = c.paren(c.r(w))
    return f"jnp.where(jnp.abs({w}) < 0.5, {x} + {w} * {diff}, {end} - {diff} * (1 - {w}))"


# ----------------------------------------------------------------------------- activations
def _prelu(c, a):
    x, w = c.r(a["self"]), c.r(a["weight"])
    n = c.val(a["weight"]).numel()
    if n != 1 and c.ndim(a["self"]) > 2:
        w = f"{c.paren(w)}.reshape({(-1,) + (1,) * (c.ndim(a['self']) - 2)})"
    return f"jnp.where({c.paren(x)} > 0, {x}, {c.paren(w)} * {c.paren(x)})"


def _glu(c, a):
    x, dim = c.r(a["self"]), a.get("dim", -1)
    return f"(lambda a, b: a * jax.nn.sigmoid(b))(*jnp.split({x}, 2, axis={dim}))"


def _rrelu(c, a):
    if a.get("training"):
        raise Unsupported("rrelu in training mode draws random slopes")
    slope = (a.get("lower", 1 / 8) + a.get("upper", 1 / 3)) / 2
    return f"jax.nn.leaky_relu({c.r(a['self'])}, {c.r(slope)})"


def _logit(c, a):
    x = c.r(a["self"])
    if a.get("eps") is not None:
        eps = a["eps"]
        x = f"jnp.clip({x}, {c.r(eps)}, {c.r(1 - eps)})"
        return f"(lambda z: jnp.log(z / (1 - z)))({x})"
    return f"jnp.log({c.paren(x)} / (1 - {c.paren(x)}))"


def _nan_to_num(c, a):
    kw = "".join(f", {k}={c.r(a[k])}" for k in ("nan", "posinf", "neginf") if a.get(k) is not None)
    return f"jnp.nan_to_num({c.r(a['self'])}{kw})"


def _threshold(c, a):
    x = c.r(a["self"])
    return f"jnp.where({c.paren(x)} <= {c.r(a['threshold'])}, {c.r(a['value'])}, {x})"


def _hardshrink(c, a):
    x = c.r(a["self"])
    return f"jnp.where(jnp.abs({x}) <= {c.r(a.get('lambd', 0.5))}, 0.0, {x})"


def _softshrink(c, a):
    x, lam = c.paren(c.r(a["self"])), c.r(a.get("lambd", 0.5))
    return f"jnp.where({x} > {lam}, {x} - {lam}, jnp.where({x} < -{lam}, {x} + {lam}, 0.0))"


def _special(fn: str, arg: str = "self"):
    return lambda c, a: f"{fn}({c.r(a[arg])})"


def _safe_softmax(c, a):
    x, dim = c.r(a["self"]), a["dim"]
    if a.get("dtype") is not None:
        x = f"{c.paren(x)}.astype({c.r(a['dtype'])})"
    return f"jnp.where(jnp.isneginf({x}).all(axis={dim}, keepdims=True), 0.0, jax.nn.softmax({x}, axis={dim}))"


# ----------------------------------------------------------------------------- creation
def _linspace(c, a, log: bool = False):
    c.helper("torch_linspace")
    steps = a["steps"]
    args = f"{c.r(a['start'])}, {c.r(a['end'])}, {c.r(steps)}, {c.dtype_of(c.out)}"
    if log:
        return f"{c.r(a.get('base', 10.0))} ** torch_linspace({args})"
    return f"torch_linspace({args})"


def _eye(c, a):
    m = a.get("m")
    return f"jnp.eye({c.r(a['n'])}{', ' + c.r(m) if m is not None else ''}, dtype={c.dtype_of(c.out)})"


def _tri_indices(fn: str):
    def emit(c, a):
        return f"jnp.stack(jnp.{fn}({c.r(a['row'])}, {c.r(a.get('offset', 0))}, {c.r(a['col'])}))" \
            f".astype({c.dtype_of(c.out)})"
    return emit


def _window(c, a):
    n, periodic = a["window_length"], a.get("periodic", True)
    denom = n if periodic else n - 1
    return f"0.5 - 0.5 * jnp.cos(2 * jnp.pi * jnp.arange({c.r(n)}, dtype={c.dtype_of(c.out)}) / {c.r(max(denom, 1))})"


# ----------------------------------------------------------------------------- dropout forms
def _train_rate(c) -> float:
    """The rate of the op being written in the aligned train-mode graph (0: it does not drop)."""
    from jaxformer.port.ops_base import bind
    t = c.port.train_nodes.get(c.out) if c.port.train_nodes else None
    if t is None:
        return 0.0
    a = bind(t)
    return float(a.get("p") or 0.0) if a.get("train") else 0.0


def _native_dropout(c, a):
    x = a["input"]
    if a.get("train") and a["p"] > 0:
        raise Unsupported("native_dropout in train mode: its mask is an output")
    return f"({c.r(x)}, jnp.ones({c.shape_of(x)}, jnp.bool_))"


def _feature_dropout(c, a):
    """Whole channels (axis 1) dropped in train mode: nnx.Dropout applied to a [B, C, 1, ...] mask."""
    x = a["input"]
    if a.get("train"):
        raise Unsupported("feature dropout traced in train mode")
    p = _train_rate(c)
    if not p:
        return c.r(x)
    attr = c.port.dropout_attr(c, p)
    keep = f"jnp.ones({c.paren(c.r(x))}.shape[:2] + (1,) * {c.ndim(x) - 2}, {c.dtype_of(x)})"
    return f"{c.paren(c.r(x))} * self.{attr}({keep})"


def _alpha_dropout(c, a):
    if a.get("train") or _train_rate(c):
        raise Unsupported("alpha dropout in train mode (SELU-preserving noise) has no nnx layer")
    return c.r(a["input"])


def _refuse(why: str):
    def emit(c, a):
        raise Unsupported(why)
    return emit


RANDOM = "random numbers: torch's generator cannot be reproduced in JAX (parity would never hold)"
DATA_SHAPE = "its output's shape depends on the input's values"


TABLE: dict[str, Callable[[Any, dict], str]] = {
    # the add* family
    "aten.addmm": _mm("mat1", "mat2"), "aten.baddbmm": _mm("batch1", "batch2"), "aten.addbmm": _addbmm,
    "aten.addmv": _mm("mat", "vec"), "aten.addr": _addr, "aten.addcmul": _addcmul, "aten.addcdiv": _addcdiv,
    "aten.lerp": _lerp,
    # activations
    "aten.hardswish": lambda c, a: f"{c.paren(c.r(a['self']))} * jnp.clip({c.r(a['self'])} + 3, 0, 6) / 6",
    "aten.hardsigmoid": lambda c, a: f"jnp.clip({c.r(a['self'])} + 3, 0, 6) / 6",
    "aten.relu6": lambda c, a: f"jnp.clip({c.r(a['self'])}, 0, 6)",
    "aten.prelu": _prelu, "aten._prelu_kernel": _prelu, "aten.glu": _glu,
    "aten.log_sigmoid": lambda c, a: f"jnp.minimum({c.r(a['self'])}, 0) - jnp.log1p(jnp.exp(-jnp.abs({c.r(a['self'])})))",
    "aten.selu": _u("jax.nn.selu"),
    "aten.celu": lambda c, a: f"jax.nn.celu({c.r(a['self'])}, {c.r(a.get('alpha', 1.0))})",
    "aten.threshold": _threshold, "aten.hardshrink": _hardshrink, "aten.softshrink": _softshrink,
    "aten.rrelu": _rrelu, "aten._safe_softmax": _safe_softmax,
    # elementwise maths
    "aten.erfinv": _u("jax.lax.erf_inv"), "aten.exp2": _u("jnp.exp2"), "aten.log10": _u("jnp.log10"),
    "aten.erfc": _u("jax.lax.erfc"), "aten.sinh": _u("jnp.sinh"), "aten.cosh": _u("jnp.cosh"), "aten.tan": _u("jnp.tan"),
    "aten.asin": _u("jnp.arcsin"), "aten.acos": _u("jnp.arccos"), "aten.asinh": _u("jnp.arcsinh"),
    "aten.acosh": _u("jnp.arccosh"), "aten.atanh": _u("jnp.arctanh"), "aten.arctan": _u("jnp.arctan"),
    "aten.atan2": _b("jnp.arctan2"), "aten.arctan2": _b("jnp.arctan2"), "aten.hypot": _b("jnp.hypot"),
    "aten.trunc": _u("jnp.trunc"), "aten.fix": _u("jnp.trunc"),
    "aten.frac": lambda c, a: f"{c.paren(c.r(a['self']))} - jnp.trunc({c.r(a['self'])})",
    "aten.logit": _logit, "aten.nan_to_num": _nan_to_num, "aten.sgn": _u("jnp.sign"),
    "aten.isnan": _u("jnp.isnan"), "aten.isinf": _u("jnp.isinf"), "aten.isfinite": _u("jnp.isfinite"),
    "aten.isneginf": _u("jnp.isneginf"), "aten.isposinf": _u("jnp.isposinf"),
    "aten.logical_xor": _b("jnp.logical_xor"),
    "aten.bitwise_left_shift": _b("jnp.left_shift"), "aten.__lshift__": _b("jnp.left_shift"),
    "aten.bitwise_right_shift": _b("jnp.right_shift"), "aten.__rshift__": _b("jnp.right_shift"),
    "aten.logaddexp": _b("jnp.logaddexp"), "aten.logaddexp2": _b("jnp.logaddexp2"),
    "aten.copysign": _b("jnp.copysign"), "aten.signbit": _u("jnp.signbit"),
    "aten.heaviside": _b("jnp.heaviside", "values"), "aten.xlogy": _b("jax.scipy.special.xlogy"),
    "aten.lgamma": _u("jax.lax.lgamma"), "aten.digamma": _u("jax.lax.digamma"),
    "aten.deg2rad": _u("jnp.deg2rad"), "aten.rad2deg": _u("jnp.rad2deg"),
    "aten.fmax": _b("jnp.fmax"), "aten.fmin": _b("jnp.fmin"), "aten.xor": _b("jnp.logical_xor"),
    "aten.__xor__": _b("jnp.bitwise_xor"),
    # torch.special
    "aten.special_expit": _u("jax.nn.sigmoid"), "aten.special_erfc": _u("jax.lax.erfc"),
    "aten.special_erfcx": _u("jax.scipy.special.erfcx"), "aten.special_xlogy": _b("jax.scipy.special.xlogy"),
    "aten.special_ndtr": _u("jax.scipy.special.ndtr"), "aten.special_log_ndtr": _u("jax.scipy.special.log_ndtr"),
    "aten.special_ndtri": _u("jax.scipy.special.ndtri"), "aten.special_i0": _u("jax.scipy.special.i0"),
    "aten.i0": _u("jax.scipy.special.i0"), "aten.special_i0e": _u("jax.scipy.special.i0e"),
    "aten.special_i1": _u("jax.scipy.special.i1"), "aten.special_i1e": _u("jax.scipy.special.i1e"),
    "aten.special_sinc": _u("jnp.sinc"), "aten.sinc": _u("jnp.sinc"), "aten.special_entr": _u("jax.scipy.special.entr"),
    "aten.special_log1p": _u("jnp.log1p"), "aten.special_round": _u("jnp.round"), "aten.special_exp2": _u("jnp.exp2"),
    "aten.special_expm1": _u("jnp.expm1"), "aten.special_gammaln": _u("jax.lax.lgamma"),
    "aten.special_digamma": _u("jax.lax.digamma"), "aten.special_psi": _u("jax.lax.digamma"),
    "aten.special_logit": _logit, "aten.special_erf": _u("jax.lax.erf"), "aten.special_erfinv": _u("jax.lax.erf_inv"),
    "aten.special_polygamma": lambda c, a: f"jax.scipy.special.polygamma({c.r(a['n'])}, {c.r(a['self'])})",
    "aten.polygamma": lambda c, a: f"jax.scipy.special.polygamma({c.r(a['n'])}, {c.r(a['self'])})",
    "aten.special_multigammaln": lambda c, a: f"jax.scipy.special.multigammaln({c.r(a['self'])}, {c.r(a['p'])})",
    # creation
    "aten.linspace": _linspace, "aten.logspace": lambda c, a: _linspace(c, a, log=True), "aten.eye": _eye,
    "aten.tril_indices": _tri_indices("tril_indices"), "aten.triu_indices": _tri_indices("triu_indices"),
    "aten.hann_window": _window,
    # dropout's other forms (eval: the identity)
    "aten.native_dropout": _native_dropout, "aten.feature_dropout": _feature_dropout,
    "aten.alpha_dropout": _alpha_dropout, "aten.feature_alpha_dropout": _alpha_dropout,
    # refused by name
    **{f"aten.{n}": _refuse(RANDOM) for n in (
        "bernoulli", "rand", "rand_like", "randn", "randn_like", "randint", "randint_like", "normal", "uniform",
        "randperm", "multinomial", "exponential", "poisson", "native_dropout_backward", "cauchy", "geometric",
        "log_normal", "normal_functional")},
    **{f"aten.{n}": _refuse(DATA_SHAPE) for n in (
        "masked_select", "nonzero", "argwhere", "unique", "_unique", "_unique2", "unique_dim",
        "unique_consecutive")},
}
