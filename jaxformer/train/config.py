"""The run config: YAML -> typed, frozen dataclasses with `model`, `data`, `train` and
`parallel` sections. Framework-free. `--set a.b=value` overrides any nested key before
validation, so a bad override fails exactly like a bad YAML value: with the key named."""
from __future__ import annotations

import contextlib
import dataclasses
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import yaml

from jaxformer.config import ConfigError, from_dict, model_config_class, model_config_from_dict, to_dict
from jaxformer.config.base import check, check_choice, check_positive, check_prob, override_path
from jaxformer.config.lora import _PEFT_OFF, LoRAConfig
from jaxformer.config.module import MODULE, TASK_FAMILY, TASKS, absolute_spec
from jaxformer.fileio import yaml_load

SCHEDULES = ("warmup_cosine", "constant", "inverse_sqrt")
INITS = ("default", "xavier_uniform", "normal_0.02")
PRECISIONS = ("fp32", "bf16")
# jax.checkpoint_policies' names, and offload_layer_inputs (jaxformer/lowering.py remat_policy)
REMAT_POLICIES = ("nothing_saveable", "dots_saveable", "dots_with_no_batch_dims_saveable",
                  "everything_saveable", "offload_layer_inputs")
PARALLEL_MODES = ("none", "pmap", "mesh")
NONFINITE = ("stop", "skip")
LORA_BASE_DTYPES = ("fp32", "bf16", "int8")  # layers/kernels/quant.py's reduced weights
ATTENTION = ("auto", "plain", "blockwise", "splash")  # jaxformer/lowering.py's attention switch
QUANTIZATION = ("int8", "fp8")  # layers/kernels/quant_train.py MODES (config imports no layers)


@dataclass(frozen=True)
class TrainLoRAConfig(LoRAConfig):
    """`train.lora:` LoRA fine-tuning (jaxformer/config/lora.py's fields, PEFT's defaults; only
    `r` is required, and target_modules defaults to every attention and MLP projection), plus
    base_dtype: how the frozen base of each adapted layer is stored while training, fp32, or
    bf16 / int8 (QLoRA style, layers/kernels/quant.py's weights; the adapters stay fp32)."""

    base_dtype: str = "fp32"

    def __post_init__(self):
        super().__post_init__()
        check_choice(self, "base_dtype", LORA_BASE_DTYPES)
        check(self.base_dtype == "fp32" or not self.target_parameters, "base_dtype",
              f"{self.base_dtype!r} stores Linear bases only; the stacked weights of target_parameters stay "
              "fp32: use fp32, or adapt Linear layers only")

    def adapter(self) -> LoRAConfig:
        """The LoRAConfig alone (what the model checkpoint's model.yaml records)."""
        return LoRAConfig(**{f.name: getattr(self, f.name) for f in dataclasses.fields(LoRAConfig)})


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 200
    batch_size: int = 32  # examples per optimizer step (all devices, all micro-batches)
    seed: int = 0
    lr: float = 1e-3
    schedule: str = "warmup_cosine"
    warmup_steps: int = 20  # Vaswani et al. 2017 use 4000 at full size
    min_lr_ratio: float = 0.0  # cosine floor, as a fraction of lr
    weight_decay: float = 0.01
    decay_norms_and_biases: bool = False  # False: exempt 1-D params (biases, norm scales)
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    grad_clip: float = 1.0  # max global norm; 0 disables
    label_smoothing: float = 0.0
    grad_accum_steps: int = 1
    precision: str = "fp32"  # bf16: bf16 compute, fp32 params and optimiser state
    remat: bool = False
    remat_policy: str = "nothing_saveable"
    init: str = "default"
    # if set, EVERY dropout rate of the model for training: `dropout` and each `*_dropout` field
    # (attn_dropout, ffn_dropout, embed_dropout, ...); not Swin's drop_path_rate (stochastic
    # depth, a different regulariser). The saved model config keeps the model section's rates.
    dropout: float | None = None
    init_from: str | None = None  # a model checkpoint dir (jaxformer/checkpoint_io.py) to fine-tune
    lora: TrainLoRAConfig | None = None  # set: train LoRA adapters only (jaxformer/train/lora.py)
    eval_every: int = 50
    eval_batches: int = 4
    checkpoint_every: int = 50
    keep_checkpoints: int = 2  # the last K, plus the best by eval loss
    async_checkpoint: bool = True
    log_every: int = 1  # fetch metrics from the device every N steps (and at eval/checkpoint steps)
    on_nonfinite: str = "stop"  # NaN/inf loss or grad norm: stop (exit 2, keep the last good
    # checkpoint) or skip (that step leaves params and optimizer state unchanged; counted)
    sample_tokens: int = 48  # length of the sample printed at the end (lm, seq2seq)
    sample_temperature: float = 0.8  # lm: the sampled continuation's settings (train/samples.py)
    sample_top_p: float = 0.9
    # how self-attention is computed (jaxformer/lowering.py; the function is the same): auto
    # (per layer, the platform's fastest kernel that takes it: splash on TPU, cuDNN flash on
    # GPU, blockwise from 1024 keys on, plain below; layers/dispatch.py choose_attention), plain
    # ([B, H, T, S] scores, O(T^2) memory), blockwise (online softmax over key blocks, O(T)),
    # splash (TPU's Pallas kernel, blockwise elsewhere); attention_blocks = (query, key) block
    attention: str = "auto"
    attention_blocks: tuple[int, int] = (512, 512)
    # the token loss in sequence chunks of at most this many MiB of float32 logits per device
    # (layers/kernels/chunked_loss.py; the same loss within fp32 rounding); null: the logits whole
    loss_chunk_mib: int | None = None
    # int8 or fp8 products in every Linear, forward and backward, float master weights and
    # optimiser (layers/kernels/quant_train.py, through qwix; as MaxText's `quantization`);
    # null: float. Changes the numbers within a measured budget (docs/numerics.md §48)
    quantization: str | None = None

    def __post_init__(self) -> None:
        check_positive(self, "steps", "batch_size", "grad_accum_steps", "eval_every", "eval_batches",
                       "checkpoint_every", "keep_checkpoints", "log_every")
        check(self.warmup_steps >= 0, "warmup_steps", f"must be >= 0, got {self.warmup_steps}")
        check(self.lr > 0, "lr", f"must be > 0, got {self.lr}")
        check(0 <= self.min_lr_ratio <= 1, "min_lr_ratio", f"must be in [0, 1], got {self.min_lr_ratio}")
        check(self.weight_decay >= 0, "weight_decay", f"must be >= 0, got {self.weight_decay}")
        check(self.grad_clip >= 0, "grad_clip", f"must be >= 0, got {self.grad_clip}")
        check_prob(self, "label_smoothing", "b1", "b2")
        check(self.eps > 0, "eps", f"must be > 0, got {self.eps}")
        check_choice(self, "schedule", SCHEDULES)
        check_choice(self, "precision", PRECISIONS)
        check_choice(self, "remat_policy", REMAT_POLICIES)
        check_choice(self, "init", INITS)
        check_choice(self, "on_nonfinite", NONFINITE)
        check_choice(self, "attention", ATTENTION)
        check(self.quantization in (None, *QUANTIZATION), "quantization",
              f"must be one of {', '.join(QUANTIZATION)} or null, got {self.quantization!r}")
        check(self.loss_chunk_mib is None or self.loss_chunk_mib > 0, "loss_chunk_mib",
              f"must be a positive number of MiB or null, got {self.loss_chunk_mib}")
        check(all(b > 0 for b in self.attention_blocks), "attention_blocks",
              f"must be two positive block sizes [query, key], got {list(self.attention_blocks)}")
        check(math.isfinite(self.lr), "lr", f"must be finite, got {self.lr}")
        check(self.batch_size % self.grad_accum_steps == 0, "grad_accum_steps",
              f"batch_size={self.batch_size} is not divisible by grad_accum_steps={self.grad_accum_steps}")
        check(self.sample_tokens >= 0, "sample_tokens", "must be >= 0")
        check(self.sample_temperature > 0 and math.isfinite(self.sample_temperature), "sample_temperature",
              f"must be a finite number > 0, got {self.sample_temperature}")
        check(0 < self.sample_top_p <= 1, "sample_top_p", f"must be in (0, 1], got {self.sample_top_p}")
        if self.dropout is not None:
            check_prob(self, "dropout")

    @property
    def micro_batch(self) -> int:
        return self.batch_size // self.grad_accum_steps


@dataclass(frozen=True)
class MeshConfig:
    data: int = -1  # -1: the rest of the devices
    fsdp: int = 1  # -1 (with data set): the rest of the devices, e.g. data 1, fsdp -1 = pure FSDP
    tensor: int = 1
    expert: int = 1  # expert parallelism: MoE experts split over it; it also splits the batch
    # context parallelism: the sequence split over it, attention as ring attention
    # (jaxformer/layers/kernels/ring.py); lm only, data.seq_len divisible by 2 x context (zigzag)
    context: int = 1
    # pipeline parallelism: a scanned LM's layers in this many stages (layers/kernels/pipeline.py,
    # GPipe), the batch in parallel.pipeline_microbatches microbatches; outermost axis
    pipeline: int = 1

    def __post_init__(self) -> None:
        check_positive(self, "tensor", "expert", "context", "pipeline")
        check(self.data == -1 or self.data > 0, "data", f"must be -1 (the rest) or > 0, got {self.data}")
        check(self.fsdp == -1 or self.fsdp > 0, "fsdp", f"must be -1 (the rest) or > 0, got {self.fsdp}")
        check(not (self.data == -1 and self.fsdp == -1), "fsdp",
              "-1 takes the devices the other axes leave, and so does data: set data to a number")


# pipeline is the outermost axis (its stages exchange one activation per tick); expert sits
# outside tensor: tensor is the innermost (fastest-linked) axis; context next to it
# (ring attention passes key/value blocks between neighbours on it at every layer)
MESH_AXES = ("pipeline", "data", "fsdp", "expert", "context", "tensor")
CONTEXT_AXIS = "context"
DCN_AXES = ("data", "fsdp")  # the axes a multi-slice run may split across slices (parallel.dcn_axis)
# logical axis (jaxformer/layers/kernels/partitioning.py) -> mesh axis, several, or None (never split)
LOGICAL_AXIS_RULES: dict[str, Any] = {
    # the global batch is split over data x fsdp x expert (the expert axis is data parallel
    # outside the MoE layers, so every device holds distinct tokens to send to the experts)
    "batch": ("data", "fsdp", "expert"),
    "embed": "fsdp",            # the model width of every weight: FSDP shards params + optimiser state
    "heads": "tensor",          # attention heads (q/k/v out, o in): Megatron column/row split
    "mlp": "tensor",            # FFN hidden width (gate/up out, down in)
    "vocab": "tensor",          # embedding rows, LM head outputs
    "norm": None,               # norm scales and biases: small, replicated
    "layers": "pipeline",       # the stacked layer axis of scanned layers: split into pipeline stages
    "expert": "expert",         # the expert axis E of MoE weights (layers/moe.py): expert parallelism
}


@dataclass(frozen=True)
class ParallelConfig:
    mode: str = "none"
    mesh: MeshConfig = field(default_factory=MeshConfig)
    num_devices: int | None = None  # pmap/mesh: devices to use; None = all local devices
    # mesh: overrides of LOGICAL_AXIS_RULES, e.g. {vocab: null, mlp: [fsdp, tensor]}
    axis_rules: dict = field(default_factory=dict)
    # multi-slice (mesh): the devices are on this many TPU slices (or processes); dcn_axis (data
    # or fsdp) is split across them over the data-center network, every other axis stays inside
    # a slice (train/sharding.py hybrid_devices)
    slices: int = 1
    dcn_axis: str = "data"
    # pipeline (parallel.mesh.pipeline > 1): microbatches per optimizer micro-batch; null: as many
    # as there are stages (bubble (S - 1) / (M + S - 1): more microbatches, less idle time)
    pipeline_microbatches: int | None = None

    def __post_init__(self) -> None:
        check_choice(self, "mode", PARALLEL_MODES)
        check_positive(self, "slices")
        check(self.pipeline_microbatches is None or self.pipeline_microbatches > 0, "pipeline_microbatches",
              f"must be a positive number or null, got {self.pipeline_microbatches}")
        check_choice(self, "dcn_axis", DCN_AXES)
        for name, target in self.axis_rules.items():
            if name not in LOGICAL_AXIS_RULES:
                raise ConfigError(f"parallel.axis_rules: unknown logical axis {name!r}; "
                                  f"known: {sorted(LOGICAL_AXIS_RULES)}")
            names = [target] if isinstance(target, str) or target is None else target
            if not isinstance(names, (list, tuple)) or any(
                    n is not None and n not in MESH_AXES for n in names) or \
                    len(set(names)) != len(names) or (None in names and len(names) > 1):
                raise ConfigError(f"parallel.axis_rules.{name}: {target!r} is not a mesh axis, a list of "
                                  f"distinct mesh axes ({', '.join(MESH_AXES)}) or null")

    @property
    def microbatches(self) -> int:
        """The pipeline's microbatches (1 unpipelined)."""
        return 1 if self.mesh.pipeline == 1 else self.pipeline_microbatches or self.mesh.pipeline

    def logical_axis_rules(self) -> dict[str, tuple[str, ...]]:
        """The logical -> mesh axes table with the overrides applied (each value a tuple)."""
        merged = {**LOGICAL_AXIS_RULES, **self.axis_rules}
        return {k: (() if v is None else (v,) if isinstance(v, str) else tuple(v)) for k, v in merged.items()}


@dataclass(frozen=True)
class RunConfig:
    model_name: str
    model: Any
    data_name: str
    data: Any  # the dataset module's own frozen Config dataclass
    train: TrainConfig
    parallel: ParallelConfig
    task: str | None = None  # a model.module's task (config/module.py TASKS); None for registry models

    @property
    def family(self) -> str:
        """The registered family whose batches, loss and metrics the run shares
        (jaxformer/train/tasks.py): the model's name, or a model.module's task's family."""
        return TASK_FAMILY[self.task] if self.model_name == MODULE else self.model_name

    def to_dict(self) -> dict:
        out = {"model": {"name": self.model_name, **to_dict(self.model)},
               "data": {"name": self.data_name, **to_dict(self.data)},
               "train": to_dict(self.train), "parallel": to_dict(self.parallel)}
        return out if self.task is None else {"task": self.task, **out}


SECTIONS = ("model", "data", "train", "parallel")
TOP_LEVEL = SECTIONS + ("task",)  # task: a scalar beside the sections


def apply_override(raw: dict, assignment: str) -> None:
    """'train.lr=3e-4' -> raw['train']['lr'] = 3e-4 (value parsed as YAML)."""
    if "=" not in assignment:
        raise ConfigError(f"--set {assignment!r}: expected key=value")
    key, value = assignment.split("=", 1)
    parts = key.strip().split(".")
    if parts == ["task"]:
        raw["task"] = value.strip()
        return
    if parts[0] not in SECTIONS or len(parts) < 2:
        raise ConfigError(f"--set {key}: unknown key; it must start with one of {SECTIONS}")
    if parts[0] == "model" and isinstance(raw.get("model"), dict):  # a flat key of a nested YAML, or back
        parts = ["model", *_model_override_path(raw["model"], parts[1:])]
    node = raw
    for p in parts[:-1]:
        node = node.setdefault(p, {})
        if not isinstance(node, dict):
            raise ConfigError(f"--set {key}: {p} is not a section")
    try:
        node[parts[-1]] = yaml_load(value)
    except yaml.YAMLError as e:
        raise ConfigError(f"--set {key}: not a valid YAML value: {getattr(e, 'problem', None) or e}") from None


def _model_override_path(model: dict, parts: list[str]) -> list[str]:
    """--set model.KEY: the path in the model section (config/base.py's override_path), by the
    section's model class; as given where the name is missing or unknown (the load names it)."""
    name = model.get("name", MODULE if "module" in model else None)
    try:
        cls = model_config_class(name) if isinstance(name, str) else None
    except ConfigError:
        cls = None
    return parts if cls is None else override_path(cls, model, parts)


def config_from_dict(raw: Mapping[str, Any]) -> RunConfig:
    unknown = sorted(set(raw) - set(TOP_LEVEL))
    if unknown:
        raise ConfigError(f"unknown top-level key(s) {unknown}; valid: {list(TOP_LEVEL)}")
    if "model" not in raw:
        raise ConfigError("model: missing section")
    for key in SECTIONS:  # a section written as a list, a number or (model) null: one error naming it
        if not isinstance(raw.get(key, {}), Mapping) and not (key != "model" and raw[key] is None):
            raise ConfigError(f"{key}: must be a mapping of the section's fields, got {raw[key]!r}"[:300])
    name, model = model_config_from_dict(raw["model"])
    data_raw = dict(raw.get("data") or {})
    if "name" not in data_raw:
        raise ConfigError("data.name: missing; it selects the dataset")
    data_name = data_raw.pop("name")
    from jaxformer.train.data import dataset_config_class
    data = from_dict(dataset_config_class(data_name), data_raw, prefix="data.")
    train_raw = raw.get("train") or {}
    refused = sorted(set(train_raw.get("lora") or {}) & set(_PEFT_OFF)) if isinstance(train_raw, Mapping) else []
    if refused:  # PEFT options we do not implement, refused by name (config/lora.py)
        raise ConfigError("; ".join(f"train.lora.{k}: PEFT's {k} is not supported by jaxformer's LoRA"
                                    for k in refused))
    train = from_dict(TrainConfig, train_raw, prefix="train.")
    parallel = from_dict(ParallelConfig, raw.get("parallel") or {}, prefix="parallel.")
    cfg = RunConfig(name, model, data_name, data, train, parallel, _task(raw, name))
    check_sections(cfg)
    return cfg


def _task(raw: Mapping[str, Any], name: str) -> str | None:
    """The top-level `task:`: required for a model.module (what it learns), refused otherwise
    (a registered model's task is its name's)."""
    task = raw.get("task")
    if name != MODULE:
        if task is not None:
            raise ConfigError(f"task: applies to a model given by model.module; model.name {name} "
                              "trains as its own family")
        return None
    if task is None:
        raise ConfigError(f"task: missing; a model given by model.module needs one of {list(TASKS)} "
                          "(what it learns, and how a batch becomes its call)")
    if task not in TASKS:
        raise ConfigError(f"task: must be one of {list(TASKS)}, got {task!r}")
    return task


BYTE_VOCAB = 259  # the embedded text datasets' byte-level ids (train/data/tokenizer.py)
DATA_FOR_MODEL = {"lm": ("stdlib_docs", "tokens"), "classifier": ("text_source",), "seq2seq": ("dates",),
                  "vit": ("digits", "image_folder"), "swin": ("digits", "image_folder"),
                  "timeseries": ("series",)}
DATA_FOR_TASK = {"causal_lm": ("stdlib_docs", "tokens"), "classification": ("text_source", "digits", "image_folder"),
                 "seq2seq": ("dates",)}


def check_sections(cfg: RunConfig) -> None:
    """Checks across sections that are known before any data is loaded or file written: the
    dataset fits the model (lengths, vocab, classes, channels) and the batch divides statically.
    All problems are reported in one ConfigError."""
    m, d, t, p = cfg.model, cfg.data, cfg.train, cfg.parallel
    problems = []

    def need(ok: bool, msg: str) -> None:
        if not ok:
            problems.append(msg)

    if cfg.model_name == MODULE:
        problems += _module_problems(cfg)
        if problems:
            raise ConfigError("; ".join(problems))
        return
    fits = DATA_FOR_MODEL.get(cfg.model_name)
    need(fits is None or cfg.data_name in fits,
         f"data.name={cfg.data_name} does not fit model.name={cfg.model_name} (use {fits})")
    if cfg.data_name in ("stdlib_docs", "text_source", "tokens"):
        need(d.seq_len <= m.max_len, f"data.seq_len={d.seq_len} exceeds model.max_len={m.max_len}")
    if cfg.data_name == "tokens" and hasattr(m, "vocab_size"):
        # meta.json and every shard's header are read here, so a missing, truncated or foreign
        # directory is an error before any workdir is touched (each names the file)
        from jaxformer.train.data.tokens_data import open_dir
        vocab = open_dir(d).vocab_size
        need(vocab <= m.vocab_size, f"model.vocab_size={m.vocab_size} is below the vocab of the tokens in "
             f"{d.path} ({vocab} ids; its meta.json); set model.vocab_size >= {vocab}")
    if cfg.data_name == "dates":
        for k in ("src_len", "tgt_len"):
            need(getattr(d, k) <= m.max_len, f"data.{k}={getattr(d, k)} exceeds model.max_len={m.max_len}")
    if cfg.data_name in ("stdlib_docs", "text_source", "dates"):
        vocab = [("vocab_size", m.vocab_size)]
        if cfg.model_name == "seq2seq":
            vocab.append(("tgt_vocab_size", m.resolved_tgt_vocab))
        for k, v in vocab:
            need(v >= BYTE_VOCAB, f"model.{k}={v} is below the {cfg.data_name} byte vocabulary ({BYTE_VOCAB})")
    if cfg.data_name == "text_source" and hasattr(m, "num_classes"):
        need(m.num_classes == 3, f"model.num_classes={m.num_classes}; text_source has 3 classes")
    if cfg.model_name == "vit":
        need(m.head == "classifier", f"model.head={m.head!r}: training needs class logits (head 'pooler' "
             "outputs HF ViTModel's pooled features [B, D]); set model.head=classifier and model.num_classes")
    if cfg.data_name == "digits":
        need(getattr(m, "num_classes", 10) == 10, f"model.num_classes={m.num_classes}; digits has 10 classes")
        need(m.num_channels == d.num_channels,
             f"model.num_channels={m.num_channels} differs from data.num_channels={d.num_channels}")
        if cfg.model_name == "vit":
            need(m.image_size == d.image_size,
                 f"model.image_size={m.image_size} differs from data.image_size={d.image_size}")
    if cfg.data_name == "image_folder" and cfg.model_name in ("vit", "swin"):
        problems += _image_folder_problems(cfg)
    if cfg.data_name == "series" and cfg.model_name == "timeseries":
        for k in ("input_len", "horizon", "num_channels", "target_channels"):
            need(tuple(_seq(getattr(m, k))) == tuple(_seq(getattr(d, k))),
                 f"model.{k}={getattr(m, k)} differs from data.{k}={getattr(d, k)}")
    n = p.num_devices
    if p.mode == "pmap" and n:
        need(t.batch_size % (t.grad_accum_steps * n) == 0,
             f"train.batch_size={t.batch_size} is not divisible by grad_accum_steps="
             f"{t.grad_accum_steps} x parallel.num_devices={n} = {t.grad_accum_steps * n}: use a "
             f"multiple of {t.grad_accum_steps * n}")
    attn_rate = t.dropout if t.dropout is not None else getattr(getattr(m, "attention", m), "attn_dropout", 0.0)
    need(t.attention in ("auto", "plain") or not attn_rate,
         f"train.attention={t.attention} does not apply attention dropout ({attn_rate}; it needs the "
         "plain path's [B, H, T, S] weights): set model.attention.attn_dropout (and train.dropout) to 0, or "
         "train.attention: plain")
    if p.mesh.context > 1:
        problems += _context_problems(cfg)
    if p.mesh.pipeline > 1:
        problems += _pipeline_problems(cfg)
    if p.mode == "mesh" and p.mesh.data > 0 and p.mesh.fsdp > 0:
        shards = p.mesh.data * p.mesh.fsdp * p.mesh.expert * p.microbatches
        what = "data x fsdp x expert" + (" x pipeline microbatches" if p.microbatches > 1 else "")
        need(t.micro_batch % shards == 0, f"train.batch_size / grad_accum_steps = {t.micro_batch} "
             f"is not divisible by parallel.mesh {what} = {shards}: use a batch_size "
             f"that is a multiple of {t.grad_accum_steps * shards}")
    if problems:
        raise ConfigError("; ".join(problems))


def _module_problems(cfg: RunConfig) -> list[str]:
    """A model given by model.module (config/module.py): its data fits its task, and the train
    settings that act on jaxformer's own layers are refused by name (the module has none of them).
    What fits only the module itself (its call, its logits' shape) is checked when it is built
    (jaxformer/train/tasks.py check_call)."""
    m, d, t, p = cfg.model, cfg.data, cfg.train, cfg.parallel
    out = []
    fits = DATA_FOR_TASK[cfg.task]
    if cfg.data_name not in fits:
        out.append(f"data.name={cfg.data_name} does not fit task={cfg.task} (use {fits})")
    if getattr(d, "packing", None) == "segments":
        out.append("data.packing: segments needs a model that takes segment ids; a model.module is called with "
                   "the token ids alone: set data.packing: concat")
    why = "acts on jaxformer's own layers, which a model.module does not have"
    for bad, what in ((t.remat, f"train.remat: {why}"), (t.attention not in ("auto", "plain"), f"train.attention={t.attention}: {why}"),
                      (t.lora is not None, f"train.lora: {why}"), (t.init != "default",
                       f"train.init={t.init}: the named schemes know jaxformer's leaf names; a model.module starts "
                       "from its own constructor's init (default)"),
                      (p.mesh.context > 1, f"parallel.mesh.context={p.mesh.context}: ring attention {why}")):
        if bad:
            out.append(what)
    known = set(LOGICAL_AXIS_RULES)
    for pattern, axes in m.axes.items():
        bad = sorted({a for a in axes or () if a is not None and a not in known})
        if bad:
            out.append(f"model.axes: {pattern!r}: unknown logical axis {', '.join(map(repr, bad))}; known: {sorted(known)}")
    if p.mode == "pmap" and p.num_devices:
        n = p.num_devices
        if t.batch_size % (t.grad_accum_steps * n):
            out.append(f"train.batch_size={t.batch_size} is not divisible by grad_accum_steps={t.grad_accum_steps} x "
                       f"parallel.num_devices={n}")
    if p.mode == "mesh" and p.mesh.data > 0 and p.mesh.fsdp > 0:
        shards = p.mesh.data * p.mesh.fsdp * p.mesh.expert
        if t.micro_batch % shards:
            out.append(f"train.batch_size / grad_accum_steps = {t.micro_batch} is not divisible by parallel.mesh "
                       f"data x fsdp x expert = {shards}")
    return out


def data_vocab(cfg: RunConfig) -> int | None:
    """How many token ids the data's targets take (None: the data has no token targets)."""
    if cfg.data_name in ("stdlib_docs", "text_source", "dates"):
        return BYTE_VOCAB
    if cfg.data_name == "tokens":
        from jaxformer.train.data.tokens_data import open_dir
        return open_dir(cfg.data).vocab_size
    return None


def data_classes(cfg: RunConfig) -> int | None:
    """How many classes a classification dataset has (None: not a classification dataset)."""
    if cfg.data_name == "text_source":
        return 3
    if cfg.data_name == "digits":
        return 10
    if cfg.data_name == "image_folder":
        from jaxformer.train.data import image_folder
        return image_folder.num_classes(cfg.data)
    return None


def _pipeline_problems(cfg: RunConfig) -> list[str]:
    """parallel.mesh.pipeline > 1: GPipe over a scanned LM's layers (layers/kernels/pipeline.py)."""
    m, p, t, n = cfg.model, cfg.parallel, cfg.train, cfg.parallel.mesh.pipeline
    if p.mode != "mesh":
        return [f"parallel.mesh.pipeline={n} needs parallel.mode: mesh (got {p.mode})"]
    if cfg.model_name != "lm":
        return [f"parallel.mesh.pipeline={n}: pipeline parallelism is implemented for model.name lm only, "
                f"got {cfg.model_name}"]
    out = []
    if not m.scan_layers:
        out.append(f"parallel.mesh.pipeline={n} splits the stacked layers into stages: set model.scan_layers: true")
    if m.num_layers % n:
        out.append(f"model.num_layers={m.num_layers} does not split into parallel.mesh.pipeline={n} stages")
    if m.feedforward.moe is not None:
        out.append(f"parallel.mesh.pipeline={n}: MoE layers' auxiliary losses are not carried through the "
                   "pipeline; use pipeline 1 for MoE")
    if p.mesh.context > 1:
        out.append("parallel.mesh.pipeline and parallel.mesh.context together are not supported")
    rates = [t.dropout] if t.dropout is not None else [m.dropout, m.embed_dropout, m.attention.attn_dropout,
                                                        m.feedforward.ffn_dropout]
    if any(rates):
        out.append(f"parallel.mesh.pipeline={n}: dropout is not supported in pipeline stages (a stage's RNG "
                   "is not carried across ticks); set the model's dropout rates (or train.dropout) to 0")
    return out


def _context_problems(cfg: RunConfig) -> list[str]:
    """parallel.mesh.context > 1: ring attention over the sequence of an LM (layers/kernels/ring.py)."""
    m, d, p, n = cfg.model, cfg.data, cfg.parallel, cfg.parallel.mesh.context
    out = []
    if p.mode != "mesh":
        out.append(f"parallel.mesh.context={n} needs parallel.mode: mesh (got {p.mode})")
    if cfg.model_name != "lm":
        out.append(f"parallel.mesh.context={n}: context parallelism is implemented for model.name lm "
                   f"only, got {cfg.model_name}")
        return out
    seq = getattr(d, "seq_len", None)
    if seq is not None and seq % (2 * n):
        out.append(f"data.seq_len={seq} does not divide by 2 x parallel.mesh.context = {2 * n} "
                   "(the zigzag layout gives each context device two equal chunks)")
    rate = (cfg.train.dropout if cfg.train.dropout is not None
            else getattr(getattr(m, "attention", m), "attn_dropout", 0.0))
    if rate:
        out.append(f"parallel.mesh.context={n}: attention dropout {rate} is not applied by ring attention "
                   "(it needs the [B, H, T, S] weights); set model.attention.attn_dropout (and train.dropout) to 0")
    if getattr(getattr(m, "positions", None), "kind", None) == "t5":
        out.append(f"parallel.mesh.context={n}: T5's relative bias is a dense [H, T, S] bias that ring "
                   "attention does not pass around the ring")
    return out


def _image_folder_problems(cfg: RunConfig) -> list[str]:
    """Your images against the vision model: channels, vit's image size, the class count."""
    from jaxformer.train.data import image_folder
    m, d = cfg.model, cfg.data
    out = []
    if m.num_channels != d.num_channels:
        out.append(f"model.num_channels={m.num_channels} differs from data.num_channels={d.num_channels}")
    if cfg.model_name == "vit" and m.image_size != d.image_size:
        out.append(f"model.image_size={m.image_size} differs from data.image_size={d.image_size}")
    try:
        n = image_folder.num_classes(d)
    except ValueError as e:
        return out + [str(e)]
    if n != m.num_classes:
        out.append(f"model.num_classes={m.num_classes} differs from the {n} classes in data.path {d.path}")
    return out


def _seq(v):
    return v if isinstance(v, (list, tuple)) else (v,)


def packaged_configs() -> list[str]:
    """Names of the configs that ship in the package (jaxformer/configs/NAME.yaml)."""
    folder = resources.files("jaxformer") / "configs"
    return sorted(f.name[:-5] for f in folder.iterdir() if f.name.endswith(".yaml"))


def resolve_config(spec: str) -> str:
    """A config path, or the name of a packaged config (`lm`, `llama`, ...) -> a file path.

    A path that exists wins; a bare name (no directory, with or without .yaml) is looked up
    among the packaged configs."""
    if os.path.isfile(spec):
        return spec
    name = spec[:-5] if spec.endswith(".yaml") else spec
    if os.sep not in spec and name in packaged_configs():
        return str(resources.files("jaxformer") / "configs" / f"{name}.yaml")
    raise ConfigError(f"--config {spec}: no such file, and not a packaged config "
                      f"(packaged: {', '.join(packaged_configs())})")


def load_config(path: str, overrides: list[str] | tuple[str, ...] = ()) -> RunConfig:
    """Load a YAML config (a path or a packaged config's name) with --set overrides applied."""
    return config_from_dict(load_raw(path, overrides))


def load_raw(path: str, overrides: list[str] | tuple[str, ...] = ()) -> dict:
    """A YAML config's mapping (a path or a packaged config's name), --set overrides applied,
    not yet validated."""
    path = resolve_config(path)
    with open(path) as f:
        try:
            raw = yaml_load(f) or {}
        except yaml.YAMLError as e:  # syntax, or a tag that would build a Python object
            mark = getattr(e, "problem_mark", None)
            where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
            raise ConfigError(f"{path}: not valid YAML{where}: {getattr(e, 'problem', None) or e}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level")
    for o in overrides:
        apply_override(raw, o)
    model = raw.get("model")
    if isinstance(model, dict):  # a model.module's FILE.py paths are relative to the YAML's folder
        for key in ("module", "torch"):
            if key in model:
                model[key] = absolute_spec(model[key], os.path.dirname(os.path.abspath(path)))
    return raw


def explain_config(raw: Mapping[str, Any]) -> list[str]:
    """Every problem of a run config's mapping: each rule its model section breaks
    (jaxformer/config/rules.py), then the first problem of the rest as a run would report it."""
    from jaxformer.config.rules import explain
    model = raw.get("model")
    if isinstance(model, Mapping) and "name" not in model and "module" in model:
        model = {"name": MODULE, **model}
    if not isinstance(model, Mapping) or "name" not in model:
        return ["model.name: missing; it selects the model"]
    model = dict(model)
    try:
        cls = model_config_class(model.pop("name"))
    except ConfigError as e:
        return [str(e)]
    problems = explain(cls, model, prefix="model.")
    if problems:
        return problems
    try:
        config_from_dict(raw)
    except ConfigError as e:
        return [str(e)]
    return []


def save_config(cfg: RunConfig, path: str) -> None:
    from jaxformer.fileio import write_text
    write_text(path, yaml.safe_dump(cfg.to_dict(), sort_keys=False))


def flatten(d: Mapping, prefix: str = "") -> dict:
    """{"train": {"lr": 1e-3}} -> {"train.lr": 1e-3} (tuples as lists, as YAML stores them)."""
    out = {}
    for k, v in d.items():
        if isinstance(v, Mapping):
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = list(v) if isinstance(v, tuple) else v
    return out


def config_changes(old: Mapping, new: RunConfig) -> tuple[list[str], list[str]]:
    """Compare a stored config (the dict of a run's config.yaml) with a new one, for --resume.
    -> (breaking, allowed): lines "key: old -> new". Breaking: the model and data sections
    (they fix the checkpoint's shapes and the data it trains on) and train.lora. Allowed: the train section
    (a longer schedule, another eval cadence, ...) and the parallel layout (the checkpoint
    holds unsharded arrays)."""
    # the stored config with its defaults filled in, as the new one has them
    with contextlib.suppress(ConfigError, TypeError):
        old = config_from_dict(old).to_dict()
    a, b = flatten(old), flatten(new.to_dict())
    breaking, allowed = [], []
    for k in sorted(set(a) | set(b)):
        va, vb = a.get(k, "<absent>"), b.get(k, "<absent>")
        if va != vb:
            line = f"{k}: {va!r} -> {vb!r}"
            # train.lora fixes which params the checkpoint holds (adapters, frozen base)
            (breaking if k.split(".")[0] in ("model", "data") or k.startswith("train.lora")
             else allowed).append(line)
    return breaking, allowed
