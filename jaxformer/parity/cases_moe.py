"""Parity cases for the mixture of experts (layers/moe.py): each router rule, constructed exact
ties (docs/numerics.md §26), the MoE layer (outputs and every gradient, the router's
included) per router and per expert FFN kind, shared experts, expert biases with gpt-oss's
clamped SwiGLU, capacity dropping, the auxiliary losses, and full tiny MoE LMs (loop and
scan). Indices are integer outputs: compared exactly.
"""
from __future__ import annotations

import numpy as np

from jaxformer.config.models import LMConfig
from jaxformer.config.moe import MoEConfig
from jaxformer.parity.cases import case, ids, mirror, mirror_fn, model_pair, normal, padding

B, T, D, N = 2, 6, 32, 12


def _moe(**kw) -> MoEConfig:
    return MoEConfig(**{"num_experts": 4, "top_k": 2, "router": "softmax_topk", "d_expert": 16, **kw})


def _edited(dotted: str, cfg: MoEConfig, edit):
    """mirror(dotted, D, cfg), then edit(torch_module, rng) in place on the torch side (the
    harness copies torch's weights and buffers into the flax twin afterwards)."""
    base = mirror(dotted, D, cfg)

    def build(seed: int):
        import torch
        t, j = base(seed)
        with torch.no_grad():
            edit(t, np.random.RandomState(seed + 1))
        return t, j
    return build


def _randomise(names: tuple[str, ...], scale: float = 1.0):
    """Fill the named params/buffers (dotted, relative to the module) with N(0, scale^2): the
    biases and score_bias start at zero, which would hide their use."""
    def edit(module, rng):
        import torch
        for name in names:
            owner, _, leaf = name.rpartition(".")
            tensor = getattr(module.get_submodule(owner) if owner else module, leaf)
            tensor.copy_(torch.from_numpy((rng.standard_normal(tuple(tensor.shape)) * scale).astype(np.float32)))
    return edit


def _scaled(names: tuple[str, ...], factor: float, then=None):
    """Multiply the named weights by `factor` (so gpt-oss's clamps bind), then `then`."""
    def edit(module, rng):
        for name in names:
            module.get_parameter(name).mul_(factor)
        if then is not None:
            then(module, rng)
    return edit


# ---------------------------------------------------------------- 1. routers
GROUPED = dict(router="sigmoid_grouped", num_experts=8, top_k=3, n_group=4, topk_group=2, score_bias=True,
               routed_scaling_factor=2.5)
ROUTERS = {
    "softmax_topk": _moe(),
    "softmax_topk_unnormalised": _moe(num_experts=6, top_k=3, norm_topk_prob=False),
    "topk_softmax_bias": _moe(router="topk_softmax", router_bias=True),
    "sigmoid_grouped": _moe(**GROUPED),
    "sigmoid_ungrouped_unnormalised": _moe(router="sigmoid_grouped", num_experts=6, top_k=2, norm_topk_prob=False,
                                           score_bias=True),
}
for tag, cfg in ROUTERS.items():
    extra = tuple(n for n, on in (("bias", cfg.router_bias), ("score_bias", cfg.score_bias)) if on)
    case(f"router_{tag}", "moe", _edited("layers.moe.Router", cfg, _randomise(extra, 0.05)),
         lambda r: {"x": normal(N, D, scale=5.0)(r)})


# ---------------------------------------------------------------- 2. exact ties (docs/numerics.md §26)
def _tie_rows(groups: list[list[int]]):
    """Router rows made equal within each group: their logits tie exactly for every token."""
    def edit(module, rng):
        for g in groups:
            for e in g[1:]:
                module.weight[e] = module.weight[g[0]]
    return edit


# equal router rows: experts 1, 3, 5 (and 0, 7) always tie
case("router_ties_equal_rows", "moe",
     _edited("layers.moe.Router", _moe(num_experts=8, top_k=2), _tie_rows([[1, 3, 5], [0, 7]])),
     lambda r: {"x": normal(N, D, scale=5.0)(r)})


def _equal_logits(module, rng):  # logits = bias: experts 1, 2, 4 tie at the top for every token
    import torch
    module.weight.zero_()
    module.bias.copy_(torch.tensor([0.5, 1.0, 1.0, -1.0, 1.0, 0.25]))


case("router_ties_equal_logits", "moe",
     _edited("layers.moe.Router", _moe(router="topk_softmax", num_experts=6, top_k=2, router_bias=True),
             _equal_logits),
     lambda r: {"x": normal(N, D)(r)})


def _group_ties(module, rng):
    """Groups 1, 2, 3 (experts 3-5, 6-8, 9-11) are copies: their group scores tie, and so do the
    experts across them; score_bias repeats the pattern."""
    import torch
    _tie_rows([[3, 6, 9], [4, 7, 10], [5, 8, 11]])(module, rng)
    module.score_bias.copy_(torch.tensor([0.1, -0.2, 0.0] + [0.05, 0.0, -0.1] * 3))


case("router_ties_groups", "moe",
     _edited("layers.moe.Router", _moe(router="sigmoid_grouped", num_experts=12, top_k=3, n_group=4, topk_group=2,
                                       score_bias=True), _group_ties),
     lambda r: {"x": normal(N, D, scale=5.0)(r)})

# ---------------------------------------------------------------- 3. the MoE layer
x_btd = normal(B, T, D)
case("moe_softmax_topk", "moe", mirror("layers.moe.MoE", D, _moe()), lambda r: {"x": x_btd(r)})
case("moe_softmax_topk_shared_gate", "moe",  # Qwen2-MoE
     mirror("layers.moe.MoE", D, _moe(num_experts=6, top_k=3, norm_topk_prob=False, num_shared_experts=1,
                                      d_shared=24, shared_expert_gate=True)), lambda r: {"x": x_btd(r)})
case("moe_sigmoid_grouped_shared", "moe",  # DeepSeek-V3
     _edited("layers.moe.MoE", _moe(**GROUPED, num_shared_experts=2), _randomise(("router.score_bias",), 0.05)),
     lambda r: {"x": x_btd(r)})
# gpt-oss: router bias, expert biases, clamped SwiGLU with its clamps binding (weights x 40)
GPT_OSS = _moe(router="topk_softmax", router_bias=True, expert_bias=True, expert_ffn="swiglu_clamped",
               swiglu_limit=2.0)
case("moe_topk_softmax_clamped_bias", "moe",
     _edited("layers.moe.MoE", GPT_OSS, _scaled(
         ("experts.gate_proj", "experts.up_proj"), 40.0,
         _randomise(("router.bias", "experts.gate_proj_bias", "experts.up_proj_bias", "experts.down_proj_bias"),
                    0.5))),
     lambda r: {"x": x_btd(r)})
# capacity ceil(0.5 * 12 * 2 / 4) = 3 of the 24 assignments per expert: most tokens lose one
case("moe_capacity_dropping", "moe", mirror("layers.moe.MoE", D, _moe(capacity_factor=0.5)),
     lambda r: {"x": x_btd(r)})
for kind in ("geglu", "geglu_tanh", "relu", "gelu", "gelu_tanh", "silu"):
    case(f"moe_expert_ffn_{kind}", "moe", mirror("layers.moe.MoE", D, _moe(expert_ffn=kind)),
         lambda r: {"x": x_btd(r)})

# ---------------------------------------------------------------- 4. auxiliary losses
L, E = 3, 6
AUX_CFG = _moe(num_experts=E, top_k=2)
case("moe_aux_losses", "moe", mirror_fn("layers.moe.moe_aux_losses", cfg=AUX_CFG),
     lambda r: {"router_logits": normal(L, B, T, E, scale=2.0)(r), "attention_mask": None})
case("moe_aux_losses_padding", "moe", mirror_fn("layers.moe.moe_aux_losses", cfg=AUX_CFG),
     lambda r: {"router_logits": normal(L, B, T, E, scale=2.0)(r), "attention_mask": padding(B, T, [6, 3])})

# ---------------------------------------------------------------- 5. full MoE LMs
LM_MOE = LMConfig.tiny("llama", num_layers=3, d_ff=48, moe=_moe(dense_layers=(0,), aux_loss_coef=0.02))
left_pad = np.array([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]], np.int32)
case("lm_moe_llama", "moe", model_pair("lm", LM_MOE),
     lambda r: {"ids": ids(B, T, 64)(r), "attention_mask": left_pad, "return_aux": np.array(True)})
case("lm_moe_llama_scan", "moe",
     model_pair("lm", LM_MOE.replace(num_layers=2, scan_layers=True,
                                          moe=_moe(router="sigmoid_grouped", num_experts=8, top_k=2, n_group=2,
                                                   topk_group=1, num_shared_experts=1))),
     lambda r: {"ids": ids(B, T, 64)(r), "return_aux": np.array(True)})
