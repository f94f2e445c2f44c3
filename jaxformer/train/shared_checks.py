"""The self-test's catalogue for code both trees share (issue 52 §3): a bug planted there lands in
the JAX tree and its torch twin at once, so no parity case can see it. Each mutation here comes
with a check of the shared code against a reference outside jaxformer (the paper's formula in
float64, torch's or ml_dtypes' own operation, Python's utf-8), run with the bug planted; the
bug is caught when the check's worst |ours - reference| / tolerance exceeds 1. The suite's own
reference tests (tests/test_references.py, docs/shared.md) cover the same code more widely; these
are the ones `jaxformer parity --self-test` runs, so a user sees the catalogue's score.

One mutation per inventory group of docs/shared.md: config rules, tables, schedules, clipping,
quantizers, the attention mask convention, the tokenizer, generation's filters. The HF config
readers (hf/, beside train/ in the layering) are checked by the suite against transformers."""
from __future__ import annotations

import contextlib
import dataclasses
import math

import numpy as np

from jaxformer.parity.mutations import Mutation, Outcome, patched


# ----------------------------------------------------------------------------- checks
def _ratio(got, ref, tol: float) -> float:
    return float(np.max(np.abs(np.asarray(got, np.float64) - np.asarray(ref, np.float64)))) / tol


def check_head_dim() -> float:
    """TransformerConfig's default head width: d_model / num_heads (Vaswani et al. 2017, d_k)."""
    from jaxformer.config import TransformerConfig
    worst = 0.0
    for d, h in ((32, 4), (48, 6), (64, 2)):
        cfg = TransformerConfig(d_model=d, num_heads=h, d_ff=2 * d, num_layers=1)
        worst = max(worst, abs(cfg.resolved_head_dim - d / h) / 1e-9)
    return worst


def check_rope_frequencies() -> float:
    """tables.rope_inv_freq against base^(-2i/d) in float64 (Su et al. 2021, eq. 15)."""
    from jaxformer import tables
    worst = 0.0
    for d, base in ((8, 10000.0), (64, 500000.0)):
        got = tables.rope_inv_freq(d, base)[0]
        ref = base ** (-np.arange(0, d, 2, dtype=np.float64) / d)
        worst = max(worst, float(np.max(np.abs(got / ref - 1))) / 1e-6)
    return worst


def check_alibi_slopes() -> float:
    """tables.alibi_slopes against Press et al. (2022): 2^(-8i/n) for n a power of two; else the
    closest power of two's slopes, then every other slope of twice that many."""
    from jaxformer import tables

    def paper(n: int) -> np.ndarray:
        def pow2(m):
            return np.array([2.0 ** (-8.0 * (i + 1) / m) for i in range(m)])
        if math.log2(n).is_integer():
            return pow2(n)
        m = 2 ** math.floor(math.log2(n))
        return np.concatenate([pow2(m), pow2(2 * m)[0::2][: n - m]])
    return max(_ratio(tables.alibi_slopes(n), paper(n), 1e-7) for n in (8, 12, 6))


def check_t5_buckets() -> float:
    """tables.t5_bucket_table against the bucket rule of T5's reference code (Raffel et al.
    2020), written here in float64: exact below max_exact, log-spaced above, saturating."""
    from jaxformer import tables
    worst = 0.0
    for bidirectional in (True, False):
        nb, md = 32, 128
        got = tables.t5_bucket_table(bidirectional, nb, md)
        ref = []
        for rel in range(-md, md + 1):
            n, ret = nb, 0
            if bidirectional:
                n //= 2
                ret += n if rel > 0 else 0
                r = abs(rel)
            else:
                r = max(-rel, 0)
            exact = n // 2
            if r < exact:
                ret += r
            else:
                ret += min(n - 1, exact + int(math.log(r / exact) / math.log(md / exact) * (n - exact)))
            ref.append(ret)
        worst = max(worst, float(np.sum(got != np.array(ref))) * 1e9)  # any bucket off: caught
    return worst


def check_sinusoid() -> float:
    """tables.sinusoid_table against PE(p, 2i) = sin(p / 10000^(2i/d)), PE(p, 2i+1) = cos (float64)."""
    from jaxformer import tables
    p = np.arange(16, dtype=np.float64)[:, None]
    i = np.arange(0, 8, 2, dtype=np.float64)[None, :]
    ref = np.zeros((16, 8))
    ref[:, 0::2], ref[:, 1::2] = np.sin(p / 10000 ** (i / 8)), np.cos(p / 10000 ** (i / 8))
    return _ratio(tables.sinusoid_table(16, 8), ref, 1e-6)


def check_schedule() -> float:
    """optim.lr_multiplier (warmup_cosine) at every step against its definition in float64:
    k / w in warmup (0 at step 0, 1 at step w), then cosine to min_lr_ratio at the last step."""
    from jaxformer.train.config import TrainConfig
    from jaxformer.train.optim import lr_multiplier
    cfg = dataclasses.replace(TrainConfig(), schedule="warmup_cosine", warmup_steps=4, steps=12, min_lr_ratio=0.1)
    ref = [k / 4 if k < 4 else 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (k - 4) / 8)) for k in range(13)]
    return _ratio([float(lr_multiplier(k, cfg)) for k in range(13)], ref, 1e-6)


def check_clipping() -> float:
    """optim.clip_by_global_norm_torch against torch.nn.utils.clip_grad_norm_, at a norm (1e-4)
    where torch's +1e-6 moves the coefficient by 1%."""
    import jax.numpy as jnp
    import torch

    from jaxformer.train.optim import clip_by_global_norm_torch
    rs = np.random.RandomState(0)
    g = [rs.standard_normal(s).astype(np.float32) for s in ((3, 4), (5,))]
    scale = 1e-4 / math.sqrt(sum(float((x.astype(np.float64) ** 2).sum()) for x in g))
    g = [(x * scale).astype(np.float32) for x in g]
    ours, _ = clip_by_global_norm_torch(5e-5).update([jnp.asarray(x) for x in g], None)
    params = [torch.nn.Parameter(torch.zeros(x.shape)) for x in g]
    for p, x in zip(params, g, strict=True):
        p.grad = torch.from_numpy(x.copy())
    torch.nn.utils.clip_grad_norm_(params, 5e-5)
    return max(_ratio(np.asarray(o) / 5e-5, p.grad.numpy() / 5e-5, 1e-5) for o, p in zip(ours, params, strict=True))


def _tie_patterns() -> np.ndarray:
    """float32 values whose low 16 bits are ties and near-ties, with even and odd kept bits."""
    hi = np.array([0x3F80, 0x3F81, 0xBF80, 0xBF81, 0x4049], np.uint32) << 16
    lo = np.array([0x8000, 0x7FFF, 0x8001, 0xFFFF], np.uint32)
    return (hi[:, None] | lo[None, :]).reshape(-1).view(np.float32)


def check_bf16() -> float:
    """quant.to_bf16 bit for bit against ml_dtypes' round-to-nearest-even cast."""
    import jax.numpy as jnp
    import ml_dtypes

    from jaxformer.layers.kernels import quant
    w = _tie_patterns().reshape(4, 5)
    got = np.asarray(quant.to_bf16(jnp.asarray(w)).data)
    ref = w.astype(ml_dtypes.bfloat16).view(np.uint16)
    return float(np.sum(got != ref)) * 1e9


def check_int8() -> float:
    """quant.quantize_int8 against its definition: scale = max|row| / 127, q = round half to
    even (numpy's rint) of w / scale, on rows with exact ties."""
    import jax.numpy as jnp

    from jaxformer.layers.kernels import quant
    w = np.array([[127.0, 2.5, -3.5, 0.5, -0.5], [63.5, 1.5, -1.5, 12.5, -12.5]], np.float32)
    qw = quant.quantize_int8(jnp.asarray(w))
    scale = np.abs(w).max(-1) / np.float32(127)
    ref = np.rint(w / scale[:, None])
    return float(np.sum(np.asarray(qw.data) != ref)) * 1e9


def check_mask_fill() -> float:
    """layers.dispatch.dot_product_attention against float64 softmax attention that excludes the
    masked keys exactly, with real scores near -3e4 (where a fill of -1e4 lets masked keys in)."""
    import jax.numpy as jnp

    from jaxformer.layers import dispatch
    s, rs = 24, np.random.RandomState(2)
    q = np.zeros((1, 1, 1, 4), np.float32)
    q[..., 0] = 200.0
    k = np.zeros((1, s, 1, 4), np.float32)
    k[0, :, 0, 0] = -300.0 + rs.randint(-64, 64, size=s) / 64.0
    visible = np.arange(s) % 3 == 0
    k[0, ~visible, 0, 0] = 300.0
    v = rs.standard_normal((1, s, 1, 4)).astype(np.float32)
    v[0, ~visible] += 100.0
    scores = np.where(visible, (q[0, 0, 0].astype(np.float64) @ k[0, :, 0].astype(np.float64).T) * 0.5, -np.inf)
    w = np.exp(scores - scores.max())
    ref = (w / w.sum()) @ v[0, :, 0].astype(np.float64)
    out, _ = dispatch.dot_product_attention(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v),
                                            mask=jnp.asarray(visible[None, None, None, :]), return_weights=True)
    return _ratio(np.asarray(out)[0, 0, 0], ref, 1e-4)


def check_byte_tokenizer() -> float:
    """The byte tokenizer against Python's utf-8: id = byte + 3 (0-2 the specials), and back."""
    from jaxformer.train.data import tokenizer
    text = "héllo, wörld ✓"
    ref = [b + 3 for b in text.encode("utf-8")]
    got = tokenizer.encode(text).tolist()
    return 0.0 if got == ref and tokenizer.decode(got) == text else 1e9


def check_top_p() -> float:
    """generation.filter_logits' nucleus against Holtzman et al. (2020) in float64: the smallest
    set of most likely tokens whose probability reaches top_p."""
    import jax.numpy as jnp

    from jaxformer.generation import filter_logits
    rs = np.random.RandomState(4)
    logits = rs.standard_normal((8, 30)).astype(np.float32) * 2
    bad = 0
    for top_p in (0.3, 0.6, 0.9):
        got = np.isfinite(np.asarray(filter_logits(jnp.asarray(logits), top_p=top_p)))
        for row, kept in zip(logits.astype(np.float64), got, strict=True):
            order = np.argsort(-row)
            p = np.exp(row[order] - row.max())
            p /= p.sum()
            n = int(np.searchsorted(np.cumsum(p), top_p) + 1)
            ref = np.zeros_like(kept)
            ref[order[:n]] = True
            bad += int(np.sum(ref != kept))
    return bad * 1e9


# ----------------------------------------------------------------------------- planted bugs
def _late_warmup():
    from jaxformer.train import optim
    original = optim.lr_multiplier

    def late(step, cfg, xp=np):  # the warmup starts one step late
        return original(xp.maximum(xp.asarray(step, dtype=xp.float32) - 1.0, 0.0), cfg, xp)
    return patched(optim, "lr_multiplier", late)


def _clip_without_eps():
    import jax
    import jax.numpy as jnp
    import optax

    from jaxformer.train import optim

    def clip(max_norm: float):
        def update(updates, state, params=None):
            coef = jnp.minimum(1.0, max_norm / optax.tree.norm(updates))
            return jax.tree.map(lambda g: g * coef.astype(g.dtype), updates), state
        return optax.GradientTransformation(lambda params: optax.EmptyState(), update)
    return patched(optim, "clip_by_global_norm_torch", clip)


def _bf16_truncated():
    import jax
    import jax.numpy as jnp

    from jaxformer.layers.kernels import quant

    def truncate(w):
        bits = jax.lax.bitcast_convert_type(w.astype(jnp.float32), jnp.uint32)
        return quant.QuantizedWeight((bits >> 16).astype(jnp.uint16))
    return patched(quant, "to_bf16", truncate)


def _int8_half_away():
    import jax.numpy as jnp

    from jaxformer.layers.kernels import quant

    def quantize(w):
        w = w.astype(jnp.float32)
        amax = jnp.max(jnp.abs(w), axis=-1)
        scale = jnp.where(amax > 0, amax / quant.INT8_MAX, 1.0)
        x = w / scale[..., None]
        q = jnp.sign(x) * jnp.floor(jnp.abs(x) + 0.5)  # ties away from zero
        return quant.QuantizedWeight(jnp.clip(q, -quant.INT8_MAX, quant.INT8_MAX).astype(jnp.int8), scale)
    return patched(quant, "quantize_int8", quantize)


class _FillProxy:
    """jax.numpy with finfo(...).min replaced by -1e4: a fill that is merely very negative."""

    def __init__(self, jnp):
        self._jnp = jnp

    def __getattr__(self, name):
        return getattr(self._jnp, name)

    def finfo(self, dtype):
        return type("finfo", (), {"min": -1e4, "max": self._jnp.finfo(dtype).max})()


def _fill_minus_1e4():
    import jax.numpy as jnp

    from jaxformer.layers import dispatch
    return patched(dispatch, "jnp", _FillProxy(jnp))


def _head_dim_plus_one():
    from jaxformer.config import TransformerConfig
    original = TransformerConfig.resolved_head_dim
    return patched(TransformerConfig, "resolved_head_dim", property(lambda c: original.fget(c) + 1))


def _rope_exponent_shifted():
    from jaxformer import tables
    original = tables.rope_inv_freq

    def shifted(head_dim, base, scaling=None, long=False):  # base^(-(2i+2)/d)
        inv, factor = original(head_dim, base, scaling, long)
        return inv / base ** (2.0 / head_dim), factor
    return patched(tables, "rope_inv_freq", shifted)


def _alibi_not_interleaved():
    from jaxformer import tables

    def slopes(n):  # every head by 2^(-8i/n), also for n not a power of two
        return np.array([2.0 ** (-8.0 * (i + 1) / n) for i in range(n)], np.float32)
    return patched(tables, "alibi_slopes", slopes)


def _t5_sign_flipped():
    from jaxformer import tables
    original = tables.t5_bucket_table

    def flipped(bidirectional, num_buckets, max_distance):
        return original(bidirectional, num_buckets, max_distance)[::-1].copy()
    return patched(tables, "t5_bucket_table", flipped)


def _sinusoid_cos_first():
    from jaxformer import tables
    original = tables.sinusoid_table

    def swapped(max_len, d_model):
        t = np.array(original(max_len, d_model))
        t[:, 0::2], t[:, 1::2] = t[:, 1::2].copy(), t[:, 0::2].copy()
        return t
    return patched(tables, "sinusoid_table", swapped)


def _bytes_offset_two():
    from jaxformer.train.data import tokenizer
    return patched(tokenizer, "OFFSET", 2)


def _top_p_keeps_one_more():
    import jax.numpy as jnp

    from jaxformer import generation

    def filter_logits(logits, *, temperature=1.0, top_k=0, top_p=1.0):
        x = logits.astype(jnp.float32) / temperature
        sorted_x = jnp.flip(jnp.sort(x, axis=-1), axis=-1)
        probs = jnp.exp(sorted_x - sorted_x[:, :1])
        probs = probs / probs.sum(-1, keepdims=True)
        before = jnp.cumsum(probs, axis=-1) - probs
        n_keep = jnp.minimum(jnp.sum(before < top_p, axis=-1, keepdims=True) + 1, x.shape[-1])  # one more
        return jnp.where(x < jnp.take_along_axis(sorted_x, n_keep - 1, axis=-1), -jnp.inf, x)
    return patched(generation, "filter_logits", filter_logits)


def _shared(name: str, description: str, patch, check) -> Mutation:
    return Mutation(name=name, description=description, patch=patch, reference=check)


SHARED_MUTATIONS: dict[str, Mutation] = {m.name: m for m in [
    _shared("shared_head_dim_default", "config: the default head width d_model / heads + 1", _head_dim_plus_one,
            check_head_dim),
    _shared("shared_rope_exponent", "tables: RoPE frequencies base^(-(2i+2)/d)", _rope_exponent_shifted,
            check_rope_frequencies),
    _shared("shared_alibi_not_interleaved", "tables: ALiBi slopes 2^(-8i/n) for n not a power of two",
            _alibi_not_interleaved, check_alibi_slopes),
    _shared("shared_t5_buckets_flipped", "tables: T5 buckets read for -rel", _t5_sign_flipped, check_t5_buckets),
    _shared("shared_sinusoid_cos_first", "tables: sinusoid columns cos, sin", _sinusoid_cos_first, check_sinusoid),
    _shared("shared_warmup_late", "schedule: the warmup starts one step late", _late_warmup, check_schedule),
    _shared("shared_clip_no_eps", "clipping without torch's +1e-6", _clip_without_eps, check_clipping),
    _shared("shared_bf16_truncated", "quantizer: bf16 by truncation", _bf16_truncated, check_bf16),
    _shared("shared_int8_half_away", "quantizer: int8 ties away from zero", _int8_half_away, check_int8),
    _shared("shared_mask_fill_1e4", "attention: masked scores filled with -1e4", _fill_minus_1e4, check_mask_fill),
    _shared("shared_bytes_offset", "tokenizer: byte ids offset by 2", _bytes_offset_two, check_byte_tokenizer),
    _shared("shared_top_p_one_more", "generation: the nucleus keeps one token more", _top_p_keeps_one_more,
            check_top_p),
]}


def run_shared_mutation(m: Mutation) -> Outcome:
    """The check unpatched must pass (ratio <= 1), and fail with the bug planted."""
    clean = m.reference()
    if clean > 1:
        return Outcome(m.name, False, clean, {"reference": f"fails without the bug ({clean:.3g} x tolerance)"})
    with contextlib.ExitStack() as stack:
        stack.enter_context(m.patch())
        try:
            ratio = m.reference()
        except Exception as e:  # a bug that makes the check raise is caught too
            return Outcome(m.name, True, math.inf, {"reference": f"raised {type(e).__name__}: {e}"})
    return Outcome(m.name, ratio > 1, ratio, {"reference": f"{ratio:.3g} x tolerance"})
