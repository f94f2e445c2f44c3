"""Configs of the full text models: `classifier`, `seq2seq` and `lm`. Shared by both trees and
loaded from the `model:` section of a YAML file. Imports neither jax nor torch.

Each extends TransformerConfig (the stack's hyper-parameters) with the model's own fields.
Flavours (GPT-2, LLaMA, the original Transformer) are field values, never hidden code paths:
in YAML (configs/lm.yaml, configs/llama.yaml) or from the named constructors beside the
config, which fill in the same fields (gemma's style):

    LMConfig.gpt2(**overrides)      GPT-2 flavour at the class's default sizes
    LMConfig.llama(**overrides)     LLaMA flavour at the class's default sizes
    LMConfig.gpt2_small(**overrides)  the real 124M GPT-2 small (vocab 50257, 1024 positions)
    LMConfig.tiny("gpt2" | "llama" | None, **overrides)  TINY sizes, for tests
    ClassifierConfig.tiny(**overrides), Seq2SeqConfig.tiny(**overrides)

Overrides win over the preset's values; the result is validated like any other config.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from jaxformer.config.base import ConfigError, check, check_choice, check_positive, layered
from jaxformer.config.rules import Rule, as_tuples, choice, is_number, number_or_null, positive
from jaxformer.config.transformer import TransformerConfig

COMPUTE_DTYPES = ("float32", "bfloat16")
POOLINGS = ("cls", "mean")
POOLER_ACTIVATIONS = ("tanh", "gelu", "gelu_tanh", "relu", "silu")

# Test sizes shared by the tiny presets (parity cases, unit tests): D 32, 2 layers, vocab 64.
TINY_SIZES = dict(vocab_size=64, d_model=32, num_heads=4, d_ff=64, num_layers=2, max_len=32, pad_id=0)
# GPT-2 (Radford et al. 2019): learned positions, LayerNorm eps 1e-5, GELU with the tanh
# approximation (gelu_new), Pre-LN with a final norm, biases everywhere, no embedding
# scaling, output tied to the token embedding.
GPT2_FLAVOUR = dict(position="learned", norm="layernorm", norm_eps=1e-5, ffn="gelu_tanh",
                    norm_position="pre", final_norm=True, bias=True, scale_embedding=False,
                    tie_embeddings=True)
# LLaMA (Touvron et al. 2023): rotary positions, RMSNorm eps 1e-6, SwiGLU, Pre-LN with a final
# norm, no biases, grouped-query attention (2 key/value heads), no embedding scaling, a
# separate output projection.
LLAMA_FLAVOUR = dict(position="rope", norm="rmsnorm", norm_eps=1e-6, ffn="swiglu", norm_position="pre",
                     final_norm=True, bias=False, num_kv_heads=2, scale_embedding=False,
                     tie_embeddings=False)
LM_FLAVOURS = {"gpt2": GPT2_FLAVOUR, "llama": LLAMA_FLAVOUR}
# T5 v1.0 (Raffel et al. 2020; HF t5-small): bucketed relative position bias (32 buckets, 128
# max distance), no 1/sqrt(K) score scale, RMSNorm eps 1e-6 (T5LayerNorm), ReLU FFN, Pre-LN with
# a final norm, no biases, no embedding scaling, one shared table tied to the output, whose
# input is rescaled by d_model ** -0.5; decoding starts from pad (0), eos 1. v1.1 / flan: ffn
# "geglu_tanh", tie_output=False, scale_decoder_output=False (jaxformer/hf/t5.py).
T5_FLAVOUR = dict(position="t5", rel_num_buckets=32, rel_max_distance=128, attn_scale=1.0, norm="rmsnorm",
                  norm_eps=1e-6, ffn="relu", norm_position="pre", final_norm=True, bias=False,
                  scale_embedding=False, share_embeddings=True, tie_output=True, scale_decoder_output=True,
                  pad_id=0, bos_id=0, eos_id=1)


def stack_config(cfg: TransformerConfig, **changes) -> TransformerConfig:
    """The plain TransformerConfig part of a model config (what the layers read), with changes."""
    fields = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(TransformerConfig)}
    fields.update(changes)
    return TransformerConfig(**fields)


def _meta_token_ok(value, name: str) -> bool:
    ids = value if isinstance(value, tuple) and name == "eos_id" else (value,)
    return value is None or (len(ids) > 0 and all(isinstance(i, int) and not isinstance(i, bool) and i >= 0
                                                  for i in ids))


def _meta_token(name: str) -> Rule:
    """bos/eos of an LM are token metadata (generation stops at an eos id): ints >= 0, a tuple
    of them for eos, or None; an id outside the vocabulary is allowed (it is never produced)."""
    return Rule(f"{name}_meta_token", name, lambda c: _meta_token_ok(getattr(c, name), name),
                f"must be a token id >= 0{', a non-empty tuple of them' if name == 'eos_id' else ''} "
                f"or null, got {{{name}!r}}")


def _check_meta_tokens(cfg, name: str) -> None:
    rule = _meta_token(name)
    if not rule.ok(cfg):
        raise ConfigError(rule.text(cfg))


def eos_ids(eos) -> tuple[int, ...]:
    """An eos setting (int, tuple of ints or None) -> the tuple of ids generation stops at."""
    return () if eos is None else tuple(eos) if isinstance(eos, (tuple, list)) else (eos,)


def _target_token(name: str) -> Rule:
    return Rule(f"{name}_target_token", name,
                lambda c: isinstance(getattr(c, name), int) and 0 <= getattr(c, name) < c.resolved_tgt_vocab,
                f"must be a token id in [0, {{resolved_tgt_vocab}}), got {{{name}!r}}")


_NO_POOLER = Rule("pooler_encoder_only", "bert.pooler", lambda c: not c.bert.pooler,
                  "only the encoder and classifier have a pooler")


@dataclass(frozen=True)
class ClassifierConfig(TransformerConfig):
    """A Transformer encoder classifier: scaled embeddings, positions, an encoder stack,
    [CLS] (first token) or mean pooling over non-pad tokens, then a linear head. BERT adds
    bert.pooler=True (dense + tanh on the pooled vector), token types and an embedding norm
    (TransformerConfig's `bert` record).

    dtype: compute dtype; "bfloat16" runs the matmuls in bf16 (params stay float32).
    pooler_act, pooler_bias, pooler_norm: the pooler's activation, its dense bias, and a norm
        (norms.kind, norms.norm_eps, norms.norm_bias) after the activation: BERT/RoBERTa's tanh with a
        bias and no norm (the defaults), ModernBERT's head (GELU, optional bias, LayerNorm).
    """

    num_classes: int = 2
    pooling: str = "cls"
    dtype: str = "float32"
    classifier_dropout: float | None = None  # before the head; None = dropout (HF BERT's rule)
    pooler_act: str = "tanh"
    pooler_bias: bool = True
    pooler_norm: bool = False

    RULES = (  # not annotated: a class attribute, never a dataclass field (nor a pseudo-field)
        *positive("num_classes"),
        Rule("classifier_dropout_probability", "classifier_dropout",
             lambda c: is_number(c.classifier_dropout) and 0.0 <= c.classifier_dropout < 1.0,
             "must be a probability in [0, 1), got {classifier_dropout!r}",
             when=lambda c: c.classifier_dropout is not None),
        choice("pooling", POOLINGS), choice("dtype", COMPUTE_DTYPES), choice("pooler_act", POOLER_ACTIVATIONS),
        Rule("pooler_options_need_pooler", "pooler_act",
             lambda c: (c.pooler_act, c.pooler_bias, c.pooler_norm) == ("tanh", True, False),
             "pooler_act / pooler_bias / pooler_norm describe the pooler; set bert.pooler: true",
             when=lambda c: not c.bert.pooler),
    )

    @classmethod
    def tiny(cls, **overrides) -> ClassifierConfig:
        """TINY_SIZES with the class defaults (Post-LN, [CLS] pooling), for tests."""
        return layered(cls, TINY_SIZES, overrides)


@dataclass(frozen=True)
class Seq2SeqConfig(TransformerConfig):
    """Encoder-decoder Transformer (Vaswani et al. 2017). `num_layers` is the encoder depth.

    num_decoder_layers: decoder depth; None = num_layers.
    tgt_vocab_size: target vocabulary; None = vocab_size. Must be None/equal when shared.
    share_embeddings: one token embedding for source and target (`embed`), else
        `src_embed` and `tgt_embed`.
    tie_output: the output projection is the target embedding transposed (no `lm_head`).
    scale_decoder_output: multiply the decoder output by d_model ** -0.5 before the output
        projection (T5 v1.0, HF's scale_decoder_outputs; docs/numerics.md §22).
    bos_id / eos_id: decoder start token and end of sequence (target vocabulary).
    Seq2SeqConfig.t5(**overrides): T5_FLAVOUR at the class's default sizes.
    """

    num_decoder_layers: int | None = None
    tgt_vocab_size: int | None = None
    share_embeddings: bool = True
    tie_output: bool = True
    scale_decoder_output: bool = False
    bos_id: int = 1
    eos_id: int = 2
    dtype: str = "float32"

    RULES = (  # not annotated: a class attribute, never a dataclass field (nor a pseudo-field)
        *positive("num_decoder_layers", "tgt_vocab_size", optional=True),
        Rule("shared_embeddings_one_vocab", "tgt_vocab_size",
             lambda c: not c.share_embeddings or c.tgt_vocab_size == c.vocab_size,
             "shared embeddings need tgt_vocab_size == vocab_size ({vocab_size}), got {tgt_vocab_size}",
             when=lambda c: c.tgt_vocab_size is not None),
        _target_token("bos_id"), _target_token("eos_id"),
        Rule("pad_id_target_token", "pad_id", lambda c: c.pad_id < c.resolved_tgt_vocab,
             "must be a target token id too (< {resolved_tgt_vocab})"),
        choice("dtype", COMPUTE_DTYPES), _NO_POOLER,
    )

    @property
    def resolved_decoder_layers(self) -> int:
        return self.num_layers if self.num_decoder_layers is None else self.num_decoder_layers

    @property
    def resolved_tgt_vocab(self) -> int:
        return self.vocab_size if self.tgt_vocab_size is None else self.tgt_vocab_size

    @classmethod
    def tiny(cls, **overrides) -> Seq2SeqConfig:
        """TINY_SIZES with the class defaults (Post-LN, shared and tied embeddings), for tests."""
        return layered(cls, TINY_SIZES, overrides)

    @classmethod
    def t5(cls, **overrides) -> Seq2SeqConfig:
        """T5_FLAVOUR (v1.0) at the class's default sizes."""
        return layered(cls, T5_FLAVOUR, overrides)

    def encoder_config(self) -> TransformerConfig:
        return stack_config(self)

    def decoder_config(self) -> TransformerConfig:
        return stack_config(self, num_layers=self.resolved_decoder_layers,
                            vocab_size=self.resolved_tgt_vocab)


@dataclass(frozen=True)
class LMConfig(TransformerConfig):
    """Decoder-only causal LM: a Decoder stack without cross-attention. GPT-2 and LLaMA are
    presets of the TransformerConfig fields: LMConfig.gpt2(), LMConfig.llama() (GPT2_FLAVOUR,
    LLAMA_FLAVOUR), and in YAML configs/lm.yaml, configs/llama.yaml.

    tie_embeddings: the output projection is the token embedding transposed (no `lm_head`).
    final_logit_softcap: cap * tanh(logits / cap) on the output logits (Gemma2); None = off.
    bos_id / eos_id: start and end of sequence, token metadata (None = none); eos_id may be a
        tuple (HF's eos_token_id list): generation stops at any of them.
    """

    tie_embeddings: bool = True
    bos_id: int | None = 1
    eos_id: int | tuple[int, ...] | None = 2
    dtype: str = "float32"
    final_logit_softcap: float | None = None  # logits -> cap * tanh(logits / cap) (Gemma2)

    def normalise(self) -> None:
        super().normalise()
        as_tuples(self, "eos_id")

    RULES = (  # not annotated: a class attribute, never a dataclass field (nor a pseudo-field)
        number_or_null("final_logit_softcap"), _meta_token("bos_id"), _meta_token("eos_id"),
        choice("dtype", COMPUTE_DTYPES), _NO_POOLER,
    )

    @classmethod
    def gpt2(cls, **overrides) -> LMConfig:
        """GPT2_FLAVOUR at the class's default sizes."""
        return layered(cls, GPT2_FLAVOUR, overrides)

    @classmethod
    def llama(cls, **overrides) -> LMConfig:
        """LLAMA_FLAVOUR at the class's default sizes (num_kv_heads 2: pass num_kv_heads with
        a num_heads that 2 does not divide)."""
        return layered(cls, LLAMA_FLAVOUR, overrides)

    @classmethod
    def gpt2_small(cls, **overrides) -> LMConfig:
        """GPT-2 small (124M): HF GPT2Config()'s sizes, 1024 positions, <|endoftext|> (50256)
        as bos and eos."""
        return layered(cls, GPT2_FLAVOUR, dict(vocab_size=50257, d_model=768, num_heads=12, d_ff=3072, num_layers=12,
                                               max_len=1024, pad_id=0, bos_id=50256, eos_id=50256), overrides)

    @classmethod
    def tiny(cls, flavour: str | None = None, **overrides) -> LMConfig:
        """TINY_SIZES in the named flavour ("gpt2", "llama"; None = the class defaults), for tests."""
        check(flavour is None or flavour in LM_FLAVOURS, "flavour",
              f"must be one of {tuple(LM_FLAVOURS)} or None, got {flavour!r}")
        return layered(cls, TINY_SIZES, LM_FLAVOURS.get(flavour, {}), overrides)

    def decoder_config(self) -> TransformerConfig:
        return stack_config(self)


STRATEGIES = ("greedy", "sample", "beam")
WEIGHTS_DTYPES = ("fp32", "bf16", "int8")  # generation's matmul weights (jaxformer/layers/kernels/quant.py)


@dataclass(frozen=True)
class GenerationConfig:
    """Decoding settings shared by jaxformer.generation and torch_ref.generation.

    strategy: greedy | sample (temperature, then top-k, then top-p) | beam.
    top_k: keep the k most likely tokens (0 = off).  top_p: keep the smallest set of most
        likely tokens whose probability reaches top_p (1.0 = off).
    num_beams, length_penalty: beam search; a finished hypothesis scores
        sum(log p) / (number of generated tokens, EOS included) ** length_penalty.
    eos_id: None = the model config's eos_id; an int or a tuple of ints (stop at any).
        stop_at_eos: False: no eos at all, every sequence (every beam hypothesis too) runs
            exactly max_new_tokens (benchmarks; HF generate's eos_token_id=None).
    cache_len: KV cache slots; None = prompt length + max_new_tokens (LM) or
        1 + max_new_tokens (seq2seq decoder). A fixed value keeps one compilation for
        prompts of different lengths.
    seed: sampling RNG seed (streams differ between the frameworks, docs/numerics.md §9).
    weights_dtype: the matmul weights decoding reads: fp32 (as stored), bf16, or int8
        (weight-only, symmetric, per output channel; fp32 activations and accumulation).
        Linear kernels and a tied output table are reduced (jaxformer/layers/kernels/quant.py,
        docs/numerics.md §24).
    prefill_chunk: LM prompts are prefilled through the KV cache in chunks of this many
        tokens (a positive int), so prefill attention holds [chunk, cache] scores instead of
        [prompt, cache]; the ids are identical to the one-pass prefill (None, the default, or
        a chunk >= the prompt; LM only; docs/numerics.md §31).
    """

    max_new_tokens: int = 32
    strategy: str = "greedy"
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    num_beams: int = 4
    length_penalty: float = 1.0
    eos_id: int | tuple[int, ...] | None = None
    stop_at_eos: bool = True
    cache_len: int | None = None
    seed: int = 0
    weights_dtype: str = "fp32"
    prefill_chunk: int | None = None

    def __post_init__(self) -> None:
        check_positive(self, "max_new_tokens", "num_beams")
        if self.prefill_chunk is not None:
            check_positive(self, "prefill_chunk")
        check_choice(self, "strategy", STRATEGIES)
        check_choice(self, "weights_dtype", WEIGHTS_DTYPES)
        check(_finite(self.temperature) and self.temperature > 0, "temperature",
              f"must be a finite number > 0, got {self.temperature!r}")
        check(_int(self.top_k) and self.top_k >= 0, "top_k", f"must be an int >= 0, got {self.top_k!r}")
        check(_finite(self.top_p) and 0.0 < self.top_p <= 1.0, "top_p", f"must be in (0, 1], got {self.top_p!r}")
        # HF's length_penalty: any finite exponent (0 = sum of log-probs, < 0 favours short)
        check(_finite(self.length_penalty), "length_penalty", f"must be a finite number, got {self.length_penalty!r}")
        check(_int(self.seed), "seed", f"must be an int, got {self.seed!r}")
        check(isinstance(self.stop_at_eos, bool), "stop_at_eos", f"must be true or false, got {self.stop_at_eos!r}")
        if self.cache_len is not None:
            check_positive(self, "cache_len")
        if isinstance(self.eos_id, list):
            object.__setattr__(self, "eos_id", tuple(self.eos_id))
        _check_meta_tokens(self, "eos_id")
        ids = eos_ids(self.eos_id)
        check(len(set(ids)) == len(ids), "eos_id", f"lists an id twice: {self.eos_id!r}")


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


# Framework-free generation inputs, shared by jaxformer.generation and torch_ref.generation.
def pad_prompts(prompts: Sequence[Sequence[int]], pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """Left-pad token lists to one array: -> ids [B, P] int32, mask [B, P] int32 (1 = token)."""
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token")
    for b, x in enumerate(prompts):  # a float or bool would be cast to an int32 id silently
        kind = np.asarray(x).dtype.kind
        if kind not in "iu":
            raise ValueError(f"prompt {b}: token ids must be integers, got {np.asarray(x).dtype}")
    p = max(len(x) for x in prompts)
    ids = np.full((len(prompts), p), pad_id, np.int32)
    mask = np.zeros((len(prompts), p), np.int32)
    for b, x in enumerate(prompts):
        ids[b, p - len(x):] = x
        mask[b, p - len(x):] = 1
    return ids, mask


def check_lengths(prompt_len: int, gen: GenerationConfig, max_len: int, start: int = 0) -> int:
    """The cache length for a prompt of prompt_len slots (`start` extra target slots, e.g. BOS)
    plus gen.max_new_tokens, or ValueError when it exceeds max_len or gen.cache_len."""
    need = prompt_len + start + gen.max_new_tokens
    if prompt_len + start > max_len:
        raise ValueError(f"prompt length {prompt_len + start} exceeds max_len={max_len}")
    if need > max_len:
        raise ValueError(f"prompt length {prompt_len + start} + max_new_tokens {gen.max_new_tokens} "
                         f"= {need} exceeds max_len={max_len}")
    if gen.cache_len is not None and need > gen.cache_len:
        raise ValueError(f"prompt length {prompt_len + start} + max_new_tokens {gen.max_new_tokens} "
                         f"= {need} exceeds the KV cache ({gen.cache_len} slots)")
    return need if gen.cache_len is None else gen.cache_len


def check_longrope_switch(cfg, prompt_len: int, gen: GenerationConfig) -> None:
    """ValueError where a longrope generation would cross original_max_len mid-way: at the step
    whose sequence first exceeds it, transformers' Phi-3 generate drops the KV cache and
    recomputes every earlier key with the long factors (prepare_inputs_for_generation), while
    jaxformer keeps the cached keys rotated with the short ones, so the ids could differ
    (docs/numerics.md §34). A prompt longer than original_max_len, or a generation that stays
    within it, computes what HF does."""
    scaling = cfg.positions.rope_scaling if hasattr(cfg, "positions") else None
    if scaling is None or scaling.rope_type != "longrope":
        return
    last = prompt_len + gen.max_new_tokens - 1  # the longest sequence a decode step feeds
    if prompt_len <= scaling.original_max_len < last:
        raise ValueError(f"longrope: prompt length {prompt_len} + max_new_tokens {gen.max_new_tokens} crosses "
                         f"original_max_len={scaling.original_max_len} mid-generation, where transformers "
                         "recomputes the whole KV cache with the long factors and jaxformer does not; "
                         f"keep prompt + max_new_tokens - 1 <= {scaling.original_max_len} or start from a "
                         "prompt longer than it")


def check_prefill_chunk(cfg, gen: GenerationConfig) -> None:
    """ValueError where chunked prefill would not compute what the one pass does: an MoE
    that drops tokens over capacity (its capacity counts the tokens of one call), and RoPE
    scaling that depends on the call's largest position (dynamic, longrope: an early chunk
    would rotate with another scaling than the one pass; docs/numerics.md §20, §34)."""
    scaling = cfg.positions.rope_scaling if hasattr(cfg, "positions") else None
    if gen.prefill_chunk is not None and scaling is not None and scaling.rope_type in ("dynamic", "longrope"):
        raise ValueError(f"prefill_chunk: {scaling.rope_type} RoPE scaling picks its frequencies from the "
                         "largest position of each call, so chunks would rotate the prompt differently "
                         "from the one-pass prefill; use no prefill_chunk")
    moe = cfg.feedforward.moe if hasattr(cfg, "feedforward") else None
    if gen.prefill_chunk is not None and moe is not None and moe.capacity_factor is not None:
        raise ValueError(f"prefill_chunk: an MoE with capacity_factor={moe.capacity_factor} drops tokens per "
                         "call, so chunks would route differently from the one-pass prefill; use a "
                         "dropless MoE (capacity_factor null) or no prefill_chunk")


__all__ = ["ClassifierConfig", "Seq2SeqConfig", "LMConfig", "GenerationConfig", "stack_config",
           "COMPUTE_DTYPES", "TINY_SIZES", "GPT2_FLAVOUR", "LLAMA_FLAVOUR", "LM_FLAVOURS", "T5_FLAVOUR",
           "pad_prompts", "check_lengths", "check_longrope_switch", "check_prefill_chunk", "eos_ids"]

