"""Configs of mixture-of-experts feed-forwards and multi-head latent attention, shared by both
trees. Imports neither jax nor torch.

    MoEConfig  `model.feedforward.moe:` of any stack config (TransformerConfig.feedforward.moe): the routed experts,
               the router's rule, shared experts, dispatch, auxiliary losses and which layers
               are sparse (layers/moe.py in each tree).
    MLAConfig  `model.attention.mla:` (TransformerConfig.attention.mla): DeepSeek-V2/V3 multi-head latent attention
               (layers/mla.py in each tree).

Every family's routing rule is a named value of `router`, never a default:

    softmax_topk     softmax over all experts, top-k, then (norm_topk_prob) renormalised over the
                     chosen k (Mixtral; Qwen2-MoE / Qwen3-MoE with their norm_topk_prob)
    topk_softmax     top-k of the logits, then a softmax over the chosen k (gpt-oss)
    sigmoid_grouped  sigmoid scores; the choice adds score_bias (DeepSeek-V3's
                     e_score_correction_bias, never in the weights), keeps the topk_group best of
                     n_group expert groups (a group's score: the sum of its two best), takes the
                     top-k there; weights are the unbiased scores of the chosen, renormalised when
                     norm_topk_prob, times routed_scaling_factor (DeepSeek-V3)

Ties are broken towards the lower expert index in both trees (docs/numerics.md, MoE section).
"""
from __future__ import annotations

from dataclasses import dataclass

from jaxformer.config.base import check, check_choice, check_positive

ROUTERS = ("softmax_topk", "topk_softmax", "sigmoid_grouped")
# the experts' FFN kinds: the gated kinds of layers/ffn.py, plain ones, and gpt-oss's clamped
# SwiGLU: gate = min(gate, limit); up = clip(up, -limit, limit); (up + 1) * gate * sigmoid(alpha * gate)
EXPERT_FFNS = ("swiglu", "geglu", "geglu_tanh", "relu", "gelu", "gelu_tanh", "silu", "swiglu_clamped")


@dataclass(frozen=True)
class MoEConfig:
    """A mixture-of-experts FFN in place of the dense FFN of the sparse layers.

    num_experts: E routed experts.  top_k: k experts per token.  router: ROUTERS (required).
    d_expert: each routed expert's hidden width (HF moe_intermediate_size; Mixtral's
        intermediate_size). The dense layers keep the stack's d_ff and ffn.
    norm_topk_prob: renormalise the chosen weights to sum to 1 (softmax_topk, sigmoid_grouped).
    router_bias: a bias on the router's linear layer (gpt-oss).
    expert_ffn / expert_bias: the experts' FFN kind (EXPERT_FFNS) and whether their projections
        have biases (gpt-oss). swiglu_alpha / swiglu_limit: swiglu_clamped's constants.
    n_group, topk_group, routed_scaling_factor: sigmoid_grouped's options (DeepSeek-V3).
    score_bias: sigmoid_grouped keeps a per-expert correction bias used only to choose
        (e_score_correction_bias); it never gets a gradient (see bias_update_rate).
    num_shared_experts: always-on experts beside the routed ones (DeepSeek: one MLP of width
        d_shared). d_shared: their total hidden width; None = num_shared_experts * d_expert.
    shared_expert_gate: sigmoid(Linear(D, 1)(x)) scales the shared experts' output (Qwen2-MoE).
    dense_layers: indices of layers that keep the dense FFN (DeepSeek's first_k_dense_replace,
        Qwen's mlp_only_layers / decoder_sparse_step, resolved at import).
    capacity_factor: None = dropless (every routed token is computed). A number drops, per
        expert, the assignments beyond ceil(capacity_factor * tokens * top_k / E), in token
        order (Switch Transformer); dropped assignments contribute 0.
    aux_loss_coef: weight of the load-balancing loss as HF computes it (router_aux_loss_coef).
    z_loss_coef: weight of the router z-loss, mean(logsumexp(router logits) ** 2) (ST-MoE).
    bias_update_rate: training option of sigmoid_grouped with score_bias: after each step
        score_bias += rate * sign(mean load - load) per expert (DeepSeek-V3's aux-loss-free
        balancing); 0 = off.
    """

    num_experts: int
    top_k: int
    router: str
    d_expert: int
    norm_topk_prob: bool = True
    router_bias: bool = False
    expert_ffn: str = "swiglu"
    expert_bias: bool = False
    swiglu_alpha: float = 1.702
    swiglu_limit: float = 7.0
    n_group: int = 1
    topk_group: int = 1
    routed_scaling_factor: float = 1.0
    score_bias: bool = False
    num_shared_experts: int = 0
    d_shared: int | None = None
    shared_expert_gate: bool = False
    dense_layers: tuple[int, ...] = ()
    capacity_factor: float | None = None
    aux_loss_coef: float = 0.0
    z_loss_coef: float = 0.0
    bias_update_rate: float = 0.0

    def __post_init__(self) -> None:
        check_positive(self, "num_experts", "top_k", "d_expert", "n_group", "topk_group")
        check_choice(self, "router", ROUTERS)
        check_choice(self, "expert_ffn", EXPERT_FFNS)
        check(self.top_k <= self.num_experts, "top_k",
              f"must be <= num_experts={self.num_experts}, got {self.top_k}")
        if isinstance(self.dense_layers, list):  # YAML / JSON lists
            object.__setattr__(self, "dense_layers", tuple(self.dense_layers))
        check(all(isinstance(i, int) and i >= 0 for i in self.dense_layers), "dense_layers",
              f"must be layer indices >= 0, got {self.dense_layers!r}")
        check(isinstance(self.num_shared_experts, int) and self.num_shared_experts >= 0,
              "num_shared_experts", f"must be an int >= 0, got {self.num_shared_experts!r}")
        if self.d_shared is not None:
            check_positive(self, "d_shared")
        check(not self.shared_expert_gate or self.num_shared_experts > 0, "shared_expert_gate",
              "gates the shared experts; num_shared_experts is 0")
        if self.router == "sigmoid_grouped":
            check(self.num_experts % self.n_group == 0, "n_group",
                  f"must divide num_experts={self.num_experts}, got {self.n_group}")
            check(self.topk_group <= self.n_group, "topk_group",
                  f"must be <= n_group={self.n_group}, got {self.topk_group}")
            check(self.num_experts // self.n_group >= 2 or self.n_group == 1, "n_group",
                  "each group needs >= 2 experts (a group's score is the sum of its best two)")
            check(self.top_k <= self.topk_group * (self.num_experts // self.n_group), "top_k",
                  f"must be <= topk_group * experts per group = "
                  f"{self.topk_group * (self.num_experts // self.n_group)}, got {self.top_k}")
        else:
            for name, default in (("n_group", 1), ("topk_group", 1), ("score_bias", False),
                                  ("routed_scaling_factor", 1.0), ("bias_update_rate", 0.0)):
                check(getattr(self, name) == default, name,
                      f"is a sigmoid_grouped option; router {self.router!r} does not use it")
        if self.router == "topk_softmax":
            check(self.norm_topk_prob, "norm_topk_prob",
                  "topk_softmax's weights are a softmax over the chosen k (they always sum to 1)")
        check(self.routed_scaling_factor > 0, "routed_scaling_factor",
              f"must be > 0, got {self.routed_scaling_factor}")
        check(self.capacity_factor is None or self.capacity_factor > 0, "capacity_factor",
              f"must be > 0 or null (dropless), got {self.capacity_factor!r}")
        for name in ("aux_loss_coef", "z_loss_coef", "bias_update_rate"):
            check(getattr(self, name) >= 0, name, f"must be >= 0, got {getattr(self, name)}")
        check(self.bias_update_rate == 0 or self.score_bias, "bias_update_rate",
              "updates score_bias; set score_bias: true")
        if self.expert_ffn == "swiglu_clamped":
            check(self.swiglu_limit > 0 and self.swiglu_alpha > 0, "swiglu_limit",
                  f"swiglu_clamped needs alpha and limit > 0, got {self.swiglu_alpha}, {self.swiglu_limit}")

    @property
    def resolved_d_shared(self) -> int:
        return self.d_shared if self.d_shared is not None else self.num_shared_experts * self.d_expert

    def sparse_layers(self, num_layers: int) -> tuple[bool, ...]:
        """Per layer: is its FFN this mixture of experts (else the stack's dense FFN)?"""
        check(all(i < num_layers for i in self.dense_layers), "dense_layers",
              f"indices must be < num_layers={num_layers}, got {self.dense_layers!r}")
        return tuple(i not in self.dense_layers for i in range(num_layers))


@dataclass(frozen=True)
class MLAConfig:
    """Multi-head latent attention (DeepSeek-V2, DeepSeek-V3).

    q_lora_rank: queries go D -> q_lora_rank (q_a_proj, then an RMSNorm q_a_layernorm) -> heads
        (q_b_proj); None = one q_proj (DeepSeek-V2-Lite).
    kv_lora_rank: keys and values share a compressed latent D -> kv_lora_rank (+ the rope key,
        kv_a_proj_with_mqa; kv_a_layernorm on the latent part), expanded per head by kv_b_proj.
    qk_nope_head_dim / qk_rope_head_dim: each query/key head is [nope | rope]; the rope part of
        the key is one head shared by all heads (decoupled RoPE). v_head_dim: value head width.
    rope_interleave: the rope parts of q and k hold their rotated pairs interleaved
        (x0, x1), (x2, x3)... (HF DeepSeek-V3's rope_interleave, its default there); False =
        the rotate-half layout of every other layer here (docs/numerics.md §6, §27).
    latent_norm_eps: eps of q_a_layernorm and kv_a_layernorm (HF builds them with its RMSNorm's
        default 1e-6, not rms_norm_eps).
    The KV cache holds the latent (kv_lora_rank) and the rope key (qk_rope_head_dim) per token.
    """

    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    q_lora_rank: int | None = None
    rope_interleave: bool = False
    latent_norm_eps: float = 1e-6

    def __post_init__(self) -> None:
        check_positive(self, "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
        if self.q_lora_rank is not None:
            check_positive(self, "q_lora_rank")
        check(self.qk_rope_head_dim % 2 == 0, "qk_rope_head_dim", "RoPE needs an even width")
        check(self.latent_norm_eps > 0, "latent_norm_eps", f"must be > 0, got {self.latent_norm_eps}")

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    def latent_values_per_token(self) -> int:
        """Numbers one layer's KV cache holds per token: the latent and the rope key."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    def expanded_values_per_token(self, num_heads: int) -> int:
        """What a cache of the expanded per-head keys and values would hold (docs/numerics.md §27)."""
        return num_heads * (self.qk_head_dim + self.v_head_dim)
