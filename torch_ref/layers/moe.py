"""Mixture-of-experts feed-forward: a router, stacked experts, optional shared experts, and
the auxiliary losses. Twin: jaxformer/layers/moe.py. This tree defines the maths: the experts
run in HF's plain per-expert loop (each expert on the tokens routed to it).

    MoE(x) = sum_j w_j(x) * expert_{i_j}(x)  [+ gate(x) * shared(x)]

The router's rule is named in the config (jaxformer/config/moe.py: softmax_topk, topk_softmax,
sigmoid_grouped) and computed in float32, as HF does. Ties between experts are broken towards
the lower expert index in both trees (`topk`; docs/numerics.md §26).

capacity_factor drops, per expert, the assignments beyond ceil(capacity_factor * N * k / E) in
token order (Switch Transformer); a dropped assignment contributes 0.

Shapes: x [B, T, D] -> [B, T, D]; N = B*T tokens, E experts, k = top_k, F = d_expert.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from jaxformer.config import ConfigError
from jaxformer.config.moe import MoEConfig
from torch_ref.layers.ffn import GATED, FeedForward, activation
from torch_ref.layers.sow import capturing, sow

EXPERT_GATED = GATED + ("swiglu_clamped",)


# ----------------------------------------------------------------------------- routing
def topk(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(values, indices) of the k largest entries of the last axis, largest first, equal values
    in ascending index order (docs/numerics.md §26). torch.topk orders ties arbitrarily on CPU,
    so the indices come from a stable descending sort; the values are gathered from x."""
    idx = torch.sort(x.detach(), dim=-1, descending=True, stable=True).indices[..., :k]
    return x.gather(-1, idx), idx


def renormalise(w: torch.Tensor, eps: float = 0.0) -> torch.Tensor:
    """The chosen weights scaled to sum to 1 over the k chosen: w / (sum w + eps)."""
    return w / (w.sum(dim=-1, keepdim=True) + eps)


def route(logits: torch.Tensor, cfg: MoEConfig, score_bias: torch.Tensor | None = None):
    """logits [N, E] float32 -> (weights [N, k] float32, indices [N, k] int64) by cfg.router
    (jaxformer/config/moe.py; HF's MixtralTopKRouter, GptOssTopKRouter, DeepseekV3TopkRouter)."""
    k = cfg.top_k
    if cfg.router == "softmax_topk":
        w, idx = topk(torch.softmax(logits, dim=-1), k)
        return (renormalise(w) if cfg.norm_topk_prob else w), idx
    if cfg.router == "topk_softmax":
        top, idx = topk(logits, k)
        return torch.softmax(top, dim=-1), idx
    # sigmoid_grouped: score_bias only chooses; the weights are the unbiased scores
    scores = torch.sigmoid(logits)  # [N, E]
    choice = scores if score_bias is None else scores + score_bias.float()
    if cfg.n_group > 1:
        n, e = choice.shape
        grouped = choice.view(n, cfg.n_group, e // cfg.n_group)  # [N, G, E/G]
        group_scores = grouped.topk(2, dim=-1).values.sum(dim=-1)  # [N, G] sum of the best two
        _, gidx = topk(group_scores, cfg.topk_group)  # [N, topk_group]
        keep = torch.zeros(n, cfg.n_group, dtype=torch.bool, device=logits.device).scatter(1, gidx, True)
        choice = choice.masked_fill(~keep.repeat_interleave(e // cfg.n_group, dim=-1), float("-inf"))
    _, idx = topk(choice, k)
    w = scores.gather(-1, idx)
    if cfg.norm_topk_prob:
        w = renormalise(w, 1e-20)  # HF's 1e-20 in the denominator
    return w * cfg.routed_scaling_factor, idx


class Router(nn.Module):
    """Router logits x @ weight^T (+ bias) in float32, then cfg.router's rule.

    Params: weight [E, D], bias [E] (router_bias), score_bias [E] a saved buffer (score_bias:
    DeepSeek-V3's e_score_correction_bias, zeros; updated only by the trainer's bias rule);
    weight_lora: a LoRA update of weight (layers/lora.py ParamLoRA), or None.
    Shapes: x [N, D] -> (logits [N, E] float32, weights [N, k] float32, indices [N, k] int64).
    """

    def __init__(self, d_model: int, cfg: MoEConfig):
        super().__init__()
        self.cfg = cfg
        e = cfg.num_experts
        self.weight = nn.Parameter(torch.randn(e, d_model) * 0.02)
        self.bias = nn.Parameter(torch.zeros(e)) if cfg.router_bias else None
        self.register_buffer("score_bias", torch.zeros(e) if cfg.score_bias else None, persistent=True)
        self.weight_lora = None

    def effective_weight(self) -> torch.Tensor:
        """weight [E, D], plus its LoRA update (weight frozen) when adapted."""
        if self.weight_lora is None:
            return self.weight
        return self.weight.detach() + self.weight_lora.delta().to(self.weight.dtype)

    def forward(self, x: torch.Tensor):
        logits = F.linear(x.float(), self.effective_weight().float())  # [N, E]
        if self.bias is not None:
            logits = logits + self.bias.float()
        weights, idx = route(logits, self.cfg, self.score_bias)
        return logits, weights, idx


# ----------------------------------------------------------------------------- experts
def expert_activation(kind: str, gate: torch.Tensor | None, up: torch.Tensor, alpha: float,
                      limit: float) -> torch.Tensor:
    """The experts' hidden activation; gpt-oss's swiglu_clamped (HF GptOssExperts._apply_gate):
    gate = min(gate, limit), up = clip(up, -limit, limit), (up + 1) * gate * sigmoid(alpha * gate)."""
    if kind == "swiglu_clamped":
        gate = gate.clamp(max=limit)
        up = up.clamp(min=-limit, max=limit)
        return (up + 1) * (gate * torch.sigmoid(gate * alpha))
    if gate is not None:
        return activation(kind)(gate) * up
    return activation(kind)(up)


def capacity(cfg: MoEConfig, num_tokens: int) -> int | None:
    """Assignments each expert keeps: ceil(capacity_factor * N * k / E); None = dropless."""
    if cfg.capacity_factor is None:
        return None
    return math.ceil(cfg.capacity_factor * num_tokens * cfg.top_k / cfg.num_experts)


class Experts(nn.Module):
    """E expert FFNs with stacked weights [E, out, in], run one expert at a time on the tokens
    routed to it (HF's loop), in token order.

    Params: gate_proj [E, F, D] (gated kinds), up_proj [E, F, D], down_proj [E, D, F];
    gate_proj_bias / up_proj_bias [E, F], down_proj_bias [E, D] (bias).
    LoRA (layers/lora.py ParamLoRA, or None): gate_up_proj_lora on the gate and up weights as
    one [E, 2F, D] stack (gated kinds), up_proj_lora (the others), down_proj_lora; `weight`.
    Shapes: x [N, D], indices [N, k] int, weights [N, k] -> [N, D].
    """

    def __init__(self, d_model: int, cfg: MoEConfig):
        super().__init__()
        self.cfg = cfg
        e, f, d = cfg.num_experts, cfg.d_expert, d_model

        def weight(*shape):
            return nn.Parameter(torch.randn(*shape) * 0.02)

        def bias(*shape):
            return nn.Parameter(torch.zeros(*shape)) if cfg.expert_bias else None

        gated = cfg.expert_ffn in EXPERT_GATED
        self.gate_proj = weight(e, f, d) if gated else None
        self.up_proj = weight(e, f, d)
        self.down_proj = weight(e, d, f)
        self.gate_proj_bias = bias(e, f) if gated else None
        self.up_proj_bias = bias(e, f)
        self.down_proj_bias = bias(e, d)
        self.gate_up_proj_lora = self.up_proj_lora = self.down_proj_lora = None

    def stacked_shape(self, name: str) -> tuple:
        """The [E, out, in] shape of weight `name`; gate_up_proj: gate and up stacked, [E, 2F, D]."""
        if name == "gate_up_proj":
            e, f, d = self.up_proj.shape
            return (e, 2 * f, d)
        return tuple(getattr(self, name).shape)

    def weight(self, name: str) -> torch.Tensor:
        """The [E, out, in] weight `name` the FFN multiplies by: the stored one, plus its LoRA
        update (the stored one frozen) when adapted; gate_up_proj_lora's rows [:F] update
        gate_proj, rows [F:] up_proj."""
        w = getattr(self, name)
        fused = self.gate_proj is not None and name != "down_proj"
        lora = self.gate_up_proj_lora if fused else getattr(self, f"{name}_lora")
        if lora is None:
            return w
        delta = lora.delta()  # [E, out, in]
        if fused:
            f = w.shape[1]
            delta = delta[:, :f] if name == "gate_proj" else delta[:, f:]
        return w.detach() + delta.to(w.dtype)

    def ffn(self, x: torch.Tensor, project) -> torch.Tensor:
        """The expert FFN on rows x [M, D]; project(name, h) applies weight `name` and its bias."""
        gate = project("gate_proj", x) if self.gate_proj is not None else None
        h = expert_activation(self.cfg.expert_ffn, gate, project("up_proj", x), self.cfg.swiglu_alpha,
                              self.cfg.swiglu_limit)  # [M, F]
        return project("down_proj", h)  # [M, D]

    def forward(self, x: torch.Tensor, indices: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        n = x.shape[0]
        out = torch.zeros_like(x)
        cap = capacity(self.cfg, n)
        weight = {name: self.weight(name) for name in ("gate_proj", "up_proj", "down_proj")
                  if getattr(self, name) is not None}
        for e in range(self.cfg.num_experts):
            token, slot = torch.where(indices == e)  # token order (row-major)
            if cap is not None:
                token, slot = token[:cap], slot[:cap]
            if token.numel() == 0:
                continue

            def project(name, h, e=e):
                b = getattr(self, f"{name}_bias")
                return F.linear(h, weight[name][e], None if b is None else b[e])

            y = self.ffn(x[token], project)  # [M, D]
            # summed in x's dtype: under torch.autocast y is bf16 and x the float32 stream
            out = out.index_add(0, token, y.to(out.dtype) * weights[token, slot, None].to(out.dtype))
        return out


# ----------------------------------------------------------------------------- the layer
class MoE(nn.Module):
    """Router -> experts, plus shared experts (DeepSeek's shared_experts; Qwen2-MoE's
    shared_expert scaled by sigmoid(shared_expert_gate(x))).

    Args: d_model D; cfg MoEConfig; dropout on the output (as FeedForward's).
    Shapes: x [B, T, D] -> [B, T, D]. Under a capture (layers/sow.py) it sows the router's
    logits [B, T, E] float32 as "router_logits" and the routed assignments per expert [E]
    float32 (before any capacity drop) as "expert_load" (models/lm.py return_aux).
    """

    def __init__(self, d_model: int, cfg: MoEConfig, *, dropout: float = 0.0):
        super().__init__()
        if cfg.num_shared_experts and cfg.expert_ffn == "swiglu_clamped":
            raise ConfigError(f"moe.expert_ffn: shared experts of kind {cfg.expert_ffn!r} are not supported")
        self.cfg = cfg
        self.router = Router(d_model, cfg)
        self.experts = Experts(d_model, cfg)
        self.shared_experts = FeedForward(d_model, cfg.resolved_d_shared, kind=cfg.expert_ffn, bias=False) \
            if cfg.num_shared_experts else None
        self.shared_expert_gate = nn.Linear(d_model, 1, bias=False) if cfg.shared_expert_gate else None
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        h = x.reshape(b * t, d)  # [N, D]
        logits, weights, idx = self.router(h)
        out = self.experts(h, idx, weights)  # [N, D]
        if self.shared_experts is not None:
            shared = self.shared_experts(h)
            if self.shared_expert_gate is not None:
                shared = torch.sigmoid(self.shared_expert_gate(h)) * shared
            out = out + shared
        if capturing(self):
            sow(self, "router_logits", logits.reshape(b, t, -1))
            sow(self, "expert_load", torch.bincount(idx.reshape(-1), minlength=self.cfg.num_experts).float())
        return self.dropout(out.reshape(b, t, d))


# ----------------------------------------------------------------------------- auxiliary losses
def load_balance_probs(logits: torch.Tensor) -> torch.Tensor:
    """The router probabilities the load-balancing loss uses: softmax over all E experts."""
    return torch.softmax(logits.float(), dim=-1)


def moe_aux_losses(router_logits: torch.Tensor, attention_mask: torch.Tensor | None, cfg: MoEConfig) -> dict:
    """{"load_balance", "z_loss"} (float32 scalars, without their coefficients) of the router
    logits [L, B, T, E] of L sparse layers; attention_mask [B, T] (1 = token) or None.

    load_balance: HF's load_balancing_loss_func (modeling_mixtral.py) over the L layers:
        E * sum_e f_e * P_e, f_e the share of top-k assignments (softmax top-k, ties to the lower
        index) to expert e and P_e the mean softmax probability of e, over real tokens.
    z_loss: mean over layers and real tokens of logsumexp(logits)^2 (ST-MoE).
    """
    logits = router_logits.float()
    num_layers, b, t, e = logits.shape
    mask = torch.ones(b, t, device=logits.device) if attention_mask is None else attention_mask.float()
    probs = load_balance_probs(logits)  # [L, B, T, E]
    _, idx = topk(probs, cfg.top_k)  # [L, B, T, k]
    chosen = F.one_hot(idx, e).float().sum(dim=-2)  # [L, B, T, E]
    rows = num_layers * mask.sum()
    tokens_per_expert = torch.einsum("lbte,bt->e", chosen, mask) / rows
    prob_per_expert = torch.einsum("lbte,bt->e", probs, mask) / rows
    z = torch.logsumexp(logits, dim=-1).square()  # [L, B, T]
    return {"load_balance": e * torch.sum(tokens_per_expert * prob_per_expert),
            "z_loss": torch.einsum("lbt,bt->", z, mask) / rows}
