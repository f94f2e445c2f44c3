"""Blockwise attention, the torch twin of jaxformer/layers/blockwise.py (docs/numerics.md §29).

Two forms, chosen per call:
  * torch's SDPA with is_causal=True and no mask (its flash CPU kernel, O(T) memory in the
    forward and the backward) where the mask is plain causal self-attention: default slots, no
    padding, segments, window, ALiBi, bias, soft-cap or sinks;
  * else the same algorithm as jaxformer's in torch ops: the same block plan (per-block min/max
    of slots and segments), the online softmax over the visited key blocks of each query block,
    sinks starting each row. Its backward is autograd's (it keeps each visited block's
    probabilities: O(visited blocks) memory in training, O(T) in inference).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from torch_ref import lowering
from torch_ref.layers.attention import AttentionMask


def blockwise_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask, *, bias=None, scale=None,
                        softcap=None, sinks=None, block_q: int | None = None,
                        block_k: int | None = None) -> torch.Tensor:
    """jaxformer/layers/blockwise.py's function in torch. q [B, T, H, K], k [B, S, G, K],
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
    visit = plan(mask, k_valid, t, s, bq, bk)
    outs = []
    for i in range(visit.shape[0]):
        q0, q1 = i * bq, min(t, (i + 1) * bq)
        qi = q5[:, q0:q1]  # [B, bq, G, R, K]
        n = q1 - q0
        if sinks is None:
            m = torch.full((b, g, r, n), -math.inf, device=q.device)
            l_sum = torch.zeros((b, g, r, n), device=q.device)
        else:  # the sink is the row's first column, with no value
            m = sinks.float().reshape(1, g, r, 1).expand(b, g, r, n)
            l_sum = torch.ones((b, g, r, n), device=q.device)
        acc = torch.zeros((b, g, r, n, v.shape[-1]), device=q.device)
        for j in torch.nonzero(visit[i]).flatten().tolist():
            k0, k1 = j * bk, min(s, (j + 1) * bk)
            sc = torch.einsum("bqgrk,bsgk->bgrqs", qi, k[:, k0:k1]).float() * scale
            if softcap is not None:
                sc = torch.tanh(sc / softcap) * softcap
            if bias is not None:
                sc = sc + bias[..., q0:q1 if bias.shape[3] != 1 else 1, k0:k1 if bias.shape[4] != 1 else 1].float()
            if slopes is not None:
                dist = (mask.q_slots[:, q0:q1, None] - mask.k_slots[:, None, k0:k1]).abs().float()
                sc = sc - slopes[None, :, :, None, None] * dist[:, None, None]
            vis = mask.visible(mask.q_slots[:, q0:q1], mask.k_slots[:, k0:k1], k_valid[:, k0:k1],
                               None if mask.q_segments is None else mask.q_segments[:, q0:q1],
                               None if mask.k_segments is None else mask.k_segments[:, k0:k1])
            sc = sc.masked_fill(~vis[:, :, None], -math.inf)  # [B, G, R, bq, bk]
            m_new = torch.maximum(m, sc.amax(dim=-1))
            m_safe = torch.where(m_new == -math.inf, torch.zeros_like(m_new), m_new)
            p = torch.exp(sc - m_safe[..., None])
            alpha = torch.exp(m - m_safe)  # the old terms, brought to the new maximum
            l_sum = alpha * l_sum + p.sum(dim=-1)
            acc = alpha[..., None] * acc + torch.einsum("bgrqs,bsgk->bgrqk", p.to(v.dtype), v[:, k0:k1]).float()
            m = m_new
        out = acc / torch.where(l_sum == 0, torch.ones_like(l_sum), l_sum)[..., None]  # no visible key -> 0
        outs.append(out.permute(0, 3, 1, 2, 4).to(v.dtype))  # [B, bq, G, R, Kv]
    return torch.cat(outs, dim=1).reshape(b, t, h, v.shape[-1])


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
