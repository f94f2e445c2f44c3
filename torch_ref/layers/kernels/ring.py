"""Ring attention, the torch twin of jaxformer/layers/kernels/ring.py. torch_ref has no device mesh, so
this is the single-device equivalent: the sequence in `shards` parts, and for each query part
the same steps the ring takes (its own key/value block, then the blocks of parts i-1, i-2, ...
as they would arrive), each a `local_attention` returning (out, lse), merged by the same
online-softmax rule. shards=1 is one step over the whole sequence. The zigzag layout and the
mask permutation are the same functions.

Each step here is a dense [T/shards, T/shards] score block (`local_attention`), where jaxformer's
steps run its blockwise kernel (docs/numerics.md §30): the same function to fp32 rounding. This
twin is a reference for the ring's steps and merges, not a memory path (torch_ref has no mesh
to split a sequence over), so it keeps the plain form.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from torch_ref.layers.masks import AttentionMask
from torch_ref.layers.scores import alibi_block


# ----------------------------------------------------------------------------- layout
def zigzag_order(length: int, n: int) -> np.ndarray:
    """The slot held at each index of the zigzag layout over n devices (jaxformer's function)."""
    if n <= 1:
        return np.arange(length, dtype=np.int32)
    if length % (2 * n):
        raise ValueError(f"zigzag over {n} context devices needs a sequence length divisible by "
                         f"2 x {n} = {2 * n}, got {length}")
    chunks = np.arange(length, dtype=np.int32).reshape(2 * n, length // (2 * n))
    return np.concatenate([np.concatenate([chunks[i], chunks[2 * n - 1 - i]]) for i in range(n)])


def permute_mask(mask: AttentionMask, order) -> AttentionMask:
    """The parts of a self-attention mask over a sequence whose index i holds slot order[i]."""
    idx = torch.as_tensor(np.asarray(order), dtype=torch.long, device=mask.q_slots.device)
    take = lambda a: None if a is None else a[:, idx]
    slots = idx[None]
    return AttentionMask(slots, slots, k_valid=take(mask.k_valid), q_segments=take(mask.q_segments),
                         k_segments=take(mask.k_segments), window=mask.window,
                         alibi_slopes=mask.alibi_slopes, causal=mask.causal)


# ----------------------------------------------------------------------------- one block
def local_attention(q, k, v, mask: AttentionMask, q_parts: tuple, k_parts: tuple, *, scale: float,
                    softcap: float | None):
    """Queries q [B, Tq, H, K] against one block k [B, Sk, G, K], v [B, Sk, G, Kv] -> (out
    [B, Tq, H, Kv] float32 normalised over the block, lse [B, Tq, H] float32, -inf where no key
    is visible)."""
    b, t, h, d = q.shape
    g, s = k.shape[2], k.shape[1]
    r = h // g
    q_slots, q_segments = q_parts
    k_slots, k_valid, k_segments = k_parts
    scores = torch.einsum("btgrk,bsgk->bgrts", q.reshape(b, t, g, r, d).float(), k.float()) * scale
    scores = scores.reshape(b, h, t, s)  # [B, H, Tq, Sk]
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    if mask.alibi_slopes is not None:
        scores = scores + alibi_block(mask.alibi_slopes, q_slots, k_slots)
    visible = mask.visible(q_slots, k_slots, k_valid, q_segments, k_segments)  # [B|1, 1, Tq, Sk]
    scores = scores.masked_fill(~visible, -math.inf)
    m = scores.amax(dim=-1).detach()  # [B, H, Tq]; any finite shift is exact
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    p = torch.exp(scores - m[..., None])  # 0 where hidden
    l = p.sum(dim=-1)  # [B, H, Tq]
    out = torch.einsum("bgrts,bsgk->btgrk", p.reshape(b, g, r, t, s), v.float()).reshape(b, t, h, v.shape[-1])
    seen = l > 0
    l_safe = torch.where(seen, l, torch.ones_like(l))
    lse = torch.where(seen, m + torch.log(l_safe), torch.full_like(l, -math.inf))
    out = out / l_safe.transpose(1, 2)[..., None]
    return out, lse.transpose(1, 2)


def merge(out_a, lse_a, out_b, lse_b):
    """Two normalised partial results over disjoint key sets -> the one over their union."""
    m = torch.maximum(lse_a, lse_b).detach()
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    w_a, w_b = torch.exp(lse_a - m), torch.exp(lse_b - m)
    total = w_a + w_b
    seen = total > 0
    safe = torch.where(seen, total, torch.ones_like(total))
    lse = torch.where(seen, m + torch.log(safe), torch.full_like(total, -math.inf))
    out = (out_a * w_a[..., None] + out_b * w_b[..., None]) / safe[..., None]
    return out, lse


def finish(out, lse, sinks, dtype):
    """out * sigmoid(lse - sink): the sinks' column joins the merged denominator."""
    if sinks is not None:
        out = out * torch.sigmoid(lse - sinks.float())[..., None]
    return out.to(dtype)


# ----------------------------------------------------------------------------- the ring
def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: AttentionMask, *, bias=None,
                   scale: float | None = None, softcap: float | None = None,
                   sinks: torch.Tensor | None = None, shards: int = 1) -> torch.Tensor:
    """jaxformer/layers/kernels/ring.py's function on one device, the sequence in `shards` parts.
    q [B, T, H, K], k/v [B, T, G, K]; mask an AttentionMask (slots say where each token sits).
    -> [B, T, H, Kv]."""
    if bias is not None:
        raise ValueError("ring attention takes no dense bias (T5's relative bias, a user bias); "
                         "ALiBi goes as AttentionMask.alibi_slopes")
    b, t, h, _ = q.shape
    g = k.shape[2]
    if h % g:
        raise ValueError(f"query heads {h} are not a multiple of key/value heads {g}")
    if k.shape[1] != t:
        raise ValueError(f"ring attention is self-attention: {t} queries but {k.shape[1]} keys")
    if t % shards:
        raise ValueError(f"ring attention over {shards} shards needs a sequence length divisible "
                         f"by {shards}, got {t}")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    c = t // shards
    part = lambda a, j: None if a is None else a[:, j * c:(j + 1) * c]  # [B|1, T] -> part j
    outs = []
    for i in range(shards):  # the query part device i holds
        q_parts = (part(mask.q_slots, i), part(mask.q_segments, i))
        out = lse = None
        for step in range(shards):  # its own block, then those of i-1, i-2, ... as the ring brings them
            j = (i - step) % shards
            k_parts = (part(mask.k_slots, j), part(mask.k_valid, j), part(mask.k_segments, j))
            o, l = local_attention(q[:, i * c:(i + 1) * c], k[:, j * c:(j + 1) * c], v[:, j * c:(j + 1) * c],
                                   mask, q_parts, k_parts, scale=scale, softcap=softcap)
            out, lse = (o, l) if out is None else merge(out, lse, o, l)
        outs.append(finish(out, lse, sinks, q.dtype))
    return torch.cat(outs, dim=1)
