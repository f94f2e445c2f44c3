"""The options of one attention layer, grouped in small frozen records that both trees'
MultiHeadAttention take (jaxformer/layers/attention.py and its twin): the biases of the
projections (`Projections`), the dropout rates (`Dropouts`), where the rotary positions come
from (`Rope`), the norms of q and k (`QKNorm`) and how the scores are modified before the
softmax (`Scores`: scale, soft-capping, sinks; the modifiers' maths is layers/scores.py).
make_attention fills them from a TransformerConfig."""
from __future__ import annotations

from dataclasses import dataclass

from jaxformer.config.transformer import RopeScaling


@dataclass(frozen=True)
class Projections:
    """Biases of the projections: `bias` on q_proj, k_proj and v_proj (and on o_proj when
    out_bias is None), `out_bias` on o_proj (Qwen2: q/k/v biases, none on o_proj)."""
    bias: bool = True
    out_bias: bool | None = None

    @property
    def resolved_out_bias(self) -> bool:
        """Whether o_proj has a bias: out_bias, or bias where out_bias is None."""
        return self.bias if self.out_bias is None else self.out_bias


@dataclass(frozen=True)
class Dropouts:
    """Dropout rates: `attn` on the attention weights (after the softmax), `out` on the output
    (after o_proj)."""
    attn: float = 0.0
    out: float = 0.0


@dataclass(frozen=True)
class Rope:
    """RoPE for self-attention: tables of `max_len` positions, frequency base `base`, an optional
    RopeScaling (docs/numerics.md §20); rotary_dim rotates the first rotary_dim dims of each
    head (None = all, §35)."""
    max_len: int
    base: float = 10000.0
    scaling: RopeScaling | None = None
    rotary_dim: int | None = None


@dataclass(frozen=True)
class QKNorm:
    """A norm of kind `kind` ("rmsnorm": Qwen3; "layernorm") on q and k before RoPE, with eps
    `eps`: per head, or with full=True one norm over all heads' q (H * K) and k (G * K),
    applied before the head split (OLMo 2, docs/numerics.md §35)."""
    kind: str
    eps: float = 1e-6
    full: bool = False


@dataclass(frozen=True)
class Scores:
    """How the scores are modified before the softmax: scale (None = 1/sqrt(K); T5 uses 1),
    soft-capping (Gemma2: cap * tanh(s / cap)), and sinks: a learned per-head logit in every
    softmax denominator (gpt-oss). See jaxformer/layers/scores.py."""
    scale: float | None = None
    softcap: float | None = None
    sinks: bool = False
