"""A small T5-style encoder: relative position bias from log-spaced buckets (arange, abs, log,
a clamp by torch.min, torch.where), computed by the first layer only and passed on to the next,
no 1/sqrt(d) scaling, T5's RMS LayerNorm without mean or bias, ReLU FFN without biases.
Written in the functional, type-annotated way of a research codebase."""
from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

D_MODEL, N_HEADS, D_KV, D_FF, VOCAB = 32, 4, 8, 64, 64
NUM_BUCKETS, MAX_DISTANCE = 8, 20


def relative_position_bucket(relative_position: torch.Tensor, bidirectional: bool = True,
                             num_buckets: int = 32, max_distance: int = 128) -> torch.Tensor:
    """Map relative positions (key - query) to bucket ids: half the buckets for exact small
    distances, the rest log-spaced up to max_distance; both signs in bidirectional mode."""
    ret = 0
    n = -relative_position
    if bidirectional:
        num_buckets //= 2
        ret += (n < 0).to(torch.long) * num_buckets
        n = torch.abs(n)
    else:
        n = torch.max(n, torch.zeros_like(n))
    max_exact = num_buckets // 2
    is_small = n < max_exact
    val_if_large = max_exact + (
        torch.log(n.float() / max_exact) / math.log(max_distance / max_exact) * (num_buckets - max_exact)
    ).to(torch.long)
    val_if_large = torch.min(val_if_large, torch.full_like(val_if_large, num_buckets - 1))
    ret += torch.where(is_small, n, val_if_large)
    return ret


class T5LayerNorm(nn.Module):
    def __init__(self, d: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        var = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(var + self.eps))


class RelativeSelfAttention(nn.Module):
    def __init__(self, has_relative_bias: bool) -> None:
        super().__init__()
        inner = N_HEADS * D_KV
        self.q = nn.Linear(D_MODEL, inner, bias=False)
        self.k = nn.Linear(D_MODEL, inner, bias=False)
        self.v = nn.Linear(D_MODEL, inner, bias=False)
        self.o = nn.Linear(inner, D_MODEL, bias=False)
        self.has_relative_bias = has_relative_bias
        if has_relative_bias:
            self.relative_attention_bias = nn.Embedding(NUM_BUCKETS, N_HEADS)

    def compute_bias(self, q_len: int, k_len: int, device=None) -> torch.Tensor:
        context_position = torch.arange(q_len, dtype=torch.long, device=device)[:, None]
        memory_position = torch.arange(k_len, dtype=torch.long, device=device)[None, :]
        buckets = relative_position_bucket(memory_position - context_position, bidirectional=True,
                                           num_buckets=NUM_BUCKETS, max_distance=MAX_DISTANCE)
        values = self.relative_attention_bias(buckets)  # (q, k, heads)
        return values.permute(2, 0, 1).unsqueeze(0)  # (1, heads, q, k)

    def forward(self, x: torch.Tensor, pad: torch.Tensor, position_bias: torch.Tensor | None):
        b, t, _ = x.shape
        split = lambda y: y.view(b, t, N_HEADS, D_KV).transpose(1, 2)
        q, k, v = split(self.q(x)), split(self.k(x)), split(self.v(x))
        scores = torch.einsum("bhqd,bhkd->bhqk", q, k)  # T5: no 1/sqrt(d_kv)
        if position_bias is None:
            position_bias = self.compute_bias(t, t, device=x.device)
            # padding keys get the dtype's minimum, folded into the bias once for all layers
            position_bias = position_bias + (1.0 - pad[:, None, None, :].to(x.dtype)) * torch.finfo(x.dtype).min
        scores = scores + position_bias
        attn = F.softmax(scores.float(), dim=-1).type_as(scores)
        out = torch.einsum("bhqk,bhkd->bhqd", attn, v)
        out = out.transpose(1, 2).reshape(b, t, N_HEADS * D_KV)
        return self.o(out), position_bias


class T5Block(nn.Module):
    def __init__(self, first: bool) -> None:
        super().__init__()
        self.attn_norm = T5LayerNorm(D_MODEL)
        self.attn = RelativeSelfAttention(has_relative_bias=first)
        self.ffn_norm = T5LayerNorm(D_MODEL)
        self.wi = nn.Linear(D_MODEL, D_FF, bias=False)
        self.wo = nn.Linear(D_FF, D_MODEL, bias=False)

    def forward(self, x, pad, position_bias=None):
        h, position_bias = self.attn(self.attn_norm(x), pad, position_bias)
        x = x + h
        x = x + self.wo(F.relu(self.wi(self.ffn_norm(x))))
        return x, position_bias


class T5StyleEncoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, D_MODEL)
        self.blocks = nn.ModuleList([T5Block(first=(i == 0)) for i in range(2)])
        self.final_norm = T5LayerNorm(D_MODEL)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        x = self.embed(input_ids)
        bias = None
        for block in self.blocks:
            x, bias = block(x, attention_mask, bias)
        return self.final_norm(x)


def make():
    torch.manual_seed(5)
    model = T5StyleEncoder()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.normal_(1.0, 0.1)
    rng = np.random.RandomState(5)
    input_ids = rng.randint(1, VOCAB, size=(2, 8)).astype(np.int32)
    attention_mask = np.ones((2, 8), np.int32)
    attention_mask[1, 6:] = 0  # the second row is padded
    return model.eval(), {"input_ids": input_ids, "attention_mask": attention_mask}
