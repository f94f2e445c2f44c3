"""A catalogue of realistic porting bugs, injected into the JAX side, that the parity suite must
catch: the self-test that shows the harness has teeth (`jaxformer parity --self-test`).

Each Mutation is a context manager factory that patches jaxformer (never torch_ref) for the
duration of a block, and names the registry cases that must fail under it; bugs of the
training loop name the training-trajectory check instead (its callable and the training-side
bugs live in jaxformer/train/trajectory.py: they patch jaxformer.train, which ranks above
this package). A bug that no named case catches means a missing case or a loose tolerance,
never a bug to drop (docs/numerics.md §16, §19). Each bug names one case, the cheapest that
exercises it: every case it named before also caught it alone (§16).
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import sys
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any


@dataclasses.dataclass(frozen=True)
class Mutation:
    name: str
    description: str
    patch: Callable[[], AbstractContextManager]
    cases: tuple[str, ...] = ()  # registry cases that must each fail under the bug
    trajectory: bool = False  # the training-trajectory check must fail under the bug
    grads_too: bool = False  # the named cases must fail on gradients too, not only on outputs
    # code both trees share: a check against an outside reference (worst |diff| / tolerance),
    # run with the bug planted (jaxformer/train/shared_checks.py)
    reference: Callable[[], float] | None = None


@dataclasses.dataclass
class Outcome:
    mutation: str
    caught: bool
    worst_ratio: float  # largest |diff| / tolerance seen over the named checks (> 1: caught)
    detail: dict[str, str] = dataclasses.field(default_factory=dict)  # check -> what it saw


MUTATIONS: dict[str, Mutation] = {}


def register(m: Mutation) -> Mutation:
    if m.name in MUTATIONS:
        raise ValueError(f"duplicate mutation {m.name!r}")
    MUTATIONS[m.name] = m
    return m


# ----------------------------------------------------------------------------- patching
@contextlib.contextmanager
def patched(owner: Any, name: str, new: Any) -> Iterator[None]:
    """Replace owner.name by new; for a module-level function, also in every jaxformer module
    that imported it by name (`from ... import f`). Restored on exit, also in the modules first
    imported inside the block, which took `new` by name (else the bug outlives its block)."""
    original = getattr(owner, name)
    is_module = isinstance(owner, type(sys))

    def holding(value):
        return [m for k, m in list(sys.modules.items())
                if k.startswith("jaxformer.") and m is not owner and getattr(m, name, None) is value]
    holders = [owner] + (holding(original) if is_module else [])
    for h in holders:
        setattr(h, name, new)
    try:
        yield
    finally:
        for h in holders + (holding(new) if is_module else []):
            setattr(h, name, original)


def _wrap_init(cls, **change: Callable[[Any], Any]) -> AbstractContextManager:
    """Patch cls.__init__ so that the arguments named in `change` (given or defaulted) are
    transformed before the original constructor sees them."""
    import inspect
    original = cls.__init__
    sig = inspect.signature(original)

    @functools.wraps(original)  # keeps the signature, which registry.mirror inspects for rngs
    def init(self, *args, **kw):
        bound = sig.bind(self, *args, **kw)
        bound.apply_defaults()
        for key, f in change.items():
            bound.arguments[key] = f(bound.arguments[key])
        original(*bound.args, **bound.kwargs)
    return patched(cls, "__init__", init)


def _attention():
    from jaxformer.layers import attention
    return attention


def _sdpa_wrapper(transform: Callable) -> AbstractContextManager:
    """Patch dot_product_attention with transform(original, q, k, v, **kw)."""
    att = _attention()
    original = att.dot_product_attention

    def sdpa(q, k, v, **kw):
        return transform(original, q, k, v, **kw)
    return patched(att, "dot_product_attention", sdpa)


# ----------------------------------------------------------------------------- the bugs
def _layernorm_eps():
    from jaxformer.layers import norm
    return _wrap_init(norm.LayerNorm, eps=lambda e: e * 10)


def _rmsnorm_eps_outside():
    import jax.numpy as jnp

    from jaxformer.layers import norm

    def call(self, x):
        x32 = x.astype(jnp.float32)
        y = x32 / (jnp.sqrt(jnp.mean(jnp.square(x32), axis=-1, keepdims=True)) + self.eps)
        return (y * self.scale[...]).astype(x.dtype)
    return patched(norm.RMSNorm, "__call__", call)


def _gelu_tanh():
    from jaxformer.layers import ffn
    return patched(ffn, "gelu_exact", ffn.gelu_tanh)


def _scale_by_width():
    def f(orig, q, k, v, scores=None, **kw):
        scores = _attention().ScoreMods() if scores is None else scores
        if scores.scale is None:  # H * K = model width
            scores = dataclasses.replace(scores, scale=1.0 / math.sqrt(q.shape[2] * q.shape[3]))
        return orig(q, k, v, scores=scores, **kw)
    return _sdpa_wrapper(f)


def _causal_off_by_one():
    import jax.numpy as jnp
    att = _attention()

    def make_causal_mask(q_len, k_len=None, offset=0):
        k_len = q_len if k_len is None else k_len
        q = jnp.arange(q_len)[:, None] + offset
        return (jnp.arange(k_len)[None, :] <= q + 1)[None, None]  # sees one token ahead
    return patched(att, "make_causal_mask", make_causal_mask)


def _rope_interleaved():
    import jax.numpy as jnp

    from jaxformer.layers import positional

    def rotate_every_two(x):  # GPT-J pairs (2i, 2i+1) against rotate-half tables
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return jnp.stack([-x2, x1], axis=-1).reshape(x.shape)
    return patched(positional, "rotate_half", rotate_every_two)


def _rope_base():
    from jaxformer.layers import positional
    return _wrap_init(positional.RotaryEmbedding, base=lambda b: b * 1.001)


def _alibi_pow2():
    import jax.numpy as jnp

    from jaxformer.layers import positional

    def alibi_bias(num_heads, q_positions, k_positions):  # 2^(-8 i / H) for every H: wrong unless 2^n
        slopes = jnp.asarray([2.0 ** (-8.0 * (i + 1) / num_heads) for i in range(num_heads)],
                             jnp.float32)[None, :, None, None]
        dist = jnp.abs(q_positions[:, None, :, None] - k_positions[:, None, None, :])
        return -slopes * dist.astype(jnp.float32)
    return patched(positional, "alibi_bias", alibi_bias)


def _t5_flipped():
    from jaxformer.layers import positional
    return _wrap_init(positional.T5RelativePositionBias, bidirectional=lambda b: not b)


def _gqa_tiled():
    import jax.numpy as jnp

    def f(orig, q, k, v, kv_head_major=False, **kw):
        h, g = q.shape[2], k.shape[1 if kv_head_major else 2]
        if g != h:  # query head h reads kv head h % G (tile) instead of h // R
            axis = 1 if kv_head_major else 2
            k, v = jnp.tile(k, (1,) * axis + (h // g,) + (1,) * (3 - axis)), \
                jnp.tile(v, (1,) * axis + (h // g,) + (1,) * (3 - axis))
        return orig(q, k, v, kv_head_major=kv_head_major, **kw)
    return _sdpa_wrapper(f)


def _softmax_bf16():
    import jax
    import jax.numpy as jnp
    original = jax.nn.softmax

    def softmax(x, axis=-1, **kw):
        return original(x.astype(jnp.bfloat16), axis=axis, **kw).astype(x.dtype)
    return patched(jax.nn, "softmax", softmax)


def _dropout_in_eval():
    from flax import nnx
    original = nnx.Module.eval

    def eval_(self, **kw):
        original(self, **kw)
        for _, m in nnx.iter_modules(self):
            if isinstance(m, nnx.Dropout):
                m.deterministic = False  # eval() forgot the dropouts
    return patched(nnx.Module, "eval", eval_)


def _key_bias_cut_under_rope():
    att = _attention()
    original = att.key_projection

    def key_projection(linear, x, *, rotated=False):
        return original(linear, x, rotated=False)  # cut even though RoPE rotates b_k
    return patched(att, "key_projection", key_projection)


def _padding_inverted():
    att = _attention()

    def make_padding_mask(valid):
        return ~valid.astype(bool)[:, None, None, :]  # True = padding
    return patched(att, "make_padding_mask", make_padding_mask)


def _masked_rows_mean_v():
    import jax.numpy as jnp

    def f(orig, q, k, v, mask=None, **kw):
        if mask is not None:  # a row with no visible key attends to every key (mean of V)
            mask = mask | ~jnp.any(mask, axis=-1, keepdims=True)
        return orig(q, k, v, mask=mask, **kw)
    return _sdpa_wrapper(f)


def _sinks_per_kv_head():
    import jax.numpy as jnp

    def f(orig, q, k, v, scores=None, kv_head_major=False, **kw):
        sinks = None if scores is None else scores.sinks
        if sinks is not None:  # each query group shares its first head's sink (a [G] sink layout)
            g = k.shape[1 if kv_head_major else 2]
            r = sinks.shape[0] // g
            scores = dataclasses.replace(scores, sinks=jnp.repeat(sinks.reshape(g, r)[:, 0], r))
        return orig(q, k, v, scores=scores, kv_head_major=kv_head_major, **kw)
    return _sdpa_wrapper(f)


def _embedding_unscaled():
    from jaxformer.layers import embedding
    return _wrap_init(embedding.Embedding, scale=lambda s: False)


def _sinusoid_offset():
    import jax.numpy as jnp

    from jaxformer import tables
    from jaxformer.layers import positional

    def call(self, positions):  # positions counted from 1
        return jnp.take(jnp.asarray(tables.sinusoid_table(self.max_len + 1, self.dim)), positions + 1, axis=0)
    return patched(positional.SinusoidalPositionalEncoding, "__call__", call)


def _moe():
    from jaxformer.layers import moe
    return moe


def _moe_no_renormalise():
    return patched(_moe(), "renormalise", lambda w, eps=0.0: w)  # the top-k weights left unnormalised


def _moe_aux_on_topk_weights():
    import jax
    import jax.numpy as jnp
    moe = _moe()
    original = moe.load_balance_probs

    def probs(logits):  # the renormalised top-k weights (zeros elsewhere) instead of the full softmax
        p = original(logits)
        w, idx = moe.topk(p, 2)
        return jnp.sum(jax.nn.one_hot(idx, p.shape[-1]) * moe.renormalise(w)[..., None], axis=-2)
    return patched(moe, "load_balance_probs", probs)


def _moe_experts_reversed():
    moe = _moe()
    original = moe.Experts.__call__

    def call(self, x, indices, weights):  # expert e's tokens go to expert E-1-e
        return original(self, x, self.cfg.num_experts - 1 - indices, weights)
    return patched(moe.Experts, "__call__", call)


def _segment_positions_not_restarted():
    import jax.numpy as jnp

    from jaxformer.models import common
    # packed documents keep the window's positions 0 .. T-1
    return patched(common, "positions_from_segments",
                   lambda seg: jnp.broadcast_to(jnp.arange(seg.shape[1], dtype=jnp.int32), seg.shape))


def _segment_mask_dropped():
    from jaxformer.layers import attention
    # only the padding part of the segment mask: documents see the ones before them
    return patched(attention, "make_segment_mask", lambda seg: (seg != 0)[:, None, None, :])


def _lora():
    from jaxformer.layers import lora
    return lora


def _lora_scaling_alpha():
    lora = _lora()
    original = lora.LoRALinear.__init__

    @functools.wraps(original)
    def init(self, *args, **kw):
        original(self, *args, **kw)
        self.scaling = self.scaling * self.r  # alpha instead of alpha / r
    return patched(lora.LoRALinear, "__init__", init)


def _lora_b_random():
    from flax import nnx
    lora = _lora()
    original = lora.adapter_inits

    def adapter_inits(init, r):  # B drawn like A instead of zeros: a fresh adapter changes the model
        a, _ = original(init, r)
        return a, nnx.initializers.normal(stddev=0.02)
    return patched(lora, "adapter_inits", adapter_inits)


def _lora_dropout_on_base():
    lora = _lora()
    original = lora.LoRALinear.__call__

    def call(self, x, stop_bias_gradient=False):  # the base sees the dropped-out input too
        return original(self, self.lora_dropout(x), stop_bias_gradient)
    return patched(lora.LoRALinear, "__call__", call)


def _lora_base_not_frozen():
    lora = _lora()
    from jaxformer.layers.linear import Linear

    def call(self, x, stop_bias_gradient=False):  # the base without stop_gradient: it would train
        return Linear.__call__(self, x, stop_bias_gradient) + \
            self.lora_B(self.lora_A(self.lora_dropout(x))) * self.scaling
    return patched(lora.LoRALinear, "__call__", call)


def _lora_wrong_module():
    lora = _lora()
    original = lora.find_targets

    def find_targets(model, cfg):  # the adapter lands on v_proj where q_proj was asked for
        swap = lambda p: p.replace("q_proj", "v_proj") if isinstance(p, str) else p
        return {swap(k): tuple(swap(p) for p in path) for k, path in original(model, cfg).items()}
    return patched(lora, "find_targets", find_targets)


def _blockwise():
    from jaxformer.layers.kernels import blockwise
    return blockwise


def _blockwise_no_rescale():
    import jax.numpy as jnp
    # the running sums kept when the running max grows (exp(m_old - m_new) forgotten)
    return patched(_blockwise(), "_rescale", lambda m_old, m_new: jnp.ones_like(m_new))


def _blockwise_lse_log2():
    # the backward reads the natural-log lse as log2 units (the exp2 convention of FA kernels):
    # the forward stays right, only the recomputed probabilities and so the gradients are wrong
    return patched(_blockwise(), "_lse_for_backward", lambda lse: lse / math.log(2.0))


for _m in [
    Mutation("layernorm_eps_10x", "LayerNorm eps 1e-4 instead of 1e-5", _layernorm_eps,
             ("norm_layernorm_eps_small_std",)),
    Mutation("rmsnorm_eps_outside_sqrt", "RMSNorm x / (rms + eps) instead of x / sqrt(ms + eps)",
             _rmsnorm_eps_outside, ("norm_rmsnorm_eps_small_std",)),
    Mutation("gelu_tanh_for_exact", "tanh GELU where the model uses exact erf GELU", _gelu_tanh, ("ffn_gelu",)),
    Mutation("attention_scaled_by_model_width", "scores / sqrt(D) instead of / sqrt(head dim)",
             _scale_by_width, ("mha_self_padding",)),
    Mutation("causal_mask_off_by_one", "a query sees the next token", _causal_off_by_one, ("lm_gpt2",)),
    Mutation("rope_interleaved", "RoPE pairs (2i, 2i+1) (GPT-J) instead of rotate-half (NeoX/LLaMA)",
             _rope_interleaved, ("pos_rope_rotate_half",)),
    Mutation("rope_base_0.1pct", "RoPE base 10010 instead of 10000", _rope_base,
             ("pos_rope_long_positions",), grads_too=True),
    Mutation("alibi_slopes_non_pow2", "ALiBi slopes 2^(-8i/H) for every H (wrong unless H = 2^n)",
             _alibi_pow2, ("pos_alibi_6_heads",)),
    Mutation("t5_bidirectional_flipped", "T5 buckets with the bidirectional flag flipped", _t5_flipped,
             ("pos_t5_bias_causal",)),
    Mutation("gqa_heads_tiled", "query head h reads kv head h % G instead of h // (H/G)", _gqa_tiled,
             ("sdpa_fused_gqa",)),
    Mutation("softmax_bf16", "attention softmax computed in bf16", _softmax_bf16,
             ("sdpa_weights_nomask",)),
    Mutation("dropout_active_in_eval", "eval() leaves dropout on", _dropout_in_eval, ("mha_dropout_in_eval",)),
    Mutation("key_bias_cut_under_rope", "key-bias gradient cut although RoPE rotates it",
             _key_bias_cut_under_rope, ("lm_llama_rope_bias",), grads_too=True),
    Mutation("padding_mask_inverted", "padding mask polarity inverted (True = pad)", _padding_inverted,
             ("text_encoder_preln_padding",)),
    Mutation("masked_rows_mean_v", "a query with no visible key returns mean(V), not 0", _masked_rows_mean_v,
             ("sdpa_fused_fully_masked_rows",)),
    Mutation("attention_sinks_per_kv_head", "gpt-oss sinks shared per key/value group, not one per query head",
             _sinks_per_kv_head, ("sdpa_sinks_sliding_gqa",), grads_too=True),
    Mutation("embedding_not_scaled", "token embedding without its sqrt(D) factor", _embedding_unscaled,
             ("embedding_scaled",)),
    Mutation("sinusoid_positions_from_1", "sinusoidal positions counted from 1", _sinusoid_offset,
             ("pos_sinusoidal",)),
    Mutation("moe_topk_not_renormalised", "MoE top-k weights not renormalised to sum to 1",
             _moe_no_renormalise, ("router_softmax_topk",)),
    Mutation("moe_aux_on_topk_weights", "load-balancing loss on the renormalised top-k weights, not the full softmax",
             _moe_aux_on_topk_weights, ("moe_aux_losses_padding",), grads_too=True),
    Mutation("moe_experts_reversed", "tokens sent to expert E-1-e instead of e", _moe_experts_reversed,
             ("moe_softmax_topk",), grads_too=True),
    Mutation("segment_positions_not_restarted", "packed documents keep the window's positions",
             _segment_positions_not_restarted, ("lm_gpt2_segments",), grads_too=True),
    Mutation("segment_mask_dropped", "packed documents attend to the ones before them",
             _segment_mask_dropped, ("lm_gpt2_segments",), grads_too=True),
    Mutation("lora_scaling_alpha", "LoRA scaling alpha instead of alpha / r", _lora_scaling_alpha,
             ("lora_linear",), grads_too=True),
    Mutation("lora_b_random_init", "LoRA B initialised random (a fresh adapter changes the output)",
             _lora_b_random, ("lora_fresh_linear_kaiming",)),
    Mutation("lora_dropout_on_base", "LoRA dropout applied to the base path's input too", _lora_dropout_on_base,
             ("lora_linear_dropout_train",)),
    Mutation("lora_wrong_module", "LoRA adapter on v_proj where target_modules asks for q_proj", _lora_wrong_module,
             ("lora_llama_targets_q_only",)),
    Mutation("lora_base_not_frozen", "LoRA base weights get a gradient (no stop_gradient)", _lora_base_not_frozen,
             ("lora_linear",), grads_too=True),
    Mutation("blockwise_running_max_not_rescaled", "blockwise attention keeps its running sums unscaled when "
             "the running max grows", _blockwise_no_rescale,
             ("blockwise_causal_odd_length",)),
    Mutation("blockwise_backward_lse_log2", "blockwise attention's backward reads the log-sum-exp in log2 "
             "units (forward right, gradients wrong)", _blockwise_lse_log2,
             ("blockwise_sinks_padded_gqa",), grads_too=True),
]:
    register(_m)


# ----------------------------------------------------------------------------- running
def run_on_cases(m: Mutation, seed: int = 0) -> Outcome:
    """Run m's named registry cases under the bug; caught = every one of them fails (and on
    gradients too when m.grads_too)."""
    from jaxformer.parity.registry import load_all, run_case
    cases = load_all()
    missing = [c for c in m.cases if c not in cases]
    if missing:
        raise ValueError(f"mutation {m.name}: unknown parity case(s) {missing}")
    caught, worst, detail = True, 0.0, {}
    for name in m.cases:
        with m.patch():
            try:
                r = run_case(cases[name], seed, locate=False)  # every case fails here: only the verdict counts
            except Exception as e:  # the mutation itself is broken: not a catch
                detail[name] = f"MISSED: raised {type(e).__name__}: {e}"
                caught = False
                continue
        # a leaf the float64 referee excused (docs/numerics.md §32) reads as passing here
        g = max((d.ratio for d in r.grads.values()), default=0.0)
        fails = not r.ok and (not m.grads_too or g > 1)
        caught &= fails
        worst = max(worst, r.worst_ratio)
        ref = r.refereed.get(r.worst_leaf)
        detail[name] = (f"{'caught' if fails else 'MISSED'}: worst {r.worst_leaf} at "
                        f"{r.worst_ratio:.3g}x tol{f' ({ref.side} off)' if ref else ''}, gradients {g:.3g}x tol")
    return Outcome(m.name, caught, worst, detail)


def self_test(mutations=None, trajectory: Callable[[Mutation], Outcome] | None = None,
              extra: dict[str, Mutation] | None = None, progress: Callable[[Outcome], None] | None = None,
              reference: Callable[[Mutation], Outcome] | None = None) -> list[Outcome]:
    """Run every mutation against its checks. `trajectory(m)` runs a trajectory-flagged mutation
    (jaxformer/train/trajectory.py), `reference(m)` one in shared code (train/shared_checks.py);
    `extra` adds mutations defined above this package."""
    catalogue = {**MUTATIONS, **(extra or {})}
    names = list(catalogue) if mutations is None else list(mutations)
    out = []
    for n in names:
        if n not in catalogue:
            raise ValueError(f"unknown mutation {n!r}; known: {', '.join(catalogue)}")
        m = catalogue[n]
        if m.reference is not None:
            if reference is None:
                raise ValueError(f"mutation {n} needs the reference check")
            o = reference(m)
        elif m.trajectory:
            if trajectory is None:
                raise ValueError(f"mutation {n} needs the trajectory check")
            o = trajectory(m)
        else:
            o = run_on_cases(m)
        out.append(o)
        if progress:
            progress(o)
    return out


__all__ = ["Mutation", "Outcome", "MUTATIONS", "register", "patched", "run_on_cases", "self_test"]
