"""Helpers for torch's spatial ops (interpolation, pooling, norms, transposed and 'same'
convolutions), written into a ported file when its graph uses them (jaxformer/port/helpers.py).

Index and weight tables are computed from static shapes with numpy in float32, as torch's CPU
kernels compute them (docs/numerics.md §46)."""

HELPERS_NN = {
    "resize_taps": '''def resize_taps(n_in, n_out, scale, mode, align_corners, axes=1):
    """Source indices and weights [n_out, taps] of one axis of torch's F.interpolate, computed in
    float32 as torch's CPU kernels do (docs/numerics.md §46). `scale`: the scale factor the op
    was given (torch then maps with 1/scale, not n_in/n_out), or None. `axes`: how many axes the
    op resizes (2-D nearest copies or doubles without the scale when n_out is n_in or 2 n_in)."""
    import numpy as np
    f32 = np.float32
    i = np.arange(n_out)
    if mode == "nearest" and axes == 2 and n_out in (n_in, 2 * n_in):
        return (i // (n_out // n_in)).astype(np.int32)[:, None], None
    if align_corners and mode in ("linear", "cubic"):
        ratio = f32(n_in - 1) / f32(n_out - 1) if n_out > 1 else f32(0)
    else:
        ratio = f32(1.0 / scale) if scale is not None and scale > 0 else f32(n_in) / f32(n_out)
    if mode == "nearest":  # floor(i * ratio)
        return np.minimum(np.floor(i.astype(f32) * ratio), n_in - 1).astype(np.int32)[:, None], None
    if mode == "nearest-exact":  # floor(ratio * (i + 0.5) - 0.5 + 0.5)
        src = np.maximum(ratio * (i.astype(f32) + f32(0.5)) - f32(0.5), f32(0))
        return np.minimum(np.floor(src + f32(0.5)), n_in - 1).astype(np.int32)[:, None], None
    if align_corners:
        src = ratio * i.astype(f32)
    else:
        src = ratio * (i.astype(f32) + f32(0.5)) - f32(0.5)
        if mode == "linear":
            src = np.maximum(src, f32(0))
    base = np.minimum(np.floor(src).astype(np.int64), n_in - 1)
    t = np.clip(src - base.astype(f32), f32(0), f32(1)).astype(f32)
    if mode == "linear":
        if n_in == n_out:
            return i[:, None].repeat(2, 1).astype(np.int32), np.stack([np.ones(n_out, f32), np.zeros(n_out, f32)], 1)
        index = np.stack([base, base + (base < n_in - 1)], 1)
        return index.astype(np.int32), np.stack([f32(1) - t, t], 1)
    a = f32(-0.75)  # bicubic: the cubic convolution with A = -0.75, taps clamped to the border

    def near(x):
        return ((a + f32(2)) * x - (a + f32(3))) * x * x + f32(1)

    def far(x):
        return ((a * x - f32(5) * a) * x + f32(8) * a) * x - f32(4) * a
    s = (f32(1) - t).astype(f32)
    weight = np.stack([far((t + f32(1)).astype(f32)), near(t), near(s), far((s + f32(1)).astype(f32))], 1)
    index = np.clip(base[:, None] - 1 + np.arange(4)[None, :], 0, n_in - 1)
    return index.astype(np.int32), weight.astype(f32)''',
    "resize_taps_aa": '''def resize_taps_aa(n_in, n_out, scale, mode, align_corners, axes=2):
    """Indices and weights [n_out, taps] of one axis of torch's antialiased interpolation
    (antialias=True: a triangle or a cubic (A = -0.5) filter stretched by the downscale factor,
    each row normalised to sum 1), as torch's CPU kernel computes them (docs/numerics.md §46)."""
    import numpy as np
    f32 = np.float32
    if align_corners:
        ratio = f32(n_in - 1) / f32(n_out - 1) if n_out > 1 else f32(0)
    else:
        ratio = f32(1.0 / scale) if scale is not None and scale > 0 else f32(n_in) / f32(n_out)
    size = 2 if mode == "linear" else 4
    support = f32(size * 0.5 * ratio) if ratio >= 1 else f32(size * 0.5)
    inv = f32(1.0 / ratio) if ratio >= 1 else f32(1)

    def filt(x):
        x = abs(x)
        if mode == "linear":
            return f32(1) - x if x < 1 else f32(0)
        a = f32(-0.5)
        if x < 1:
            return ((a + f32(2)) * x - (a + f32(3))) * x * x + f32(1)
        return (((x - f32(5)) * x + f32(8)) * x - f32(4)) * a if x < 2 else f32(0)
    rows = []
    for i in range(n_out):
        center = f32(ratio * (i + 0.5))
        lo = max(int(center - support + 0.5), 0)
        hi = min(int(center + support + 0.5), n_in)
        w = [filt(f32((j + lo - center + 0.5) * inv)) for j in range(hi - lo)]
        total = f32(sum(w, f32(0))) if w else f32(0)
        rows.append((lo, [f32(v / total) for v in w] if total != 0 else w))
    taps = max(len(w) for _, w in rows)
    index = np.array([[lo + min(j, len(w) - 1) for j in range(taps)] for lo, w in rows], np.int32)
    weight = np.array([w + [f32(0)] * (taps - len(w)) for _, w in rows], f32)
    return index, weight''',
    "torch_resize": '''def torch_resize(x, size, scales, *, mode, align_corners=False, antialias=False):
    """torch.nn.functional.interpolate over x's trailing len(size) axes (x [B, C, *spatial]):
    mode "nearest", "nearest-exact", "linear" (bi-/trilinear) or "cubic" (bicubic); a size of
    None is torch's floor(n * scale). One axis at a time, the last first, as torch's kernels."""
    taps = resize_taps_aa if antialias else resize_taps
    for axis in reversed(range(len(size))):
        at = x.ndim - len(size) + axis
        n_in, n_out = x.shape[at], size[axis]
        n_out = int(n_in * scales[axis]) if n_out is None else n_out
        if antialias and n_in == n_out:
            continue
        index, weight = taps(n_in, n_out, scales[axis], mode, align_corners, len(size))
        if weight is None:
            x = jnp.take(x, index[:, 0], axis=at)
            continue
        shape = (-1,) + (1,) * (x.ndim - at - 1)
        y = None
        for k in range(index.shape[1]):
            term = jnp.take(x, index[:, k], axis=at) * jnp.asarray(weight[:, k], x.dtype).reshape(shape)
            y = term if y is None else y + term
        x = y
    return x''',
    "pool_size": '''def pool_size(size, kernel, stride, padding, dilation, ceil_mode):
    """torch's pooling output size of one axis: with ceil_mode a last partial window counts if
    it starts inside the input or its left padding."""
    out = (size + 2 * padding - dilation * (kernel - 1) - 1 + (stride - 1 if ceil_mode else 0)) // stride + 1
    return out - 1 if ceil_mode and (out - 1) * stride >= size + padding else out''',
    "torch_max_pool": '''def torch_max_pool(x, kernel, stride, padding, dilation, *, ceil_mode=False, indices=False):
    """torch's max_pool1d/2d/3d over x's trailing len(kernel) axes, padded with -inf. With
    `indices`, also the flat index of each maximum in its input plane (the first one, as torch's
    kernels pick)."""
    import numpy as np
    n = len(kernel)
    spatial = x.shape[x.ndim - n:]
    out_size = [pool_size(*v, ceil_mode) for v in zip(spatial, kernel, stride, padding, dilation)]
    low = -jnp.inf if jnp.issubdtype(x.dtype, jnp.floating) else jnp.iinfo(x.dtype).min
    if not indices and all(d == 1 for d in dilation):  # JAX's max window has no dilated gradient
        pads = [(p, max((o - 1) * s + d * (k - 1) + 1 - size - p, 0))
                for p, o, s, d, k, size in zip(padding, out_size, stride, dilation, kernel, spatial)]
        return jax.lax.reduce_window(x, low, jax.lax.max, (1,) * (x.ndim - n) + tuple(kernel),
                                     (1,) * (x.ndim - n) + tuple(stride), [(0, 0)] * (x.ndim - n) + pads,
                                     window_dilation=(1,) * (x.ndim - n) + tuple(dilation))
    # windows gathered explicitly: out [..., o1, ..., on, k1 * ... * kn]
    where = [np.arange(o)[:, None] * s + np.arange(k)[None, :] * d - p
             for o, s, d, k, p in zip(out_size, stride, dilation, kernel, padding)]
    grids = np.meshgrid(*[w.reshape(-1) for w in where], indexing="ij")
    shape = tuple(v for o, k in zip(out_size, kernel) for v in (o, k))
    order = tuple(range(0, 2 * n, 2)) + tuple(range(1, 2 * n, 2))
    pos = [g.reshape(shape).transpose(order).reshape(tuple(out_size) + (-1,)) for g in grids]
    valid = np.all([(p >= 0) & (p < size) for p, size in zip(pos, spatial)], axis=0)
    clipped = tuple(np.clip(p, 0, size - 1) for p, size in zip(pos, spatial))
    windows = jnp.where(valid, x[(Ellipsis,) + clipped], low)
    flat = np.ravel_multi_index(clipped, spatial).astype(np.int32)
    best = jnp.argmax(windows, axis=-1)[..., None]
    values = jnp.take_along_axis(windows, best, axis=-1)[..., 0]
    if not indices:
        return values
    return values, jnp.take_along_axis(jnp.broadcast_to(flat, windows.shape), best, axis=-1)[..., 0]''',
    "torch_avg_pool": '''def torch_avg_pool(x, kernel, stride, padding, *, ceil_mode=False, count_include_pad=True, divisor=None):
    """torch's avg_pool1d/2d/3d over x's trailing len(kernel) axes: each window's sum (zero
    padding) over torch's divisor: the window's cells inside the padded input
    (count_include_pad) or inside the input, or `divisor` (divisor_override)."""
    import numpy as np
    n = len(kernel)
    spatial = x.shape[x.ndim - n:]
    out_size = [pool_size(*v, 1, ceil_mode) for v in zip(spatial, kernel, stride, padding)]
    pads = [(p, max((o - 1) * s + k - size - p, 0)) for p, o, s, k, size in zip(padding, out_size, stride, kernel, spatial)]
    total = jax.lax.reduce_window(x, x.dtype.type(0), jax.lax.add, (1,) * (x.ndim - n) + tuple(kernel),
                                  (1,) * (x.ndim - n) + tuple(stride), [(0, 0)] * (x.ndim - n) + pads)
    if divisor is not None:
        return total / divisor
    counts = []
    for o, s, k, p, size in zip(out_size, stride, kernel, padding, spatial):
        start = np.arange(o) * s - p
        end = np.minimum(start + k, size + p)
        if not count_include_pad:
            start, end = np.maximum(start, 0), np.minimum(end, size)
        counts.append(end - start)
    count = counts[0]
    for c in counts[1:]:
        count = np.multiply.outer(count, c)
    return total / jnp.asarray(count, x.dtype)''',
    "adaptive_bins": '''def adaptive_bins(n_in, n_out):
    """torch's adaptive pooling bins of one axis: [floor(i * n_in / n_out), ceil((i + 1) * n_in / n_out))."""
    return [((i * n_in) // n_out, -(-((i + 1) * n_in) // n_out)) for i in range(n_out)]''',
    "torch_adaptive_pool": '''def torch_adaptive_pool(x, size, *, reduce):
    """torch's adaptive_avg_pool / adaptive_max_pool over x's trailing len(size) axes (None in
    size keeps that axis). "mean": each bin's sum over its cell count; "max": (values, the flat
    index of each maximum in its input plane, the first one)."""
    import numpy as np
    n = len(size)
    spatial = x.shape[x.ndim - n:]
    size = [s if o is None else o for s, o in zip(spatial, size)]
    if reduce == "mean":
        count = 1
        for axis, (n_in, n_out) in enumerate(zip(spatial, size)):
            at = x.ndim - n + axis
            bins = adaptive_bins(n_in, n_out)
            x = jnp.stack([jax.lax.slice_in_dim(x, a, b, axis=at).sum(axis=at) for a, b in bins], axis=at)
            count = np.multiply.outer(count, np.array([b - a for a, b in bins]))
        return x / jnp.asarray(count, x.dtype)
    # max: each bin's cells gathered (short bins repeat their last cell), first maximum taken
    where = []
    for n_in, n_out in zip(spatial, size):
        bins = adaptive_bins(n_in, n_out)
        k = max(b - a for a, b in bins)
        where.append(np.array([[min(a + j, b - 1) for j in range(k)] for a, b in bins]))
    grids = np.meshgrid(*[w.reshape(-1) for w in where], indexing="ij")
    shape = tuple(v for w in where for v in w.shape)
    order = tuple(range(0, 2 * n, 2)) + tuple(range(1, 2 * n, 2))
    pos = tuple(g.reshape(shape).transpose(order).reshape(tuple(size) + (-1,)) for g in grids)
    windows = x[(Ellipsis,) + pos]
    best = jnp.argmax(windows, axis=-1)[..., None]
    flat = np.ravel_multi_index(pos, spatial).astype(np.int32)
    return (jnp.take_along_axis(windows, best, axis=-1)[..., 0],
            jnp.take_along_axis(jnp.broadcast_to(flat, windows.shape), best, axis=-1)[..., 0])''',
    "torch_group_norm": '''def torch_group_norm(x, groups, weight, bias, *, eps, stats=False):
    """torch.nn.functional.group_norm: x [N, C, *] normalised over each group of C // groups
    channels and the spatial axes (biased variance), then the per-channel affine. With `stats`,
    also torch's mean and 1 / std [N, groups] (native_group_norm)."""
    g = x.reshape(x.shape[0], groups, -1)
    mean = g.mean(axis=-1, keepdims=True)
    rstd = jax.lax.rsqrt(jnp.square(g - mean).mean(axis=-1, keepdims=True) + eps)
    y = ((g - mean) * rstd).reshape(x.shape)
    channel = (1, -1) + (1,) * (x.ndim - 2)
    if weight is not None:
        y = y * weight.reshape(channel)
    if bias is not None:
        y = y + bias.reshape(channel)
    return (y, mean[..., 0], rstd[..., 0]) if stats else y''',
    "torch_batch_norm": '''def torch_batch_norm(x, weight, bias, mean, var, *, eps):
    """torch's batch_norm with given statistics (eval mode: the running mean and variance), per
    channel (axis 1), in torch's inference form x * (w / sqrt(var + eps)) + (b - mean * that)."""
    channel = (1, -1) + (1,) * (x.ndim - 2)
    scale = 1 / jnp.sqrt(var + eps)
    if weight is not None:
        scale = scale * weight
    shift = -mean * scale if bias is None else bias - mean * scale
    return x * scale.reshape(channel) + shift.reshape(channel)''',
    "torch_batch_stats_norm": '''def torch_batch_stats_norm(x, weight, bias, *, eps, axes):
    """torch's batch_norm / instance_norm with the batch's own statistics (biased variance) over
    `axes`, without running statistics to update; returns (y, mean, 1 / std), the statistics
    flattened (per channel for batch norm, as torch's)."""
    mean = x.mean(axis=axes, keepdims=True)
    rstd = jax.lax.rsqrt(jnp.square(x - mean).mean(axis=axes, keepdims=True) + eps)
    y = (x - mean) * rstd
    channel = (1, -1) + (1,) * (x.ndim - 2)
    if weight is not None:
        y = y * weight.reshape(channel)
    if bias is not None:
        y = y + bias.reshape(channel)
    return y, mean.reshape(-1), rstd.reshape(-1)''',
    "conv_transpose": '''def conv_transpose(x, weight, bias, *, stride, padding, output_padding, dilation, groups):
    """torch's conv_transpose1d/2d/3d: x [B, C, *spatial], weight [C, O // groups, *kernel]: the
    gradient of a convolution, written as one with the input dilated by the stride and the
    kernel flipped, its in/out axes swapped within each group."""
    c, o = weight.shape[0], weight.shape[1]
    k = weight.shape[2:]
    w = weight.reshape((groups, c // groups, o) + k).swapaxes(1, 2).reshape((groups * o, c // groups) + k)
    w = jnp.flip(w, axis=tuple(range(2, w.ndim)))
    pads = [(d * (kk - 1) - p, d * (kk - 1) - p + op) for kk, p, op, d in zip(k, padding, output_padding, dilation)]
    y = jax.lax.conv_general_dilated(x, w, (1,) * len(k), pads, lhs_dilation=stride, rhs_dilation=dilation,
                                     feature_group_count=groups)
    return y if bias is None else y + bias.reshape((1, -1) + (1,) * (y.ndim - 2))''',
}
