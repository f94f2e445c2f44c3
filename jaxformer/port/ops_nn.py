"""Table entries for torch's spatial layers as functional ops: interpolation (F.interpolate),
pooling, group / instance / batch norm with given statistics, 3-D, transposed and
'same'-padded convolutions. Each writes a call of a helper (jaxformer/port/helpers_nn.py) that
computes torch's index and weight tables from static shapes (docs/numerics.md §46)."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from jaxformer.port.ops_base import Unsupported


def _n(v, n: int) -> tuple:
    """An int-list argument of an n-d op as n ints (torch repeats a single value)."""
    v = [v] if isinstance(v, int) else list(v)
    return tuple(v * n if len(v) == 1 else v)


def _input(a):
    return a["input"] if "input" in a else a["self"]


# ----------------------------------------------------------------------------- interpolation
_SCALES = {1: ("scales",), 2: ("scales_h", "scales_w"), 3: ("scales_d", "scales_h", "scales_w")}


def _resize(mode: str, axes: int, antialias: bool = False):
    """upsample_* / _upsample_*_aa, `.vec` (output_size or scale_factors) and the per-axis form
    (output_size and optional scales_*). Given a scale factor, torch maps an output index back
    with 1/scale (not in/out) and sizes the output floor(in * scale): the helper does both."""
    def emit(c, a):
        x = _input(a)
        scales = a["scale_factors"] if "scale_factors" in a else [a.get(k) for k in _SCALES[axes]]
        scales = tuple(scales) if scales is not None else (None,) * axes
        size = a.get("output_size")
        if size is None or all(s is not None for s in scales):
            size = (None,) * axes  # the helper sizes the output from the scales, as torch does
        c.helper("torch_resize")
        c.helper("resize_taps_aa" if antialias else "resize_taps")
        args = [c.r(x), c.r(tuple(size)), c.r(scales), f"mode={mode!r}"]
        if a.get("align_corners"):
            args.append("align_corners=True")
        if antialias:
            args.append("antialias=True")
        return f"torch_resize({', '.join(args)})"
    return emit


# ----------------------------------------------------------------------------- pooling
def _max_pool(n: int, indices: bool = False):
    def emit(c, a):
        kernel = _n(a["kernel_size"], n)
        stride = _n(a.get("stride") or kernel, n)
        c.helper("torch_max_pool")
        c.helper("pool_size")
        args = [c.r(a["self"]), c.r(kernel), c.r(stride), c.r(_n(a.get("padding", 0), n)),
                c.r(_n(a.get("dilation", 1), n))]
        if a.get("ceil_mode"):
            args.append("ceil_mode=True")
        if indices:
            args.append("indices=True")
        return f"torch_max_pool({', '.join(args)})"
    return emit


def _avg_pool(n: int):
    def emit(c, a):
        kernel = _n(a["kernel_size"], n)
        stride = _n(a.get("stride") or kernel, n)
        c.helper("torch_avg_pool")
        c.helper("pool_size")
        args = [c.r(a["self"]), c.r(kernel), c.r(stride), c.r(_n(a.get("padding", 0), n))]
        if a.get("ceil_mode"):
            args.append("ceil_mode=True")
        if not a.get("count_include_pad", True):
            args.append("count_include_pad=False")
        if a.get("divisor_override") is not None:
            args.append(f"divisor={c.r(a['divisor_override'])}")
        return f"torch_avg_pool({', '.join(args)})"
    return emit


def _adaptive(n: int, reduce: str):
    def emit(c, a):
        c.helper("torch_adaptive_pool")
        c.helper("adaptive_bins")
        size = _n(a["output_size"], n)
        return f"torch_adaptive_pool({c.r(a['self'])}, {c.r(size)}, reduce={reduce!r})"
    return emit


# ----------------------------------------------------------------------------- norms
def _group_norm(c, a):
    c.helper("torch_group_norm")
    return (f"torch_group_norm({c.r(a['input'])}, {c.r(a['num_groups'])}, {c.r(a.get('weight'))}, "
            f"{c.r(a.get('bias'))}, eps={c.r(a['eps'])})")


def _native_group_norm(c, a):
    c.helper("torch_group_norm")
    return (f"torch_group_norm({c.r(a['input'])}, {c.r(a['group'])}, {c.r(a.get('weight'))}, "
            f"{c.r(a.get('bias'))}, eps={c.r(a['eps'])}, stats=True)")


def _eval_batch_norm(c, a, x) -> str:
    c.helper("torch_batch_norm")
    return (f"torch_batch_norm({c.r(x)}, {c.r(a.get('weight'))}, {c.r(a.get('bias'))}, {c.r(a['running_mean'])}, "
            f"{c.r(a['running_var'])}, eps={c.r(a['eps'])})")


def _batch_stats(c, a, x, axes) -> str:
    c.helper("torch_batch_stats_norm")
    return (f"torch_batch_stats_norm({c.r(x)}, {c.r(a.get('weight'))}, {c.r(a.get('bias'))}, eps={c.r(a['eps'])}, "
            f"axes={c.r(tuple(axes))})")


def _stat_axes(c, x, per_sample: bool) -> tuple:
    """The axes a norm's statistics run over: the spatial ones per sample and channel (instance
    norm), or the batch and spatial ones per channel (batch norm)."""
    return tuple(range(2, c.ndim(x))) if per_sample else (0,) + tuple(range(2, c.ndim(x)))


def _updates_stats(a, op: str):
    if a.get("running_mean") is not None or a.get("running_var") is not None:
        raise Unsupported(f"{op} with batch statistics updates its running statistics in place; the functional "
                          "op has no place to put them")


def _batch_norm(c, a):
    x = a["input"]
    if not a["training"]:
        if a.get("running_mean") is None:
            raise Unsupported("batch_norm in eval mode without running statistics")
        return _eval_batch_norm(c, a, x)
    _updates_stats(a, "batch_norm")
    return f"{_batch_stats(c, a, x, _stat_axes(c, x, False))}[0]"


def _native_batch_norm(c, a):
    x = a["input"]
    if "training" in a and a["training"]:
        _updates_stats(a, "batch_norm")
        return _batch_stats(c, a, x, _stat_axes(c, x, False))
    if a.get("running_mean") is None:
        raise Unsupported("batch_norm in eval mode without running statistics")
    empty = f"jnp.zeros((0,), {c.dtype_of(x)})"
    return f"({_eval_batch_norm(c, a, x)}, {empty}, {empty})"


def _instance_norm(c, a):
    x = a["input"]
    if not a["use_input_stats"]:
        return _eval_batch_norm(c, a, x)
    _updates_stats(a, "instance_norm")
    return f"{_batch_stats(c, a, x, _stat_axes(c, x, True))}[0]"


# ----------------------------------------------------------------------------- convolutions
def _conv_padding(c, a, n: int):
    pad = a.get("padding", 0)
    if pad == "valid":
        return (0,) * n
    if pad == "same":  # torch pads dilation * (k - 1) in all, the odd one on the right
        if any(s != 1 for s in _n(a.get("stride", 1), n)):
            raise Unsupported("padding='same' with a stride other than 1")
        kernel = c.val(a["weight"]).shape[2:]
        pairs = []
        for k, d in zip(kernel, _n(a.get("dilation", 1), n), strict=False):
            total = d * (k - 1)
            pairs.append(total // 2 if total % 2 == 0 else (total // 2, total - total // 2))
        return tuple(pairs)
    return _n(pad, n)


def _conv(n: int):
    def emit(c, a):
        c.helper("conv")
        return (f"conv({c.r(a['input'])}, {c.r(a['weight'])}, {c.r(a.get('bias'))}, stride={c.r(_n(a['stride'], n))}, "
                f"padding={c.r(_conv_padding(c, a, n))}, dilation={c.r(_n(a['dilation'], n))}, groups={a['groups']})")
    return emit


def _conv_transpose(n: int | None):
    def emit(c, a):
        dims = n if n is not None else c.ndim(a["input"]) - 2
        c.helper("conv_transpose")
        return (f"conv_transpose({c.r(a['input'])}, {c.r(a['weight'])}, {c.r(a.get('bias'))}, "
                f"stride={c.r(_n(a['stride'], dims))}, padding={c.r(_n(a['padding'], dims))}, "
                f"output_padding={c.r(_n(a['output_padding'], dims))}, dilation={c.r(_n(a['dilation'], dims))}, "
                f"groups={a['groups']})")
    return emit


def _convolution(c, a):
    if a["transposed"]:
        return _conv_transpose(None)(c, a)
    return _conv(c.ndim(a["input"]) - 2)(c, a)


TABLE: dict[str, Callable[[Any, dict], str]] = {
    # interpolation (F.interpolate); mode "area" is adaptive_avg_pool
    "aten.upsample_nearest1d": _resize("nearest", 1), "aten.upsample_nearest2d": _resize("nearest", 2),
    "aten.upsample_nearest3d": _resize("nearest", 3),
    "aten._upsample_nearest_exact1d": _resize("nearest-exact", 1),
    "aten._upsample_nearest_exact2d": _resize("nearest-exact", 2),
    "aten._upsample_nearest_exact3d": _resize("nearest-exact", 3),
    "aten.upsample_linear1d": _resize("linear", 1), "aten.upsample_bilinear2d": _resize("linear", 2),
    "aten.upsample_trilinear3d": _resize("linear", 3), "aten.upsample_bicubic2d": _resize("cubic", 2),
    "aten._upsample_bilinear2d_aa": _resize("linear", 2, antialias=True),
    "aten._upsample_bicubic2d_aa": _resize("cubic", 2, antialias=True),
    # pooling
    "aten.max_pool1d": _max_pool(1), "aten.max_pool2d": _max_pool(2), "aten.max_pool3d": _max_pool(3),
    "aten.max_pool1d_with_indices": _max_pool(1, True), "aten.max_pool2d_with_indices": _max_pool(2, True),
    "aten.max_pool3d_with_indices": _max_pool(3, True),
    "aten.avg_pool1d": _avg_pool(1), "aten.avg_pool2d": _avg_pool(2), "aten.avg_pool3d": _avg_pool(3),
    "aten.adaptive_avg_pool1d": _adaptive(1, "mean"), "aten.adaptive_avg_pool2d": _adaptive(2, "mean"),
    "aten._adaptive_avg_pool2d": _adaptive(2, "mean"), "aten.adaptive_avg_pool3d": _adaptive(3, "mean"),
    "aten._adaptive_avg_pool3d": _adaptive(3, "mean"),
    "aten.adaptive_max_pool1d": _adaptive(1, "max"), "aten.adaptive_max_pool2d": _adaptive(2, "max"),
    "aten.adaptive_max_pool3d": _adaptive(3, "max"),
    # norms as functional ops
    "aten.group_norm": _group_norm, "aten.native_group_norm": _native_group_norm,
    "aten.batch_norm": _batch_norm, "aten._native_batch_norm_legit_no_training": _native_batch_norm,
    "aten._native_batch_norm_legit": _native_batch_norm, "aten.native_batch_norm": _native_batch_norm,
    "aten._native_batch_norm_legit_functional": _native_batch_norm,
    "aten.instance_norm": _instance_norm,
    # convolutions
    "aten.conv1d": _conv(1), "aten.conv2d": _conv(2), "aten.conv3d": _conv(3),
    "aten.conv_transpose1d": _conv_transpose(1), "aten.conv_transpose2d": _conv_transpose(2),
    "aten.conv_transpose3d": _conv_transpose(3), "aten.convolution": _convolution, "aten._convolution": _convolution,
}
