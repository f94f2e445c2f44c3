"""Table entries for reductions (norms, logsumexp, cumulative ops, var_mean), distances,
losses (as HF models compute them in forward), and shape / patch ops (pixel_shuffle,
unfold, im2col, diag_embed, searchsorted, embedding_bag, ...)."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from jaxformer.port.ops_base import Unsupported, _axes, _dtype_cast, _keep


def _ddof(a) -> int:
    if a.get("correction") is not None:
        return a["correction"]
    return 1 if a.get("unbiased", True) else 0


def _var_mean(fn: str):
    def emit(c, a):
        x, axis = c.r(a["self"]), _axes(c, a.get("dim"))
        return f"(jnp.{fn}({x}, axis={axis}, ddof={c.r(_ddof(a))}{_keep(a)}), jnp.mean({x}, axis={axis}{_keep(a)}))"
    return emit


def _var(fn: str):
    def emit(c, a):
        return f"jnp.{fn}({c.r(a['self'])}, axis={_axes(c, a.get('dim'))}, ddof={c.r(_ddof(a))}{_keep(a)})"
    return emit


def _vector_norm(c, a, ord_key: str = "ord", dim=None):
    c.helper("torch_vector_norm")
    ord_ = a.get(ord_key)
    ord_ = 2 if ord_ is None else ord_
    dim = a.get("dim") if dim is None else dim
    x = _dtype_cast(c, c.r(a["self"]), a.get("dtype"))
    extra = ", keepdims=True" if a.get("keepdim") else ""
    return f"torch_vector_norm({x}, {c.r(float(ord_))}, {_axes(c, dim) if dim not in (None, []) else 'None'}{extra})"


def _linalg_norm(c, a):
    ord_, dim = a.get("ord"), a.get("dim")
    if isinstance(ord_, str) and ord_ != "fro" or (ord_ is not None and dim is not None and len(dim) == 2) \
            or (ord_ is not None and dim is None and c.ndim(a["self"]) == 2):
        raise Unsupported(f"a matrix norm (ord={ord_!r})")
    return _vector_norm(c, {**a, "ord": 2 if ord_ in (None, "fro") else ord_})


def _cummax(smallest: bool):
    def emit(c, a):
        c.helper("torch_cummax")
        return f"torch_cummax({c.r(a['self'])}, {a['dim'] % c.ndim(a['self'])}{', smallest=True' if smallest else ''})"
    return emit


def _logsumexp(c, a):
    return f"jax.nn.logsumexp({c.r(a['self'])}, axis={_axes(c, a.get('dim'))}{_keep(a)})"


def _aminmax(c, a):
    x, dim = c.r(a["self"]), a.get("dim")
    axis = f"axis={dim}{_keep(a)}" if dim is not None else ""
    return f"({x}.min({axis}), {x}.max({axis}))"


# ----------------------------------------------------------------------------- distances
def _cosine_similarity(c, a):
    c.helper("torch_cosine_similarity")
    return f"torch_cosine_similarity({c.r(a['x1'])}, {c.r(a['x2'])}, {a.get('dim', 1)}, {c.r(a.get('eps', 1e-8))})"


def _pairwise_distance(c, a):
    c.helper("torch_vector_norm")
    diff = f"{c.paren(c.r(a['x1']))} - {c.paren(c.r(a['x2']))} + {c.r(a.get('eps', 1e-6))}"
    keep = ", keepdims=True" if a.get("keepdim") else ""
    return f"torch_vector_norm({diff}, {c.r(float(a.get('p', 2.0)))}, -1{keep})"


def _cdist(c, a):
    c.helper("torch_cdist")
    c.helper("torch_vector_norm")
    p, mode = a.get("p", 2.0), a.get("compute_mode")
    rows = (c.val(a["x1"]).shape[-2], c.val(a["x2"]).shape[-2])
    mm = p == 2 and (mode == 1 or (mode is None and any(not isinstance(r, int) or r > 25 for r in rows)))
    return f"torch_cdist({c.r(a['x1'])}, {c.r(a['x2'])}, {c.r(float(p))}{', mm=True' if mm else ''})"


# ----------------------------------------------------------------------------- losses
def _loss(formula: Callable[[Any, dict, str, str], str]):
    def emit(c, a):
        c.helper("torch_loss_reduce")
        x, t = c.paren(c.r(a["self"])), c.paren(c.r(a["target"]))
        return f"torch_loss_reduce({formula(c, a, x, t)}, {a.get('reduction', 1)})"
    return emit


def _smooth_l1(c, a, x, t):
    beta = a.get("beta", 1.0)
    if beta == 0:
        return f"jnp.abs({x} - {t})"
    return (f"(lambda z: jnp.where(z < {c.r(beta)}, 0.5 * z * z / {c.r(beta)}, z - {c.r(0.5 * beta)}))"
            f"(jnp.abs({x} - {t}))")


def _huber(c, a, x, t):
    d = a.get("delta", 1.0)
    return f"(lambda z: jnp.where(z < {c.r(d)}, 0.5 * z * z, {c.r(d)} * (z - {c.r(0.5 * d)})))(jnp.abs({x} - {t}))"


def _bce(c, a, x, t):
    loss = f"({t} - 1) * jnp.maximum(jnp.log1p(-{x}), -100.0) - {t} * jnp.maximum(jnp.log({x}), -100.0)"
    return loss if a.get("weight") is None else f"({loss}) * {c.paren(c.r(a['weight']))}"


def _bce_logits(c, a, x, t):
    log_sig = f"(jnp.minimum({x}, 0) - jnp.log1p(jnp.exp(-jnp.abs({x}))))"
    if a.get("pos_weight") is not None:
        log_sig = f"{log_sig} * (({c.paren(c.r(a['pos_weight']))} - 1) * {t} + 1)"
    loss = f"(1 - {t}) * {x} - {log_sig}"
    return loss if a.get("weight") is None else f"({loss}) * {c.paren(c.r(a['weight']))}"


def _kl_div(c, a, x, t):
    if a.get("log_target"):
        return f"jnp.exp({t}) * ({t} - {x})"
    return f"jax.scipy.special.xlogy({t}, {t}) - {t} * {x}"


def _nll(c, a, with_total: bool = False):
    c.helper("torch_nll_loss")
    w = c.r(a.get("weight"))
    expr = (f"torch_nll_loss({c.r(a['self'])}, {c.r(a['target'])}, {w}, {a.get('reduction', 1)}, "
            f"{c.r(a.get('ignore_index', -100))})")
    if with_total:  # nll_loss_forward's (loss, total weight); the total is read back rarely
        raise_if_read(c, 1, "nll_loss_forward's total weight")
        return f"({expr}, None)"
    return expr


def raise_if_read(c, index: int, what: str) -> None:
    for user in c.out.users:
        if user.target.__name__ == "getitem" and user.args[1] == index and user.users:
            raise Unsupported(f"{what} is read")


def _cross_entropy(c, a):
    c.helper("torch_cross_entropy")
    c.helper("torch_nll_loss")
    args = [c.r(a["self"]), c.r(a["target"]), c.r(a.get("weight")), str(a.get("reduction", 1)),
            c.r(a.get("ignore_index", -100))]
    if a.get("label_smoothing"):
        args.append(c.r(a["label_smoothing"]))
    return f"torch_cross_entropy({', '.join(args)})"


# ----------------------------------------------------------------------------- shapes and patches
def _pixel_shuffle(c, a):
    r = a["upscale_factor"]
    x = c.r(a["self"])
    *lead, ch, h, w = c.val(a["self"]).shape
    n = len(lead)
    order = tuple(range(n)) + (n, n + 3, n + 1, n + 4, n + 2)
    return (f"{c.paren(x)}.reshape({c.paren(x)}.shape[:-3] + ({c.r(ch // (r * r))}, {r}, {r}) + {c.paren(x)}.shape[-2:])"
            f".transpose({order}).reshape({c.paren(x)}.shape[:-3] + ({c.r(ch // (r * r))}, {c.r(h * r)}, {c.r(w * r)}))")


def _pixel_unshuffle(c, a):
    r = a["downscale_factor"]
    x = c.r(a["self"])
    *lead, ch, h, w = c.val(a["self"]).shape
    n = len(lead)
    order = tuple(range(n)) + (n, n + 2, n + 4, n + 1, n + 3)
    return (f"{c.paren(x)}.reshape({c.paren(x)}.shape[:-3] + ({c.r(ch)}, {c.r(h // r)}, {r}, {c.r(w // r)}, {r}))"
            f".transpose({order}).reshape({c.paren(x)}.shape[:-3] + ({c.r(ch * r * r)}, {c.r(h // r)}, {c.r(w // r)}))")


def _channel_shuffle(c, a):
    x, g = c.paren(c.r(a["self"])), a["groups"]
    return f"{x}.reshape({x}.shape[:1] + ({g}, -1) + {x}.shape[2:]).swapaxes(1, 2).reshape({x}.shape)"


def _unfold(c, a):
    c.helper("torch_unfold")
    return f"torch_unfold({c.r(a['self'])}, {a['dimension'] % c.ndim(a['self'])}, {c.r(a['size'])}, {c.r(a['step'])})"


def _pair(v) -> tuple:
    v = list(v) if isinstance(v, (list, tuple)) else [v]
    return tuple(v * 2 if len(v) == 1 else v)


def _im2col(c, a):
    c.helper("torch_im2col")
    c.helper("patch_index")
    return (f"torch_im2col({c.r(a['self'])}, {_pair(a['kernel_size'])}, {_pair(a['dilation'])}, "
            f"{_pair(a['padding'])}, {_pair(a['stride'])})")


def _col2im(c, a):
    c.helper("torch_col2im")
    c.helper("patch_index")
    return (f"torch_col2im({c.r(a['self'])}, {c.r(_pair(a['output_size']))}, {_pair(a['kernel_size'])}, "
            f"{_pair(a['dilation'])}, {_pair(a['padding'])}, {_pair(a['stride'])})")


def _narrow(c, a):
    x, dim, start, length = a["self"], a["dim"] % c.ndim(a["self"]), a["start"], a["length"]
    if hasattr(start, "meta") and not isinstance(c.val(start), int):
        return f"jax.lax.dynamic_slice_in_dim({c.r(x)}, {c.r(start)}, {c.r(length)}, axis={dim})"
    end = f"{c.r(start)} + {c.r(length)}" if not isinstance(start, int) else c.r(start + length)
    return f"{c.recv(x)}[{', '.join([':'] * dim + [f'{c.r(start)}:{end}'])}]"


def _diag_embed(c, a):
    x = c.r(a["self"])
    offset = a.get("offset", 0)
    nd = c.ndim(c.out)
    d1, d2 = a.get("dim1", -2) % nd, a.get("dim2", -1) % nd
    n = c.val(a["self"]).shape[-1] + abs(offset)
    base = f"jnp.zeros({c.paren(x)}.shape[:-1] + ({c.r(n)}, {c.r(n)}), {c.paren(x)}.dtype)"
    rows, cols = f"jnp.arange({c.paren(x)}.shape[-1]) + {max(-offset, 0)}", f"jnp.arange({c.paren(x)}.shape[-1]) + {max(offset, 0)}"
    out = f"{base}.at[..., {rows}, {cols}].set({x})"
    return out if (d1, d2) == (nd - 2, nd - 1) else f"jnp.moveaxis({out}, (-2, -1), ({d1}, {d2}))"


def _searchsorted(c, a):
    seq, x = a["sorted_sequence"], a["self"]
    if a.get("sorter") is not None:
        raise Unsupported("searchsorted with a sorter")
    right = bool(a.get("right")) or a.get("side") == "right"
    if c.ndim(seq) == 1:
        return f"jnp.searchsorted({c.r(seq)}, {c.r(x)}, side={'right' if right else 'left'!r})"
    cmp = "<=" if right else "<"
    return f"({c.paren(c.r(seq))}[..., None, :] {cmp} {c.paren(c.r(x))}[..., None]).sum(axis=-1)"


def _bucketize(c, a):
    side = "right" if a.get("right") else "left"
    return f"jnp.searchsorted({c.r(a['boundaries'])}, {c.r(a['self'])}, side={side!r})"


def _embedding_bag(c, a):
    mode = {0: "sum", 1: "mean", 2: "max"}[a.get("mode", 0)]
    for i in (1, 2, 3):
        raise_if_read(c, i, "embedding_bag's offsets / bag sizes / argmax outputs")
    c.helper("torch_embedding_bag")
    offsets = a.get("offsets")
    n = c.val(c.out)[0].shape[0]
    args = [c.r(a["weight"]), c.r(a["indices"]), c.r(offsets), f"mode={mode!r}", f"bags={c.r(n)}"]
    if a.get("include_last_offset"):
        raise Unsupported("embedding_bag with include_last_offset")
    if a.get("per_sample_weights") is not None:
        args.append(f"per_sample_weights={c.r(a['per_sample_weights'])}")
    if a.get("padding_idx") not in (None, -1):
        args.append(f"padding_idx={c.r(a['padding_idx'])}")
    return f"(torch_embedding_bag({', '.join(args)}), None, None, None)"


def _meshgrid(c, a):
    indexing = a.get("indexing") or "ij"
    return f"tuple(jnp.meshgrid({', '.join(c.r(t) for t in a['tensors'])}, indexing={indexing!r}))"


def _cartesian_prod(c, a):
    ts = a["tensors"]
    return f"jnp.stack(jnp.meshgrid({', '.join(c.r(t) for t in ts)}, indexing='ij'), axis=-1).reshape(-1, {len(ts)})"


def _one_hot(c, a):
    n = c.val(c.out).shape[-1]
    return f"jax.nn.one_hot({c.r(a['self'])}, {c.r(n)}, dtype={c.dtype_of(c.out)})"


TABLE: dict[str, Callable[[Any, dict], str]] = {
    # reductions
    "aten.var": _var("var"), "aten.std": _var("std"), "aten.var_mean": _var_mean("var"),
    "aten.std_mean": _var_mean("std"), "aten.logsumexp": _logsumexp, "aten.special_logsumexp": _logsumexp,
    "aten.cumprod": lambda c, a: _dtype_cast(c, f"jnp.cumprod({c.r(a['self'])}, axis={a['dim']})", a.get("dtype")),
    "aten.cummax": _cummax(False), "aten.cummin": _cummax(True),
    "aten.logcumsumexp": lambda c, a: f"jax.lax.cumlogsumexp({c.r(a['self'])}, axis={a['dim'] % c.ndim(a['self'])})",
    "aten.linalg_vector_norm": _vector_norm, "aten.norm": lambda c, a: _vector_norm(c, a, "p"),
    "aten.frobenius_norm": lambda c, a: _vector_norm(c, {**a, "ord": 2}), "aten.linalg_norm": _linalg_norm,
    "aten.aminmax": _aminmax,
    "aten.count_nonzero": lambda c, a: f"({c.paren(c.r(a['self']))} != 0).sum(axis={_axes(c, a.get('dim'))})",
    "aten.nansum": lambda c, a: f"jnp.nansum({c.r(a['self'])}, axis={_axes(c, a.get('dim'))}{_keep(a)})",
    "aten.nanmean": lambda c, a: f"jnp.nanmean({c.r(a['self'])}, axis={_axes(c, a.get('dim'))}{_keep(a)})",
    "aten.trace": lambda c, a: f"jnp.trace({c.r(a['self'])})",
    # distances
    "aten.cosine_similarity": _cosine_similarity, "aten.pairwise_distance": _pairwise_distance, "aten.cdist": _cdist,
    "aten._cdist_forward": _cdist,
    # losses
    "aten.mse_loss": _loss(lambda c, a, x, t: f"jnp.square({x} - {t})"),
    "aten.l1_loss": _loss(lambda c, a, x, t: f"jnp.abs({x} - {t})"),
    "aten.smooth_l1_loss": _loss(_smooth_l1), "aten.huber_loss": _loss(_huber),
    "aten.binary_cross_entropy": _loss(_bce), "aten.binary_cross_entropy_with_logits": _loss(_bce_logits),
    "aten.kl_div": _loss(_kl_div),
    "aten.cross_entropy_loss": _cross_entropy, "aten.nll_loss": _nll, "aten.nll_loss_nd": _nll,
    "aten.nll_loss2d": _nll, "aten.nll_loss_forward": lambda c, a: _nll(c, a, True),
    "aten.nll_loss2d_forward": lambda c, a: _nll(c, a, True),
    # shapes and patches
    "aten.pixel_shuffle": _pixel_shuffle, "aten.pixel_unshuffle": _pixel_unshuffle,
    "aten.channel_shuffle": _channel_shuffle, "aten.native_channel_shuffle": _channel_shuffle,
    "aten.unfold": _unfold, "aten.im2col": _im2col, "aten.col2im": _col2im, "aten.narrow": _narrow,
    "aten.take": lambda c, a: f"jnp.take({c.paren(c.r(a['self']))}.reshape(-1), {c.r(a['index'])})",
    "aten.tile": lambda c, a: f"jnp.tile({c.r(a['self'])}, {c.r(tuple(a['dims']))})",
    "aten.meshgrid": _meshgrid,
    "aten.broadcast_tensors": lambda c, a: f"tuple(jnp.broadcast_arrays({', '.join(c.r(t) for t in a['tensors'])}))", "aten.cartesian_prod": _cartesian_prod,
    "aten.diag": lambda c, a: f"jnp.diag({c.r(a['self'])}, {c.r(a.get('diagonal', 0))})",
    "aten.diagonal": lambda c, a: (f"jnp.diagonal({c.r(a['self'])}, {c.r(a.get('offset', 0))}, "
                                   f"{a.get('dim1', 0)}, {a.get('dim2', 1)})"),
    "aten.diag_embed": _diag_embed, "aten.searchsorted": _searchsorted, "aten.bucketize": _bucketize,
    "aten.embedding_bag": _embedding_bag, "aten._embedding_bag": _embedding_bag, "aten.one_hot": _one_hot,
    "aten.swapaxes": lambda c, a: f"{c.r(a['self'])}.swapaxes({a['axis0']}, {a['axis1']})",
    "aten.swapdims": lambda c, a: f"{c.r(a['self'])}.swapaxes({a['dim0']}, {a['dim1']})",
    "aten.fliplr": lambda c, a: f"jnp.fliplr({c.r(a['self'])})", "aten.flipud": lambda c, a: f"jnp.flipud({c.r(a['self'])})",
    "aten.rot90": lambda c, a: f"jnp.rot90({c.r(a['self'])}, {a.get('k', 1)}, axes={c.r(tuple(a.get('dims', (0, 1))))})",
    "aten.kron": lambda c, a: f"jnp.kron({c.r(a['self'])}, {c.r(a['other'])})",
    "aten.block_diag": lambda c, a: f"jax.scipy.linalg.block_diag({', '.join(c.r(t) for t in a['tensors'])})",
    "aten.linalg_cross": lambda c, a: f"jnp.cross({c.r(a['self'])}, {c.r(a['other'])}, axis={a.get('dim', -1)})",
}
