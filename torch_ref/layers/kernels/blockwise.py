"""Blockwise attention, the torch twin of jaxformer/layers/kernels/blockwise.py (docs/numerics.md §29).

Two forms, chosen per call:
  * torch's SDPA with is_causal=True and no mask (its flash CPU kernel, O(T) memory in the
    forward and the backward) where the mask is plain causal self-attention: default slots, no
    padding, segments, window, ALiBi, bias, soft-cap or sinks;
  * else the same algorithm as jaxformer's in torch ops (a torch.autograd.Function): the same
    block plan (per-block min/max of slots and segments), the online softmax over the visited
    key blocks of each query block, sinks starting each row; it saves the inputs, the output and
    the log-sum-exp, and its backward recomputes each block's probabilities (FA-2), so memory
    stays O(T) in training too.
"""
from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F

from torch_ref import lowering
from torch_ref.layers.masks import AttentionMask
from torch_ref.layers.scores import slot_distance, soft_cap


def blockwise_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask, *, bias=None, scale=None,
                        softcap=None, sinks=None, block_q: int | None = None,
                        block_k: int | None = None) -> torch.Tensor:
    """jaxformer/layers/kernels/blockwise.py's function in torch. q [B, T, H, K], k [B, S, G, K],
    v [B, S, G, Kv]; mask a torch_ref AttentionMask (or None). -> [B, T, H, Kv]."""
    b, t, h, d = q.shape
    s, g = k.shape[1], k.shape[2]
    if h % g:
        raise ValueError(f"query heads {h} are not a multiple of key/value heads {g}")
    if sinks is not None and tuple(sinks.shape) != (h,):
        raise ValueError(f"sinks must be [H] = ({h},), one logit per query head, got {tuple(sinks.shape)}")
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    if mask is None:
        mask = AttentionMask(torch.arange(t, device=q.device)[None], torch.arange(s, device=q.device)[None])
    if _plain_causal(mask, t, s) and bias is None and softcap is None and sinks is None and d == v.shape[-1]:
        return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                              is_causal=True, scale=scale,
                                              enable_gqa=g != h).transpose(1, 2)  # [B, T, H, Kv]
    blocks = lowering.active().attention_blocks
    bq = min(t, blocks[0] if block_q is None else block_q)
    bk = min(s, blocks[1] if block_k is None else block_k)
    r = h // g
    q5 = q.reshape(b, t, g, r, d)  # [B, T, G, R, K]
    if bias is not None:
        bias = bias.reshape((1,) * (4 - bias.dim()) + tuple(bias.shape))
        hb = bias.shape[1]
        bias = bias.reshape(bias.shape[0], g if hb == h else 1, r if hb == h else 1, *bias.shape[2:])
    slopes = None if mask.alibi_slopes is None else mask.alibi_slopes.float().reshape(g, r)
    k_valid = torch.ones((1, s), dtype=torch.bool, device=q.device) if mask.k_valid is None else mask.k_valid.bool()
    st = _Static(mask, k_valid, plan(mask, k_valid, t, s, bq, bk), bq, bk, scale, softcap)
    out = _Blockwise.apply(q5, k, v, bias, sinks if sinks is None else sinks.reshape(g, r), slopes, st)
    return out.reshape(b, t, h, v.shape[-1])  # [B, T, H, Kv]


@dataclasses.dataclass(frozen=True)
class _Static:
    mask: AttentionMask
    k_valid: torch.Tensor  # [B|1, S] bool
    visit: torch.Tensor    # [nq, nk] bool, the plan
    bq: int
    bk: int
    scale: float
    softcap: float | None


def _block(st: _Static, qi, kj, bias, slopes, q0: int, q1: int, k0: int, k1: int):
    """Scores of block (i, j) after soft-cap, bias and ALiBi [B, G, R, bq, bk] float32, the
    soft-cap's tanh (or None), the ALiBi distances (or None), the visible pairs [B|1, 1, 1, bq, bk]."""
    m = st.mask
    sc = torch.einsum("bqgrk,bsgk->bgrqs", qi, kj).float() * st.scale
    sc, tanh = soft_cap(sc, st.softcap)  # before bias and mask
    if bias is not None:
        sc = sc + bias[..., q0:q1 if bias.shape[3] != 1 else 1, k0:k1 if bias.shape[4] != 1 else 1].float()
    dist = None
    if slopes is not None:
        dist = slot_distance(m.q_slots[:, q0:q1], m.k_slots[:, k0:k1])[:, None, None]
        sc = sc - slopes[None, :, :, None, None] * dist
    vis = m.visible(m.q_slots[:, q0:q1], m.k_slots[:, k0:k1], st.k_valid[:, k0:k1],
                    None if m.q_segments is None else m.q_segments[:, q0:q1],
                    None if m.k_segments is None else m.k_segments[:, k0:k1])
    return sc, tanh, dist, vis[:, :, None]


def _ranges(st: _Static, t: int, s: int, i: int):
    """(q0, q1) of query block i and the (j, k0, k1) of the key blocks it visits."""
    q0, q1 = i * st.bq, min(t, (i + 1) * st.bq)
    return q0, q1, [(j, j * st.bk, min(s, (j + 1) * st.bk)) for j in torch.nonzero(st.visit[i]).flatten().tolist()]


class _Blockwise(torch.autograd.Function):
    """The online softmax over the visited key blocks; the backward recomputes each block's
    probabilities from the saved log-sum-exp (FA-2), as jaxformer's custom_vjp."""

    @staticmethod
    def forward(ctx, q5, k, v, bias, sinks, slopes, st: _Static):
        b, t, g, r, _ = q5.shape
        outs, lses = [], []
        for i in range(st.visit.shape[0]):
            q0, q1, visited = _ranges(st, t, k.shape[1], i)
            n = q1 - q0
            if sinks is None:
                m = torch.full((b, g, r, n), -math.inf, device=q5.device)
                l_sum = torch.zeros((b, g, r, n), device=q5.device)
            else:  # the sink is the row's first column, with no value
                m = sinks.float().reshape(1, g, r, 1).expand(b, g, r, n)
                l_sum = torch.ones((b, g, r, n), device=q5.device)
            acc = torch.zeros((b, g, r, n, v.shape[-1]), device=q5.device)
            for _, k0, k1 in visited:
                sc, _, _, vis = _block(st, q5[:, q0:q1], k[:, k0:k1], bias, slopes, q0, q1, k0, k1)
                sc = sc.masked_fill(~vis, -math.inf)  # [B, G, R, bq, bk]
                m_new = torch.maximum(m, sc.amax(dim=-1))
                m_safe = torch.where(m_new == -math.inf, torch.zeros_like(m_new), m_new)
                p = torch.exp(sc - m_safe[..., None])
                alpha = torch.exp(m - m_safe)  # the old terms, brought to the new maximum
                l_sum = alpha * l_sum + p.sum(dim=-1)
                acc = alpha[..., None] * acc + torch.einsum("bgrqs,bsgk->bgrqk", p.to(v.dtype), v[:, k0:k1]).float()
                m = m_new
            empty = l_sum == 0  # no visible key (and no sink) -> 0
            one = torch.ones_like(l_sum)
            outs.append((acc / torch.where(empty, one, l_sum)[..., None]).permute(0, 3, 1, 2, 4).to(v.dtype))
            lses.append(torch.where(empty, torch.zeros_like(m), m + torch.log(torch.where(empty, one, l_sum))))
        out, lse = torch.cat(outs, dim=1), torch.cat(lses, dim=-1)  # [B, T, G, R, Kv], [B, G, R, T]
        ctx.save_for_backward(q5, k, v, bias, sinks, slopes, out, lse)
        ctx.st = st
        return out

    @staticmethod
    def backward(ctx, d_out):
        q5, k, v, bias, sinks, slopes, out, lse = ctx.saved_tensors
        st = ctx.st
        t = q5.shape[1]
        delta = (d_out.float() * out.float()).sum(-1).permute(0, 2, 3, 1)  # D = rowsum(dO * O) [B, G, R, T]
        dq, dk, dv = (torch.zeros(a.shape, device=a.device) for a in (q5, k, v))
        dbias = None if bias is None else torch.zeros(bias.shape, device=bias.device)
        dsinks = None if sinks is None else torch.zeros(sinks.shape, device=sinks.device)
        dslopes = None if slopes is None else torch.zeros(slopes.shape, device=slopes.device)
        for i in range(st.visit.shape[0]):
            q0, q1, visited = _ranges(st, t, k.shape[1], i)
            qi, doi = q5[:, q0:q1], d_out[:, q0:q1]
            lse_i, delta_i = lse[..., q0:q1], delta[..., q0:q1]
            for _, k0, k1 in visited:
                sc, tanh, dist, vis = _block(st, qi, k[:, k0:k1], bias, slopes, q0, q1, k0, k1)
                p = torch.where(vis, torch.exp(sc - lse_i[..., None]), torch.zeros_like(sc))
                dp = torch.einsum("bqgrk,bsgk->bgrqs", doi, v[:, k0:k1]).float()
                ds = p * (dp - delta_i[..., None])  # d loss / d scores (after soft-cap, bias, ALiBi)
                if dbias is not None:
                    axes = tuple(a for a in range(5) if dbias.shape[a] == 1 and ds.shape[a] != 1)
                    red = ds.sum(dim=axes, keepdim=True) if axes else ds
                    dbias[..., q0:q1 if dbias.shape[3] != 1 else 1, k0:k1 if dbias.shape[4] != 1 else 1] += red
                if dslopes is not None:
                    dslopes -= (ds * dist).sum(dim=(0, 3, 4))
                if tanh is not None:  # d(c tanh(x / c)) / dx = 1 - tanh^2
                    ds = ds * (1.0 - tanh * tanh)
                ds = ds * st.scale
                dq[:, q0:q1] += torch.einsum("bgrqs,bsgk->bqgrk", ds, k[:, k0:k1].float())
                dk[:, k0:k1] += torch.einsum("bgrqs,bqgrk->bsgk", ds, qi.float())
                dv[:, k0:k1] += torch.einsum("bgrqs,bqgrk->bsgk", p, doi.float())
            if dsinks is not None:  # d / d sink = -sum over rows of p_sink * D
                dsinks -= (torch.exp(sinks.float()[None, :, :, None] - lse_i) * delta_i).sum(dim=(0, 3))
        cast = lambda d, a: None if a is None else d.to(a.dtype)
        return (cast(dq, q5), cast(dk, k), cast(dv, v), cast(dbias, bias), cast(dsinks, sinks),
                cast(dslopes, slopes), None)


def _plain_causal(mask: AttentionMask, t: int, s: int) -> bool:
    """The mask is causal self-attention over slots 0..T-1 and nothing else."""
    if not mask.causal or t != s or mask.window is not None or mask.k_valid is not None:
        return False
    if mask.q_segments is not None or mask.alibi_slopes is not None:
        return False
    ar = torch.arange(t, device=mask.q_slots.device)
    return (mask.q_slots.shape[0] == 1 and mask.k_slots.shape[0] == 1 and torch.equal(mask.q_slots[0], ar)
            and torch.equal(mask.k_slots[0], ar))


def plan(mask: AttentionMask, k_valid: torch.Tensor, t: int, s: int, bq: int, bk: int) -> torch.Tensor:
    """Which key blocks each query block visits -> [nq, nk] bool (jaxformer's `plan`: per-block
    min/max of the slots and segments, over the batch, of real queries and keys)."""
    nq, nk = -(-t // bq), -(-s // bk)
    q_valid = torch.ones((1, t), dtype=torch.bool, device=k_valid.device)
    if mask.q_segments is not None:
        q_valid = q_valid & (mask.q_segments != 0)
        k_valid = k_valid & (mask.k_segments != 0)

    def ranges(x, valid, n, nb, blk):
        x, valid = torch.broadcast_tensors(x, valid)
        pad = nb * blk - n
        x, valid = F.pad(x, (0, pad)), F.pad(valid, (0, pad))
        x, valid = x.reshape(x.shape[0], nb, blk), valid.reshape(x.shape[0], nb, blk)
        big = torch.iinfo(torch.int32).max // 4
        lo = torch.where(valid, x, big).amin(dim=(0, 2))
        hi = torch.where(valid, x, -big).amax(dim=(0, 2))
        return lo, hi, valid.any(dim=2).any(dim=0)

    qlo, qhi, qany = (a[:, None] for a in ranges(mask.q_slots.long(), q_valid, t, nq, bq))
    klo, khi, kany = (a[None, :] for a in ranges(mask.k_slots.long(), k_valid, s, nk, bk))
    need = qany & kany
    if mask.causal:
        need &= klo <= qhi
    if mask.window is not None:
        w = int(mask.window)
        need &= qlo - khi < w
        if not mask.causal:
            need &= qhi - klo > -w
    if mask.q_segments is not None:
        slo, shi, _ = ranges(mask.q_segments.long(), q_valid, t, nq, bq)
        tlo, thi, _ = ranges(mask.k_segments.long(), k_valid, s, nk, bk)
        need &= (slo[:, None] <= thi[None, :]) & (tlo[None, :] <= shi[:, None])
    return need
