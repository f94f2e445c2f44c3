"""Blockwise attention: FlashAttention-2's online softmax over key blocks in lax ops, with a
recomputing backward pass, O(T) memory on every backend (docs/numerics.md §29).
Twin: torch_ref/layers/kernels/blockwise.py.

Hand-written because no library op does this in lax with our mask parts, sinks and soft-cap:
jax.nn.dot_product_attention's XLA form builds the [B, H, T, S] scores, cuDNN runs on NVIDIA GPUs
only, and Pallas' splash kernel on TPUs only ("splash" below names it there).

The function (dot_product_attention's): softmax(q k^T * scale [soft-capped] + bias [+ ALiBi],
masked by an AttentionMask) v; a query row with no visible key outputs 0; attention sinks join
every row's denominator.

  1) plan: per-block min/max of the slots and segments (of the real queries and keys) say which
     [bq, bk] blocks may hold a visible pair; each query block visits only those key blocks,
     in a while loop of its own length (causal ~ half the blocks, a window ~ window / T).
  2) forward, per query block: a running max m, a running sum l and the unnormalised output over
     its key blocks; when a block raises m, the sums so far are rescaled by exp(m_old - m_new)
     (the online softmax). A sink starts the row as (m, l) = (sink, 1). Stored for the
     backward: only the inputs (q, k, v, bias, sinks, the O(T) mask parts), the output and the
     log-sum-exp lse = m + log l.
  3) backward, per query block again: each block's probabilities recomputed as exp(s - lse);
     D = rowsum(dO * O); dS = P * (dP - D) (FA-2); dq carried, dk / dv accumulated in place.
Grouped-query attention: q is viewed as [B, T, G, R, K] (R = H / G), k/v are never repeated.
Odd lengths: q / k are padded to block multiples; padded keys are masked, padded queries see
nothing, and the output is sliced back.
"""
from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from jaxformer import lowering
from jaxformer.layers.masks import AttentionMask
from jaxformer.layers.scores import slot_distance, soft_cap


@dataclasses.dataclass(frozen=True)
class _Static:
    """The trace-time constants of one call (hashable: custom_vjp's nondiff argument)."""

    bq: int
    bk: int
    scale: float
    softcap: float | None
    causal: bool


def blockwise_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask, *, bias=None, scale=None,
                        softcap=None, sinks=None, block_q: int | None = None,
                        block_k: int | None = None) -> jax.Array:
    """softmax(q k^T * scale [softcapped] + bias [+ alibi], masked by `mask`) v, with
    dot_product_attention's semantics (a row with no visible key outputs 0; sinks join every
    denominator). q [B, T, H, K], k [B, S, G, K], v [B, S, G, Kv]; mask an AttentionMask (or
    None = all visible); bias None or broadcastable to [B, H, T, S]; scale None = 1/sqrt(K).
    block_q / block_k: None = lowering.active().attention_blocks. -> [B, T, H, Kv]."""
    b, t, h, d = q.shape
    s, g = k.shape[1], k.shape[2]
    if h % g:
        raise ValueError(f"query heads {h} are not a multiple of key/value heads {g}")
    if sinks is not None and sinks.shape != (h,):
        raise ValueError(f"sinks must be [H] = ({h},), one logit per query head, got {sinks.shape}")
    if mask is None:  # numpy slots: a static pattern splash can take
        mask = AttentionMask(np.arange(t, dtype=np.int32)[None], np.arange(s, dtype=np.int32)[None])
    if lowering.active().attention == "splash" and lowering.platform() == "tpu":
        out = _splash(q, k, v, mask, bias=bias, scale=scale, softcap=softcap, sinks=sinks)
        if out is not None:
            return out
    else:
        lowering.note_kernel("blockwise")
    st, args = _prepare(q, k, v, mask, bias=bias, scale=scale, softcap=softcap, sinks=sinks,
                        block_q=block_q, block_k=block_k)
    out = _attend(st, *args)  # [B, Tp, G, R, Kv]
    return out[:, :q.shape[1]].reshape(q.shape[:3] + (v.shape[-1],))


def block_visits(q, k, v, mask, *, bias=None, scale=None, softcap=None, sinks=None, block_q: int | None = None,
                 block_k: int | None = None) -> dict[str, int]:
    """A debug hook: how many [bq, bk] blocks the forward and the backward pass computed (the
    bodies their loops ran) for these inputs, and how many there are. Same arguments as
    blockwise_attention."""
    @jax.jit
    def run(q, k, v, mask, bias, sinks):
        st, args = _prepare(q, k, v, mask, bias=bias, scale=scale, softcap=softcap, sinks=sinks,
                            block_q=block_q, block_k=block_k)
        out, lse, forward = _forward(st, *args)
        _, backward = _backward(st, args, out, lse, jnp.ones_like(out))
        return forward, backward, args[-1]["order"].size
    forward, backward, blocks = run(q, k, v, mask, bias, sinks)
    return {"forward": int(forward), "backward": int(backward), "blocks": int(blocks)}


def _prepare(q, k, v, mask, *, bias, scale, softcap, sinks, block_q, block_k):
    """-> (_Static, (q [B, Tp, G, R, K], k / v [B, Sp, G, K], bias [B|1, G|1, R|1, Tp|1, Sp|1],
    sinks [G, R], ALiBi slopes [G, R], the padded mask parts and the plan))."""
    b, t, h, d = q.shape
    s, g = k.shape[1], k.shape[2]
    blocks = lowering.active().attention_blocks
    bq = min(t, blocks[0] if block_q is None else block_q)
    bk = min(s, blocks[1] if block_k is None else block_k)
    st = _Static(bq, bk, 1.0 / math.sqrt(d) if scale is None else float(scale),
                 None if softcap is None else float(softcap), mask.causal)
    tp, sp = -(-t // bq) * bq, -(-s // bk) * bk  # padded to block multiples
    r = h // g

    # the mask parts, padded: padded keys invalid, padded queries see nothing
    def pad_to(a, n, value):
        return a if a.shape[1] == n else jnp.pad(a, ((0, 0), (0, n - a.shape[1])), constant_values=value)
    k_valid = jnp.ones((1, s), bool) if mask.k_valid is None else mask.k_valid.astype(bool)
    parts = dict(q_slots=pad_to(mask.q_slots.astype(jnp.int32), tp, 0),
                 k_slots=pad_to(mask.k_slots.astype(jnp.int32), sp, 0),
                 k_valid=pad_to(k_valid, sp, False),
                 q_valid=pad_to(jnp.ones((1, t), bool), tp, False),
                 q_segments=None if mask.q_segments is None else pad_to(mask.q_segments.astype(jnp.int32), tp, 0),
                 k_segments=None if mask.k_segments is None else pad_to(mask.k_segments.astype(jnp.int32), sp, 0),
                 window=None if mask.window is None else jnp.asarray(mask.window, jnp.int32))
    parts["order"], parts["count"] = plan(st, parts)

    q5 = _pad_axis(q.reshape(b, t, g, r, d), 1, tp)  # [B, Tp, G, R, K]
    kp, vp = _pad_axis(k, 1, sp), _pad_axis(v, 1, sp)  # [B, Sp, G, K]
    bias5 = None
    if bias is not None:
        bias = bias.reshape((1,) * (4 - bias.ndim) + bias.shape)  # [B|1, H|1, T|1, S|1]
        hb = bias.shape[1]
        bias5 = bias.reshape(bias.shape[0], g if hb == h else 1, r if hb == h else 1, *bias.shape[2:])
        bias5 = _pad_axis(_pad_axis(bias5, 3, tp), 4, sp)  # [B|1, G|1, R|1, Tp|1, Sp|1]
    sinks5 = None if sinks is None else sinks.reshape(g, r)
    slopes = None if mask.alibi_slopes is None else mask.alibi_slopes.reshape(g, r)
    return st, (q5, kp, vp, bias5, sinks5, slopes, parts)


def _pad_axis(a: jax.Array, axis: int, n: int) -> jax.Array:
    """Zero-pad `axis` of a to length n (left alone when it is 1: it broadcasts)."""
    if a.shape[axis] in (1, n):
        return a
    widths = [(0, 0)] * a.ndim
    widths[axis] = (0, n - a.shape[axis])
    return jnp.pad(a, widths)


# ----------------------------------------------------------------------------- 1) the plan
def plan(st: _Static, parts: dict) -> tuple[jax.Array, jax.Array]:
    """Which key blocks each query block visits: -> order [nq, nk] int32 (the visited key
    blocks first, ascending), count [nq] int32 (how many). A block is visited unless the
    per-block min/max of the slots and segments (over the batch, of real queries and keys)
    prove it fully masked; run time, so left padding, offsets and traced windows are planned
    exactly as they come."""
    big = jnp.iinfo(jnp.int32).max // 4  # sentinels with room for one subtraction
    q_valid, k_valid = parts["q_valid"], parts["k_valid"]
    if parts["q_segments"] is not None:  # segment 0 is padding: such queries see nothing
        q_valid = q_valid & (parts["q_segments"] != 0)
        k_valid = k_valid & (parts["k_segments"] != 0)

    def ranges(x, valid, n, blk):  # [B|1, n*blk] -> per block (min, max, any) over batch and block
        x, valid = jnp.broadcast_arrays(x, valid)
        x, valid = x.reshape(x.shape[0], n // blk, blk), valid.reshape(x.shape[0], n // blk, blk)
        lo = jnp.min(jnp.where(valid, x, big), axis=(0, 2))
        hi = jnp.max(jnp.where(valid, x, -big), axis=(0, 2))
        return lo, hi, jnp.any(valid, axis=(0, 2))

    tp, sp = parts["q_slots"].shape[1], parts["k_slots"].shape[1]
    qlo, qhi, qany = ranges(parts["q_slots"], q_valid, tp, st.bq)
    klo, khi, kany = ranges(parts["k_slots"], k_valid, sp, st.bk)
    qlo, qhi, qany = (a[:, None] for a in (qlo, qhi, qany))  # [nq, 1]
    klo, khi, kany = (a[None, :] for a in (klo, khi, kany))  # [1, nk]
    need = qany & kany  # [nq, nk]
    if st.causal:  # some key slot <= some query slot
        need &= klo <= qhi
    window = parts["window"]
    if window is not None:  # some distance inside (-window, window), or [0, window) causal
        need &= qlo - khi < window
        if not st.causal:
            need &= qhi - klo > -window
    if parts["q_segments"] is not None:  # the segment ranges overlap
        slo, shi, _ = ranges(parts["q_segments"], q_valid, tp, st.bq)
        tlo, thi, _ = ranges(parts["k_segments"], k_valid, sp, st.bk)
        need &= (slo[:, None] <= thi[None, :]) & (tlo[None, :] <= shi[:, None])  # [nq, nk]
    order = jnp.argsort((~need).astype(jnp.int8), axis=1, stable=True).astype(jnp.int32)
    return order, jnp.sum(need, axis=1, dtype=jnp.int32)


# ----------------------------------------------------------------------------- one block
def _slice(a, start, size, axis):
    return a if a is None or a.shape[axis] == 1 else jax.lax.dynamic_slice_in_dim(a, start, size, axis)


def _block_mask(st: _Static, parts: dict, i, j) -> jax.Array:
    """The visible pairs of block (i, j) -> [B|1, 1, 1, bq, bk] bool (AttentionMask's rule)."""
    q0, k0 = i * st.bq, j * st.bk
    m = AttentionMask(parts["q_slots"], parts["k_slots"], window=parts["window"], causal=st.causal)
    seg = parts["q_segments"] is not None
    vis = m.visible(_slice(parts["q_slots"], q0, st.bq, 1), _slice(parts["k_slots"], k0, st.bk, 1),
                    _slice(parts["k_valid"], k0, st.bk, 1),
                    _slice(parts["q_segments"], q0, st.bq, 1) if seg else None,
                    _slice(parts["k_segments"], k0, st.bk, 1) if seg else None)  # [B|1, 1, bq, bk]
    vis = vis & _slice(parts["q_valid"], q0, st.bq, 1)[:, None, :, None]
    return vis[:, :, None]


def _block_scores(st: _Static, qi, kj, bias, slopes, parts, i, j):
    """Scores of block (i, j): qi [B, bq, G, R, K], kj [B, bk, G, K] -> (s [B, G, R, bq, bk]
    float32 after soft-cap, bias and ALiBi; tanh of the soft-cap or None; the slot distances
    [B|1, 1, 1, bq, bk] float32 for ALiBi or None)."""
    s = jnp.einsum("bqgrk,bsgk->bgrqs", qi, kj, preferred_element_type=jnp.float32) * st.scale
    s, tanh = soft_cap(s, st.softcap)  # before bias and mask
    if bias is not None:
        blk = _slice(_slice(bias, i * st.bq, st.bq, 3), j * st.bk, st.bk, 4)
        s = s + blk.astype(jnp.float32)
    dist = None
    if slopes is not None:  # ALiBi: -slope_h * |q_slot - k_slot|, this block only
        qs = _slice(parts["q_slots"], i * st.bq, st.bq, 1)
        ks = _slice(parts["k_slots"], j * st.bk, st.bk, 1)
        dist = slot_distance(qs, ks)[:, None, None]
        s = s - slopes.astype(jnp.float32)[None, :, :, None, None] * dist
    return s, tanh, dist


# ----------------------------------------------------------------------------- 2) forward
def _forward(st: _Static, q, k, v, bias, sinks, slopes, parts):
    """-> (out [B, Tp, G, R, Kv] float32, lse [B, G, R, Tp] float32, -inf on a row without
    visible keys, visited blocks). Ring attention (jaxformer/layers/kernels/ring.py) merges these per
    key block."""
    b, tp, g, r, _ = q.shape
    nq = tp // st.bq
    kv_width = v.shape[-1]

    def q_block(i, carry):
        out_all, lse_all, visits_all = carry
        qi = jax.lax.dynamic_slice_in_dim(q, i * st.bq, st.bq, 1)  # [B, bq, G, R, K]
        if sinks is None:
            m0 = jnp.full((b, g, r, st.bq), -jnp.inf, jnp.float32)
            l0 = jnp.zeros((b, g, r, st.bq), jnp.float32)
        else:  # the sink is the row's first column: exp(sink - m) with m = sink, and no value
            m0 = jnp.broadcast_to(sinks.astype(jnp.float32)[None, :, :, None], (b, g, r, st.bq))
            l0 = jnp.ones((b, g, r, st.bq), jnp.float32)
        acc0 = jnp.zeros((b, g, r, st.bq, kv_width), jnp.float32)
        m0, l0, acc0 = _varying((qi, k, v, bias, slopes, parts), m0, l0, acc0)

        def body(carry):
            n, m, l, acc = carry
            j = parts["order"][i, n]
            kj = jax.lax.dynamic_slice_in_dim(k, j * st.bk, st.bk, 1)  # [B, bk, G, K]
            vj = jax.lax.dynamic_slice_in_dim(v, j * st.bk, st.bk, 1)
            s, _, _ = _block_scores(st, qi, kj, bias, slopes, parts, i, j)
            s = jnp.where(_block_mask(st, parts, i, j), s, -jnp.inf)
            m_new = jnp.maximum(m, jnp.max(s, axis=-1))
            m_safe = jnp.where(m_new == -jnp.inf, 0.0, m_new)  # a row with nothing visible yet
            p = jnp.exp(s - m_safe[..., None])  # [B, G, R, bq, bk]
            alpha = _rescale(m, m_safe)  # the old terms, brought to the new maximum
            l = alpha * l + jnp.sum(p, axis=-1)
            pv = jnp.einsum("bgrqs,bsgk->bgrqk", p.astype(v.dtype), vj, preferred_element_type=jnp.float32)
            return n + 1, m_new, l, alpha[..., None] * acc + pv

        visits, m, l, acc = jax.lax.while_loop(lambda c: c[0] < parts["count"][i], body,
                                               (jnp.int32(0), m0, l0, acc0))
        out = acc / jnp.where(l == 0, 1.0, l)[..., None]  # l = 0: no visible key (and no sink) -> 0
        lse = jnp.where(l == 0, -jnp.inf, m + jnp.log(jnp.where(l == 0, 1.0, l)))
        out_all = jax.lax.dynamic_update_slice_in_dim(out_all, jnp.moveaxis(out, 3, 1), i * st.bq, 1)
        lse_all = jax.lax.dynamic_update_slice_in_dim(lse_all, lse, i * st.bq, 3)
        return out_all, lse_all, visits_all + visits

    # the output buffers are filled block by block; their zeros come from q (_zeros_from, §38)
    init = _varying((q, k, v, bias, slopes, parts), _zeros_from(q, (b, tp, g, r, kv_width)),
                    _zeros_from(q, (b, g, r, tp)), jnp.int32(0))
    out, lse, visits = jax.lax.fori_loop(0, nq, q_block, init)  # [B, Tp, G, R, Kv], [B, G, R, Tp]
    return out, lse, visits  # visits: the loop bodies run (blocks computed)


def _zeros_from(x, shape):
    """float32 zeros of `shape` computed from the array x (0 * |x's first element|, a non-finite
    one taken as 0), not a constant. XLA:CPU shares one constant zero buffer between all loops
    that fill a buffer of that shape (each layer's forward output, each layer's backward
    accumulators), builds it and the copies the loops update in place at the start of the
    program, and holds them through the forward pass: 4 [T, H, K] arrays per layer at the
    step's peak. Computed from x, each is built where x is (docs/numerics.md §38)."""
    x0 = jnp.ravel(x)[0].astype(jnp.float32)
    return jnp.broadcast_to(jnp.abs(jnp.where(jnp.isfinite(x0), x0, 0.0)) * 0.0, shape)


def _varying(inputs, *carries):
    """The loop carries cast to vary over every manual mesh axis the inputs vary over: inside
    shard_map (ring attention's steps, jaxformer/layers/kernels/ring.py) a carry built from constants
    varies over none, its updated value over the inputs' axes, and a loop's carry must keep its
    type (jax's "vma" check). The identity outside shard_map."""
    def axes(a):
        t = jax.typeof(a)
        mat = getattr(t, "manual_axis_type", None)
        return frozenset(mat.varying) if mat is not None else frozenset(getattr(t, "vma", ()))
    want = frozenset().union(*(axes(a) for a in jax.tree.leaves(inputs)))
    cast = lambda c: c if c is None or not want - axes(c) else jax.lax.pcast(
        c, tuple(sorted(want - axes(c))), to="varying")
    return tuple(cast(c) for c in carries)


def _rescale(m_old, m_new):
    """exp(m_old - m_new): the factor of the terms summed under the old running maximum."""
    return jnp.exp(m_old - m_new)


# ----------------------------------------------------------------------------- 3) backward
def _lse_for_backward(lse):
    """The log-sum-exp the backward recomputes each block's probabilities with."""
    return lse


def _backward(st: _Static, args: tuple, out, lse, d_out, d_lse=None, slopes_grad: bool = True):
    """FA-2's backward over the same plan -> ((dq, dk, dv, dbias, dsinks, dslopes), blocks computed).
    args: the forward's (q, k, v, bias, sinks, slopes, parts), as _prepare gives them.
    d_lse [B, G, R, Tp]: a cotangent of the lse too (None = 0). slopes_grad=False: dslopes is
    not computed (None), for a caller whose ALiBi slopes are constants. Ring attention passes its merged
    out and lse, and the cotangents of both, for each key block: p = exp(s - lse) is then the
    block's share of the whole softmax, so each block's gradients come without its own lse."""
    q, k, v, bias, sinks, slopes, parts = args
    b, tp, g, r, dk_width = q.shape
    nq = tp // st.bq
    lse = _lse_for_backward(lse)
    # D = rowsum(dO * O), the sum over keys of P * dP in each row; d lse / d s = P, so a
    # cotangent of the lse enters as dS = P * (dP - (D - d_lse))
    delta = jnp.einsum("btgrk,btgrk->bgrt", d_out.astype(jnp.float32), out.astype(jnp.float32))
    if d_lse is not None:
        delta = delta - d_lse.astype(jnp.float32)
    # the accumulators' zeros come from delta, so XLA builds them in the backward pass (§38)
    f32 = lambda a: None if a is None else _zeros_from(delta, a.shape)

    def q_block(carry, i):
        dq_all, dk, dv, dbias, dslopes, dsinks = carry
        qi = jax.lax.dynamic_slice_in_dim(q, i * st.bq, st.bq, 1)  # [B, bq, G, R, K]
        doi = jax.lax.dynamic_slice_in_dim(d_out, i * st.bq, st.bq, 1)  # [B, bq, G, R, Kv]
        lse_i = jax.lax.dynamic_slice_in_dim(lse, i * st.bq, st.bq, 3)  # [B, G, R, bq]
        delta_i = jax.lax.dynamic_slice_in_dim(delta, i * st.bq, st.bq, 3)

        def body(c):
            n, dq, dk, dv, dbias, dslopes = c
            j = parts["order"][i, n]
            k0 = j * st.bk
            kj = jax.lax.dynamic_slice_in_dim(k, k0, st.bk, 1)  # [B, bk, G, K]
            vj = jax.lax.dynamic_slice_in_dim(v, k0, st.bk, 1)
            s, tanh, dist = _block_scores(st, qi, kj, bias, slopes, parts, i, j)
            p = jnp.where(_block_mask(st, parts, i, j), jnp.exp(s - lse_i[..., None]), 0.0)  # [B, G, R, bq, bk]
            dp = jnp.einsum("bqgrk,bsgk->bgrqs", doi, vj, preferred_element_type=jnp.float32)
            ds = p * (dp - delta_i[..., None])  # d loss / d s (after soft-cap, bias, ALiBi)
            if dbias is not None:  # summed over the axes the bias broadcasts over
                axes = tuple(a for a in range(5) if dbias.shape[a] == 1 and ds.shape[a] != 1)
                red = jnp.sum(ds, axis=axes, keepdims=True)
                if dbias.shape[3] != 1 or dbias.shape[4] != 1:
                    starts = (0, 0, 0, i * st.bq if dbias.shape[3] != 1 else 0, k0 if dbias.shape[4] != 1 else 0)
                    old = jax.lax.dynamic_slice(dbias, starts, red.shape)
                    dbias = jax.lax.dynamic_update_slice(dbias, old + red, starts)
                else:
                    dbias = dbias + red
            if dslopes is not None:
                dslopes = dslopes - jnp.sum(ds * dist, axis=(0, 3, 4))
            if tanh is not None:  # d(c tanh(x / c)) / dx = 1 - tanh^2
                ds = ds * (1.0 - tanh * tanh)
            ds = ds * st.scale
            dq = dq + jnp.einsum("bgrqs,bsgk->bqgrk", ds.astype(k.dtype), kj, preferred_element_type=jnp.float32)
            dk_j = jnp.einsum("bgrqs,bqgrk->bsgk", ds.astype(q.dtype), qi, preferred_element_type=jnp.float32)
            dv_j = jnp.einsum("bgrqs,bqgrk->bsgk", p.astype(doi.dtype), doi, preferred_element_type=jnp.float32)
            dk = jax.lax.dynamic_update_slice_in_dim(dk, jax.lax.dynamic_slice_in_dim(dk, k0, st.bk, 1) + dk_j, k0, 1)
            dv = jax.lax.dynamic_update_slice_in_dim(dv, jax.lax.dynamic_slice_in_dim(dv, k0, st.bk, 1) + dv_j, k0, 1)
            return n + 1, dq, dk, dv, dbias, dslopes

        dq0, = _varying((qi, k, v, bias, slopes, parts, doi, lse_i),
                        jnp.zeros((b, st.bq, g, r, dk_width), jnp.float32))
        visits, dq, dk, dv, dbias, dslopes = jax.lax.while_loop(
            lambda c: c[0] < parts["count"][i], body, (jnp.int32(0), dq0, dk, dv, dbias, dslopes))
        if dsinks is not None:  # d / d sink = -sum over rows of p_sink * D
            p_sink = jnp.exp(sinks.astype(jnp.float32)[None, :, :, None] - lse_i)
            dsinks = dsinks - jnp.sum(p_sink * delta_i, axis=(0, 3))
        dq_all = jax.lax.dynamic_update_slice_in_dim(dq_all, dq, i * st.bq, 1)
        return (dq_all, dk, dv, dbias, dslopes, dsinks), visits

    carry0 = _varying((q, k, v, bias, sinks, slopes, parts, d_out, lse, d_lse),
                      f32(q), f32(k), f32(v), f32(bias), f32(slopes if slopes_grad else None), f32(sinks))
    (dq, dk, dv, dbias, dslopes, dsinks), visits = jax.lax.scan(q_block, carry0, jnp.arange(nq, dtype=jnp.int32))
    cast = lambda d, a: None if a is None or d is None else d.astype(a.dtype)
    grads = (cast(dq, q), cast(dk, k), cast(dv, v), cast(dbias, bias), cast(dsinks, sinks), cast(dslopes, slopes))
    return grads, jnp.sum(visits)


# ----------------------------------------------------------------------------- custom_vjp
@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _attend(st, q, k, v, bias, sinks, slopes, parts):
    return _forward(st, q, k, v, bias, sinks, slopes, parts)[0].astype(v.dtype)


def _attend_fwd(st, q, k, v, bias, sinks, slopes, parts):
    out, lse, _ = _forward(st, q, k, v, bias, sinks, slopes, parts)
    out = out.astype(v.dtype)
    return out, (q, k, v, bias, sinks, slopes, parts, out, lse)  # the inputs, the output, the lse


def _attend_bwd(st, res, d_out):
    *args, out, lse = res
    grads, _ = _backward(st, tuple(args), out, lse, d_out)
    return (*grads, None)  # the mask parts are integers: no cotangent


_attend.defvjp(_attend_fwd, _attend_bwd)


# ----------------------------------------------------------------------------- splash (TPU)
_SPLASH_LANES = 128  # splash's blocks are multiples of the TPU's 128 lanes
_NEUTRAL_SINK = -1e30  # a sink logit whose exp(sink - m) is exactly 0 in fp32 beside any real score
# the matmul precisions Mosaic lowers the kernel's dots at: default, and highest on fp32 operands
_SPLASH_PRECISIONS = (None, "default", "bfloat16", "fastest", "highest", "float32")


# Splash, what it takes and how (_splash):
# Taken: causal or full masks over the default slots (0..T-1 and 0..S-1, concrete at trace
# time), a window concrete at trace time (causal q - k < window, else |q - k| < window), key
# padding, segment ids, GQA, soft-cap, attention sinks; lengths that are multiples of 128.
# How our semantics map onto the kernel's:
#   * the static pattern: CausalMask / FullMask / LocalMask, one per query head;
#   * segment ids: the kernel's SegmentIds show key j to query i iff their ids are equal, 0
#     included; ours iff equal and not 0. Key padding joins them as id 0 on the key side (no
#     segments: every query in 1). Queries of segment 0 see only keys of segment 0 in the
#     kernel; their rows are set to 0 afterwards (ours see nothing), which also makes their
#     output cotangent 0, so they add nothing to any gradient;
#   * a row no key is visible to outputs 0 (ours) where the kernel would average the values of
#     its masked block (its masked scores all equal mask_value): every call passes sinks,
#     ours or _NEUTRAL_SINK, which starts each row's running max at the sink and its sum at
#     1; beside any real score exp(-1e30 - m) is exactly 0, so a row with a visible key is
#     computed as without a sink, and an empty one ends as 0 / 1 = 0, in the backward too
#     (exp(mask_value - lse) = 0);
#   * scale: q is multiplied by it before the kernel, whose soft-cap then applies to the
#     scaled scores, softcap * tanh(scale q.k / softcap), as dot_product_attention does
#     (in fp32, then rounded once to q's dtype);
#   * matmul precision: the kernel's dots take jax's default matmul precision at trace time.
#     Mosaic lowers "default" on any operands and "highest" on fp32 ones only (bf16 operands
#     fail to compile: "Bad lhs type"), so under "highest" (the parity tests') q, k, v enter
#     the kernel in fp32 and the output is cast back.
# Refused (run blockwise, by name): a bias, ALiBi, a value head width other than q's, slots or
# a window known only at run time (traced), slots other than 0..T-1, a window < 1, lengths
# not multiples of 128, a matmul precision Mosaic does not lower ("high", dot algorithms).
# Slots and windows made inside a jit trace are traced (AttentionMask.self_attention's
# jnp.arange slots, with_window's jnp scalar), so a model's masks built in its forward are
# refused ("traced slots") unless they come in as NumPy constants.
# Blocks: the largest multiple of 128 up to lowering.active().attention_blocks (at least
# 128) that divides the length, in the forward and both backward kernels.
# Under a mesh (jax.set_mesh) the kernel is one custom call the SPMD partitioner cannot split:
# it runs in jax.shard_map, the batch split over the lowering's batch_axes and the key/value
# heads (with their query heads) over its head_axes where they divide them, the rest
# replicated.
def _splash(q, k, v, mask: AttentionMask, *, bias, scale, softcap, sinks, interpret: bool = False):
    """Pallas' TPU splash-attention kernel (jax.experimental.pallas.ops.tpu.splash_attention) for
    the calls it takes, else None (the caller runs the blockwise path). Either way it notes the
    kernel (lowering.note_kernel): "splash", or "blockwise (splash refused: <reason>)".
    interpret=True runs the kernel in Pallas' interpreter on any backend. Never run on a TPU
    (this project has none): tests/test_splash.py checks it in interpret mode on CPU against
    the plain path (outputs within 6e-7, gradients within 3.6e-6, fp32) and compiles it for a
    TPU slice with libtpu."""
    why = splash_refusal(q, k, v, mask, bias)
    if why is not None:
        lowering.note_kernel(f"blockwise (splash refused: {why})")
        return None
    lowering.note_kernel("splash")
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm

    b, t, h, d = q.shape
    s = k.shape[1]
    pattern = _splash_pattern(sm, mask.causal, _concrete(mask.window), t, s)
    blocks = lowering.active().attention_blocks
    bq, bk = _splash_block(t, blocks[0]), _splash_block(s, blocks[1])
    sizes = sk.BlockSizes(block_q=bq, block_kv=bk, block_kv_compute=bk, block_q_dkv=bq, block_kv_dkv=bk,
                          block_kv_dkv_compute=bk, block_q_dq=bq, block_kv_dq=bk)
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    q_seg, k_seg = _splash_segments(mask, b, t, s)
    zero_rows = mask.q_segments is not None  # queries of segment 0
    dtype = q.dtype
    wide = jax.config.jax_default_matmul_precision in ("highest", "float32")  # the kernel then runs on fp32

    def attend(q, k, v, q_seg, k_seg, sinks):  # this device's batch rows and heads
        if wide:
            q, k, v = (a.astype(jnp.float32) for a in (q, k, v))
        n = q.shape[2]  # query heads here
        kernel = sk.make_splash_mha_single_device(sm.MultiHeadMask((pattern,) * n), block_sizes=sizes,
                                                  attn_logits_soft_cap=softcap, interpret=interpret)
        sinks = jnp.full((n,), _NEUTRAL_SINK, jnp.float32) if sinks is None else sinks  # [H]
        qh = jnp.swapaxes((q.astype(jnp.float32) * scale).astype(q.dtype), 1, 2)  # [B, H, T, K]
        kh, vh = jnp.swapaxes(k, 1, 2), jnp.swapaxes(v, 1, 2)  # [B, G, S, K]
        if q_seg is None:
            out = jax.vmap(lambda q, k, v: kernel(q, k, v, sinks=sinks))(qh, kh, vh)
        else:
            out = jax.vmap(lambda q, k, v, qs, ks: kernel(q, k, v, segment_ids=sk.SegmentIds(qs, ks), sinks=sinks))(
                qh, kh, vh, q_seg, k_seg)  # [B, H, T, K]
        out = jnp.swapaxes(out, 1, 2).astype(dtype)  # [B, T, H, K]
        return jnp.where((q_seg != 0)[:, :, None, None], out, 0) if zero_rows else out

    return _splash_on_mesh(attend, q, k, v, q_seg, k_seg, sinks)


def splash_refusal(q, k, v, mask: AttentionMask, bias) -> str | None:
    """Why splash cannot take this call (the kernel's name for it), or None (also what
    attention "auto" asks on TPU: layers/dispatch.py choose_attention)."""
    t, d = q.shape[1], q.shape[3]
    s = k.shape[1]
    q_slots, k_slots, window = _concrete(mask.q_slots), _concrete(mask.k_slots), _concrete(mask.window)
    precision = jax.config.jax_default_matmul_precision  # what the kernel's dots are traced with
    checks = (
        (bias is not None, "attention bias"),
        (mask.alibi_slopes is not None, "ALiBi"),
        (v.shape[-1] != d, "value head dim differs"),
        (q_slots is None or k_slots is None, "traced slots"),
        (lambda: not ((q_slots == np.arange(t)).all() and (k_slots == np.arange(s)).all()), "slots not 0..T-1"),
        (mask.window is not None and window is None, "traced window"),
        (window is not None and window < 1, "window < 1"),
        (t % _SPLASH_LANES or s % _SPLASH_LANES, f"length not a multiple of {_SPLASH_LANES}"),
        (precision not in _SPLASH_PRECISIONS, f"matmul precision {precision}"),
    )
    for failed, why in checks:  # in order: a later check may assume the earlier ones passed
        if failed() if callable(failed) else failed:
            return why
    return None


def _splash_pattern(sm, causal: bool, window, t: int, s: int):
    """The kernel's static mask: keys j with i - window < j <= i (causal) or |i - j| < window
    (window: the concrete one, or None), else causal, else full."""
    if window is not None and window < max(t, s):
        return sm.LocalMask((t, s), (int(window) - 1, 0 if causal else int(window) - 1), offset=0)
    return sm.CausalMask((t, s)) if causal else sm.FullMask((t, s))


def _splash_segments(mask: AttentionMask, b: int, t: int, s: int):
    """Segment ids [B, T], [B, S] int32 with the key padding as id 0, or (None, None)."""
    if mask.q_segments is None and mask.k_valid is None:
        return None, None
    q_seg = jnp.ones((1, t), jnp.int32) if mask.q_segments is None else mask.q_segments.astype(jnp.int32)
    k_seg = jnp.ones((1, s), jnp.int32) if mask.k_segments is None else mask.k_segments.astype(jnp.int32)
    if mask.k_valid is not None:
        k_seg = jnp.where(mask.k_valid, k_seg, 0)
    return jnp.broadcast_to(q_seg, (b, t)), jnp.broadcast_to(k_seg, (b, s))


def _splash_on_mesh(attend, q, k, v, q_seg, k_seg, sinks):
    """attend(q, k, v, q_seg, k_seg, sinks) as is, or under jax.shard_map over the free axes of
    the mesh in force: the batch over the lowering's batch_axes, the key/value heads (with their
    query heads) over its head_axes, where they divide them."""
    mesh = jax.sharding.get_abstract_mesh()
    free = () if mesh.empty else tuple(a for a in mesh.axis_names if a not in mesh.manual_axes)
    if not free:
        return attend(q, k, v, q_seg, k_seg, sinks)
    switches = lowering.active()
    batch = _dividing_axes(mesh, free, switches.batch_axes, q.shape[0])
    heads = _dividing_axes(mesh, tuple(a for a in free if a not in (batch or ())), switches.head_axes, k.shape[2])
    seq = P(batch, None)
    qkv = P(batch, None, heads, None)  # the query heads split as their key/value heads
    # check_vma=False: the kernel's pallas_calls give their outputs no varying-axes type
    return jax.shard_map(attend, mesh=mesh, axis_names=set(free), check_vma=False,
                         in_specs=(qkv, qkv, qkv, None if q_seg is None else seq, None if k_seg is None else seq,
                                   None if sinks is None else P(heads)),
                         out_specs=qkv)(q, k, v, q_seg, k_seg, sinks)


def _concrete(x) -> np.ndarray | None:
    """x as a NumPy array when its value is known at trace time, else None (also for None)."""
    try:
        return None if x is None else np.asarray(x)
    except jax.errors.TracerArrayConversionError:
        return None


def _splash_block(n: int, want: int) -> int:
    """The largest multiple of 128 that divides n (a multiple of 128) and is at most max(want, 128)."""
    top = max(want, _SPLASH_LANES) // _SPLASH_LANES * _SPLASH_LANES
    return next(blk for blk in range(min(top, n), 0, -_SPLASH_LANES) if n % blk == 0)


def _dividing_axes(mesh, free: tuple, names: tuple, n: int) -> tuple | None:
    """The mesh axes among `names` (those in `free`, of size > 1) if their product divides n, else
    None (that dim stays whole on every device)."""
    axes = tuple(a for a in names if a in free and mesh.shape[a] > 1)
    return axes if axes and n % math.prod(mesh.shape[a] for a in axes) == 0 else None
