"""Helpers for reductions, norms, distances, losses and window / patch ops, with torch's
formulas (jaxformer/port/helpers.py; docs/numerics.md §46)."""

HELPERS_MATH = {
    "torch_vector_norm": '''def torch_vector_norm(x, ord=2, axis=None, keepdims=False):
    """torch.linalg.vector_norm: over `axis` (all axes: None) as one vector, whatever their count;
    ord inf / -inf the largest / smallest |x|, 0 the count of non-zeros. A zero 2-norm has
    gradient 0, as torch's."""
    axis = tuple(range(x.ndim)) if axis is None else axis
    a = jnp.abs(x)
    if ord == jnp.inf:
        return a.max(axis=axis, keepdims=keepdims)
    if ord == -jnp.inf:
        return a.min(axis=axis, keepdims=keepdims)
    if ord == 0:
        return (x != 0).sum(axis=axis, keepdims=keepdims).astype(x.dtype)
    if ord == 1:
        return a.sum(axis=axis, keepdims=keepdims)
    if ord == 2:
        total = jnp.square(x).sum(axis=axis, keepdims=keepdims)
        return jnp.where(total == 0, 0.0, jnp.sqrt(jnp.where(total == 0, 1.0, total))).astype(x.dtype)
    total = (a ** ord).sum(axis=axis, keepdims=keepdims)
    return jnp.where(total == 0, 0.0, jnp.where(total == 0, 1.0, total) ** (1.0 / ord)).astype(x.dtype)''',
    "torch_cummax": '''def torch_cummax(x, axis, *, smallest=False):
    """torch.cummax / cummin along `axis`: (values, indices), a tie taking the later index and a
    NaN holding from where it appears, as torch's kernels do."""
    def pick(a, b):
        (va, ia), (vb, ib) = a, b
        better = (vb <= va) if smallest else (vb >= va)
        take = jnp.isnan(vb) | (~jnp.isnan(va) & better)
        return jnp.where(take, vb, va), jnp.where(take, ib, ia)
    shape = [1] * x.ndim
    shape[axis] = x.shape[axis]
    index = jnp.broadcast_to(jnp.arange(x.shape[axis]).reshape(shape), x.shape)
    _, index = jax.lax.associative_scan(pick, (jax.lax.stop_gradient(x), index), axis=axis)
    return jnp.take_along_axis(x, index, axis=axis), index''',
    "torch_linspace": '''def torch_linspace(start, end, steps, dtype):
    """torch.linspace: the first half counted up from start, the rest down from end."""
    i = jnp.arange(steps)
    step = (end - start) / max(steps - 1, 1)
    return jnp.where(i < steps // 2, start + step * i, end - step * (steps - 1 - i)).astype(dtype)''',
    "torch_cosine_similarity": '''def torch_cosine_similarity(x1, x2, axis=1, eps=1e-8):
    """torch.nn.functional.cosine_similarity: each input over its norm clamped to eps (the clamp
    outside autograd, as torch's), then the sum of the products."""
    x1, x2 = jnp.broadcast_arrays(x1, x2)

    def unit(x):
        n = jnp.sqrt(jnp.square(x).sum(axis=axis, keepdims=True))
        return x / (n + jax.lax.stop_gradient(jnp.maximum(n, eps) - n))
    return (unit(x1) * unit(x2)).sum(axis=axis)''',
    "torch_cdist": '''def torch_cdist(x1, x2, p=2.0, mm=False):
    """torch.cdist [..., P, M] x [..., R, M] -> [..., P, R]; `mm`: torch's matmul form of the
    Euclidean distance (its default past 25 rows), |a|^2 + |b|^2 - 2 a.b clamped at 0."""
    if mm:
        a2 = jnp.square(x1).sum(axis=-1, keepdims=True)
        b2 = jnp.square(x2).sum(axis=-1, keepdims=True)
        left = jnp.concatenate([-2 * x1, a2, jnp.ones_like(a2)], axis=-1)
        right = jnp.concatenate([x2, jnp.ones_like(b2), b2], axis=-1)
        d2 = jnp.maximum(left @ right.swapaxes(-1, -2), 0)
        return jnp.where(d2 == 0, 0.0, jnp.sqrt(jnp.where(d2 == 0, 1.0, d2)))
    return torch_vector_norm(x1[..., :, None, :] - x2[..., None, :, :], p, axis=-1)''',
    "torch_unfold": '''def torch_unfold(x, axis, size, step):
    """torch.Tensor.unfold: the windows of `size` every `step` along `axis`; that axis becomes
    the window count and the window is a new last axis."""
    count = (x.shape[axis] - size) // step + 1
    index = jnp.arange(count)[:, None] * step + jnp.arange(size)[None, :]
    return jnp.moveaxis(jnp.take(x, index, axis=axis), axis + 1, -1)''',
    "patch_index": '''def patch_index(size, kernel, dilation, padding, stride):
    """Rows (block, kernel offset) of the padded input that F.unfold / F.fold read, per axis."""
    count = (size + 2 * padding - dilation * (kernel - 1) - 1) // stride + 1
    return jnp.arange(kernel)[:, None] * dilation + jnp.arange(count)[None, :] * stride''',
    "torch_im2col": '''def torch_im2col(x, kernel, dilation, padding, stride):
    """torch.nn.functional.unfold: x [N, C, H, W] -> [N, C * kh * kw, L], blocks row-major."""
    n, c = x.shape[:2]
    x = jnp.pad(x, ((0, 0), (0, 0), (padding[0], padding[0]), (padding[1], padding[1])))
    rows = patch_index(x.shape[2] - 2 * padding[0], kernel[0], dilation[0], padding[0], stride[0])
    cols = patch_index(x.shape[3] - 2 * padding[1], kernel[1], dilation[1], padding[1], stride[1])
    patches = x[:, :, rows[:, None, :, None], cols[None, :, None, :]]  # [N, C, kh, kw, bh, bw]
    return patches.reshape(n, c * kernel[0] * kernel[1], -1)''',
    "torch_col2im": '''def torch_col2im(cols, size, kernel, dilation, padding, stride):
    """torch.nn.functional.fold: [N, C * kh * kw, L] summed back into [N, C, H, W]."""
    n = cols.shape[0]
    c = cols.shape[1] // (kernel[0] * kernel[1])
    rows = patch_index(size[0], kernel[0], dilation[0], padding[0], stride[0])
    columns = patch_index(size[1], kernel[1], dilation[1], padding[1], stride[1])
    blocks = cols.reshape(n, c, kernel[0], kernel[1], rows.shape[1], columns.shape[1])
    out = jnp.zeros((n, c, size[0] + 2 * padding[0], size[1] + 2 * padding[1]), cols.dtype)
    out = out.at[:, :, rows[:, None, :, None], columns[None, :, None, :]].add(blocks)
    return out[:, :, padding[0]:padding[0] + size[0], padding[1]:padding[1] + size[1]]''',
    "torch_embedding_bag": '''def torch_embedding_bag(weight, indices, offsets, *, mode, bags, per_sample_weights=None,
                        padding_idx=None):
    """torch.nn.functional.embedding_bag: the rows of `weight` at `indices`, reduced ("sum",
    "mean", "max") within each bag; bag b runs from offsets[b] to the next offset. An empty bag
    (or one of padding ids only) gives zeros, as torch's."""
    if indices.ndim == 2:  # fixed-size bags
        offsets = jnp.arange(indices.shape[0]) * indices.shape[1]
        indices = indices.reshape(-1)
    bag = jnp.searchsorted(offsets, jnp.arange(indices.shape[0]), side="right") - 1
    keep = jnp.ones(indices.shape, jnp.bool_) if padding_idx is None else indices != padding_idx
    rows = jnp.take(weight, indices, axis=0)
    if per_sample_weights is not None:
        rows = rows * per_sample_weights[:, None]
    if mode == "max":
        rows = jnp.where(keep[:, None], rows, -jnp.inf)
        out = jax.ops.segment_max(rows, bag, num_segments=bags)
        return jnp.where(jnp.isneginf(out), 0.0, out)
    out = jax.ops.segment_sum(jnp.where(keep[:, None], rows, 0.0), bag, num_segments=bags)
    if mode == "mean":
        count = jax.ops.segment_sum(keep.astype(weight.dtype), bag, num_segments=bags)
        out = out / jnp.maximum(count, 1)[:, None]
    return out''',
    "torch_loss_reduce": '''def torch_loss_reduce(loss, reduction):
    """torch's loss reduction: 0 none, 1 mean, 2 sum."""
    return loss if reduction == 0 else (loss.mean() if reduction == 1 else loss.sum())''',
    "torch_nll_loss": '''def torch_nll_loss(logp, target, weight=None, reduction=1, ignore_index=-100):
    """torch.nn.functional.nll_loss: logp [N, C, ...] (or [C]), target class ids; the mean
    divides by the summed weights of the targets not ignored."""
    axis = 0 if logp.ndim == 1 else 1
    safe = jnp.where(target == ignore_index, 0, target)
    picked = jnp.take_along_axis(logp, jnp.expand_dims(safe, axis), axis=axis).squeeze(axis)
    w = jnp.ones_like(picked) if weight is None else jnp.take(weight, safe)
    w = jnp.where(target == ignore_index, 0.0, w)
    loss = -picked * w
    if reduction == 1:
        return loss.sum() / w.sum()
    return loss.sum() if reduction == 2 else loss''',
    "torch_cross_entropy": '''def torch_cross_entropy(logits, target, weight=None, reduction=1, ignore_index=-100, smoothing=0.0):
    """torch.nn.functional.cross_entropy over the class axis (1; 0 for one sample): class ids
    (nll_loss of the log-softmax, label smoothing mixed in as torch mixes it) or probabilities."""
    axis = 0 if logits.ndim == 1 else 1
    logp = jax.nn.log_softmax(logits, axis=axis)
    classes = logits.shape[axis]
    shape = [1] * logits.ndim
    shape[axis] = classes
    if jnp.issubdtype(target.dtype, jnp.floating):  # class probabilities
        if smoothing:
            target = target * (1 - smoothing) + smoothing / classes
        per = logp * target if weight is None else logp * target * weight.reshape(shape)
        loss = -per.sum(axis=axis)
        if reduction == 1:
            return loss.sum() / (logits.size // classes)
        return loss.sum() if reduction == 2 else loss
    loss = torch_nll_loss(logp, target, weight, reduction, ignore_index)
    if not smoothing:
        return loss
    ignored = target == ignore_index
    smooth = -(logp if weight is None else logp * weight.reshape(shape)).sum(axis=axis)
    smooth = jnp.where(ignored, 0.0, smooth)
    if reduction == 1:
        safe = jnp.where(ignored, 0, target)
        total = (~ignored).sum() if weight is None else jnp.where(ignored, 0.0, jnp.take(weight, safe)).sum()
        smooth = smooth.sum() / total
    elif reduction == 2:
        smooth = smooth.sum()
    return (1 - smoothing) * loss + smooth * (smoothing / classes)''',
}
