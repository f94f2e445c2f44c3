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
from typing import Any, Callable, Iterable, Mapping

from jaxformer.config import ConfigError

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
}


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
        unknown = sorted(k for k in self.raw if k not in self.used and k not in self.ignored
                         and k not in GENERIC_IGNORED)
        problems = list(self.problems)
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
    """bos/eos/pad ids for jaxformer: a list of eos ids keeps the first (noted), a null pad
    becomes 0 (only used to fill generated rows after EOS and for masks)."""
    out = {}
    names = (("bos_id", "bos_token_id"), ("eos_id", "eos_token_id")) if need_bos_eos else ()
    for ours, theirs in names + (("pad_id", "pad_token_id"),):
        v = opts[theirs]
        if isinstance(v, list):
            if not v:
                v = None
            else:
                if len(v) > 1:
                    opts.notes.append(f"{theirs}={v}: jaxformer keeps one id, {v[0]}; generation "
                                      f"stops only at {v[0]}")
                v = v[0]
        if v is None:
            if ours == "pad_id":
                opts.notes.append("pad_token_id is null: pad_id=0 (only fills generated rows "
                                  "after EOS; pass attention masks explicitly)")
                v = 0
            else:
                opts.problem(theirs, f"jaxformer needs a {ours} in [0, {vocab_size})")
                continue
        if not (isinstance(v, int) and 0 <= v < vocab_size):
            opts.problem(theirs, f"must be a token id in [0, vocab_size={vocab_size})")
            continue
        out[ours] = v
    return out


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
