"""LoRA (Hu et al. 2021) as PEFT defines it, shared by both trees (layers/lora.py in each).
Imports neither jax nor torch.

    LoRAConfig       r, alpha, dropout, use_rslora, init, target_modules, target_parameters,
                     rank_pattern, alpha_pattern
    lora_scaling     alpha / r, or alpha / sqrt(r) with rslora (PEFT's LoraLayer.update_layer)
    select_targets   which module paths an adapter wraps (PEFT's check_target_module_exists)
    select_parameters   which stacked expert / router weights get an adapter (target_parameters)
    peft_refusals    the PEFT LoraConfig options jaxformer does not implement, each named

Field names follow our YAML style; `from_peft` / `to_peft` map PEFT's adapter_config.json names
(lora_alpha, lora_dropout, init_lora_weights) onto them.
"""
from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from jaxformer.config.base import ConfigError, check, check_choice, check_positive, from_dict

INITS = ("kaiming", "gaussian")
# Every attention and MLP projection our models name (layers/attention.py, layers/ffn.py, and
# the MLA projections of DeepSeek's names): PEFT's "all-linear" without the LM head. Embeddings
# are not Linear layers, so they can never be wrapped.
DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
                   "q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj")

# PEFT LoraConfig options that change the maths or the set of trained weights, with the value
# that means "off". Any other value is refused by name: an adapter trained or loaded with it
# would silently compute something else here.
_PEFT_OFF: dict[str, Any] = {
    "use_dora": False, "modules_to_save": None, "layers_to_transform": None, "layers_pattern": None,
    "bias": "none", "fan_in_fan_out": False, "exclude_modules": None, "lora_bias": False, "use_qalora": False,
    "layer_replication": None, "trainable_token_indices": None, "megatron_config": None,
    "alora_invocation_tokens": None, "use_bdlora": None, "arrow_config": None, "kasa_config": None,
}
# PEFT keys that carry no maths (bookkeeping, or options of inits we refuse through
# init_lora_weights)
_PEFT_IGNORED = {
    "peft_type", "task_type", "base_model_name_or_path", "revision", "inference_mode", "auto_mapping",
    "peft_version", "megatron_core", "loftq_config", "eva_config", "corda_config", "lora_ga_config",
    "velora_config", "monteclora_config", "runtime_config", "qalora_group_size", "astra_config",
    "ensure_weight_tying",  # ties adapters of tied embeddings; embedding adapters are refused by key
}
_PEFT_INITS = {True: "kaiming", "gaussian": "gaussian"}
# Options that only say which modules get an adapter and how it starts, so that an adapter
# read with its tensors (hf/adapters.py: the tensors name the adapted modules and hold A and B)
# is fully determined without them. init_lora_weights=False (A and B both nn.Linear's random
# init) is then recorded as "kaiming": the init of a loaded adapter is moot.
_PEFT_BY_TENSORS = ("exclude_modules", "layers_to_transform", "layers_pattern")


def lora_scaling(alpha: float, r: int, use_rslora: bool) -> float:
    """The factor on B @ A: alpha / r, or alpha / sqrt(r) with rank-stabilized LoRA (Kalajdzievski
    2023), as PEFT computes it."""
    return alpha / math.sqrt(r) if use_rslora else alpha / r


def pattern_value(patterns: Mapping[str, Any] | None, path: str, default):
    r"""PEFT's rank_pattern / alpha_pattern rule (peft.utils.other.get_pattern_key): the value of
    the first key k (in the mapping's order) with re.match(rf"(.*\.)?({k})$", path), else default."""
    for key, value in (patterns or {}).items():
        if re.match(rf"(.*\.)?({key})$", path):
            return value
    return default


def _is_empty(value) -> bool:
    return value is None or value == {} or value == [] or value == ()


def peft_refusals(options: Mapping[str, Any], with_tensors: bool = False) -> list[str]:
    """One line per PEFT LoraConfig option in `options` that is set to something jaxformer does
    not implement (DoRA, modules_to_save, per-layer ranks, ...). with_tensors: the adapter's
    saved tensors come with it, so options they determine (_PEFT_BY_TENSORS) are accepted."""
    out = []
    for key, off in _PEFT_OFF.items():
        if key not in options or (with_tensors and key in _PEFT_BY_TENSORS):
            continue
        value = options[key]
        if not (value == off or (_is_empty(off) and _is_empty(value))):
            out.append(f"{key}={value!r} is not supported (only {off!r})")
    init = options.get("init_lora_weights", True)
    if init not in _PEFT_INITS and not (with_tensors and init is False):
        out.append(f"init_lora_weights={init!r} is not supported (only true or 'gaussian')")
    return out


@dataclass(frozen=True)
class LoRAConfig:
    """Low-rank adapters on Linear layers: y = W x + b + B(A(dropout(x))) * scaling.

    r: the rank (required).  alpha: PEFT's lora_alpha (default 8, as PEFT).
    dropout: on the adapter's input only (PEFT's lora_dropout), never on the base path.
    use_rslora: scaling alpha / sqrt(r) instead of alpha / r.
    init: "kaiming" (PEFT's default: A as torch's nn.Linear init, kaiming-uniform with a=sqrt(5),
        i.e. U(-1/sqrt(in), 1/sqrt(in)); B zeros) or "gaussian" (A ~ N(0, (1/r)^2); B zeros).
        B = 0 makes a fresh adapter leave the model's output unchanged.
    target_modules: None = DEFAULT_TARGETS (every attention and MLP projection, never the LM
        head); a list of names, each matching a module whose dotted path equals it or ends in
        "." + it (PEFT's rule: "q_proj", or "self_attn.q_proj"); or one string, a regular
        expression matched against the whole dotted path with re.fullmatch (PEFT's rule).
        Each listed name must match some Linear layer; the regex must match at least one. An
        empty list adapts no Linear layer (with target_parameters only).
    target_parameters: stacked weights adapted in place, PEFT's target_parameters (its
        ParamWrapper): "gate_up_proj" (a gated MoE's gate and up expert weights as one [E, 2F, D]
        stack, gate rows first, as transformers fuses them), "down_proj", "up_proj" (ungated
        experts), "router.weight"; matched as target_modules' names are, against the weight's
        dotted path (decoder.layers.0.ffn.experts.gate_up_proj). One (A, B) pair per expert;
        no dropout (PEFT refuses it there too). layers/lora.py ParamLoRA.
    rank_pattern / alpha_pattern: per-adapter r and alpha by PEFT's rule (`pattern_value`) on our
        dotted paths, e.g. {"gate_up_proj": 8}; PEFT writes them for the fused gate_up_proj.
    """

    r: int
    alpha: float = 8.0
    dropout: float = 0.0
    use_rslora: bool = False
    init: str = "kaiming"
    target_modules: tuple[str, ...] | str | None = None
    target_parameters: tuple[str, ...] | None = None
    rank_pattern: dict[str, int] | None = None
    alpha_pattern: dict[str, float] | None = None

    def __post_init__(self):
        check_positive(self, "r")
        check(isinstance(self.alpha, (int, float)) and not isinstance(self.alpha, bool) and self.alpha > 0,
              "alpha", f"must be a positive number, got {self.alpha!r}")
        # 1.0 is allowed: the adapter path is then dropped entirely in training (both trees
        # return exact zeros), which the parity suite uses as a deterministic dropout
        check(isinstance(self.dropout, (int, float)) and 0.0 <= self.dropout <= 1.0,
              "dropout", f"must be a probability in [0, 1], got {self.dropout!r}")
        check_choice(self, "init", INITS)
        t = self.target_modules
        if isinstance(t, str):
            try:
                re.compile(t)
            except re.error as e:
                raise ConfigError(f"target_modules: {t!r} is not a regular expression ({e})") from None
        elif t is not None:
            if isinstance(t, list):
                object.__setattr__(self, "target_modules", tuple(t))
            check((len(self.target_modules) > 0 or bool(self.target_parameters))
                  and all(isinstance(n, str) and n for n in self.target_modules),
                  "target_modules", f"must be None, a non-empty list of module names or one regex, got {t!r}")
        self._check_parameters()

    def _check_parameters(self) -> None:
        p = self.target_parameters
        if isinstance(p, (list, set)):
            object.__setattr__(self, "target_parameters", tuple(sorted(p)) if isinstance(p, set) else tuple(p))
        check(p is None or (len(p) > 0 and all(isinstance(n, str) and n for n in p)), "target_parameters",
              f"must be None or a non-empty list of parameter names, got {p!r}")
        check(not (p and self.dropout), "dropout", f"must be 0 with target_parameters (PEFT's ParamWrapper "
              f"has no dropout: the update is added to the weight), got {self.dropout!r}")
        for field, kind in (("rank_pattern", int), ("alpha_pattern", (int, float))):
            pat = getattr(self, field)
            check(pat is None or isinstance(pat, dict), field, f"must be a mapping, got {pat!r}")
            for key, value in (pat or {}).items():
                check(isinstance(value, kind) and not isinstance(value, bool) and value > 0, field,
                      f"{key!r}: must be a positive {'int' if kind is int else 'number'}, got {value!r}")
                try:
                    re.compile(key)
                except (re.error, TypeError) as e:
                    raise ConfigError(f"{field}: {key!r} is not a regular expression ({e})") from None

    def rank_of(self, path: str) -> int:
        """The rank of the adapter at dotted `path` (rank_pattern, else r)."""
        return pattern_value(self.rank_pattern, path, self.r)

    def alpha_of(self, path: str) -> float:
        """The alpha of the adapter at dotted `path` (alpha_pattern, else alpha)."""
        return pattern_value(self.alpha_pattern, path, self.alpha)

    def scaling_of(self, path: str) -> float:
        """The scaling of the adapter at dotted `path` (rank_pattern / alpha_pattern applied)."""
        return lora_scaling(self.alpha_of(path), self.rank_of(path), self.use_rslora)

    def match_parameter(self, path: str) -> str | None:
        """The target_parameters entry that selects the weight at dotted `path`, or None."""
        for name in self.target_parameters or ():
            if path == name or path.endswith("." + name):
                return name
        return None

    @property
    def scaling(self) -> float:
        return lora_scaling(self.alpha, self.r, self.use_rslora)

    def match(self, path: str) -> str | None:
        """The target_modules entry (the regex itself for a string) that selects the module at
        dotted `path`, or None."""
        t = DEFAULT_TARGETS if self.target_modules is None else self.target_modules
        if isinstance(t, str):
            return t if re.fullmatch(t, path) else None
        for name in t:
            if path == name or path.endswith("." + name):
                return name
        return None

    @classmethod
    def from_peft(cls, options: Mapping[str, Any], with_tensors: bool = False) -> LoRAConfig:
        """A PEFT adapter_config.json dict -> LoRAConfig; unsupported options are refused by name.
        with_tensors: read with the adapter's tensors, which then decide the adapted modules
        (exclude_modules, layers_to_transform and layers_pattern accepted, target_modules kept as
        listed) and A and B (init_lora_weights=False accepted, recorded as "kaiming")."""
        problems = peft_refusals(options, with_tensors)
        if options.get("peft_type", "LORA") != "LORA":
            problems.append(f"peft_type={options['peft_type']!r} is not supported (only 'LORA')")
        known = {"r", "lora_alpha", "lora_dropout", "use_rslora", "init_lora_weights", "target_modules",
                 "target_parameters", "rank_pattern", "alpha_pattern"}
        # A newer PEFT writes every LoraConfig field, its new ones at their "off" value (None,
        # False, empty): those cannot change the adapter and are accepted; one set to anything
        # else is refused by name (peft 0.22 added astra_config this way).
        unknown = sorted(k for k in set(options) - known - set(_PEFT_OFF) - _PEFT_IGNORED
                         if not (options[k] is False or _is_empty(options[k])))
        problems += [f"{k}={options[k]!r}: unknown PEFT LoraConfig option (only unset is accepted)" for k in unknown]
        if problems:
            raise ConfigError("PEFT adapter config: " + "; ".join(problems))
        target = options.get("target_modules")
        if target == "all-linear":  # PEFT's shorthand: every Linear but the output layer
            target = None
        return cls(r=options.get("r", 8), alpha=options.get("lora_alpha", 8),
                   dropout=options.get("lora_dropout", 0.0), use_rslora=options.get("use_rslora", False),
                   init=_PEFT_INITS.get(options.get("init_lora_weights", True), "kaiming"),
                   target_modules=list(target) if isinstance(target, (list, tuple, set)) else target,
                   target_parameters=options.get("target_parameters") or None,
                   rank_pattern=options.get("rank_pattern") or None, alpha_pattern=options.get("alpha_pattern") or None)

    def to_peft(self) -> dict[str, Any]:
        """The LoRA fields of a PEFT adapter_config.json (the exporter adds the model's name
        and task); target_modules None is written as DEFAULT_TARGETS."""
        t = DEFAULT_TARGETS if self.target_modules is None else self.target_modules
        return {"peft_type": "LORA", "r": self.r, "lora_alpha": self.alpha, "lora_dropout": self.dropout,
                "use_rslora": self.use_rslora, "init_lora_weights": True if self.init == "kaiming" else "gaussian",
                "target_modules": t if isinstance(t, str) else sorted(t), "bias": "none",
                "fan_in_fan_out": False, "use_dora": False, "modules_to_save": None,
                "target_parameters": None if self.target_parameters is None else sorted(self.target_parameters),
                "rank_pattern": dict(self.rank_pattern or {}), "alpha_pattern": dict(self.alpha_pattern or {})}


def lora_config_from_dict(data: Mapping[str, Any], prefix: str = "lora.") -> LoRAConfig:
    """YAML mapping -> LoRAConfig. PEFT option names we refuse (use_dora, modules_to_save, ...)
    are refused by name before the generic unknown-key error."""
    refused = [k for k in data if k in _PEFT_OFF]
    if refused:
        raise ConfigError("; ".join(f"{prefix}{k}: PEFT's {k} is not supported by jaxformer's LoRA"
                                    for k in refused))
    return from_dict(LoRAConfig, data, prefix=prefix)


def select_targets(cfg: LoRAConfig, modules: Mapping[str, bool]) -> list[str]:
    """{dotted path: is a Linear layer} -> the sorted paths to wrap.

    ConfigError when target_modules selects a module that is not a Linear layer, when a listed
    name (or the regex) matches nothing, or when nothing matches at all (PEFT raises too)."""
    hits = {p: cfg.match(p) for p in modules}
    chosen = sorted(p for p, m in hits.items() if m is not None)
    not_linear = [p for p in chosen if not modules[p]]
    if not_linear:
        raise ConfigError(f"target_modules selects {not_linear}, which are not Linear layers; LoRA "
                          f"wraps Linear layers only")
    if cfg.target_modules is None:
        if not chosen:
            raise ConfigError(f"target_modules: none of the default targets {list(DEFAULT_TARGETS)} is in the model")
    elif isinstance(cfg.target_modules, str):
        if not chosen:
            raise ConfigError(f"target_modules: the regex {cfg.target_modules!r} matches no module path")
    else:
        unmatched = [n for n in cfg.target_modules if n not in set(hits.values())]
        if unmatched:
            raise ConfigError(f"target_modules: {unmatched} match no module of the model")
    return chosen


def select_parameters(cfg: LoRAConfig, params: Mapping[str, str | None]) -> list[str]:
    """{dotted weight path: None if LoRA can adapt it, else why not} -> the sorted paths
    cfg.target_parameters selects. ConfigError when it selects a weight that cannot be adapted,
    or when a listed name matches nothing."""
    if not cfg.target_parameters:
        return []
    hits = {p: cfg.match_parameter(p) for p in params}
    chosen = sorted(p for p, m in hits.items() if m is not None)
    refused = [f"{p} ({params[p]})" for p in chosen if params[p] is not None]
    if refused:
        raise ConfigError(f"target_parameters selects {refused}")
    unmatched = [n for n in cfg.target_parameters if n not in set(hits.values())]
    if unmatched:
        raise ConfigError(f"target_parameters: {unmatched} match no expert or router weight of the model")
    return chosen


__all__ = ["LoRAConfig", "DEFAULT_TARGETS", "INITS", "lora_scaling", "peft_refusals", "select_targets",
           "select_parameters", "pattern_value", "lora_config_from_dict"]
