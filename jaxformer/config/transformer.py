"""Config for Transformer stacks (encoder, decoder, decoder-only) shared by both trees."""
from __future__ import annotations

from dataclasses import dataclass

from jaxformer.config.base import check, check_choice
from jaxformer.config.moe import MLAConfig, MoEConfig
from jaxformer.config.rules import (
    Rule,
    as_tuples,
    at_most,
    check_rules,
    choice,
    is_number,
    number_or_null,
    positive,
    positive_int,
    positive_number,
    probability,
)

FFN_KINDS = ("relu", "gelu", "gelu_tanh", "silu", "swiglu", "geglu", "geglu_tanh")
NORM_KINDS = ("layernorm", "rmsnorm", "rmsnorm_offset")
NORM_POSITIONS = ("pre", "post", "sandwich", "post_sublayer")
LAYER_TYPES = ("full_attention", "sliding_attention")  # HF's layer_types names
POSITION_KINDS = ("sinusoidal", "learned", "rope", "alibi", "t5", "none")
ROPE_SCALING_KINDS = ("linear", "dynamic", "llama3", "yarn", "longrope")
# Sizes beyond any real model (the largest published: 126 layers, width 25,600, ffn 73,728,
# vocab 262,144, 128 heads, 10 M positions; DeepNet trained 1,000 layers). A config past them is
# corrupt or hostile: 3,000 layers took minutes to build before any check could run.
SIZE_LIMITS = {"num_layers": 1024, "d_model": 1 << 16, "d_ff": 1 << 19, "vocab_size": 1 << 24,
               "num_heads": 4096, "num_kv_heads": 4096, "head_dim": 1 << 14, "max_len": 1 << 27}


@dataclass(frozen=True)
class RopeScaling:
    """RoPE frequency scaling as transformers 5.x computes it (modeling_rope_utils.py;
    docs/numerics.md §20). The inverse frequencies come from jaxformer.tables.rope_inv_freq.

    rope_type: "linear" (inv_freq / factor), "dynamic" (NTK: the base grows with the run's
        sequence length once it exceeds original_max_len), "llama3" (Llama 3.1's banded
        interpolation), "yarn" (ramped interpolation plus an attention factor on cos/sin).
    factor: the context extension factor (>= 1 for llama3 and yarn; > 0 otherwise).
    original_max_len: llama3 / yarn: the pretraining context (HF original_max_position_embeddings);
        dynamic: HF's max_position_embeddings, the length beyond which the base grows.
    low_freq_factor, high_freq_factor: llama3's band edges.
    beta_fast, beta_slow, attention_factor, mscale, mscale_all_dim, truncate: yarn's options
        (attention_factor None = derived from factor, mscale and mscale_all_dim, as HF does).
    longrope (Phi-3, docs/numerics.md §34): short_factor, long_factor divide the frequencies of
        a call whose largest position + 1 is <= original_max_len, resp. beyond it (one number
        per rotated frequency: head_dim / 2 of them); attention_factor multiplies cos and sin
        (None = sqrt(1 + ln(factor) / ln(original_max_len)), 1 for factor <= 1).
    """

    rope_type: str
    factor: float
    original_max_len: int | None = None
    low_freq_factor: float | None = None
    high_freq_factor: float | None = None
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    attention_factor: float | None = None
    mscale: float | None = None
    mscale_all_dim: float | None = None
    truncate: bool = True
    short_factor: tuple[float, ...] | None = None
    long_factor: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        check_choice(self, "rope_type", ROPE_SCALING_KINDS)
        for name in ("short_factor", "long_factor"):
            value = getattr(self, name)
            if isinstance(value, list):  # YAML / JSON lists; a tuple keeps the config hashable
                object.__setattr__(self, name, tuple(value))
            value = getattr(self, name)
            if self.rope_type == "longrope":
                check(isinstance(value, tuple) and len(value) > 0 and all(
                    isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in value),
                    name, f"longrope needs a list of numbers > 0 (one per rotated frequency), got {value!r}")
                object.__setattr__(self, name, tuple(float(v) for v in value))
            else:
                check(value is None, name, f"is a longrope option; {self.rope_type} scaling does not use it")
        check(isinstance(self.factor, (int, float)) and not isinstance(self.factor, bool)
              and self.factor > 0, "factor", f"must be a number > 0, got {self.factor!r}")
        if self.rope_type in ("llama3", "yarn"):
            check(self.factor >= 1, "factor", f"{self.rope_type} needs factor >= 1, got {self.factor}")
        if self.rope_type in ("dynamic", "llama3", "yarn", "longrope"):
            check(isinstance(self.original_max_len, int) and self.original_max_len > 0,
                  "original_max_len", f"{self.rope_type} needs an int > 0, got {self.original_max_len!r}")
        else:
            check(self.original_max_len is None, "original_max_len",
                  f"is not used by {self.rope_type} scaling; leave it null")
        if self.rope_type == "llama3":
            for name in ("low_freq_factor", "high_freq_factor"):
                check(isinstance(getattr(self, name), (int, float)) and getattr(self, name) > 0,
                      name, f"llama3 needs a number > 0, got {getattr(self, name)!r}")
            check(self.high_freq_factor > self.low_freq_factor, "high_freq_factor",
                  f"must exceed low_freq_factor={self.low_freq_factor}, got {self.high_freq_factor}")
        else:
            check(self.low_freq_factor is None and self.high_freq_factor is None, "low_freq_factor",
                  f"low_freq_factor/high_freq_factor are llama3 options, not {self.rope_type}'s")
        if self.rope_type != "yarn":
            yarn = dict(beta_fast=32.0, beta_slow=1.0, mscale=None, mscale_all_dim=None, truncate=True)
            if self.rope_type != "longrope":
                yarn["attention_factor"] = None
            for name, default in yarn.items():
                check(getattr(self, name) == default, name,
                      f"is a yarn option; {self.rope_type} scaling does not use it")
        if self.attention_factor is not None:
            check(self.attention_factor > 0, "attention_factor", f"must be > 0, got {self.attention_factor}")


@dataclass(frozen=True)
class TransformerConfig:
    """Hyper-parameters of a Transformer stack. Every default that differs between the
    frameworks (LayerNorm eps, GELU variant) is named here, never inherited."""

    vocab_size: int = 1000
    d_model: int = 64
    num_heads: int = 4
    num_kv_heads: int | None = None  # grouped-query attention; None = num_heads
    head_dim: int | None = None  # None = d_model // num_heads
    d_ff: int = 256
    num_layers: int = 2
    ffn: str = "relu"
    norm: str = "layernorm"  # rmsnorm_offset: RMSNorm scaled by (1 + w), w stored around 0 (Gemma)
    norm_eps: float = 1e-5
    norm_position: str = "post"  # sandwich: pre norm and a norm on the sublayer output (Gemma2);
    #   post_sublayer: only the norm on the sublayer output, x + norm(sublayer(x)) (OLMo 2)
    parallel_residual: bool = False  # x + attn(attn_norm(x)) + ffn(ffn_norm(x)), pre-norm only (GPT-NeoX)
    final_norm: bool = True
    bias: bool = True  # biases in attention and FFN projections (default of the three below)
    attn_qkv_bias: bool | None = None  # biases on q/k/v projections; None = bias
    attn_out_bias: bool | None = None  # bias on the attention output projection; None = bias
    ffn_bias: bool | None = None  # biases in the FFN projections; None = bias
    norm_bias: bool = True  # LayerNorm bias (RMSNorm has none)
    dropout: float = 0.0  # residual dropout on each sublayer output
    attn_dropout: float = 0.0  # dropout on attention weights
    ffn_dropout: float = 0.0  # dropout inside the FFN (after the activation)
    embed_dropout: float = 0.0  # dropout after embeddings + positions
    position: str = "sinusoidal"
    max_len: int = 512
    rope_base: float = 10000.0
    rope_scaling: RopeScaling | None = None  # RoPE frequency scaling (Llama 3.x, YaRN, ...)
    rotary_dim: int | None = None  # RoPE rotates the first rotary_dim dims of each head; None = all
    #   (GPT-NeoX's rotary_pct, partial_rotary_factor; docs/numerics.md §35)
    rope_local_base: float | None = None  # the sliding-window layers' own RoPE base (Gemma3,
    #   ModernBERT); None = they rotate as the full layers (rope_base, rope_scaling) (§33, §36)
    rope_local_scaling: RopeScaling | None = None  # their scaling, with rope_local_base; None = unscaled
    qk_norm: bool = False  # a per-head norm (`norm`, `norm_eps`) on q and k before RoPE (Qwen3)
    qk_norm_full: bool = False  # one norm over all heads' q (H*K) and k (G*K) before the head
    #   split and RoPE (OLMo 2; docs/numerics.md §35)
    rel_num_buckets: int = 32  # T5 relative position bias
    rel_max_distance: int = 128
    attn_scale: float | None = None  # attention score scale; None = 1/sqrt(head_dim) (T5: 1.0)
    sliding_window: int | None = None  # a query sees itself and the window - 1 keys before it
    layer_types: tuple[str, ...] | None = None  # per layer full_attention | sliding_attention; None = all
    #   layers sliding when sliding_window is set (Mistral), else all full (docs/numerics.md §21)
    attn_logit_softcap: float | None = None  # scores -> cap * tanh(scores / cap) before masking (Gemma2)
    query_pre_attn_scalar: float | None = None  # scores scaled by its -1/2 power; None = head_dim
    scale_embedding: bool = True  # multiply token embeddings by sqrt(d_model)
    pad_id: int = 0
    scan_layers: bool = False  # JAX: stack identical layers, run them with lax.scan (torch loops)
    # BERT options (Devlin et al. 2019); the defaults leave every other model unchanged
    type_vocab_size: int = 0  # token type (segment) embeddings added to the tokens; 0 = none
    embed_norm: bool = False  # a norm (`norm`, `norm_eps`) on the summed embeddings
    pooler: bool = False  # encoder / classifier: dense + tanh on the pooled ([CLS]) vector
    # RoBERTa / ModernBERT options (docs/numerics.md §36); the defaults leave every other model unchanged
    positions_from_padding: bool = False  # absolute positions count the non-pad tokens (ids != pad_id)
    #   from pad_id + 1, pad tokens sit at pad_id (HF RoBERTa's create_position_ids_from_input_ids)
    first_attn_norm: bool = True  # False: layer 0 has no attn_norm (ModernBERT: the embedding norm precedes it)
    # Mixture of experts and DeepSeek / gpt-oss attention (jaxformer/config/moe.py)
    moe: MoEConfig | None = None  # the sparse layers' FFN is a mixture of experts; None = dense
    mla: MLAConfig | None = None  # multi-head latent attention in place of q/k/v projections
    attn_sinks: bool = False  # a learned per-head logit in every softmax denominator (gpt-oss)
    diff_attn: float | None = None  # differential attention (Diff Transformer) with this lambda_init;
    #   None = one softmax map (layers/diff_attention.py)
    # LayerScale (Touvron et al. 2021, CaiT; DINOv2, timm ViTs with init_values): a learned
    # per-channel scale `gamma` on every sublayer output, initialised to this value; None = none
    layer_scale: float | None = None

    def normalise(self) -> None:
        as_tuples(self, "layer_types")

    def __post_init__(self) -> None:
        self.normalise()
        check_rules(self)

    RULES = (  # not annotated: a class attribute, never a dataclass field (nor a pseudo-field)
        *positive("vocab_size", "d_model", "num_heads", "d_ff", "num_layers", "max_len", "rel_num_buckets",
                  "rel_max_distance"),
        *at_most(SIZE_LIMITS),
        choice("ffn", FFN_KINDS), choice("norm", NORM_KINDS), choice("norm_position", NORM_POSITIONS),
        choice("position", POSITION_KINDS),
        *probability("dropout", "attn_dropout", "ffn_dropout", "embed_dropout"),
        Rule("diff_attn_lambda_init", "diff_attn", lambda c: 0 < c.diff_attn < 1, "lambda_init must be in (0, 1), "
             "got {diff_attn}", when=lambda c: c.diff_attn is not None),
        *(Rule(f"diff_attn_no_{n}", n, lambda c, n=n: not getattr(c, n), "is not supported with diff_attn",
               when=lambda c: c.diff_attn is not None) for n in ("mla", "attn_sinks", "qk_norm", "qk_norm_full",
                                                                 "attn_dropout", "rotary_dim")),
        Rule("diff_attn_even_head", "head_dim", lambda c: c.resolved_head_dim % 2 == 0,
             "diff_attn splits each head in two halves: head_dim {resolved_head_dim} is odd",
             when=lambda c: c.diff_attn is not None),
        Rule("norm_eps_positive", "norm_eps", lambda c: c.norm_eps > 0, "must be > 0, got {norm_eps}"),
        Rule("rope_base_positive", "rope_base", lambda c: c.rope_base > 0, "must be > 0, got {rope_base}"),
        number_or_null("attn_scale", "null (1/sqrt(head_dim))"),
        Rule("one_score_scale", "attn_scale", lambda c: c.attn_scale is None or c.query_pre_attn_scalar is None,
             "set attn_scale or query_pre_attn_scalar, not both (both set the score scale)"),
        Rule("heads_divide_width", "d_model", lambda c: c.d_model % c.num_heads == 0,
             "d_model={d_model} is not divisible by num_heads={num_heads}",
             when=lambda c: c.head_dim is None and c.mla is None),  # mla: its own widths
        *positive("head_dim", "num_kv_heads", optional=True),
        Rule("kv_heads_divide_heads", "num_kv_heads",
             lambda c: c.num_kv_heads <= c.num_heads and c.num_heads % c.num_kv_heads == 0,
             "num_heads={num_heads} must be a multiple of num_kv_heads={num_kv_heads}",
             when=lambda c: c.num_kv_heads is not None),
        Rule("rope_even_head", "head_dim", lambda c: c.resolved_head_dim % 2 == 0, "RoPE needs an even head_dim",
             when=lambda c: c.position == "rope" and c.mla is None),  # mla rotates qk_rope_head_dim
        # T5's log-spaced buckets divide by log(max_distance / max_exact)
        Rule("t5_buckets", "rel_num_buckets", lambda c: c.rel_num_buckets >= 4,
             "T5 buckets need >= 4, got {rel_num_buckets}", when=lambda c: c.position == "t5"),
        Rule("t5_max_distance", "rel_max_distance", lambda c: c.rel_max_distance > c.rel_num_buckets // 2,
             lambda c: f"must exceed rel_num_buckets // 2 = {c.rel_num_buckets // 2} (the exact buckets), "
                       f"got {c.rel_max_distance}",
             when=lambda c: c.position == "t5"),
        *positive("sliding_window", optional=True),
        Rule("layer_types_per_layer", "layer_types",
             lambda c: len(c.layer_types) == c.num_layers and all(t in LAYER_TYPES for t in c.layer_types),
             "must be {num_layers} entries (num_layers) of " + str(LAYER_TYPES) + ", got {layer_types!r}",
             when=lambda c: c.layer_types is not None),
        Rule("sliding_layers_need_window", "layer_types",
             lambda c: c.sliding_window is not None or "sliding_attention" not in c.layer_types,
             "sliding_attention layers need sliding_window", when=lambda c: c.layer_types is not None),
        number_or_null("attn_logit_softcap"), number_or_null("query_pre_attn_scalar"),
        Rule("rotary_dim_under_rope", "rotary_dim", lambda c: c.position == "rope" and c.mla is None,
             "rotates part of each head under RoPE; position is {position!r}{with_mla}",
             when=lambda c: c.rotary_dim is not None),
        Rule("rotary_dim_even", "rotary_dim",
             lambda c: positive_int(c.rotary_dim) and c.rotary_dim <= c.resolved_head_dim and c.rotary_dim % 2 == 0,
             "must be an even int in (0, head_dim={resolved_head_dim}], got {rotary_dim!r}",
             when=lambda c: c.rotary_dim is not None),
        Rule("one_qk_norm", "qk_norm_full", lambda c: not (c.qk_norm and c.qk_norm_full),
             "set qk_norm (per head, Qwen3) or qk_norm_full (the full width, OLMo 2), not both"),
        Rule("qk_norm_full_without_mla", "qk_norm_full", lambda c: not c.qk_norm_full or c.mla is None,
             "is not supported with mla"),
        Rule("parallel_residual_pre_norm", "parallel_residual", lambda c: c.norm_position == "pre",
             "runs both sublayers on pre-norms of the layer input; norm_position is {norm_position!r}",
             when=lambda c: c.parallel_residual),
        Rule("parallel_residual_plain", "parallel_residual", lambda c: c.layer_scale is None and c.first_attn_norm,
             "GPT-NeoX's parallel block has no LayerScale and a norm before both sublayers "
             "(layer_scale null, first_attn_norm true)", when=lambda c: c.parallel_residual),
        Rule("rope_scaling_under_rope", "rope_scaling", lambda c: c.position == "rope",
             "scales RoPE; position is {position!r}", when=lambda c: c.rope_scaling is not None),
        Rule("dynamic_rope_width", "rope_scaling", lambda c: c.resolved_rotary_dim > 2 or c.mla is not None,
             "dynamic scaling needs a rotated width > 2 (its exponent is K / (K - 2))",
             when=lambda c: c.rope_scaling is not None and c.rope_scaling.rope_type == "dynamic"),
        *(Rule(f"longrope_{n}_per_frequency", "rope_scaling",
               lambda c, n=n: len(getattr(c.rope_scaling, n)) == c.rotated_width // 2,
               lambda c, n=n: f"longrope {n} has {len(getattr(c.rope_scaling, n))} entries; the rotated head "
                              f"width {c.rotated_width} needs {c.rotated_width // 2}",
               when=lambda c: c.rope_scaling is not None and c.rope_scaling.rope_type == "longrope")
          for n in ("short_factor", "long_factor")),
        Rule("positions_from_padding_absolute", "positions_from_padding",
             lambda c: c.position in ("learned", "sinusoidal"),
             "offsets absolute position tables; position is {position!r}", when=lambda c: c.positions_from_padding),
        Rule("positions_from_padding_fit", "positions_from_padding", lambda c: c.pad_id + 1 < c.max_len,
             lambda c: f"the first position is pad_id + 1 = {c.pad_id + 1}, outside max_len={c.max_len}",
             when=lambda c: c.positions_from_padding),
        Rule("rope_local_base_positive", "rope_local_base", lambda c: positive_number(c.rope_local_base),
             "must be a number > 0 or null (rope_base), got {rope_local_base!r}",
             when=lambda c: c.rope_local_base is not None),
        Rule("rope_local_base_under_rope", "rope_local_base", lambda c: c.position == "rope" and c.mla is None,
             "is the RoPE base of sliding-window layers; position is {position!r}{with_mla}",
             when=lambda c: c.rope_local_base is not None),
        Rule("first_attn_norm_pre", "first_attn_norm", lambda c: c.first_attn_norm or c.norm_position == "pre",
             "only a Pre-LN stack can drop layer 0's attn_norm; norm_position is {norm_position!r}"),
        Rule("rope_local_scaling_needs_base", "rope_local_scaling", lambda c: c.rope_local_base is not None,
             "scales the local layers' own RoPE; set rope_local_base with it",
             when=lambda c: c.rope_local_scaling is not None),
        Rule("dynamic_rope_local_width", "rope_local_scaling", lambda c: c.resolved_rotary_dim > 2,
             "dynamic scaling needs a rotated width > 2 (its exponent is K / (K - 2))",
             when=lambda c: c.rope_local_scaling is not None and c.rope_local_scaling.rope_type == "dynamic"),
        Rule("type_vocab_size_int", "type_vocab_size",
             lambda c: isinstance(c.type_vocab_size, int) and c.type_vocab_size >= 0,
             "must be an int >= 0 (0 = no token type embeddings), got {type_vocab_size!r}"),
        Rule("pad_id_in_vocab", "pad_id", lambda c: 0 <= c.pad_id < c.vocab_size,
             "must be in [0, vocab_size={vocab_size}), got {pad_id}"),
        Rule("layer_scale_number", "layer_scale", lambda c: is_number(c.layer_scale),
             "must be a number (the initial scale) or null, got {layer_scale!r}",
             when=lambda c: c.layer_scale is not None),
        Rule("layer_scale_not_sandwich", "layer_scale", lambda c: c.norm_position != "sandwich",
             "is not defined with norm_position='sandwich' (the post-norm would rescale it)",
             when=lambda c: c.layer_scale is not None),
        Rule("dense_layers_in_stack", "moe.dense_layers", lambda c: all(i < c.num_layers for i in c.moe.dense_layers),
             "indices must be < num_layers={num_layers}, got {moe.dense_layers!r}", when=lambda c: c.moe is not None),
        Rule("mla_rope", "mla", lambda c: c.position == "rope", "uses decoupled RoPE; position is {position!r}",
             when=lambda c: c.mla is not None),
        # every head reads its own keys, expanded from one shared latent: no key/value groups
        Rule("mla_no_kv_groups", "num_kv_heads", lambda c: c.num_kv_heads in (None, c.num_heads),
             "does not apply to mla (keys are per head from the latent); got {num_kv_heads}",
             when=lambda c: c.mla is not None),
        *(Rule(f"mla_no_{n}", n, lambda c, n=n: getattr(c, n) is None,
               "is not supported with mla (head widths are mla's; no sliding-window ring cache holds a latent)",
               when=lambda c: c.mla is not None) for n in ("head_dim", "sliding_window", "layer_types")),
        Rule("mla_no_qk_norm", "qk_norm", lambda c: not c.qk_norm, "is not supported with mla",
             when=lambda c: c.mla is not None),
        Rule("mla_no_local_rope", "rope_local_base", lambda c: c.rope_local_base is None,
             "is not supported with mla (no local layers)", when=lambda c: c.mla is not None),
        Rule("mla_dynamic_rope_width", "rope_scaling", lambda c: c.mla.qk_rope_head_dim > 2,
             "dynamic scaling needs qk_rope_head_dim > 2",
             when=lambda c: c.mla is not None and c.rope_scaling is not None and c.rope_scaling.rope_type == "dynamic"),
    )

    @property
    def with_mla(self) -> str:  # message text
        return " with mla" if self.mla is not None else ""

    @property
    def rotated_width(self) -> int:
        """The rotated width of each head: mla's qk_rope_head_dim, else resolved_rotary_dim."""
        return self.mla.qk_rope_head_dim if self.mla is not None else self.resolved_rotary_dim

    def sparse_layers(self) -> tuple[bool, ...]:
        """Per layer: is its FFN the mixture of experts (moe), else the dense FFN?"""
        return (False,) * self.num_layers if self.moe is None else self.moe.sparse_layers(self.num_layers)

    @property
    def resolved_head_dim(self) -> int:
        return self.head_dim if self.head_dim is not None else self.d_model // self.num_heads

    @property
    def resolved_rotary_dim(self) -> int:
        """The dims of each head RoPE rotates (rotary_dim, else the whole head)."""
        return self.resolved_head_dim if self.rotary_dim is None else self.rotary_dim

    @property
    def resolved_qkv_bias(self) -> bool:
        return self.bias if self.attn_qkv_bias is None else self.attn_qkv_bias

    @property
    def resolved_out_bias(self) -> bool:
        return self.bias if self.attn_out_bias is None else self.attn_out_bias

    @property
    def resolved_ffn_bias(self) -> bool:
        return self.bias if self.ffn_bias is None else self.ffn_bias

    def local_layers(self) -> tuple[bool, ...]:
        """Per layer: does it attend within sliding_window (layer_types, else every layer when
        sliding_window is set)?"""
        if self.sliding_window is None:
            return (False,) * self.num_layers
        if self.layer_types is None:
            return (True,) * self.num_layers
        return tuple(t == "sliding_attention" for t in self.layer_types)

    def layer_options(self, i: int) -> dict:
        """The construction options of layer i that can differ between layers: sparse (its FFN
        is the MoE), local (a sliding-window layer with a RoPE of its own: rope_local_base),
        attn_norm (False on layer 0 without first_attn_norm). Both trees build layer i with these."""
        local = self.local_layers()[i] and self.rope_local_base is not None
        return dict(sparse=self.sparse_layers()[i], local=local, attn_norm=self.first_attn_norm or i > 0)

    def layer_rope(self, local: bool) -> tuple[float, RopeScaling | None]:
        """(base, scaling) of a layer's RoPE: a sliding-window layer's own (rope_local_base,
        rope_local_scaling) when rope_local_base is set (Gemma3, docs/numerics.md §33), else
        rope_base and rope_scaling."""
        if local and self.rope_local_base is not None:
            return self.rope_local_base, self.rope_local_scaling
        return self.rope_base, self.rope_scaling

    @property
    def score_scale(self) -> float | None:
        """The attention score scale: attn_scale (T5), else query_pre_attn_scalar ** -0.5
        (Gemma2), else None (1 / sqrt(head_dim))."""
        if self.attn_scale is not None:
            return self.attn_scale
        return None if self.query_pre_attn_scalar is None else self.query_pre_attn_scalar ** -0.5

    @property
    def resolved_kv_heads(self) -> int:
        return self.num_kv_heads if self.num_kv_heads is not None else self.num_heads
