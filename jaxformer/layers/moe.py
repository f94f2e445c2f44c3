"""Mixture-of-experts feed-forward: a router, stacked experts, optional shared experts, and
the auxiliary losses. Twin: torch_ref/layers/moe.py (which defines the maths with HF's plain
per-expert loop).

    MoE(x) = sum_j w_j(x) * expert_{i_j}(x)  [+ gate(x) * shared(x)]

The router's rule is named in the config (jaxformer/config/moe.py: softmax_topk, topk_softmax,
sigmoid_grouped) and computed in float32, as HF does. Ties between experts are broken towards
the lower expert index in both trees (`topk`; docs/numerics.md §26).

Dispatch (dropless by default): the N*k token-expert assignments are sorted by expert (stable,
so token order within an expert), the experts run as grouped matmuls (jax.lax.ragged_dot_general
over the [E, out, in] weights), and the outputs are scattered back to their tokens, each times
its routing weight. On CPU, where JAX computes ragged_dot densely, each expert's group is padded
to a multiple of a block instead, and one batched matmul runs every block with its expert's
weight (`blocked_dispatch`). capacity_factor drops, per expert, the assignments beyond
ceil(capacity_factor * N * k / E) in token order (Switch Transformer); a dropped assignment
contributes 0. On a mesh with an `expert` axis the tokens go to their experts' devices with
all-to-alls instead (jaxformer/layers/kernels/moe_parallel.py, the same maths). `dense_experts`
computes every expert for every token (an einsum), the reference the ragged path is tested against (tests/test_moe.py) and benchmarked against.

Shapes: x [B, T, D] -> [B, T, D]; N = B*T tokens, E experts, k = top_k, F = d_expert.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from jaxformer import lowering
from jaxformer.config import ConfigError
from jaxformer.config.moe import MoEConfig
from jaxformer.layers.ffn import GATED, FeedForward, activation
from jaxformer.layers.kernels import moe_parallel, partitioning
from jaxformer.layers.linear import Linear
from jaxformer.layers.sow import capturing, sow

EXPERT_GATED = GATED + ("swiglu_clamped",)


# ----------------------------------------------------------------------------- routing
def topk(x: jax.Array, k: int) -> tuple[jax.Array, jax.Array]:
    """(values, indices) of the k largest entries of the last axis, largest first, equal values
    in ascending index order (docs/numerics.md §26). jax.lax.top_k already prefers the lower
    index but orders -0.0 below +0.0, which torch compares equal: the indices are chosen on a
    copy with -0.0 made +0.0, and the values are gathered from x (so every value keeps its
    gradient)."""
    _, idx = jax.lax.top_k(jnp.where(x == 0, 0.0, x), k)
    return jnp.take_along_axis(x, idx, axis=-1), idx


def renormalise(w: jax.Array, eps: float = 0.0) -> jax.Array:
    """The chosen weights scaled to sum to 1 over the k chosen: w / (sum w + eps)."""
    return w / (jnp.sum(w, axis=-1, keepdims=True) + eps)


def route(logits: jax.Array, cfg: MoEConfig, score_bias: jax.Array | None = None):
    """logits [N, E] float32 -> (weights [N, k] float32, indices [N, k] int32) by cfg.router
    (jaxformer/config/moe.py; HF's MixtralTopKRouter, GptOssTopKRouter, DeepseekV3TopkRouter)."""
    k = cfg.top_k
    if cfg.router == "softmax_topk":
        w, idx = topk(jax.nn.softmax(logits, axis=-1), k)
        return (renormalise(w) if cfg.norm_topk_prob else w), idx
    if cfg.router == "topk_softmax":
        top, idx = topk(logits, k)
        return jax.nn.softmax(top, axis=-1), idx
    # sigmoid_grouped: score_bias only chooses; the weights are the unbiased scores
    scores = jax.nn.sigmoid(logits)  # [N, E]
    choice = scores if score_bias is None else scores + score_bias.astype(jnp.float32)
    if cfg.n_group > 1:
        n, e = choice.shape
        grouped = choice.reshape(n, cfg.n_group, e // cfg.n_group)  # [N, G, E/G]
        group_scores = jnp.sum(jax.lax.top_k(grouped, 2)[0], axis=-1)  # [N, G] sum of the best two
        _, gidx = topk(group_scores, cfg.topk_group)  # [N, topk_group]
        keep = jnp.zeros((n, cfg.n_group), bool).at[jnp.arange(n)[:, None], gidx].set(True)
        choice = jnp.where(jnp.repeat(keep, e // cfg.n_group, axis=-1), choice, -jnp.inf)
    _, idx = topk(choice, k)
    w = jnp.take_along_axis(scores, idx, axis=-1)
    if cfg.norm_topk_prob:
        w = renormalise(w, 1e-20)  # HF's 1e-20 in the denominator
    return w * cfg.routed_scaling_factor, idx


class Buffer(nnx.Variable):
    """A saved array that no optimiser trains (torch's persistent register_buffer): kept in
    checkpoints and by the converter (jaxformer/convert.py, checkpoint_io.py) beside the
    nnx.Params, outside the gradient and the optimiser state (which take nnx.Param only)."""


SAVED = nnx.Any(nnx.Param, Buffer)  # the state that checkpoints and the converter keep


class Router(nnx.Module):
    """Router logits x @ weight^T (+ bias) in float32, then cfg.router's rule.

    Params: weight [E, D], bias [E] (router_bias), score_bias [E] Buffer (score_bias:
    DeepSeek-V3's e_score_correction_bias, zeros; updated only by the trainer's bias rule);
    weight_lora: a LoRA update of weight (layers/lora.py ParamLoRA), or None.
    Shapes: x [N, D] -> (logits [N, E] float32, weights [N, k] float32, indices [N, k] int32).
    """

    def __init__(self, d_model: int, cfg: MoEConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        e = cfg.num_experts
        init = nnx.initializers.normal(0.02)
        self.weight = partitioning.param(init(rngs.params(), (e, d_model), jnp.float32), ("expert", "embed"))
        self.bias = partitioning.param(jnp.zeros((e,), jnp.float32), ("expert",)) if cfg.router_bias else None
        self.score_bias = Buffer(jnp.zeros((e,), jnp.float32), **partitioning.metadata(("expert",))) \
            if cfg.score_bias else None
        self.weight_lora = nnx.data(None)  # data: layers/lora.py may put a ParamLoRA here

    def effective_weight(self) -> jax.Array:
        """weight [E, D], plus its LoRA update (weight frozen) when adapted."""
        if self.weight_lora is None:
            return self.weight[...]
        w = self.weight[...]
        return jax.lax.stop_gradient(w) + self.weight_lora.delta().astype(w.dtype)

    def __call__(self, x: jax.Array):
        logits = x.astype(jnp.float32) @ self.effective_weight().astype(jnp.float32).T  # [N, E]
        if self.bias is not None:
            logits = logits + self.bias[...].astype(jnp.float32)
        bias = None if self.score_bias is None else jax.lax.stop_gradient(self.score_bias[...])
        weights, idx = route(logits, self.cfg, bias)
        return logits, weights, idx


# ----------------------------------------------------------------------------- experts
def expert_activation(kind: str, gate: jax.Array | None, up: jax.Array, alpha: float, limit: float) -> jax.Array:
    """The experts' hidden activation; gpt-oss's swiglu_clamped (HF GptOssExperts._apply_gate):
    gate = min(gate, limit), up = clip(up, -limit, limit), (up + 1) * gate * sigmoid(alpha * gate)."""
    if kind == "swiglu_clamped":
        gate = jnp.minimum(gate, limit)
        up = jnp.clip(up, -limit, limit)
        return (up + 1) * (gate * jax.nn.sigmoid(gate * alpha))
    if gate is not None:
        return activation(kind)(gate) * up
    return activation(kind)(up)


def capacity(cfg: MoEConfig, num_tokens: int) -> int | None:
    """Assignments each expert keeps: ceil(capacity_factor * N * k / E); None = dropless."""
    if cfg.capacity_factor is None:
        return None
    return math.ceil(cfg.capacity_factor * num_tokens * cfg.top_k / cfg.num_experts)


_RAGGED = jax.lax.RaggedDotDimensionNumbers(  # [M, in] x [E, out, in] -> [M, out], M grouped by expert
    dot_dimension_numbers=(((1,), (2,)), ((), ())), lhs_ragged_dimensions=[0], rhs_group_dimensions=[0])


def grouped_matmul(x: jax.Array, w: jax.Array, group_sizes: jax.Array) -> jax.Array:
    """x [M, in] (rows sorted by expert, group_sizes[e] rows for expert e) @ w[e]^T -> [M, out]."""
    return jax.lax.ragged_dot_general(x, w.astype(x.dtype), group_sizes, _RAGGED)


def blocked_dispatch() -> bool:
    """Run the experts on the block-padded layout (`block_layout`) instead of ragged_dot? JAX
    lowers ragged_dot on CPU to a dense product over a copy of the rows masked per group (E
    times the rows' FLOPs, and E copies of them), slower than `dense_experts` (bench/README.md,
    "MoE"); TPU and GPU lower it to XLA's ragged dot."""
    return lowering.on_cpu()


def block_layout(group_sizes: jax.Array, rows: int, block: int):
    """The sorted rows with each expert's group padded to a multiple of `block`, so that every
    block of `block` rows belongs to one expert. -> (source [S] the sorted row of each padded
    row, real [S] bool (False for padding), block_expert [S / block]); S = (ceil(rows / block)
    + E) * block, a static bound on the padded length (trailing blocks are padding)."""
    e = group_sizes.shape[0]
    ends = jnp.cumsum(group_sizes)
    padded = -(-group_sizes // block) * block
    padded_ends = jnp.cumsum(padded)
    slot = jnp.arange((-(-rows // block) + e) * block)
    expert = jnp.minimum(jnp.searchsorted(padded_ends, slot, side="right"), e - 1)  # [S]
    source = slot - (padded_ends - padded)[expert] + (ends - group_sizes)[expert]
    real = source < ends[expert]
    return jnp.where(real, source, 0), real, expert[::block]


def block_matmul(x: jax.Array, w: jax.Array, block_expert: jax.Array) -> jax.Array:
    """x [S, in] in `block_layout` order @ w[expert of its block]^T -> [S, out]: one batched
    matmul over the blocks, each with its expert's weight."""
    nb = block_expert.shape[0]
    xb = x.reshape(nb, -1, x.shape[-1])  # [blocks, block, in]
    w_b = jnp.take(w, block_expert, axis=0, indices_are_sorted=True).astype(x.dtype)  # [blocks, out, in]
    return jnp.einsum("jbi,joi->jbo", xb, w_b).reshape(x.shape[0], -1)


class Experts(nnx.Module):
    """E expert FFNs with stacked weights, torch layout [E, out, in] (the converter copies them
    as they are), and their dispatch (module docstring).

    Params: gate_proj [E, F, D] (gated kinds), up_proj [E, F, D], down_proj [E, D, F];
    gate_proj_bias / up_proj_bias [E, F], down_proj_bias [E, D] (bias).
    LoRA (layers/lora.py ParamLoRA, or None): gate_up_proj_lora on the gate and up weights as
    one [E, 2F, D] stack (gated kinds), up_proj_lora (the others), down_proj_lora; `weight`.
    Shapes: x [N, D], indices [N, k] int, weights [N, k] -> [N, D] in x's dtype.
    `dtype`: the compute dtype (None: x's), as nnx.Linear's, set by models/common.py
    set_compute_dtype. The rows are gathered, exchanged and multiplied in it, as torch.autocast
    runs F.linear in bf16; the weighted sum over a token's k experts is taken in x's dtype (the
    float32 residual stream under bf16 compute; docs/numerics.md §41).
    """

    def __init__(self, d_model: int, cfg: MoEConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        self.dtype = None
        e, f, d = cfg.num_experts, cfg.d_expert, d_model
        init = nnx.initializers.normal(0.02)

        def weight(shape, axes):
            return partitioning.param(init(rngs.params(), shape, jnp.float32), axes)

        def bias(shape, axes):
            return partitioning.param(jnp.zeros(shape, jnp.float32), axes) if cfg.expert_bias else None

        gated = cfg.expert_ffn in EXPERT_GATED
        self.gate_proj = weight((e, f, d), ("expert", "mlp", "embed")) if gated else None
        self.up_proj = weight((e, f, d), ("expert", "mlp", "embed"))
        self.down_proj = weight((e, d, f), ("expert", "embed", "mlp"))
        self.gate_proj_bias = bias((e, f), ("expert", "mlp")) if gated else None
        self.up_proj_bias = bias((e, f), ("expert", "mlp"))
        self.down_proj_bias = bias((e, d), ("expert", None))
        # data: layers/lora.py may put a ParamLoRA here
        self.gate_up_proj_lora = self.up_proj_lora = self.down_proj_lora = nnx.data(None)

    def stacked_shape(self, name: str) -> tuple:
        """The [E, out, in] shape of weight `name`; gate_up_proj: gate and up stacked, [E, 2F, D]."""
        if name == "gate_up_proj":
            e, f, d = self.up_proj.shape
            return (e, 2 * f, d)
        return tuple(getattr(self, name).shape)

    def stacked_axes(self, name: str) -> tuple | None:
        return partitioning.logical_axes(self.up_proj if name == "gate_up_proj" else getattr(self, name))

    def weight(self, name: str) -> jax.Array:
        """The [E, out, in] weight `name` the FFN multiplies by: the stored one, plus its LoRA
        update (the stored one frozen) when adapted; gate_up_proj_lora's rows [:F] update
        gate_proj, rows [F:] up_proj."""
        w = getattr(self, name)[...]
        fused = self.gate_proj is not None and name != "down_proj"
        lora = self.gate_up_proj_lora if fused else getattr(self, f"{name}_lora")
        if lora is None:
            return w
        delta = lora.delta()  # [E, out, in]
        if fused:
            f = w.shape[1]
            delta = delta[:, :f] if name == "gate_proj" else delta[:, f:]
        return jax.lax.stop_gradient(w) + delta.astype(w.dtype)

    def ffn(self, x: jax.Array, project) -> jax.Array:
        """The expert FFN on rows x [M, D]; project(name, h) applies weight `name` (per row's
        expert) and its bias."""
        gate = project("gate_proj", x) if self.gate_proj is not None else None
        h = expert_activation(self.cfg.expert_ffn, gate, project("up_proj", x), self.cfg.swiglu_alpha,
                              self.cfg.swiglu_limit)  # [M, F]
        return project("down_proj", h)  # [M, D]

    def compute(self, x: jax.Array) -> jax.Array:
        """x in the compute dtype."""
        return x if self.dtype is None else x.astype(self.dtype)

    def __call__(self, x: jax.Array, indices: jax.Array, weights: jax.Array) -> jax.Array:
        n, k = indices.shape
        e = self.cfg.num_experts
        flat = indices.reshape(-1)  # [N*k] assignment a = token * k + slot
        order = jnp.argsort(flat, stable=True)  # by expert, token order within an expert
        expert_sorted = flat[order]  # [N*k]
        group_sizes = jnp.bincount(flat, length=e).astype(jnp.int32)  # [E]
        token_sorted = order // k
        w_sorted = weights.reshape(-1)[order].astype(x.dtype)  # [N*k]
        cap = capacity(self.cfg, n)
        if cap is not None:  # position within its expert = rank - first rank of that expert
            starts = jnp.cumsum(group_sizes) - group_sizes
            w_sorted = jnp.where(jnp.arange(n * k) - starts[expert_sorted] < cap, w_sorted, 0)
        block_expert = None
        if blocked_dispatch():  # padding rows: token 0 with weight 0 (they add 0 and get no gradient)
            block = min(64, max(8, 1 << (-(-n * k // e) - 1).bit_length()))  # ~ the mean group, 8..64
            source, real, block_expert = block_layout(group_sizes, n * k, block)
            token_sorted, expert_sorted = token_sorted[source], expert_sorted[source]
            w_sorted = jnp.where(real, w_sorted[source], 0)

        y = self.grouped_ffn(self.compute(x)[token_sorted], expert_sorted, group_sizes, block_expert)  # [N*k, D]
        return jnp.zeros_like(x).at[token_sorted].add(y.astype(x.dtype) * w_sorted[:, None])  # [N, D]

    def grouped_ffn(self, rows: jax.Array, expert_sorted: jax.Array, group_sizes: jax.Array,
                    block_expert: jax.Array | None = None) -> jax.Array:
        """The FFN of rows [M, D] sorted by expert (expert_sorted [M], group_sizes [E] of this
        module's E, which is E/S on one device of an expert-parallel mesh) -> [M, D]. Rows past
        sum(group_sizes) are padding: ragged_dot gives them 0 and their bias is 0. block_expert:
        the rows are in `block_layout` order, run as one batched matmul (blocked_dispatch)."""
        def project(name, h):
            y = block_matmul(h, self.weight(name), block_expert) if block_expert is not None else \
                grouped_matmul(h, self.weight(name), group_sizes)
            b = getattr(self, f"{name}_bias")
            if b is None:
                return y
            return y + jnp.take(b[...].astype(y.dtype), expert_sorted, axis=0, mode="fill", fill_value=0)

        return self.ffn(rows, project)


def dense_experts(experts: Experts, x: jax.Array, indices: jax.Array, weights: jax.Array) -> jax.Array:
    """Experts(x, indices, weights) computed densely: every expert on every token (einsums over
    the stacked weights), combined with the routing weights scattered to [N, E]. No capacity.
    The reference of the ragged dispatch (tests) and its benchmark baseline."""
    n = x.shape[0]

    def project(name, h):  # h [N, E, in] or [N, in]
        eq = "nd,efd->nef" if h.ndim == 2 else "ned,efd->nef"
        y = jnp.einsum(eq, h, experts.weight(name).astype(h.dtype))
        b = getattr(experts, f"{name}_bias")
        return y if b is None else y + b[...].astype(y.dtype)

    y = experts.ffn(experts.compute(x), project).astype(x.dtype)  # [N, E, D]
    combine = jnp.zeros((n, experts.cfg.num_experts), x.dtype).at[jnp.arange(n)[:, None], indices].add(
        weights.astype(x.dtype))  # [N, E]
    return jnp.einsum("ne,ned->nd", combine, y)


# ----------------------------------------------------------------------------- the layer
class MoE(nnx.Module):
    """Router -> experts, plus shared experts (DeepSeek's shared_experts; Qwen2-MoE's
    shared_expert scaled by sigmoid(shared_expert_gate(x))).

    Args: d_model D; cfg MoEConfig; dropout on the output (as FeedForward's).
    Shapes: x [B, T, D] -> [B, T, D]. Under a capture (layers/sow.py) it sows the router's
    logits [B, T, E] float32 as "router_logits" and the routed assignments per expert [E]
    float32 (before any capacity drop) as "expert_load" (models/lm.py return_aux).
    """

    def __init__(self, d_model: int, cfg: MoEConfig, *, dropout: float = 0.0, rngs: nnx.Rngs):
        if cfg.num_shared_experts and cfg.expert_ffn == "swiglu_clamped":
            raise ConfigError(f"moe.expert_ffn: shared experts of kind {cfg.expert_ffn!r} are not supported")
        self.cfg = cfg
        self.router = Router(d_model, cfg, rngs=rngs)
        self.experts = Experts(d_model, cfg, rngs=rngs)
        self.shared_experts = FeedForward(d_model, cfg.resolved_d_shared, kind=cfg.expert_ffn, bias=False,
                                          rngs=rngs) if cfg.num_shared_experts else None
        self.shared_expert_gate = Linear(d_model, 1, use_bias=False, axes=("embed", None), rngs=rngs) \
            if cfg.shared_expert_gate else None
        self.dropout = nnx.Dropout(dropout, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        b, t, d = x.shape
        h = x.reshape(b * t, d)  # [N, D]
        on_mesh = moe_parallel.expert_mesh(b * t)
        if on_mesh is not None:  # expert parallelism: tokens move to their experts' devices
            logits, out, load = moe_parallel.routed(self.router, self.experts, h, *on_mesh)
        else:
            logits, weights, idx = self.router(h)
            out = self.experts(h, idx, weights)  # [N, D]
            load = None
        if self.shared_experts is not None:
            shared = self.shared_experts(h)
            if self.shared_expert_gate is not None:
                shared = jax.nn.sigmoid(self.shared_expert_gate(h)) * shared
            out = out + shared
        if capturing(self):
            sow(self, "router_logits", logits.reshape(b, t, -1))
            sow(self, "expert_load", load if load is not None else
                jnp.bincount(idx.reshape(-1), length=self.cfg.num_experts).astype(jnp.float32))
        return self.dropout(out.reshape(b, t, d))


# ----------------------------------------------------------------------------- auxiliary losses
def load_balance_probs(logits: jax.Array) -> jax.Array:
    """The router probabilities the load-balancing loss uses: softmax over all E experts."""
    return jax.nn.softmax(logits.astype(jnp.float32), axis=-1)


def moe_aux_losses(router_logits: jax.Array, attention_mask: jax.Array | None, cfg: MoEConfig) -> dict:
    """{"load_balance", "z_loss"} (float32 scalars, without their coefficients) of the router
    logits [L, B, T, E] of L sparse layers; attention_mask [B, T] (1 = token) or None.

    load_balance: HF's load_balancing_loss_func (modeling_mixtral.py) over the L layers:
        E * sum_e f_e * P_e, f_e the share of top-k assignments (softmax top-k, ties to the lower
        index) to expert e and P_e the mean softmax probability of e, over real tokens.
    z_loss: mean over layers and real tokens of logsumexp(logits)^2 (ST-MoE).
    """
    logits = router_logits.astype(jnp.float32)
    num_layers, b, t, e = logits.shape
    mask = jnp.ones((b, t), jnp.float32) if attention_mask is None else attention_mask.astype(jnp.float32)
    probs = load_balance_probs(logits)  # [L, B, T, E]
    _, idx = topk(probs, cfg.top_k)  # [L, B, T, k]
    chosen = jnp.sum(jax.nn.one_hot(idx, e, dtype=jnp.float32), axis=-2)  # [L, B, T, E]
    rows = num_layers * jnp.sum(mask)
    tokens_per_expert = jnp.einsum("lbte,bt->e", chosen, mask) / rows
    prob_per_expert = jnp.einsum("lbte,bt->e", probs, mask) / rows
    z = jnp.square(jax.nn.logsumexp(logits, axis=-1))  # [L, B, T]
    return {"load_balance": e * jnp.sum(tokens_per_expert * prob_per_expert),
            "z_loss": jnp.einsum("lbt,bt->", z, mask) / rows}
