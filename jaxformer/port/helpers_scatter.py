"""Helpers for the functional (out-of-place) forms of torch's mutation ops: scatter with its
reductions, diagonal_scatter, masked_scatter, boolean-mask index_put (jaxformer/port/helpers.py)."""

HELPERS_SCATTER = {
    "torch_scatter": '''def torch_scatter(x, dim, index, src, reduce=None, include_self=True):
    """torch's scatter / scatter_add / scatter_reduce: along `dim`, x's entry index[i] takes src[i]
    (reduce None) or is reduced with it: "sum", "prod", "mean", "amax", "amin", with x's own
    value (include_self) or without it. src (or a scalar) is read over index's shape. amax /
    amin share the gradient among the tied maxima, as torch does."""
    dim = dim % x.ndim
    if jnp.ndim(src) == 0:
        src = jnp.full(index.shape, src, x.dtype)
    src = src[tuple(slice(0, n) for n in index.shape)]
    at = list(jnp.indices(index.shape, sparse=True))
    at[dim] = index
    at = tuple(at)
    if reduce is None:
        return x.at[at].set(src)
    if reduce == "prod":  # JAX has no scatter-multiply gradient: a product over a one-hot mask
        part = tuple(slice(0, n) for n in index.shape[:dim]) + (slice(None),) + tuple(
            slice(0, n) for n in index.shape[dim + 1:])
        own = jnp.moveaxis(x[part], dim, -1)
        hit = jnp.moveaxis(index, dim, -1)[..., None] == jnp.arange(own.shape[-1])
        prod = jnp.where(hit, jnp.moveaxis(src, dim, -1)[..., None], 1).prod(axis=-2)
        prod = own * prod if include_self else jnp.where(hit.any(axis=-2), prod, own)
        return x.at[part].set(jnp.moveaxis(prod, -1, dim))
    hit = jnp.zeros(x.shape, jnp.bool_).at[at].set(True)
    if not include_self:
        if jnp.issubdtype(x.dtype, jnp.floating):
            low, high = -jnp.inf, jnp.inf
        else:
            low, high = jnp.iinfo(x.dtype).min, jnp.iinfo(x.dtype).max
        x = jnp.where(hit, {"sum": 0, "mean": 0, "amax": low, "amin": high}[reduce], x)
    if reduce in ("sum", "mean"):
        out = x.at[at].add(src)
        if reduce == "sum":
            return out
        count = jnp.zeros(x.shape, x.dtype).at[at].add(1) + (1 if include_self else 0)
        count = jnp.where(count == 0, 1, count)
        return out / count if jnp.issubdtype(x.dtype, jnp.floating) else out // count
    value = jax.lax.stop_gradient(x.at[at].max(src) if reduce == "amax" else x.at[at].min(src))
    own = (x == value) & (include_self | ~hit)
    srcs = src == value[at]
    count = own.astype(x.dtype) + jnp.zeros(x.shape, x.dtype).at[at].add(srcs.astype(x.dtype))
    share = (jnp.where(own, x, 0) + jnp.zeros(x.shape, x.dtype).at[at].add(jnp.where(srcs, src, 0))) / count
    return value + (share - jax.lax.stop_gradient(share))''',
    "torch_diagonal_scatter": '''def torch_diagonal_scatter(x, src, offset, dim1, dim2):
    """torch.diagonal_scatter: x with its diagonal (offset, over dim1 and dim2) set to src, whose
    last axis runs along the diagonal (as torch.diagonal gives it)."""
    y = jnp.moveaxis(x, (dim1, dim2), (-2, -1))
    n = src.shape[-1]
    rows = jnp.arange(n) + max(-offset, 0)
    cols = jnp.arange(n) + max(offset, 0)
    return jnp.moveaxis(y.at[..., rows, cols].set(src), (-2, -1), (dim1, dim2))''',
    "torch_masked_scatter": '''def torch_masked_scatter(x, mask, source):
    """torch.Tensor.masked_scatter: x's entries where mask is True, in order, take source's first
    entries (flattened); the positions depend on the mask's values, the shapes do not."""
    mask = jnp.broadcast_to(mask, x.shape).reshape(-1)
    taken = jnp.clip(jnp.cumsum(mask) - 1, 0, None)
    return jnp.where(mask, source.reshape(-1)[taken], x.reshape(-1)).reshape(x.shape)''',
    "torch_mask_put": '''def torch_mask_put(x, mask, at, values, accumulate=False):
    """x[..., mask] = values (or +=) for a boolean mask over x's axes at..at + mask.ndim - 1,
    values broadcast over the axes after the mask's (the index_put torch writes for x[mask] = v)."""
    mask = mask.reshape((1,) * at + mask.shape + (1,) * (x.ndim - at - mask.ndim))
    if accumulate:
        return x + jnp.where(mask, values, 0).astype(x.dtype)
    return jnp.where(mask, values, x).astype(x.dtype)''',
}
