"""Shared pieces of the Hugging Face families: strict reading of config.json options, the
activation table, and template-based key renaming (`Renamer`, the one renaming mechanism of
every family, both directions). Imports neither jax nor torch.

config.json is read as a plain dict (no transformers needed). Keys a checkpoint omits take
Hugging Face's class defaults, spelled out per family. Every key is then either mapped to a
jaxformer field (and its value checked), ignored for a stated reason (tokenizer ids, init
ranges, housekeeping), or an error that names it: an option jaxformer does not know is never
silently dropped. All problems are reported together in one ConfigError.
"""
from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from jaxformer.config import ConfigError
from jaxformer.config.transformer import LAYER_TYPES

# PretrainedConfig housekeeping and generation defaults that never change the weights' math
GENERIC_IGNORED = {
    "_name_or_path", "architectures", "model_type", "transformers_version", "dtype", "torch_dtype",
    "use_bfloat16", "torchscript", "return_dict", "use_return_dict", "output_attentions",
    "output_hidden_states", "output_past", "use_cache", "gradient_checkpointing",
    "initializer_range", "initializer_factor", "tokenizer_class", "prefix", "task_specific_params",
    "finetuning_task", "sep_token_id", "cls_token_id", "mask_token_id", "unk_token_id",
    "decoder_start_token_id", "chunk_size_feed_forward", "tf_legacy_loss", "is_encoder_decoder",
    "tie_encoder_decoder", "max_length", "min_length", "do_sample", "early_stopping", "num_beams",
    "num_beam_groups", "diversity_penalty", "temperature", "top_k", "top_p", "typical_p",
    "repetition_penalty", "length_penalty", "no_repeat_ngram_size", "encoder_no_repeat_ngram_size",
    "bad_words_ids", "num_return_sequences", "output_scores", "return_dict_in_generate",
    "forced_bos_token_id", "forced_eos_token_id", "remove_invalid_values",
    "exponential_decay_length_penalty", "suppress_tokens", "begin_suppress_tokens",
    "id2label", "label2id", "num_labels", "attn_implementation", "_attn_implementation",
    "_attn_implementation_autoset", "epsilon_cutoff", "eta_cutoff", "encoder_repetition_penalty",
    "num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold",
    "assistant_lookbehind", "target_lookbehind",
    # generate's KV cache class (Gemma2's "hybrid": a ring for sliding layers); the same values
    "cache_implementation",
    # the loss of HF's classification heads when trained with labels; outputs are the same
    "problem_type",
}
# PretrainedConfig options that change a model only away from their neutral value: accepted at
# that value (real config.json files carry them), refused by name otherwise. A family that
# implements one reads it itself.
GENERIC_NEUTRAL = {
    "pruned_heads": ({}, "pruned attention heads are not implemented"),
    "is_decoder": (False, "a decoder (causal) variant of this class is not implemented"),
    "add_cross_attention": (False, "cross-attention layers in this class are not implemented"),
}


@dataclass(frozen=True, eq=False)  # one record per family: compared and hashed by identity
class Family:
    """One Hugging Face family as jaxformer imports and exports it (each family module ends with
    its FAMILY). hf/families.py's one ordered table FAMILIES holds every record: import picks
    the family of a config.json by `architectures`, export the first family that claims a config.

    architectures: HF class -> our model name; model_types: HF class -> config.json model_type.
    config_from_hf(raw, arch, tensor_names) -> (name, config, notes): every option mapped,
        ignored for a stated reason, or a ConfigError naming it.
    tensor_fn(name, cfg, arch) -> HF tensor name -> (torch_ref key, layout) (the key rules).
    config_to_hf(name, cfg) -> config.json; state_dict_to_hf(sd, name, cfg) -> HF tensors.
    hf_defaults: HF class -> its config class's defaults (what an absent config.json key means;
        the exported config.json keeps the keys that differ from them).
    exports: our model name -> the fields of its config this family exports, declared one by
        one (hf/exports.py: written, required values, checks, ignored for a reason); any other
        field away from its default refuses the export by name.
    claims(cfg) -> whether this family exports a config of its models that no family before it
        in FAMILIES claimed (the feature that names the HF class: sliding window, MoE, ...).
    embed_keys: the input tables a tied lm_head copies (an untied HF head equal to one of them
        is tied, hf/__init__.py).
    resolve_checkpoint(ckpt, name, cfg, notes) -> cfg: what only the weights say (T5's head).
    """

    name: str
    architectures: Mapping[str, str]
    model_types: Mapping[str, str]
    config_from_hf: Callable
    tensor_fn: Callable
    config_to_hf: Callable
    state_dict_to_hf: Callable
    hf_defaults: Mapping[str, Mapping[str, Any]]
    exports: Mapping[str, Mapping[str, Any]]
    claims: Callable[[Any], bool] = lambda cfg: True
    embed_keys: tuple[str, ...] = ()
    resolve_checkpoint: Callable | None = None


class Options:
    """Typed access to config.json with defaults, recording which keys were read, plus a list
    of problems. `finish()` raises one ConfigError for every problem and unknown key."""

    def __init__(self, raw: Mapping[str, Any], defaults: Mapping[str, Any], *, family: str,
                 ignored: Mapping[str, str] | None = None):
        self.raw, self.defaults, self.family = dict(raw), dict(defaults), family
        self.ignored = dict(ignored or {})
        self.used: set[str] = set()
        self.problems: list[str] = []
        self.notes: list[str] = []

    def __getitem__(self, key: str) -> Any:
        self.used.add(key)
        if key in self.raw:
            return self._typed(key, self.raw[key])
        if key not in self.defaults:
            raise KeyError(f"{self.family}: no default for HF option {key!r}")
        return self.defaults[key]

    def get(self, key: str, default: Any = None) -> Any:
        self.used.add(key)
        if key in self.raw:
            return self._typed(key, self.raw[key])
        return self.defaults.get(key, default)

    def _typed(self, key: str, value: Any) -> Any:
        """`value` when it has the JSON type of the option's default (a bool, an integer, a
        finite number, a string), else a problem and the default (so mapping goes on and every
        problem is reported together). A list of numbers stands for a number (HF's per-axis
        sizes, e.g. image_size [224, 224]: the family checks those); token ids may be lists."""
        default = self.defaults.get(key)
        if default is None or key.endswith("_token_id"):
            return value
        if isinstance(default, bool):
            ok, want = isinstance(value, bool), "true or false"
        elif isinstance(default, (int, float)):
            items = value if isinstance(value, list) and value else [value]
            kind = int if isinstance(default, int) else (int, float)
            ok = all(isinstance(v, kind) and not isinstance(v, bool) and math.isfinite(v) for v in items)
            want = "an integer" if kind is int else "a finite number"
        elif isinstance(default, str):
            ok, want = isinstance(value, str), "a string"
        elif isinstance(default, list):
            ok, want = isinstance(value, list), "a list"
        else:
            return value
        if not ok:
            self.problems.append(f"{key}={value!r} is not supported: expected {want}")
            return default
        return value

    def problem(self, key: str, why: str) -> None:
        value = self.raw.get(key, self.defaults.get(key))
        self.problems.append(f"{key}={value!r} is not supported: {why}")

    def require(self, key: str, allowed: Iterable[Any] | Callable[[Any], bool], why: str) -> Any:
        value = self[key]
        ok = allowed(value) if callable(allowed) else value in tuple(allowed)
        if not ok:
            self.problem(key, why)
        return value

    def num_labels(self) -> int:
        """HF's rule: len(id2label) when given, else num_labels, else 2."""
        self.used.update(("id2label", "num_labels"))
        labels, n = self.raw.get("id2label"), self.raw.get("num_labels", 2)
        if labels is not None and not isinstance(labels, (dict, list)):
            self.problems.append(f"id2label={labels!r} is not supported: expected an object of labels")
            labels = None
        if not (isinstance(n, int) and not isinstance(n, bool) and n > 0):
            self.problems.append(f"num_labels={n!r} is not supported: expected a positive integer")
            n = 2
        if labels:
            if "num_labels" in self.raw and n != len(labels):
                self.problems.append(f"num_labels={n} disagrees with id2label ({len(labels)} labels)")
            return len(labels)
        return n

    def finish(self) -> None:
        unread = [k for k in self.raw if k not in self.used and k not in self.ignored]
        problems = list(self.problems)
        for k in unread:
            if k in GENERIC_NEUTRAL and self.raw[k] != GENERIC_NEUTRAL[k][0]:
                problems.append(f"{k}={self.raw[k]!r} is not supported: {GENERIC_NEUTRAL[k][1]}")
        unknown = sorted(k for k in unread if k not in GENERIC_IGNORED and k not in GENERIC_NEUTRAL)
        problems += [f"{k}={self.raw[k]!r} is an HF option jaxformer does not know for {self.family}; "
                     "it may change the model, so it is not ignored (remove it from config.json "
                     "if it does not)" for k in unknown]
        if problems:  # the first problem on the first line: the CLI prints only that line
            raise ConfigError(f"config.json ({self.family}): {len(problems)} unsupported option(s): "
                              + "\n  ".join(problems))


# HF activation name (hidden_act / activation_function) -> jaxformer ffn kind. GELU is exact
# (erf) under "gelu" and the tanh approximation under the other names (docs/numerics.md §2).
# "silu" exists only as the gate of a gated FFN (LLaMA's SwiGLU); the other families' FFNs are
# plain, and the gated kinds are not theirs.
ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
               "gelu_fast": "gelu_tanh", "relu": "relu", "silu": "swiglu"}
GATED = ("swiglu",)


def activations(*, gated: bool) -> dict[str, str]:
    """The part of ACTIVATIONS a family with a gated (LLaMA) or plain FFN can import."""
    return {k: v for k, v in ACTIVATIONS.items() if (v in GATED) == gated}


def ffn_to_hf(ffn: str, *, tanh: str = "gelu_new") -> str | None:
    """The HF activation name export writes for an ffn kind, or None when HF has none. `tanh`:
    which of HF's names of the tanh GELU the family writes."""
    if ffn == "gelu_tanh":
        return tanh
    return next((k for k, v in ACTIVATIONS.items() if v == ffn), None)


def ffn_from_hf(opts: Options, key: str, *, gated: bool = False, why: str | None = None) -> str:
    """The ffn kind of the HF activation option `key`. One the family cannot import is a
    problem, explained by `why` (default: the names it can import)."""
    table = activations(gated=gated)
    name = opts.require(key, table, why or f"jaxformer FFN activations: {sorted(table)}")
    return table[name] if name in tuple(table) else next(iter(table.values()))


def exportable_ffns() -> list[str]:
    """The plain (ungated) ffn kinds that have an HF activation name."""
    return sorted(set(activations(gated=False).values()))


def token_ids(opts: Options, vocab_size: int, *, need_bos_eos: bool) -> dict[str, int]:
    """bos/eos/pad ids for jaxformer. bos and eos are token metadata (LMConfig): null stays
    None, a list of eos ids becomes a tuple (generation stops at any), an id outside the
    vocabulary is kept (it is never produced; noted). A null pad becomes 0 (only used to fill
    generated rows after EOS and for masks)."""
    out = {}
    names = (("bos_id", "bos_token_id"), ("eos_id", "eos_token_id")) if need_bos_eos else ()
    for ours, theirs in names:
        v = opts[theirs]
        ids = tuple(v) if isinstance(v, list) else (v,)
        if v is None or (isinstance(v, list) and not v):
            out[ours] = None
            continue
        if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids) or (
                isinstance(v, list) and ours == "bos_id"):
            opts.problem(theirs, "must be a token id >= 0" + (" or a list of them" if ours == "eos_id" else ""))
            continue
        outside = [i for i in ids if i >= vocab_size]
        if outside:
            opts.notes.append(f"{theirs}={v!r}: {outside} outside the vocabulary ({vocab_size}); "
                              "kept as metadata, never generated")
        out[ours] = ids if len(ids) > 1 else ids[0]
    v = opts["pad_token_id"]
    if isinstance(v, list):
        v = v[0] if v else None
    if v is None:
        opts.notes.append("pad_token_id is null: pad_id=0 (only fills generated rows "
                          "after EOS; pass attention masks explicitly)")
        v = 0
    if not (isinstance(v, int) and 0 <= v < vocab_size):
        opts.problem("pad_token_id", f"must be a token id in [0, vocab_size={vocab_size})")
    else:
        out["pad_id"] = v
    return out


# ----------------------------------------------------------------------------- RoPE
# The keys transformers 5.x accepts in rope_parameters (4.x: rope_scaling) per rope_type
# (modeling_rope_utils._validate_*), besides rope_type / type / rope_theta
ROPE_KEYS = {
    "default": (),
    "linear": ("factor",),
    "dynamic": ("factor",),
    "llama3": ("factor", "original_max_position_embeddings", "low_freq_factor", "high_freq_factor"),
    "yarn": ("factor", "original_max_position_embeddings", "attention_factor", "beta_fast", "beta_slow",
             "mscale", "mscale_all_dim", "truncate"),
}


def is_number(v) -> bool:
    """An int or float that is not a bool (config.json numbers)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def rope_from_hf(o: Options, max_pos: int, default_theta: float = 10000.0, *, partial: bool = False):
    """-> (rope_base, RopeScaling or None) from config.json's rope_theta and rope_parameters
    (5.x) or rope_scaling (4.x), with HF's precedence: a non-empty rope_scaling wins, its
    rope_theta (else the top-level one, else default_theta) is the base; llama3/yarn's
    original_max_position_embeddings defaults to max_position_embeddings; dynamic's length
    is max_position_embeddings. Every other key, an unknown rope_type, partial_rotary_factor
    != 1 or a mis-typed value is a problem naming it. partial: the family reads
    partial_rotary_factor itself (rotary_dim, docs/numerics.md §35), so it is passed over here."""
    from jaxformer.config import RopeScaling
    params, legacy = o.get("rope_parameters"), o.get("rope_scaling")
    theta = o.get("rope_theta", default_theta)
    key, spec = ("rope_scaling", legacy) if legacy else ("rope_parameters", params)
    if "partial_rotary_factor" in o.raw and not partial:
        o.require("partial_rotary_factor", lambda v: v == 1, "jaxformer rotates the whole head (1.0)")
    if not spec:
        return float(theta), None
    if not isinstance(spec, dict):
        o.problem(key, "expected a mapping")
        return float(theta), None
    kind = spec.get("rope_type", spec.get("type", "default"))
    if kind not in ROPE_KEYS:
        o.problem(key, f"rope_type {kind!r} is not implemented; jaxformer has {sorted(ROPE_KEYS)}")
        return float(theta), None
    theta = spec.get("rope_theta", theta)
    if not is_number(theta) or theta <= 0:
        o.problem(key, f"rope_theta={theta!r} must be a number > 0")
        theta = default_theta
    for k in sorted(set(spec) - {"rope_type", "type", "rope_theta", *ROPE_KEYS[kind]}):
        if k == "partial_rotary_factor" and (spec[k] == 1 or partial):
            continue
        o.problem(key, f"{k}={spec[k]!r} is not a {kind} RoPE option jaxformer implements")
    if kind == "default":
        return float(theta), None
    for k in ROPE_KEYS[kind]:
        v = spec.get(k)
        if v is not None and not (isinstance(v, bool) if k == "truncate" else is_number(v)):
            o.problem(key, f"{k}={v!r} must be {'true or false' if k == 'truncate' else 'a number'}")
            return float(theta), None
    fields = dict(rope_type=kind, factor=spec.get("factor"))
    if kind in ("llama3", "yarn"):
        fields["original_max_len"] = spec.get("original_max_position_embeddings", max_pos)
        if fields["factor"] is None and kind == "yarn":  # HF: the ratio of the two lengths
            fields["factor"] = max_pos / fields["original_max_len"]
    if kind == "dynamic":
        fields["original_max_len"] = max_pos
    if kind == "llama3":
        fields.update(low_freq_factor=spec.get("low_freq_factor"), high_freq_factor=spec.get("high_freq_factor"))
    if kind == "yarn":
        fields.update(beta_fast=spec.get("beta_fast") or 32.0, beta_slow=spec.get("beta_slow") or 1.0,
                      attention_factor=spec.get("attention_factor"), mscale=spec.get("mscale"),
                      mscale_all_dim=spec.get("mscale_all_dim"), truncate=spec.get("truncate", True))
    if isinstance(fields.get("original_max_len"), float) and fields["original_max_len"].is_integer():
        fields["original_max_len"] = int(fields["original_max_len"])
    try:
        return float(theta), RopeScaling(**fields)
    except ConfigError as e:
        o.problem(key, f"invalid {kind} RoPE scaling: {e}")
        return float(theta), None


def rope_to_hf(cfg) -> dict:
    """config.json's rope_theta and rope_parameters (5.x) of a RoPE config; dynamic's length
    is written as max_position_embeddings by the family."""
    s = cfg.positions.rope_scaling
    f = lambda v: None if v is None else float(v)  # HF types these float
    params = {"rope_type": "default" if s is None else s.rope_type, "rope_theta": f(cfg.positions.rope_base)}
    if s is not None:
        params["factor"] = f(s.factor)
    if s is not None and s.rope_type in ("llama3", "yarn"):
        params["original_max_position_embeddings"] = int(s.original_max_len)
    if s is not None and s.rope_type == "llama3":
        params.update(low_freq_factor=f(s.low_freq_factor), high_freq_factor=f(s.high_freq_factor))
    if s is not None and s.rope_type == "yarn":
        params.update(beta_fast=f(s.beta_fast), beta_slow=f(s.beta_slow), truncate=s.truncate)
        params.update({k: f(getattr(s, k)) for k in ("attention_factor", "mscale", "mscale_all_dim")
                       if getattr(s, k) is not None})
    return {"rope_theta": f(cfg.positions.rope_base), "rope_parameters": params}


def typed_for_hf(hf_config: dict, defaults: Mapping[str, Any]) -> dict:
    """config.json with each number in the JSON type transformers 5.x validates (its config
    classes are strict: 30 is refused where it types float, 20.0 where it types int). The type
    is that of HF's class default (`defaults`, the family's DEFAULTS); our configs may hold
    either (a hand-written model.yaml says 30 for 30.0; a YAML round trip gives 20.0 for 20).
    A non-integral number where HF types int is an error naming the key."""
    from jaxformer.convert import ConversionError
    out, problems = dict(hf_config), []
    for k, v in hf_config.items():
        d = defaults.get(k)
        if isinstance(v, bool) or isinstance(d, bool) or not isinstance(v, (int, float)):
            continue
        if isinstance(d, float) and isinstance(v, int):
            out[k] = float(v)
        elif isinstance(d, int) and isinstance(v, float):
            if v.is_integer():
                out[k] = int(v)
            else:
                problems.append(f"{k}={v!r}: transformers types it int")
    if problems:
        raise ConversionError(problems)
    return out


def hf_max_positions(cfg) -> int:
    """max_position_embeddings to write: dynamic scaling's length, else max_len."""
    s = cfg.positions.rope_scaling
    return s.original_max_len if s is not None and s.rope_type == "dynamic" else cfg.max_len


def build_config(cls, fields: dict, opts: Options):
    """cls(**fields), reporting every config.json problem first, and a jaxformer validation
    error as an unsupported HF combination."""
    opts.finish()
    try:
        return cls(**fields)
    except ConfigError as e:
        raise ConfigError(f"config.json ({opts.family}) maps to an invalid jaxformer "
                          f"{cls.__name__}: {e}") from None


# ----------------------------------------------------------------------------- renaming
class MappingError(ValueError):
    """A family cannot map a checkpoint key."""


# A family's tensor_fn may send one HF tensor into slice `e` of axis 0 of a torch_ref key
# (one expert of a stacked [E, ...] expert weight): it returns the key expert_slice(key, e).
# streaming.convert_stream plans every slice from headers and assembles the param.
_SLICE = re.compile(r"(?P<base>.+)\[(?P<e>\d+)\]$")


def expert_slice(torch_key: str, e: int) -> str:
    """The key of slice e (axis 0) of torch_key, e.g. "decoder.layers.0.ffn.experts.up_proj[3]"."""
    return f"{torch_key}[{int(e)}]"


def split_slice(key: str) -> tuple[str, int | None]:
    """expert_slice's inverse: -> (torch key, slice index), or (key, None) for a whole key."""
    m = _SLICE.match(key)
    return (m["base"], int(m["e"])) if m else (key, None)


PLACEHOLDERS = {"i": r"\d+", "j": r"\d+", "leaf": r"weight|bias",
                "attn": r"q_proj|k_proj|v_proj|o_proj", "mlp": r"gate_proj|up_proj|down_proj"}


class Renamer:
    """Two-way key renaming by templates, e.g. ("model.layers.{i}.input_layernorm.weight",
    "decoder.layers.{i}.attn_norm.weight"). Placeholders: {i}, {j} (layer indices), {leaf}
    (weight|bias), {attn} (q/k/v/o_proj), {mlp} (gate/up/down_proj). The first rule whose
    template matches the whole key wins, in either direction: where two HF names map to one
    jaxformer name (a checkpoint format's old names), the first is the one export writes."""

    def __init__(self, rules: Iterable[tuple[str, str]]):
        self.rules = list(rules)
        self._fwd = [(self._regex(a), b) for a, b in self.rules]
        self._bwd = [(self._regex(b), a) for a, b in self.rules]

    @staticmethod
    def _regex(template: str) -> re.Pattern:
        pattern = re.escape(template)
        for name, rx in PLACEHOLDERS.items():
            pattern = pattern.replace(re.escape("{" + name + "}"), f"(?P<{name}>{rx})")
        return re.compile(pattern + "$")

    @staticmethod
    def _apply(compiled, key: str) -> str | None:
        for rx, target in compiled:
            m = rx.match(key)
            if m:
                return target.format(**m.groupdict())
        return None

    def to_torch(self, hf_key: str) -> str | None:
        return self._apply(self._fwd, hf_key)

    def to_hf(self, torch_key: str) -> str | None:
        return self._apply(self._bwd, torch_key)


def rename_all(state_dict: Mapping[str, Any], fn: Callable[[str], str | None], what: str) -> dict:
    """Rename every key with fn; an unmapped key is an error (all of them listed)."""
    from jaxformer.convert import ConversionError
    out, problems = {}, []
    for k, v in state_dict.items():
        new = fn(k)
        if new is None:
            problems.append(f"unmapped: {k} has no {what} name")
        elif new in out:
            problems.append(f"duplicate: two keys map to {new}")
        else:
            out[new] = v
    if problems:
        raise ConversionError(problems)
    return out


def partial_factor(rotary_dim: int, head_dim: int) -> float:
    """A partial_rotary_factor whose int(head_dim * factor) is rotary_dim, as HF computes it."""
    pct = rotary_dim / head_dim
    while int(head_dim * pct) < rotary_dim:  # rotary_dim / head_dim rounded down
        pct = math.nextafter(pct, 2.0)
    return pct


# ----------------------------------------------------------------------------- shared by families
def layer_types_and_window(o: Options, n: int, pattern: int = 2) -> tuple[tuple[str, ...] | None, int | None]:
    """-> (layer_types, sliding_window) for LMConfig: HF's default pattern when absent (every
    `pattern`-th layer full, the others sliding: Gemma2 2, Gemma3 sliding_window_pattern); a
    stack without sliding layers needs no window."""
    o.used.update(("layer_types", "sliding_window"))
    types = o.raw.get("layer_types")
    if types is None:
        types = ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(n)]
    if not (isinstance(types, list) and len(types) == n and all(t in LAYER_TYPES for t in types)):
        o.problem("layer_types", f"must be {n} entries (num_hidden_layers) of {list(LAYER_TYPES)}")
        return None, None
    window = o.raw.get("sliding_window", o.defaults["sliding_window"])
    if "sliding_attention" not in types:
        return None, None
    if not (isinstance(window, int) and not isinstance(window, bool) and window > 0):
        o.problem("sliding_window", "sliding_attention layers need a positive integer window")
        return None, None
    return tuple(types), window


def number_or_null(o: Options, key: str):
    """A soft cap (or scalar): a number > 0, or null = off."""
    o.used.add(key)
    v = o.raw.get(key, o.defaults[key])
    if v is not None and not (isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0):
        o.problem(key, "must be a number > 0 or null")
        return None
    return v


def uniform_window(o: Options) -> int | None:
    """The sliding window HF's Mistral-style decoders apply to every layer (Mistral, Mixtral):
    an integer or null (full attention), with layer_types absent or all alike."""
    o.used.add("sliding_window")  # an integer or null (full attention); HF's default when absent
    window = o.raw.get("sliding_window", o.defaults["sliding_window"])
    if window is not None and not (isinstance(window, int) and not isinstance(window, bool) and window > 0):
        o.problem("sliding_window", "must be a positive integer or null")
        window = None
    want = "sliding_attention" if window is not None else "full_attention"
    o.require("layer_types", lambda v: v is None or (isinstance(v, list) and all(t == want for t in v)),
              f"MistralForCausalLM applies sliding_window={window} to every layer; only all-"
              f"{want!r} layer_types agree with it")
    return window


def full_attention_only(o: Options) -> None:
    """Qwen's sliding-window options: accepted only when they have no effect."""
    why = "jaxformer's Qwen attention is full (no per-layer sliding window)"
    use = o.require("use_sliding_window", (False,), why)
    o["sliding_window"], o["max_window_layers"]  # no effect while use_sliding_window is false
    if use:
        o.problem("max_window_layers", why)
    o.require("layer_types", lambda v: v is None or (isinstance(v, list) and
                                                      all(t == "full_attention" for t in v)), why)


def bert_relative_key(key: str, arch: str) -> str | None:
    """The BertModel-relative name of a key: `bert.` prefix removed (a classification
    checkpoint always has it; a BertModel one may), legacy gamma/beta leaves read as
    weight/bias (as transformers reads them, on any key)."""
    if key.startswith("bert."):
        key = key[len("bert."):]
    elif arch == "BertForSequenceClassification" and not key.startswith("classifier."):
        return None
    if key.endswith(".gamma"):
        key = key[: -len("gamma")] + "weight"
    elif key.endswith(".beta"):
        key = key[: -len("beta")] + "bias"
    return key


def position_table_from_hf(x):
    """HF's [1, N, D] position table -> [N, D] (ViT, DINOv2)."""
    return x.reshape(tuple(x.shape[1:])) if x.ndim == 3 and x.shape[0] == 1 else x  # [1, N, D] -> [N, D]


def plain_activation(name: str) -> str:
    """HF hidden_act of a plain (ungated) FFN -> our ffn kind, or ValueError naming it."""
    plain = activations(gated=False)
    if name not in plain:
        raise ValueError(f"HF hidden_act={name!r} has no jaxformer ffn kind; known: {sorted(plain)}")
    return ACTIVATIONS[name]


def square_size(v, field: str) -> int:
    """An HF (h, w) size that must be square -> its side, or ValueError naming the field."""
    v = tuple(v)
    if len(v) != 2 or v[0] != v[1]:
        raise ValueError(f"HF {field}={v}: only square sizes map")
    return int(v[0])


def finish_config(fn, o: Options):
    """Finish reading config.json options `o`, then build with fn(); a ValueError or ConfigError
    from the build names config.json and the family."""
    o.finish()
    try:
        return fn()
    except (ValueError, ConfigError) as e:
        raise ConfigError(f"config.json ({o.family}): {e}") from None


def label_maps(n: int) -> dict:
    """HF's default id2label / label2id for n classes."""
    return {"id2label": {str(i): f"LABEL_{i}" for i in range(n)},
            "label2id": {f"LABEL_{i}": i for i in range(n)}}
