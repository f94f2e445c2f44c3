"""Config for Transformer stacks (encoder, decoder, decoder-only) shared by both trees."""
from __future__ import annotations

from dataclasses import dataclass

from jaxformer.config.base import check, check_choice, check_positive, check_prob

FFN_KINDS = ("relu", "gelu", "gelu_tanh", "swiglu", "geglu", "geglu_tanh")
NORM_KINDS = ("layernorm", "rmsnorm")
NORM_POSITIONS = ("pre", "post")
POSITION_KINDS = ("sinusoidal", "learned", "rope", "alibi", "t5", "none")


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
    norm: str = "layernorm"
    norm_eps: float = 1e-5
    norm_position: str = "post"
    final_norm: bool = True
    bias: bool = True  # biases in attention and FFN projections
    norm_bias: bool = True  # LayerNorm bias (RMSNorm has none)
    dropout: float = 0.0  # residual dropout on each sublayer output
    attn_dropout: float = 0.0  # dropout on attention weights
    ffn_dropout: float = 0.0  # dropout inside the FFN (after the activation)
    embed_dropout: float = 0.0  # dropout after embeddings + positions
    position: str = "sinusoidal"
    max_len: int = 512
    rope_base: float = 10000.0
    rel_num_buckets: int = 32  # T5 relative position bias
    rel_max_distance: int = 128
    sliding_window: int | None = None  # keys further back than this are masked
    scale_embedding: bool = True  # multiply token embeddings by sqrt(d_model)
    pad_id: int = 0
    scan_layers: bool = False  # JAX: stack identical layers, run them with lax.scan (torch loops)
    # BERT options (Devlin et al. 2019); the defaults leave every other model unchanged
    type_vocab_size: int = 0  # token type (segment) embeddings added to the tokens; 0 = none
    embed_norm: bool = False  # a norm (`norm`, `norm_eps`) on the summed embeddings
    pooler: bool = False  # encoder / classifier: dense + tanh on the pooled ([CLS]) vector

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
        if self.head_dim is None:
            check(self.d_model % self.num_heads == 0, "d_model",
                  f"d_model={self.d_model} is not divisible by num_heads={self.num_heads}")
        else:
            check_positive(self, "head_dim")
        if self.num_kv_heads is not None:
            check_positive(self, "num_kv_heads")
            check(self.num_kv_heads <= self.num_heads and self.num_heads % self.num_kv_heads == 0,
                  "num_kv_heads", f"num_heads={self.num_heads} must be a multiple of "
                  f"num_kv_heads={self.num_kv_heads}")
        if self.position == "rope":
            check(self.resolved_head_dim % 2 == 0, "head_dim", "RoPE needs an even head_dim")
        if self.sliding_window is not None:
            check_positive(self, "sliding_window")
        check(isinstance(self.type_vocab_size, int) and self.type_vocab_size >= 0, "type_vocab_size",
              f"must be an int >= 0 (0 = no token type embeddings), got {self.type_vocab_size!r}")
        check(0 <= self.pad_id < self.vocab_size, "pad_id",
              f"must be in [0, vocab_size={self.vocab_size}), got {self.pad_id}")

    @property
    def resolved_head_dim(self) -> int:
        return self.head_dim if self.head_dim is not None else self.d_model // self.num_heads

    @property
    def resolved_kv_heads(self) -> int:
        return self.num_kv_heads if self.num_kv_heads is not None else self.num_heads
