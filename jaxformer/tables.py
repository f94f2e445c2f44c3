"""Constant tables computed once in numpy (float64, then cast) and shared by both trees,
so that JAX and PyTorch start from bit-identical positional constants."""
from __future__ import annotations

import functools
import math

import numpy as np

# Attention "auto" (jaxformer/lowering.py and torch_ref/lowering.py) runs the blockwise kernel,
# where the platform's own kernel does not take a call, from this many keys on, and plain
# attention below: on CPU blockwise attention's forward and backward is about as fast as plain's
# at 1024 keys and faster beyond, with a third of its temporaries there, and plain's [B, H, T, S]
# temporaries grow as T^2 (bench/attention_auto.py; bench/README.md, "Attention auto threshold").
AUTO_BLOCKWISE_MIN_KEYS = 1024


@functools.cache
def sinusoid_table(max_len: int, d_model: int) -> np.ndarray:
    """[max_len, D] table of Vaswani et al. (2017): PE(p, 2i) = sin(p / 10000^(2i/D)),
    PE(p, 2i+1) = cos(p / 10000^(2i/D))."""
    pos = np.arange(max_len, dtype=np.float64)[:, None]
    div = np.exp(np.arange(0, d_model, 2, dtype=np.float64) * (-math.log(10000.0) / d_model))
    table = np.zeros((max_len, d_model), dtype=np.float64)
    table[:, 0::2] = np.sin(pos * div)
    table[:, 1::2] = np.cos(pos * div)[:, : d_model // 2]
    table = table.astype(np.float32)
    table.flags.writeable = False
    return table


@functools.cache
def rope_inv_freq(head_dim: int, base: float, scaling=None, long: bool = False) -> tuple[np.ndarray, float]:
    """-> (inv_freq [K/2] float64, attention factor) of RoPE with an optional scaling (a
    jaxformer.config.RopeScaling), as transformers 5.x's modeling_rope_utils computes them,
    in float64 (docs/numerics.md §20). "dynamic" returns the unscaled frequencies: its base
    grows with the run's sequence length (dynamic_rope_base). "longrope": the short factors'
    frequencies, or with `long` the long factors' (a call longer than original_max_len; §34)."""
    inv_freq = 1.0 / (base ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
    factor = 1.0 if scaling is None else float(scaling.factor)
    kind = None if scaling is None else scaling.rope_type
    attention_factor = 1.0
    if kind == "linear":
        inv_freq = inv_freq / factor
    elif kind == "llama3":  # Llama 3.1: long wavelengths / factor, short kept, a smooth band between
        old = scaling.original_max_len
        low, high = scaling.low_freq_factor, scaling.high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        scaled = np.where(wavelen > old / low, inv_freq / factor, inv_freq)
        smooth = (old / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < old / high) & ~(wavelen > old / low)
        inv_freq = np.where(medium, smoothed, scaled)
    elif kind == "yarn":  # Peng et al. 2023: interpolate below a ramp, extrapolate above it
        def mscale(scale, m=1.0):
            return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0
        if scaling.attention_factor is not None:
            attention_factor = float(scaling.attention_factor)
        elif scaling.mscale and scaling.mscale_all_dim:
            attention_factor = mscale(factor, scaling.mscale) / mscale(factor, scaling.mscale_all_dim)
        else:
            attention_factor = mscale(factor)

        def correction_dim(rotations):
            return (head_dim * math.log(scaling.original_max_len / (rotations * 2 * math.pi))
                    / (2 * math.log(base)))
        lo, hi = correction_dim(scaling.beta_fast), correction_dim(scaling.beta_slow)
        if scaling.truncate:
            lo, hi = math.floor(lo), math.ceil(hi)
        lo, hi = max(lo, 0), min(hi, head_dim - 1)
        if lo == hi:
            hi += 0.001  # HF's guard against a zero-width ramp
        ramp = np.clip((np.arange(head_dim // 2, dtype=np.float64) - lo) / (hi - lo), 0, 1)
        extrapolate = 1 - ramp
        inv_freq = inv_freq / factor * (1 - extrapolate) + inv_freq * extrapolate
    elif kind == "longrope":  # LongRoPE (Phi-3): per-frequency divisors, short or long set
        ext = np.asarray(scaling.long_factor if long else scaling.short_factor, np.float64)
        inv_freq = 1.0 / (ext * base ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
        if scaling.attention_factor is not None:
            attention_factor = float(scaling.attention_factor)
        elif factor > 1:
            attention_factor = math.sqrt(1 + math.log(factor) / math.log(scaling.original_max_len))
    inv_freq = np.asarray(inv_freq, np.float64)
    inv_freq.flags.writeable = False
    return inv_freq, attention_factor


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's attention temperature 0.1 * mscale * ln(factor) + 1 (1 for factor <= 1)."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def mla_softmax_scale(qk_head_dim: int, scaling=None, scale: float | None = None) -> float:
    """The score scale of multi-head latent attention (DeepSeek-V2/V3): `scale` (None =
    qk_head_dim ** -0.5), times yarn_mscale(factor, mscale_all_dim) ** 2 when the RoPE scaling
    has mscale_all_dim (HF's yarn_apply_mscale; docs/numerics.md §27). The rope tables carry
    the separate attention factor mscale / mscale_all_dim (rope_inv_freq)."""
    scale = qk_head_dim ** -0.5 if scale is None else float(scale)
    if scaling is not None and scaling.mscale_all_dim:
        m = yarn_mscale(float(scaling.factor), float(scaling.mscale_all_dim))
        scale = scale * m * m
    return scale


def rope_exponents(head_dim: int) -> np.ndarray:
    """[K/2] float32 exponents 2i/K: inv_freq_i = base ** -exponent_i (dynamic scaling
    recomputes the base at run time; docs/numerics.md §20)."""
    out = (np.arange(0, head_dim, 2, dtype=np.float32) / np.float32(head_dim)).astype(np.float32)
    out.flags.writeable = False
    return out


@functools.cache
def rope_tables(max_len: int, head_dim: int, base: float, scaling=None,
                long: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin tables [max_len, K] for rotate-half RoPE (GPT-NeoX / HF LLaMA layout):
    frequency i is shared by dims i and i + K/2. With a scaling, its inverse frequencies and
    attention factor (both multiply into cos and sin) from rope_inv_freq (`long`: longrope's
    long-factor tables)."""
    inv_freq, attention_factor = rope_inv_freq(head_dim, base, scaling, long)
    angles = np.arange(max_len, dtype=np.float64)[:, None] * inv_freq[None, :]  # [T, K/2]
    angles = np.concatenate([angles, angles], axis=-1)  # [T, K]
    cos = (np.cos(angles) * attention_factor).astype(np.float32)
    sin = (np.sin(angles) * attention_factor).astype(np.float32)
    cos.flags.writeable = False
    sin.flags.writeable = False
    return cos, sin


@functools.cache
def alibi_slopes(num_heads: int) -> np.ndarray:
    """Per-head ALiBi slopes (Press et al. 2022). For a head count that is not a power of
    two, take the slopes of the closest smaller power of two, then every other slope of
    the next power of two (as in the paper's reference code)."""
    def pow2_slopes(n: int) -> list[float]:
        start = 2.0 ** (-(2.0 ** -(math.log2(n) - 3)))
        return [start * start ** i for i in range(n)]

    if math.log2(num_heads).is_integer():
        slopes = pow2_slopes(num_heads)
    else:
        closest = 2 ** math.floor(math.log2(num_heads))
        slopes = pow2_slopes(closest) + pow2_slopes(2 * closest)[0::2][: num_heads - closest]
    out = np.asarray(slopes, dtype=np.float32)
    out.flags.writeable = False
    return out


@functools.cache
def t5_bucket_table(bidirectional: bool, num_buckets: int, max_distance: int) -> np.ndarray:
    """int32 bucket id of T5's relative position bias (Raffel et al. 2020) for every relative
    distance rel = key_pos - query_pos in [-max_distance, max_distance] (index rel + max_distance).
    Buckets saturate beyond max_distance, so callers clip rel to that range. Computed in numpy,
    so both frameworks bucket identically."""
    rel = np.arange(-max_distance, max_distance + 1, dtype=np.int64)
    buckets = np.zeros_like(rel)
    n = num_buckets
    if bidirectional:
        n //= 2
        buckets += (rel > 0).astype(np.int64) * n
        rel = np.abs(rel)
    else:
        rel = -np.minimum(rel, 0)
    max_exact = n // 2
    is_small = rel < max_exact
    scaled = np.log(np.maximum(rel, 1).astype(np.float32) / max_exact) / np.float32(
        math.log(max_distance / max_exact)) * (n - max_exact)
    large = np.minimum(max_exact + scaled.astype(np.int64), n - 1)
    buckets += np.where(is_small, rel, large)
    out = buckets.astype(np.int32)
    out.flags.writeable = False
    return out


# ----------------------------------------------------------------------------- Swin windows
@functools.cache
def relative_position_index(window: int, table_window: int) -> np.ndarray:
    """Swin's relative position index (Liu et al. 2021, eq. 4): [N, N] int32 row of the
    (2*table_window-1)^2-row bias table for each token pair of a window x window window
    (N = window^2); equals HF's index when window == table_window."""
    coords = np.stack(np.meshgrid(np.arange(window), np.arange(window), indexing="ij")).reshape(2, -1)
    rel = coords[:, :, None] - coords[:, None, :] + (table_window - 1)  # [2, N, N], >= 0
    out = (rel[0] * (2 * table_window - 1) + rel[1]).astype(np.int32)
    out.flags.writeable = False
    return out


@functools.cache
def shift_mask(h: int, w: int, window: int, shift: int) -> np.ndarray | None:
    """Swin's SW-MSA mask: [nW, N, N] bool, True where two tokens of a shifted window came from
    the same region of the un-shifted map (Liu et al. 2021, fig. 4); None without a shift.
    h, w: padded sizes, multiples of window."""
    if shift == 0:
        return None
    def regions(n):
        return (np.arange(n) >= n - window).astype(np.int32) + (np.arange(n) >= n - shift)
    img = (regions(h)[:, None] * 3 + regions(w)[None, :])[None, :, :, None]  # [1, h, w, 1]
    ids = _window_partition(img, window)[..., 0]  # [nW, N]
    out = ids[:, :, None] == ids[:, None, :]
    out.flags.writeable = False
    return out


def _window_partition(x: np.ndarray, window: int) -> np.ndarray:
    """[B, h, w, C] -> [B*nW, W*W, C], as the models' window_partition."""
    b, h, w, c = x.shape
    x = x.reshape(b, h // window, window, w // window, window, c).transpose(0, 1, 3, 2, 4, 5)
    return x.reshape(-1, window * window, c)


@functools.cache
def bicubic_weights(in_size: int, out_size: int) -> np.ndarray:
    """[out_size, in_size] float32: one axis of torch's bicubic resize (F.interpolate
    mode="bicubic", align_corners=False, antialias=False, `size` given, no scale_factor),
    as a matrix, so that out = W @ in along that axis (docs/numerics.md §37).

    Torch's kernel (aten UpSample.h): scale = in / out; output i reads the source coordinate
    x = scale * (i + 0.5) - 0.5 (not clamped at 0 for cubic), taps floor(x) - 1 .. floor(x) + 2
    with Keys' cubic convolution weights at A = -0.75 of t = x - floor(x); a tap outside
    [0, in) reads the edge sample (index clamped), so its weight adds to the edge column.
    Computed in float32 as torch computes them for float32 input. jax.image.resize's "cubic"
    differs on each point: A = -0.5, taps outside the image dropped and the weights
    renormalised, and a kernel widened by the scale when downsampling (antialiasing)."""
    a = np.float32(-0.75)
    one, two = np.float32(1.0), np.float32(2.0)
    scale = np.float32(in_size) / np.float32(out_size)

    def near(x):  # |x| <= 1
        return ((a + 2) * x - (a + 3)) * x * x + one

    def far(x):  # 1 < |x| < 2
        return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a
    w = np.zeros((out_size, in_size), np.float32)
    for i in range(out_size):
        x = scale * (np.float32(i) + np.float32(0.5)) - np.float32(0.5)
        x0 = np.floor(x)
        t = np.float32(x - x0)
        taps = (far(t + one), near(t), near(one - t), far(two - t))
        for k, coeff in enumerate(taps):
            j = min(max(int(x0) - 1 + k, 0), in_size - 1)
            w[i, j] += np.float32(coeff)
    return w
