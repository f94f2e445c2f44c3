"""Config for Transformer stacks (encoder, decoder, decoder-only) shared by both trees."""
from __future__ import annotations

from dataclasses import dataclass

from jaxformer.config.base import check, check_choice, check_positive, check_prob
from jaxformer.config.moe import MLAConfig, MoEConfig

FFN_KINDS = ("relu", "gelu", "gelu_tanh", "silu", "swiglu", "geglu", "geglu_tanh")
NORM_KINDS = ("layernorm", "rmsnorm", "rmsnorm_offset")
NORM_POSITIONS = ("pre", "post", "sandwich", "post_sublayer")
LAYER_TYPES = ("full_attention", "sliding_attention")  # HF's layer_types names
POSITION_KINDS = ("sinusoidal", "learned", "rope", "alibi", "t5", "none")
ROPE_SCALING_KINDS = ("linear", "dynamic", "llama3", "yarn", "longrope")


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
    # LayerScale (Touvron et al. 2021, CaiT; DINOv2, timm ViTs with init_values): a learned
    # per-channel scale `gamma` on every sublayer output, initialised to this value; None = none
    layer_scale: float | None = None

    def __post_init__(self) -> None:
        check_positive(self, "vocab_size", "d_model", "num_heads", "d_ff", "num_layers", "max_len",
                       "rel_num_buckets", "rel_max_distance")
        check_choice(self, "ffn", FFN_KINDS)
        check_choice(self, "norm", NORM_KINDS)
        check_choice(self, "norm_position", NORM_POSITIONS)
        check_choice(self, "position", POSITION_KINDS)
        check_prob(self, "dropout", "attn_dropout", "ffn_dropout", "embed_dropout")
        check(self.norm_eps > 0, "norm_eps", f"must be > 0, got {self.norm_eps}")
        check(self.rope_base > 0, "rope_base", f"must be > 0, got {self.rope_base}")
        check(self.attn_scale is None or (isinstance(self.attn_scale, (int, float))
                                          and not isinstance(self.attn_scale, bool) and self.attn_scale > 0),
              "attn_scale", f"must be a number > 0 or null (1/sqrt(head_dim)), got {self.attn_scale!r}")
        check(self.attn_scale is None or self.query_pre_attn_scalar is None, "attn_scale",
              "set attn_scale or query_pre_attn_scalar, not both (both set the score scale)")
        if self.head_dim is None:
            check(self.d_model % self.num_heads == 0 or self.mla is not None, "d_model",  # mla: its own widths
                  f"d_model={self.d_model} is not divisible by num_heads={self.num_heads}")
        else:
            check_positive(self, "head_dim")
        if self.num_kv_heads is not None:
            check_positive(self, "num_kv_heads")
            check(self.num_kv_heads <= self.num_heads and self.num_heads % self.num_kv_heads == 0,
                  "num_kv_heads", f"num_heads={self.num_heads} must be a multiple of "
                  f"num_kv_heads={self.num_kv_heads}")
        if self.position == "rope" and self.mla is None:  # mla rotates qk_rope_head_dim
            check(self.resolved_head_dim % 2 == 0, "head_dim", "RoPE needs an even head_dim")
        if self.position == "t5":  # T5's log-spaced buckets divide by log(max_distance / max_exact)
            check(self.rel_num_buckets >= 4, "rel_num_buckets", f"T5 buckets need >= 4, got {self.rel_num_buckets}")
            check(self.rel_max_distance > self.rel_num_buckets // 2, "rel_max_distance",
                  f"must exceed rel_num_buckets // 2 = {self.rel_num_buckets // 2} (the exact buckets), "
                  f"got {self.rel_max_distance}")
        if self.sliding_window is not None:
            check_positive(self, "sliding_window")
        if isinstance(self.layer_types, list):  # YAML / JSON lists
            object.__setattr__(self, "layer_types", tuple(self.layer_types))
        if self.layer_types is not None:
            check(len(self.layer_types) == self.num_layers and all(t in LAYER_TYPES for t in self.layer_types),
                  "layer_types", f"must be {self.num_layers} entries (num_layers) of {LAYER_TYPES}, "
                  f"got {self.layer_types!r}")
            check(self.sliding_window is not None or "sliding_attention" not in self.layer_types,
                  "layer_types", "sliding_attention layers need sliding_window")
        for name in ("attn_logit_softcap", "query_pre_attn_scalar"):
            value = getattr(self, name)
            check(value is None or (isinstance(value, (int, float)) and not isinstance(value, bool)
                                    and value > 0), name, f"must be a number > 0 or null, got {value!r}")
        if self.rotary_dim is not None:
            check(self.position == "rope" and self.mla is None, "rotary_dim",
                  f"rotates part of each head under RoPE; position is {self.position!r}"
                  + (" with mla" if self.mla is not None else ""))
            check(isinstance(self.rotary_dim, int) and not isinstance(self.rotary_dim, bool)
                  and 0 < self.rotary_dim <= self.resolved_head_dim and self.rotary_dim % 2 == 0,
                  "rotary_dim", f"must be an even int in (0, head_dim={self.resolved_head_dim}], "
                  f"got {self.rotary_dim!r}")
        check(not (self.qk_norm and self.qk_norm_full), "qk_norm_full",
              "set qk_norm (per head, Qwen3) or qk_norm_full (the full width, OLMo 2), not both")
        check(not self.qk_norm_full or self.mla is None, "qk_norm_full", "is not supported with mla")
        check(not self.parallel_residual or self.norm_position == "pre", "parallel_residual",
              f"runs both sublayers on pre-norms of the layer input; norm_position is {self.norm_position!r}")
        check(not self.parallel_residual or (self.layer_scale is None and self.first_attn_norm), "parallel_residual",
              "GPT-NeoX's parallel block has no LayerScale and a norm before both sublayers "
              "(layer_scale null, first_attn_norm true)")
        if self.rope_scaling is not None:
            check(self.position == "rope", "rope_scaling",
                  f"scales RoPE; position is {self.position!r}")
            check(self.rope_scaling.rope_type != "dynamic" or self.resolved_rotary_dim > 2 or self.mla, "rope_scaling",
                  "dynamic scaling needs a rotated width > 2 (its exponent is K / (K - 2))")
            if self.rope_scaling.rope_type == "longrope":  # one factor per rotated frequency
                rotated = self.mla.qk_rope_head_dim if self.mla else self.resolved_rotary_dim
                for name in ("short_factor", "long_factor"):
                    n = len(getattr(self.rope_scaling, name))
                    check(n == rotated // 2, "rope_scaling", f"longrope {name} has {n} entries; the "
                          f"rotated head width {rotated} needs {rotated // 2}")
        if self.positions_from_padding:
            check(self.position in ("learned", "sinusoidal"), "positions_from_padding",
                  f"offsets absolute position tables; position is {self.position!r}")
            check(self.pad_id + 1 < self.max_len, "positions_from_padding",
                  f"the first position is pad_id + 1 = {self.pad_id + 1}, outside max_len={self.max_len}")
        if self.rope_local_base is not None:
            check(isinstance(self.rope_local_base, (int, float)) and not isinstance(self.rope_local_base, bool)
                  and self.rope_local_base > 0, "rope_local_base",
                  f"must be a number > 0 or null (rope_base), got {self.rope_local_base!r}")
            check(self.position == "rope" and self.mla is None, "rope_local_base",
                  f"is the RoPE base of sliding-window layers; position is {self.position!r}"
                  + (" with mla" if self.mla is not None else ""))
        check(self.first_attn_norm or self.norm_position == "pre", "first_attn_norm",
              f"only a Pre-LN stack can drop layer 0's attn_norm; norm_position is {self.norm_position!r}")
        if self.rope_local_scaling is not None:
            check(self.rope_local_base is not None, "rope_local_scaling",
                  "scales the local layers' own RoPE; set rope_local_base with it")
            check(self.rope_local_scaling.rope_type != "dynamic" or self.resolved_rotary_dim > 2, "rope_local_scaling",
                  "dynamic scaling needs a rotated width > 2 (its exponent is K / (K - 2))")
        check(isinstance(self.type_vocab_size, int) and self.type_vocab_size >= 0, "type_vocab_size",
              f"must be an int >= 0 (0 = no token type embeddings), got {self.type_vocab_size!r}")
        check(0 <= self.pad_id < self.vocab_size, "pad_id",
              f"must be in [0, vocab_size={self.vocab_size}), got {self.pad_id}")
        if self.layer_scale is not None:
            check(isinstance(self.layer_scale, (int, float)) and not isinstance(self.layer_scale, bool),
                  "layer_scale", f"must be a number (the initial scale) or null, got {self.layer_scale!r}")
            check(self.norm_position != "sandwich", "layer_scale",
                  "is not defined with norm_position='sandwich' (the post-norm would rescale it)")
        if self.moe is not None:
            self.moe.sparse_layers(self.num_layers)  # checks dense_layers against num_layers
        if self.mla is not None:
            check(self.position == "rope", "mla", f"uses decoupled RoPE; position is {self.position!r}")
            # every head reads its own keys, expanded from one shared latent: no key/value groups
            check(self.num_kv_heads in (None, self.num_heads), "num_kv_heads",
                  f"does not apply to mla (keys are per head from the latent); got {self.num_kv_heads}")
            for name in ("head_dim", "sliding_window", "layer_types"):
                check(getattr(self, name) is None, name, "is not supported with mla (head widths are "
                      "mla's; no sliding-window ring cache holds a latent)")
            check(not self.qk_norm, "qk_norm", "is not supported with mla")
            check(self.rope_local_base is None, "rope_local_base", "is not supported with mla (no local layers)")
            check(self.rope_scaling is None or self.rope_scaling.rope_type != "dynamic" or
                  self.mla.qk_rope_head_dim > 2, "rope_scaling", "dynamic scaling needs qk_rope_head_dim > 2")

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
