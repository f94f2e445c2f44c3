"""Config for Transformer stacks (encoder, decoder, decoder-only) shared by both trees."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from operator import attrgetter

from jaxformer.config.base import FlatKeywords, check, check_choice, replace
from jaxformer.config.moe import MLAConfig, MoEConfig
from jaxformer.config.rules import (
    Rule,
    _last,
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
SIZE_LIMITS = {"num_layers": 1024, "d_model": 1 << 16, "feedforward.d_ff": 1 << 19, "vocab_size": 1 << 24,
               "attention.num_heads": 4096, "attention.num_kv_heads": 4096, "attention.head_dim": 1 << 14,
               "max_len": 1 << 27}


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
class AttentionOptions:
    """`attention:` of a TransformerConfig: the heads and how they score.

    num_heads; num_kv_heads: grouped-query attention (None = num_heads); head_dim: None =
        d_model // num_heads.
    attn_scale: the score scale (None = 1/sqrt(head_dim); T5: 1.0). query_pre_attn_scalar: the
        scores are scaled by its -1/2 power instead (Gemma2); set one of the two.
    sliding_window: a query sees itself and the window - 1 keys before it. layer_types: per
        layer full_attention | sliding_attention (HF's names); None = every layer sliding when
        sliding_window is set (Mistral), else all full (docs/numerics.md §21).
    attn_logit_softcap: scores -> cap * tanh(scores / cap) before masking (Gemma2).
    qk_norm: a per-head norm (norms.kind, norms.norm_eps) on q and k before RoPE (Qwen3);
        qk_norm_full: one norm over all heads' q (H*K) and k (G*K) before the head split and
        RoPE (OLMo 2; docs/numerics.md §35). Set one of the two.
    attn_sinks: a learned per-head logit in every softmax denominator (gpt-oss).
    diff_attn: differential attention (Diff Transformer) with this lambda_init; None = one
        softmax map (layers/diff_attention.py).
    mla: multi-head latent attention in place of q/k/v projections (config/moe.py).
    attn_dropout: dropout on the attention weights.
    attn_qkv_bias, attn_out_bias: biases on the q/k/v projections, on the output projection;
        None = the config's `bias`.
    """

    num_heads: int = 4
    num_kv_heads: int | None = None
    head_dim: int | None = None
    attn_scale: float | None = None
    sliding_window: int | None = None
    layer_types: tuple[str, ...] | None = None
    attn_logit_softcap: float | None = None
    query_pre_attn_scalar: float | None = None
    qk_norm: bool = False
    qk_norm_full: bool = False
    attn_sinks: bool = False
    diff_attn: float | None = None
    mla: MLAConfig | None = None
    attn_dropout: float = 0.0
    attn_qkv_bias: bool | None = None
    attn_out_bias: bool | None = None

    def __post_init__(self) -> None:
        as_tuples(self, "layer_types")


@dataclass(frozen=True)
class PositionOptions:
    """`positions:` of a TransformerConfig: how token positions enter.

    kind: sinusoidal | learned (added to the embeddings) | rope | alibi | t5 (relative bias) | none.
    rope_base, rope_scaling: RoPE's base and frequency scaling (Llama 3.x, YaRN, ...; RopeScaling).
    rotary_dim: RoPE rotates the first rotary_dim dims of each head; None = all (GPT-NeoX's
        rotary_pct, partial_rotary_factor; docs/numerics.md §35).
    rope_local_base, rope_local_scaling: the sliding-window layers' own RoPE base and scaling
        (Gemma3, ModernBERT); None = they rotate as the full layers (§33, §36).
    rel_num_buckets, rel_max_distance: T5's relative position buckets.
    positions_from_padding: absolute positions count the non-pad tokens (ids != pad_id) from
        pad_id + 1, pad tokens sit at pad_id (RoBERTa's create_position_ids_from_input_ids; §36).
    """

    kind: str = "sinusoidal"
    rope_base: float = 10000.0
    rope_scaling: RopeScaling | None = None
    rotary_dim: int | None = None
    rope_local_base: float | None = None
    rope_local_scaling: RopeScaling | None = None
    rel_num_buckets: int = 32
    rel_max_distance: int = 128
    positions_from_padding: bool = False


@dataclass(frozen=True)
class FeedForwardOptions:
    """`feedforward:` of a TransformerConfig: the FFN of every layer.

    kind: the activation (relu, gelu, gelu_tanh, silu) or gated kind (swiglu, geglu, geglu_tanh).
    d_ff: the inner width. ffn_bias: biases in its projections; None = the config's `bias`.
    ffn_dropout: dropout inside the FFN (after the activation).
    moe: the sparse layers' FFN is a mixture of experts (config/moe.py); None = dense.
    """

    kind: str = "relu"
    d_ff: int = 256
    ffn_bias: bool | None = None
    ffn_dropout: float = 0.0
    moe: MoEConfig | None = None


@dataclass(frozen=True)
class NormOptions:
    """`norms:` of a TransformerConfig: the norms and the residual block around them.

    kind: layernorm | rmsnorm | rmsnorm_offset (RMSNorm scaled by (1 + w), w stored around 0;
        Gemma). norm_eps; norm_bias: LayerNorm's bias (RMSNorm has none).
    norm_position: pre | post | sandwich (pre norm and a norm on the sublayer output, Gemma2) |
        post_sublayer (only the norm on the sublayer output, x + norm(sublayer(x)), OLMo 2).
    final_norm: a norm after the last layer. first_attn_norm: False = layer 0 has no attn_norm
        (ModernBERT: the embedding norm precedes it).
    parallel_residual: x + attn(attn_norm(x)) + ffn(ffn_norm(x)), pre-norm only (GPT-NeoX).
    layer_scale: LayerScale (Touvron et al. 2021, CaiT; DINOv2): a learned per-channel scale
        on every sublayer output, initialised to this value; None = none.
    """

    kind: str = "layernorm"
    norm_eps: float = 1e-5
    norm_position: str = "post"
    norm_bias: bool = True
    final_norm: bool = True
    first_attn_norm: bool = True
    parallel_residual: bool = False
    layer_scale: float | None = None


@dataclass(frozen=True)
class BertOptions:
    """`bert:` of a TransformerConfig: BERT-family embedding and pooling options (Devlin et al.
    2019; RoBERTa, ModernBERT); the defaults leave every other model unchanged.

    type_vocab_size: token type (segment) embeddings added to the tokens; 0 = none.
    embed_norm: a norm (norms.kind, norms.norm_eps) on the summed embeddings.
    pooler: encoder / classifier: dense + activation on the pooled ([CLS]) vector.
    """

    type_vocab_size: int = 0
    embed_norm: bool = False
    pooler: bool = False


def _flat_paths() -> dict[str, str]:
    """Each flat key of the configs before the records (`sliding_window`) -> its record path
    (`attention.sliding_window`): the records' field names, but each record's `kind`, whose
    flat key is the record's old name (position, ffn, norm)."""
    kinds = {"positions": "position", "feedforward": "ffn", "norms": "norm"}
    out = {}
    for rec, cls in (("attention", AttentionOptions), ("positions", PositionOptions),
                     ("feedforward", FeedForwardOptions), ("norms", NormOptions), ("bert", BertOptions)):
        for f in dataclasses.fields(cls):
            out[kinds[rec] if f.name == "kind" else f.name] = f"{rec}.{f.name}"
    return out


FLAT_PATHS = _flat_paths()


@dataclass(frozen=True)
class TransformerConfig(metaclass=FlatKeywords):
    """Hyper-parameters of a Transformer stack. Every default that differs between the
    frameworks (LayerNorm eps, GELU variant) is named here, never inherited.

    The core sizes and switches are flat; each family of options is one record:

        attention    AttentionOptions: heads, score scale, windows, soft cap, q/k norms, sinks,
                     differential attention, mla, attention dropout and biases
        positions    PositionOptions: kind (position), RoPE base / scaling / rotary_dim / local
                     base, T5 buckets, positions_from_padding
        feedforward  FeedForwardOptions: kind (ffn), d_ff, ffn_bias, ffn_dropout, moe
        norms        NormOptions: kind (norm), norm_eps, norm_position, norm_bias, final_norm,
                     first_attn_norm, parallel_residual, layer_scale
        bert         BertOptions: type_vocab_size, embed_norm, pooler

    Code reads the records (`cfg.attention.sliding_window`, `cfg.norms.kind`). The flat keys of
    the configs before the records (`sliding_window`, `norm`, YAML's `model:` sections, keyword
    arguments, --set model.rope_base=...) still load: FLAT_PATHS maps each to its record path
    (config/base.py's nest_flat), and a flat key given with its nested form is refused, naming
    both. `replace(**changes)` takes flat keys, record paths or partial records; to_dict writes
    the nested form.
    """

    FLAT_PATHS = FLAT_PATHS  # not annotated: a class attribute, never a dataclass field

    vocab_size: int = 1000
    d_model: int = 64
    num_layers: int = 2
    max_len: int = 512
    pad_id: int = 0
    bias: bool = True  # biases in attention and FFN projections (default of the records' three)
    dropout: float = 0.0  # residual dropout on each sublayer output
    embed_dropout: float = 0.0  # dropout after embeddings + positions
    scale_embedding: bool = True  # multiply token embeddings by sqrt(d_model)
    scan_layers: bool = False  # JAX: stack identical layers, run them with lax.scan (torch loops)
    attention: AttentionOptions = AttentionOptions()
    positions: PositionOptions = PositionOptions()
    feedforward: FeedForwardOptions = FeedForwardOptions()
    norms: NormOptions = NormOptions()
    bert: BertOptions = BertOptions()

    def normalise(self) -> None:
        pass

    def __post_init__(self) -> None:
        self.normalise()
        check_rules(self)

    def replace(self, **changes) -> TransformerConfig:
        """A copy with `changes`: flat keys (`sliding_window=4`), record paths
        (`**{"attention.sliding_window": 4}`), partial records (`attention={"sliding_window": 4}`)
        or any field (config/base.py's replace)."""
        return replace(self, **changes)

    RULES = (  # not annotated: a class attribute, never a dataclass field (nor a pseudo-field)
        *positive("vocab_size", "d_model", "attention.num_heads", "feedforward.d_ff", "num_layers", "max_len",
                  "positions.rel_num_buckets", "positions.rel_max_distance"),
        *at_most(SIZE_LIMITS),
        choice("feedforward.kind", FFN_KINDS, "ffn_choice"), choice("norms.kind", NORM_KINDS, "norm_choice"),
        choice("norms.norm_position", NORM_POSITIONS), choice("positions.kind", POSITION_KINDS, "position_choice"),
        *probability("dropout", "attention.attn_dropout", "feedforward.ffn_dropout", "embed_dropout"),
        Rule("diff_attn_lambda_init", "attention.diff_attn", lambda c: 0 < c.attention.diff_attn < 1,
             "lambda_init must be in (0, 1), got {attention.diff_attn}",
             when=lambda c: c.attention.diff_attn is not None),
        *(Rule(f"diff_attn_no_{_last(n)}", n, lambda c, n=n: not attrgetter(n)(c), "is not supported with diff_attn",
               when=lambda c: c.attention.diff_attn is not None)
          for n in ("attention.mla", "attention.attn_sinks", "attention.qk_norm", "attention.qk_norm_full",
                    "attention.attn_dropout", "positions.rotary_dim")),
        Rule("diff_attn_even_head", "attention.head_dim", lambda c: c.resolved_head_dim % 2 == 0,
             "diff_attn splits each head in two halves: head_dim {resolved_head_dim} is odd",
             when=lambda c: c.attention.diff_attn is not None),
        Rule("norm_eps_positive", "norms.norm_eps", lambda c: c.norms.norm_eps > 0,
             "must be > 0, got {norms.norm_eps}"),
        Rule("rope_base_positive", "positions.rope_base", lambda c: c.positions.rope_base > 0,
             "must be > 0, got {positions.rope_base}"),
        number_or_null("attention.attn_scale", "null (1/sqrt(head_dim))"),
        Rule("one_score_scale", "attention.attn_scale",
             lambda c: c.attention.attn_scale is None or c.attention.query_pre_attn_scalar is None,
             "set attn_scale or query_pre_attn_scalar, not both (both set the score scale)"),
        Rule("heads_divide_width", "d_model", lambda c: c.d_model % c.attention.num_heads == 0,
             "d_model={d_model} is not divisible by num_heads={attention.num_heads}",
             when=lambda c: c.attention.head_dim is None and c.attention.mla is None),  # mla: its own widths
        *positive("attention.head_dim", "attention.num_kv_heads", optional=True),
        Rule("kv_heads_divide_heads", "attention.num_kv_heads",
             lambda c: (c.attention.num_kv_heads <= c.attention.num_heads
                        and c.attention.num_heads % c.attention.num_kv_heads == 0),
             "num_heads={attention.num_heads} must be a multiple of num_kv_heads={attention.num_kv_heads}",
             when=lambda c: c.attention.num_kv_heads is not None),
        Rule("rope_even_head", "attention.head_dim", lambda c: c.resolved_head_dim % 2 == 0,
             "RoPE needs an even head_dim",
             when=lambda c: c.positions.kind == "rope" and c.attention.mla is None),  # mla rotates qk_rope_head_dim
        # T5's log-spaced buckets divide by log(max_distance / max_exact)
        Rule("t5_buckets", "positions.rel_num_buckets", lambda c: c.positions.rel_num_buckets >= 4,
             "T5 buckets need >= 4, got {positions.rel_num_buckets}", when=lambda c: c.positions.kind == "t5"),
        Rule("t5_max_distance", "positions.rel_max_distance",
             lambda c: c.positions.rel_max_distance > c.positions.rel_num_buckets // 2,
             lambda c: f"must exceed rel_num_buckets // 2 = {c.positions.rel_num_buckets // 2} (the exact buckets), "
                       f"got {c.positions.rel_max_distance}",
             when=lambda c: c.positions.kind == "t5"),
        *positive("attention.sliding_window", optional=True),
        Rule("layer_types_per_layer", "attention.layer_types",
             lambda c: (len(c.attention.layer_types) == c.num_layers
                        and all(t in LAYER_TYPES for t in c.attention.layer_types)),
             "must be {num_layers} entries (num_layers) of " + str(LAYER_TYPES) + ", got {attention.layer_types!r}",
             when=lambda c: c.attention.layer_types is not None),
        Rule("sliding_layers_need_window", "attention.layer_types",
             lambda c: c.attention.sliding_window is not None or "sliding_attention" not in c.attention.layer_types,
             "sliding_attention layers need sliding_window", when=lambda c: c.attention.layer_types is not None),
        number_or_null("attention.attn_logit_softcap"), number_or_null("attention.query_pre_attn_scalar"),
        Rule("rotary_dim_under_rope", "positions.rotary_dim",
             lambda c: c.positions.kind == "rope" and c.attention.mla is None,
             "rotates part of each head under RoPE; position is {positions.kind!r}{with_mla}",
             when=lambda c: c.positions.rotary_dim is not None),
        Rule("rotary_dim_even", "positions.rotary_dim",
             lambda c: (positive_int(c.positions.rotary_dim) and c.positions.rotary_dim <= c.resolved_head_dim
                        and c.positions.rotary_dim % 2 == 0),
             "must be an even int in (0, head_dim={resolved_head_dim}], got {positions.rotary_dim!r}",
             when=lambda c: c.positions.rotary_dim is not None),
        Rule("one_qk_norm", "attention.qk_norm_full", lambda c: not (c.attention.qk_norm and c.attention.qk_norm_full),
             "set qk_norm (per head, Qwen3) or qk_norm_full (the full width, OLMo 2), not both"),
        Rule("qk_norm_full_without_mla", "attention.qk_norm_full",
             lambda c: not c.attention.qk_norm_full or c.attention.mla is None, "is not supported with mla"),
        Rule("parallel_residual_pre_norm", "norms.parallel_residual", lambda c: c.norms.norm_position == "pre",
             "runs both sublayers on pre-norms of the layer input; norm_position is {norms.norm_position!r}",
             when=lambda c: c.norms.parallel_residual),
        Rule("parallel_residual_plain", "norms.parallel_residual",
             lambda c: c.norms.layer_scale is None and c.norms.first_attn_norm,
             "GPT-NeoX's parallel block has no LayerScale and a norm before both sublayers "
             "(layer_scale null, first_attn_norm true)", when=lambda c: c.norms.parallel_residual),
        Rule("rope_scaling_under_rope", "positions.rope_scaling", lambda c: c.positions.kind == "rope",
             "scales RoPE; position is {positions.kind!r}", when=lambda c: c.positions.rope_scaling is not None),
        Rule("dynamic_rope_width", "positions.rope_scaling",
             lambda c: c.resolved_rotary_dim > 2 or c.attention.mla is not None,
             "dynamic scaling needs a rotated width > 2 (its exponent is K / (K - 2))",
             when=lambda c: c.positions.rope_scaling is not None and c.positions.rope_scaling.rope_type == "dynamic"),
        *(Rule(f"longrope_{n}_per_frequency", "positions.rope_scaling",
               lambda c, n=n: len(getattr(c.positions.rope_scaling, n)) == c.rotated_width // 2,
               lambda c, n=n: f"longrope {n} has {len(getattr(c.positions.rope_scaling, n))} entries; the rotated head "
                              f"width {c.rotated_width} needs {c.rotated_width // 2}",
               when=lambda c: c.positions.rope_scaling is not None and c.positions.rope_scaling.rope_type == "longrope")
          for n in ("short_factor", "long_factor")),
        Rule("positions_from_padding_absolute", "positions.positions_from_padding",
             lambda c: c.positions.kind in ("learned", "sinusoidal"),
             "offsets absolute position tables; position is {positions.kind!r}",
             when=lambda c: c.positions.positions_from_padding),
        Rule("positions_from_padding_fit", "positions.positions_from_padding", lambda c: c.pad_id + 1 < c.max_len,
             lambda c: f"the first position is pad_id + 1 = {c.pad_id + 1}, outside max_len={c.max_len}",
             when=lambda c: c.positions.positions_from_padding),
        Rule("rope_local_base_positive", "positions.rope_local_base",
             lambda c: positive_number(c.positions.rope_local_base),
             "must be a number > 0 or null (rope_base), got {positions.rope_local_base!r}",
             when=lambda c: c.positions.rope_local_base is not None),
        Rule("rope_local_base_under_rope", "positions.rope_local_base",
             lambda c: c.positions.kind == "rope" and c.attention.mla is None,
             "is the RoPE base of sliding-window layers; position is {positions.kind!r}{with_mla}",
             when=lambda c: c.positions.rope_local_base is not None),
        Rule("first_attn_norm_pre", "norms.first_attn_norm",
             lambda c: c.norms.first_attn_norm or c.norms.norm_position == "pre",
             "only a Pre-LN stack can drop layer 0's attn_norm; norm_position is {norms.norm_position!r}"),
        Rule("rope_local_scaling_needs_base", "positions.rope_local_scaling",
             lambda c: c.positions.rope_local_base is not None,
             "scales the local layers' own RoPE; set rope_local_base with it",
             when=lambda c: c.positions.rope_local_scaling is not None),
        Rule("dynamic_rope_local_width", "positions.rope_local_scaling", lambda c: c.resolved_rotary_dim > 2,
             "dynamic scaling needs a rotated width > 2 (its exponent is K / (K - 2))",
             when=lambda c: (c.positions.rope_local_scaling is not None
                             and c.positions.rope_local_scaling.rope_type == "dynamic")),
        Rule("type_vocab_size_int", "bert.type_vocab_size",
             lambda c: isinstance(c.bert.type_vocab_size, int) and c.bert.type_vocab_size >= 0,
             "must be an int >= 0 (0 = no token type embeddings), got {bert.type_vocab_size!r}"),
        Rule("pad_id_in_vocab", "pad_id", lambda c: 0 <= c.pad_id < c.vocab_size,
             "must be in [0, vocab_size={vocab_size}), got {pad_id}"),
        Rule("layer_scale_number", "norms.layer_scale", lambda c: is_number(c.norms.layer_scale),
             "must be a number (the initial scale) or null, got {norms.layer_scale!r}",
             when=lambda c: c.norms.layer_scale is not None),
        Rule("layer_scale_not_sandwich", "norms.layer_scale", lambda c: c.norms.norm_position != "sandwich",
             "is not defined with norm_position='sandwich' (the post-norm would rescale it)",
             when=lambda c: c.norms.layer_scale is not None),
        Rule("dense_layers_in_stack", "feedforward.moe.dense_layers",
             lambda c: all(i < c.num_layers for i in c.feedforward.moe.dense_layers),
             "indices must be < num_layers={num_layers}, got {feedforward.moe.dense_layers!r}",
             when=lambda c: c.feedforward.moe is not None),
        Rule("mla_rope", "attention.mla", lambda c: c.positions.kind == "rope",
             "uses decoupled RoPE; position is {positions.kind!r}", when=lambda c: c.attention.mla is not None),
        # every head reads its own keys, expanded from one shared latent: no key/value groups
        Rule("mla_no_kv_groups", "attention.num_kv_heads",
             lambda c: c.attention.num_kv_heads in (None, c.attention.num_heads),
             "does not apply to mla (keys are per head from the latent); got {attention.num_kv_heads}",
             when=lambda c: c.attention.mla is not None),
        *(Rule(f"mla_no_{_last(n)}", n, lambda c, n=n: attrgetter(n)(c) is None,
               "is not supported with mla (head widths are mla's; no sliding-window ring cache holds a latent)",
               when=lambda c: c.attention.mla is not None)
          for n in ("attention.head_dim", "attention.sliding_window", "attention.layer_types")),
        Rule("mla_no_qk_norm", "attention.qk_norm", lambda c: not c.attention.qk_norm, "is not supported with mla",
             when=lambda c: c.attention.mla is not None),
        Rule("mla_no_local_rope", "positions.rope_local_base", lambda c: c.positions.rope_local_base is None,
             "is not supported with mla (no local layers)", when=lambda c: c.attention.mla is not None),
        Rule("mla_dynamic_rope_width", "positions.rope_scaling", lambda c: c.attention.mla.qk_rope_head_dim > 2,
             "dynamic scaling needs qk_rope_head_dim > 2",
             when=lambda c: (c.attention.mla is not None and c.positions.rope_scaling is not None
                             and c.positions.rope_scaling.rope_type == "dynamic")),
    )

    @property
    def with_mla(self) -> str:  # message text
        return " with mla" if self.attention.mla is not None else ""

    @property
    def rotated_width(self) -> int:
        """The rotated width of each head: mla's qk_rope_head_dim, else resolved_rotary_dim."""
        return self.attention.mla.qk_rope_head_dim if self.attention.mla is not None else self.resolved_rotary_dim

    def sparse_layers(self) -> tuple[bool, ...]:
        """Per layer: is its FFN the mixture of experts (moe), else the dense FFN?"""
        return ((False,) * self.num_layers if self.feedforward.moe is None
                else self.feedforward.moe.sparse_layers(self.num_layers))

    @property
    def resolved_head_dim(self) -> int:
        return (self.attention.head_dim if self.attention.head_dim is not None
                else self.d_model // self.attention.num_heads)

    @property
    def resolved_rotary_dim(self) -> int:
        """The dims of each head RoPE rotates (rotary_dim, else the whole head)."""
        return self.resolved_head_dim if self.positions.rotary_dim is None else self.positions.rotary_dim

    @property
    def resolved_qkv_bias(self) -> bool:
        return self.bias if self.attention.attn_qkv_bias is None else self.attention.attn_qkv_bias

    @property
    def resolved_out_bias(self) -> bool:
        return self.bias if self.attention.attn_out_bias is None else self.attention.attn_out_bias

    @property
    def resolved_ffn_bias(self) -> bool:
        return self.bias if self.feedforward.ffn_bias is None else self.feedforward.ffn_bias

    def local_layers(self) -> tuple[bool, ...]:
        """Per layer: does it attend within sliding_window (layer_types, else every layer when
        sliding_window is set)?"""
        if self.attention.sliding_window is None:
            return (False,) * self.num_layers
        if self.attention.layer_types is None:
            return (True,) * self.num_layers
        return tuple(t == "sliding_attention" for t in self.attention.layer_types)

    def layer_options(self, i: int) -> dict:
        """The construction options of layer i that can differ between layers: sparse (its FFN
        is the MoE), local (a sliding-window layer with a RoPE of its own: rope_local_base),
        attn_norm (False on layer 0 without first_attn_norm). Both trees build layer i with these."""
        local = self.local_layers()[i] and self.positions.rope_local_base is not None
        return dict(sparse=self.sparse_layers()[i], local=local, attn_norm=self.norms.first_attn_norm or i > 0)

    def layer_rope(self, local: bool) -> tuple[float, RopeScaling | None]:
        """(base, scaling) of a layer's RoPE: a sliding-window layer's own (rope_local_base,
        rope_local_scaling) when rope_local_base is set (Gemma3, docs/numerics.md §33), else
        rope_base and rope_scaling."""
        if local and self.positions.rope_local_base is not None:
            return self.positions.rope_local_base, self.positions.rope_local_scaling
        return self.positions.rope_base, self.positions.rope_scaling

    @property
    def score_scale(self) -> float | None:
        """The attention score scale: attn_scale (T5), else query_pre_attn_scalar ** -0.5
        (Gemma2), else None (1 / sqrt(head_dim))."""
        if self.attention.attn_scale is not None:
            return self.attention.attn_scale
        return None if self.attention.query_pre_attn_scalar is None else self.attention.query_pre_attn_scalar ** -0.5

    @property
    def resolved_kv_heads(self) -> int:
        return self.attention.num_kv_heads if self.attention.num_kv_heads is not None else self.attention.num_heads
