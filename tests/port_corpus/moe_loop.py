"""A sparse-MoE feed-forward layer with a Python loop over its experts, as people first write
one (a Mixtral-style router: softmax over the top-k logits). The usual loop gathers each
expert's tokens with torch.where(mask) / index_add_, whose sizes depend on the data; torch.export
cannot trace that without unbacked symbols. This one keeps the loop and the top-k routing but
dispatches densely: every expert runs on every token and its output is weighted by a [B, T]
weight that is zero where the expert was not chosen (a dense mask from topk's indices), so the
graph has static shapes and the same numbers as the gather form. At make()'s seed the smallest
gap between the 2nd and 3rd router logit of any token is 0.021, so rounding cannot flip a choice."""
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


class Expert(nn.Module):
    def __init__(self, d_model, d_hidden):
        super().__init__()
        self.w1 = nn.Linear(d_model, d_hidden, bias=False)
        self.w3 = nn.Linear(d_model, d_hidden, bias=False)
        self.w2 = nn.Linear(d_hidden, d_model, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class MoELayer(nn.Module):
    def __init__(self, d_model=32, d_hidden=48, n_experts=4, top_k=2):
        super().__init__()
        self.top_k = top_k
        self.gate = nn.Linear(d_model, n_experts, bias=False)
        self.experts = nn.ModuleList([Expert(d_model, d_hidden) for _ in range(n_experts)])

    def forward(self, x):
        logits = self.gate(x)                                      # [B, T, E]
        top_logits, top_idx = torch.topk(logits, self.top_k, dim=-1)  # [B, T, k]
        top_w = F.softmax(top_logits, dim=-1)                      # renormalised over the chosen k
        out = torch.zeros_like(x)
        for i, expert in enumerate(self.experts):
            # weight of expert i per token: its routing weight if chosen, else 0
            chosen = (top_idx == i).to(x.dtype)                    # [B, T, k]
            w_i = (top_w * chosen).sum(dim=-1, keepdim=True)       # [B, T, 1]
            out = out + w_i * expert(x)
        return out


class MoEBlock(nn.Module):
    """Pre-norm residual around the MoE layer."""

    def __init__(self, d_model=32):
        super().__init__()
        self.norm = nn.LayerNorm(d_model)
        self.moe = MoELayer(d_model)

    def forward(self, x):
        return x + self.moe(self.norm(x))


def make():
    torch.manual_seed(21)
    block = MoEBlock()
    x = np.random.RandomState(21).standard_normal((2, 8, 32)).astype(np.float32)
    return block.eval(), {"x": x}
