"""Functions a written file defines when its graph uses the torch op they stand for: torch's
functional layers, written once, readable, with torch's numerics (docs/numerics.md §42).
The spatial ones (interpolation, pooling, norms, transposed convolutions) are in helpers_nn.py,
reductions, distances, losses and patches in helpers_math.py, scatter forms in helpers_scatter.py."""
from jaxformer.port.helpers_math import HELPERS_MATH
from jaxformer.port.helpers_nn import HELPERS_NN
from jaxformer.port.helpers_scatter import HELPERS_SCATTER

HELPERS = {
    "scaled_dot_product_attention": '''def scaled_dot_product_attention(q, k, v, mask=None, *, causal=False, scale=None, grouped=False, dropout=None):
    """torch.nn.functional.scaled_dot_product_attention: q [..., H, T, K], k and v [..., H, S, K].

    A boolean mask keeps True, a float mask is added to the scores; a query row that sees no
    key outputs 0, as torch's CPU kernels give."""
    if grouped:  # grouped-query attention: each key/value head serves several query heads
        k = jnp.repeat(k, q.shape[-3] // k.shape[-3], axis=-3)
        v = jnp.repeat(v, q.shape[-3] // v.shape[-3], axis=-3)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    scores = (q @ k.swapaxes(-2, -1)) * scale
    visible = jnp.ones(scores.shape, jnp.bool_)
    if causal:
        visible = jnp.tril(visible)
    if mask is not None and mask.dtype == jnp.bool_:
        visible = visible & mask
    elif mask is not None:
        scores = scores + mask
    scores = jnp.where(visible, scores, -jnp.inf)
    any_visible = visible.any(axis=-1, keepdims=True)
    weights = jax.nn.softmax(jnp.where(any_visible, scores, 0.0), axis=-1)
    weights = jnp.where(any_visible, weights, 0.0)
    if dropout is not None:
        weights = dropout(weights)
    return weights @ v''',
    "layer_norm": '''def layer_norm(x, weight, bias, *, eps, axes=1):
    """torch.nn.functional.layer_norm over the last `axes` dimensions (biased variance)."""
    dims = tuple(range(-axes, 0))
    mean = x.mean(axis=dims, keepdims=True)
    var = jnp.square(x - mean).mean(axis=dims, keepdims=True)
    y = (x - mean) * jax.lax.rsqrt(var + eps)
    if weight is not None:
        y = y * weight
    return y if bias is None else y + bias''',
    "rms_norm": '''def rms_norm(x, weight, *, eps, axes=1):
    """torch.nn.functional.rms_norm over the last `axes` dimensions."""
    dims = tuple(range(-axes, 0))
    y = x * jax.lax.rsqrt(jnp.square(x).mean(axis=dims, keepdims=True) + eps)
    return y if weight is None else y * weight''',
    "conv": '''def conv(x, weight, bias, *, stride, padding, dilation, groups):
    """torch's conv1d / conv2d / conv3d: x [B, C, *spatial], weight [O, C // groups, *kernel];
    a padding entry is both sides' or a (left, right) pair (padding='same' with an odd total)."""
    pairs = [p if isinstance(p, tuple) else (p, p) for p in padding]
    y = jax.lax.conv_general_dilated(x, weight, stride, pairs,
                                     rhs_dilation=dilation, feature_group_count=groups)
    return y if bias is None else y + bias.reshape((1, -1) + (1,) * (y.ndim - 2))''',
    "torch_masks": '''def torch_masks(key_padding_mask=None, attn_mask=None, *, num_heads=None, sdpa_causal=False, prefix="",
                with_bias=True, slots=0):
    """torch's attention masks as jaxformer's keyword arguments {prefix + "mask", prefix + "bias"}
    (jaxformer.interop.masks_from_torch): mask bool, True = attend, [B?, H?, T?, S]; bias float or None.

    key_padding_mask [B, S]: bool True = ignore, or float added. attn_mask [T, S] or
    [B * H, T, S]: bool True = not allowed, or float added. sdpa_causal: torch's is_causal path
    without a key_padding_mask, which uses the causal mask of attn_mask's shape instead of attn_mask,
    spanning the `slots` keys nn.MultiheadAttention appends too (so hiding them): [1, 1, T, S + slots]."""
    masks, biases = [], []
    if sdpa_causal:
        t, s = attn_mask.shape[-2:]
        masks.append(jnp.tril(jnp.ones((t, s + slots), jnp.bool_))[None, None])
        attn_mask = None
    for m in (key_padding_mask, attn_mask):
        if m is None:
            continue
        if m is key_padding_mask:
            m = m[:, None, None, :]  # [B, 1, 1, S]
        elif m.ndim == 2:
            m = m[None, None]  # [1, 1, T, S]
        else:
            m = m.reshape(-1, num_heads, *m.shape[1:])  # [B, H, T, S]
        if m.dtype == jnp.bool_:
            masks.append(~m)
        else:
            masks.append(~jnp.isneginf(m))
            biases.append(jnp.where(jnp.isneginf(m), 0.0, m).astype(jnp.float32))
    mask = bias = None
    for m in masks:
        mask = m if mask is None else mask & m
    for b in biases:
        bias = b if bias is None else bias + b
    return {prefix + "mask": mask, prefix + "bias": bias} if with_bias else {prefix + "mask": mask}''',
    "mha_outputs": '''def mha_outputs(outputs, *, seq_first, average):
    """torch.nn.MultiheadAttention's (output, weights) from jaxformer's (out [B, T, D], weights
    [B, H, T, S]): output sequence-first where torch's is, weights averaged over heads where torch
    averages them."""
    out, weights = outputs
    return (out.swapaxes(0, 1) if seq_first else out), (weights.mean(axis=1) if average else weights)''',
}
HELPERS.update(HELPERS_NN)
HELPERS.update(HELPERS_MATH)
HELPERS.update(HELPERS_SCATTER)
