"""Standalone model checkpoints, and reading trained weights back from wherever they are.

A model checkpoint directory (what `jaxformer convert --to flax`, HF import, `jaxformer export
--to flax` and every training run's WORKDIR/model/last|best write, and what `train.init_from`
and `jaxformer generate` read):

    DIR/model.yaml      the model section: {name: ..., fields...}; optionally a `tokenizer:`
                        section, the describe() dict of the tokenizer the model was trained
                        with ({spec, kind, file, sha256}, jaxformer/train/data/tokenizer.py);
                        a `lora:` section (LoRAConfig's fields) when the params hold LoRA
                        adapters: loading applies it (layers/lora.apply_lora) before restoring
    DIR/params/         an orbax checkpoint of the params as a pure dict (flax layout)
    DIR/tokenizer.json  that tokenizer's file, when it has one (the entry's `file`)

A model with LoRA adapters (a `train.lora` run's export) records its LoRAConfig as model.yaml's
`lora:` section (jaxformer/config/lora.py fields); its params hold the base weights (fp32) and
the adapters (`...q_proj.lora_A.kernel`), and loading applies the adapters before restoring.

Loading builds the abstract model from model.yaml (nnx.eval_shape, no allocation), restores
the arrays into it and checks every leaf's shape and dtype. Writes are atomic (a temp dir
renamed into place), so a failed export leaves nothing behind.

A training run directory (jaxformer/train, either framework):

    RUN/config.yaml                 the resolved run config (model/data/train/parallel)
    RUN/model/last/, RUN/model/best/  model checkpoint dirs: the latest checkpoint's params,
                                    and those of the best eval so far
    RUN/checkpoints/<N>/            JAX: an orbax CheckpointManager step (items "state", the
                                    whole train state, and "record")
    RUN/checkpoints/step_<N>/       torch: model.safetensors (a torch_ref state dict) and
                                    train_state.pt (torch_checkpoints/step_<N>/ in older runs)

`load(path, step=...)` reads a model checkpoint dir or a run dir (model/last, model/best, or
step N's params; a JAX step is read with an orbax partial restore of `params` only, never the
optimiser state). Hugging Face dirs are read by `jaxformer.load`, the package-level wrapper,
since jaxformer.hf sits above this module.
"""
from __future__ import annotations

import os

import numpy as np
import yaml

from jaxformer import fileio

STEPS = ("last", "best")


# ----------------------------------------------------------------------------- model checkpoints
def save_model(model, name: str, cfg, directory: str, *, overwrite: bool = True,
               tokenizer: dict | None = None, tokenizer_file: str | None = None, lora=None) -> None:
    """Write DIR/model.yaml + DIR/params atomically; an existing DIR is an error unless
    overwrite (then replaced only once the new one is complete). The calling process writes
    alone, also in a multi-process job (give it host copies of the params).

    tokenizer: the record of the model's tokenizer (its describe() dict, as a tokens dataset's
    meta["tokenizer"], optionally with the ids' vocab_size, eos_id and bos_id), written as
    model.yaml's `tokenizer:` section; tokenizer_file: the file it names (e.g. the dataset's
    tokenizer.json), copied in as DIR/<tokenizer["file"]>. lora: the LoRAConfig the model's
    adapters were applied with (required when it has any; written as model.yaml's `lora:`)."""
    import jax
    import orbax.checkpoint as ocp
    from flax import nnx

    from jaxformer.config import to_dict
    from jaxformer.layers.lora import LoRAParam, has_adapters
    from jaxformer.layers.moe import SAVED
    check_lora(model, lora)
    params = nnx.to_pure_dict(nnx.state(model, SAVED))  # params and saved buffers (MoE score_bias)
    base = nnx.to_pure_dict(nnx.state(model, nnx.All(SAVED, nnx.Not(LoRAParam))))  # adapters stay fp32
    dtypes = {np.dtype(x.dtype).name for x in jax.tree.leaves(base) if np.dtype(x.dtype).kind == "f"
              or np.dtype(x.dtype).name == "bfloat16"}
    with fileio.atomic_dir(os.path.abspath(directory), overwrite=overwrite) as tmp:
        doc = model_yaml(name, to_dict(cfg), "bfloat16" if dtypes == {"bfloat16"} else "float32")
        if has_adapters(model):
            doc["lora"] = to_dict(lora)
        if tokenizer is not None:
            doc["tokenizer"] = _tokenizer_section(tokenizer, tokenizer_file)
            if tokenizer_file is not None:
                import shutil
                shutil.copyfile(tokenizer_file, os.path.join(tmp, tokenizer["file"]))
        with open(os.path.join(tmp, "model.yaml"), "w") as f:
            yaml.safe_dump(doc, f, sort_keys=False)
        me = jax.process_index()
        ckptr = ocp.StandardCheckpointer(multiprocessing_options=ocp.options.MultiprocessingOptions(
            primary_host=me, active_processes={me}))
        ckptr.save(os.path.join(tmp, "params"), params)
        ckptr.wait_until_finished()


def check_lora(model, lora) -> None:
    """The LoRAConfig given to save_model must be the one the model's adapters carry."""
    import math

    from jaxformer.layers.lora import lora_modules, parameter_adapters
    adapted = {**lora_modules(model), **parameter_adapters(model)}
    if adapted and lora is None:
        raise ValueError("the model has LoRA adapters: pass lora= (their LoRAConfig) to record them, or "
                         "merge them first (layers/lora.merge_lora)")
    if lora is not None and not adapted:
        raise ValueError("lora= given, but the model has no LoRA adapters")
    bad = [p for p, m in adapted.items() if m.r != lora.rank_of(p) or not math.isclose(m.scaling, lora.scaling_of(p))
           or not (lora.match(p) if p in lora_modules(model) else lora.match_parameter(p))] if lora else []
    if bad:
        raise ValueError(f"lora= (r={lora.r}, scaling {lora.scaling}, target_parameters {lora.target_parameters}) "
                         f"does not match the adapters of {bad}")


def lora_section(directory: str):
    """The LoRAConfig recorded in DIR/model.yaml's `lora:` section, or None."""
    from jaxformer.config import ConfigError
    from jaxformer.config.lora import lora_config_from_dict
    path = os.path.join(directory, "model.yaml")
    data = _read_yaml(path)
    section = data.get("lora") if isinstance(data, dict) else None
    if section is None:
        return None
    if not isinstance(section, dict):
        raise ValueError(f"{path} is corrupted: its `lora:` section is not a mapping")
    try:
        return lora_config_from_dict(section)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None


def lora_config(path: str, step: str | int | None = None):
    """The LoRAConfig of the weights `load(path, step=step)` reads (None: no adapters): a model
    checkpoint's `lora:` section; a run's model/last|best one, or its config.yaml `train.lora`
    for a checkpoint step."""
    step = parse_step(step)
    if path_kind(path) == "model":
        return lora_section(path)
    if path_kind(path) != "run":
        return None
    if step in (None, *STEPS) and os.path.isdir(os.path.join(path, "model", step or "last")):
        return lora_section(os.path.join(path, "model", step or "last"))
    section = _run_lora(path)
    return _run_adapter(section)[0] if isinstance(section, dict) else None


def model_yaml(name: str, fields: dict, param_dtype: str = "float32") -> dict:
    """The content of DIR/model.yaml: the model section, plus `param_dtype` when the params are
    stored as bfloat16 (load_model then builds the model with bfloat16 params)."""
    out: dict = {"model": {"name": name, **fields}}
    if param_dtype != "float32":
        out["param_dtype"] = param_dtype
    return out


def load_param_dtype(directory: str) -> str:
    """The params' storage dtype recorded in DIR/model.yaml ("float32" when absent)."""
    from jaxformer.models import PARAM_DTYPES
    path = os.path.join(directory, "model.yaml")
    data = _read_yaml(path)
    dtype = data.get("param_dtype", "float32") if isinstance(data, dict) else "float32"
    if dtype not in PARAM_DTYPES:
        raise ValueError(f"{path}: param_dtype {dtype!r}, expected one of {', '.join(PARAM_DTYPES)}")
    return dtype


def load_model_config(directory: str):
    """-> (name, cfg) from DIR/model.yaml; errors name the file."""
    path = os.path.join(directory, "model.yaml")
    if not os.path.exists(path):
        raise FileNotFoundError(f"{directory} is not a jaxformer model checkpoint (no model.yaml)")
    return _model_section(path, "model")


def _tokenizer_section(tokenizer: dict, tokenizer_file: str | None) -> dict:
    keys = ("spec", "kind", "file", "sha256")
    extra = ("vocab_size", "eos_id", "bos_id")  # the trained ids' specials (tokens_data.tokenizer_record)
    if not isinstance(tokenizer, dict) or set(tokenizer) - set(keys + extra) or "kind" not in tokenizer:
        raise ValueError(f"tokenizer must be a describe() dict with keys {keys}, got {tokenizer!r}")
    name = tokenizer.get("file")
    if (name is None) != (tokenizer_file is None):
        raise ValueError(f"tokenizer file {name!r} and tokenizer_file {tokenizer_file!r}: give both or neither")
    if name is not None and (os.path.basename(name) != name or name in ("model.yaml", "params")):
        raise ValueError(f"tokenizer file {name!r} is not a plain file name")
    return {**{k: tokenizer.get(k) for k in keys}, **{k: tokenizer[k] for k in extra if k in tokenizer}}


def tokenizer_entry(directory: str) -> dict | None:
    """The `tokenizer:` section of DIR/model.yaml (a describe() dict), or None when it has none."""
    path = os.path.join(directory, "model.yaml")
    data = _read_yaml(path)
    entry = data.get("tokenizer") if isinstance(data, dict) else None
    if entry is not None and not (isinstance(entry, dict) and "kind" in entry):
        raise ValueError(f"{path} is corrupted: its `tokenizer:` section is not a describe() dict")
    return entry


def _read_yaml(path: str):
    """A YAML file's data (yaml.safe_load: plain data only); not YAML is a ValueError naming it."""
    try:
        with open(path) as f:
            return fileio.yaml_load(f)
    except yaml.YAMLError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(f"{path} is corrupted (not YAML: {first})") from None


def _model_section(path: str, what: str):
    """(name, cfg) of the `model:` section of a YAML file (model.yaml, or a run's config.yaml)."""
    from jaxformer.config import ConfigError, model_config_from_dict
    data = _read_yaml(path)
    section = None
    if isinstance(data, dict):  # model.yaml may also hold the bare section
        section = data.get("model", data if what == "model" else None)
    if not isinstance(section, dict):
        raise ValueError(f"{path} is corrupted: no `model:` section with the model's fields")
    try:
        return model_config_from_dict(section)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None


def restore_params(directory: str, abstract: dict) -> dict:
    """DIR/params restored onto `abstract` (a pure dict of ShapeDtypeStructs, flax layout),
    strictly (same keys, shapes, dtypes). A leaf carrying a sharding is restored straight into
    it: each device reads only its own shard, and no host assembles the whole tensor."""
    import jax
    import orbax.checkpoint as ocp

    from jaxformer.convert import ConversionError
    try:
        restored = ocp.StandardCheckpointer().restore(os.path.join(os.path.abspath(directory), "params"), abstract)
    except Exception as e:
        raise ConversionError([f"cannot restore params from {directory}: {type(e).__name__}: {e}"]) from None
    problems = []
    for (path, a), b in zip(jax.tree_util.tree_flatten_with_path(abstract)[0], jax.tree.leaves(restored), strict=False):
        if tuple(a.shape) != tuple(b.shape) or np.dtype(a.dtype) != np.dtype(b.dtype):
            problems.append(f"shape/dtype: {jax.tree_util.keystr(path)} {b.shape}/{b.dtype}, expected {a.shape}/{a.dtype}")
    if problems:
        raise ConversionError(problems)
    return restored


def load_params_into(model, directory: str) -> None:
    """Restore DIR/params into `model` in place, strictly (same keys, shapes, dtypes)."""
    import jax
    from flax import nnx

    from jaxformer.layers.moe import SAVED
    state = nnx.state(model, SAVED)
    # onto this process' first device, whatever mesh wrote it (a run trained on 8 devices or a
    # pod, loaded on a laptop): orbax restores a saved sharding only onto a target's own
    here = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=here), nnx.to_pure_dict(state))
    nnx.replace_by_pure_dict(state, restore_params(directory, abstract))
    nnx.update(model, state)


def load_params_sharded(directory: str, abstract_params, shardings, rest=None):
    """DIR/params as an nnx.State like `abstract_params` (an abstract model's Param state),
    each leaf restored into its sharding from `shardings` (a tree like it). With `rest` (the
    model's concrete non-Param state, in its shardings): -> (params, rest with its saved
    buffers, the MoE score_bias, restored from DIR/params too)."""
    import jax
    from flax import nnx

    from jaxformer.layers.moe import Buffer

    def target(state, sh):
        return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                            nnx.to_pure_dict(state), nnx.to_pure_dict(sh))

    buffers = None if rest is None else nnx.filter_state(rest, Buffer)
    pure = target(abstract_params, shardings)
    if buffers is not None:  # params and buffers sit side by side in one saved tree
        pure = _deep_merge(pure, target(buffers, jax.tree.map(lambda x: x.sharding, buffers)))
    restored = restore_params(directory, pure)
    state = jax.tree.map(lambda x: x, abstract_params)  # fresh Variables, filled in below
    nnx.replace_by_pure_dict(state, _subtree(restored, nnx.to_pure_dict(abstract_params)))
    if rest is None:
        return state
    rest = jax.tree.map(lambda x: x, rest)
    nnx.replace_by_pure_dict(buffers, _subtree(restored, nnx.to_pure_dict(buffers)))
    nnx.update(rest, buffers)
    return state, rest


def check_init_from_layout(directory: str, cfg) -> None:
    """train.init_from: the checkpoint's layer layout must be the run's. A scanned stack
    (model.scan_layers) holds each param once with a leading layer axis, an unscanned one holds
    `layers.{i}`; the param trees differ, so one cannot be restored into the other, and the error
    says which setting to change rather than the restore's tree mismatch."""
    from jaxformer.config import ConfigError
    _, saved = load_model_config(directory)
    theirs, ours = bool(getattr(saved, "scan_layers", False)), bool(getattr(cfg, "scan_layers", False))
    if theirs == ours:
        return
    layout = {True: "scanned: each param stacked on a leading layer axis",
              False: "unscanned: one param tree per layers.{i}"}
    raise ConfigError(
        f"train.init_from={directory!r}: the checkpoint was saved with model.scan_layers={theirs} "
        f"({layout[theirs]}) and this run has model.scan_layers={ours} ({layout[ours]}); the param "
        f"trees differ, so it cannot be loaded. Fine-tune it with --set model.scan_layers="
        f"{str(theirs).lower()}, or start from a run trained with model.scan_layers={str(ours).lower()}")


def _deep_merge(a: dict, b: dict) -> dict:
    out = dict(a)
    for k, v in b.items():
        out[k] = _deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _subtree(tree: dict, like: dict) -> dict:
    """The entries of `tree` at the keys of `like` (nested dicts)."""
    return {k: _subtree(tree[k], v) if isinstance(v, dict) else tree[k] for k, v in like.items()}


# The jitted programs of _model_to_load: {(name, repr(cfg), seed): program}, the recent few
_REST: dict[tuple, object] = {}
_REST_KEPT = 8


def _model_to_load(name: str, cfg, seed: int = 0):
    """build_model(name, cfg, seed=seed) for a load that overwrites every parameter and saved
    buffer: those are abstract (nnx.eval_shape), and the rest of the state (the RNG streams) is
    computed by a jitted build in which the parameter draws are dead code: the same bits as the
    eager build's, without compiling each initialiser op by op (a tiny LM's load_model in a
    fresh process: 1.8-2.3 s of CPU eagerly, 0.6-0.7 s so)."""
    import jax
    from flax import nnx

    from jaxformer.layers.moe import SAVED
    from jaxformer.models import build_model
    model = nnx.eval_shape(lambda: build_model(name, cfg, seed=seed))
    key = (name, repr(cfg), seed)
    if key not in _REST:
        _REST[key] = jax.jit(lambda: nnx.split(build_model(name, cfg, seed=seed), SAVED, ...)[-1])
        while len(_REST) > _REST_KEPT:
            _REST.pop(next(iter(_REST)))
    nnx.update(model, _REST[key]())
    return model


def load_model(directory: str, seed: int = 0):
    """-> (name, cfg, model) from a model checkpoint directory (with its LoRA adapters, unmerged,
    when model.yaml has a `lora:` section)."""
    from jaxformer.models import build_model, cast_params
    name, cfg = load_model_config(directory)
    lora = lora_section(directory)
    # with adapters, a concrete base: applying them may read its values
    model = build_model(name, cfg, seed=seed) if lora is not None else _model_to_load(name, cfg, seed)
    cast_params(model, load_param_dtype(directory))
    if lora is not None:  # after the cast: the adapters stay fp32
        from flax import nnx

        from jaxformer.layers.lora import apply_lora
        apply_lora(model, lora, nnx.Rngs(seed))
    load_params_into(model, directory)
    return name, cfg, model


# ----------------------------------------------------------------------------- what a path holds
def path_kind(path: str) -> str:
    """"model" (DIR/model.yaml), "run" (RUN/config.yaml), "hf" (config.json), or an error that
    names the path and what is missing."""
    if not os.path.isdir(path):
        if not os.path.exists(path):
            raise FileNotFoundError(f"{path} does not exist")
        raise ValueError(f"{path} is a file, not a run dir, model checkpoint or HF dir")
    for kind, marker in (("model", "model.yaml"), ("run", "config.yaml"), ("hf", "config.json")):
        if os.path.isfile(os.path.join(path, marker)):
            return kind
    raise ValueError(f"{path} is not a run dir, model checkpoint or HF dir: no model.yaml, "
                     "config.yaml or config.json")


def model_name(model, cfg=None) -> str:
    """The registry name (jaxformer.config.MODELS) of a built model's class; "module" for a
    model.module (any NNX module; known by its config `cfg`, jaxformer/config/module.py)."""
    from jaxformer.config import MODELS
    from jaxformer.config.module import MODULE, ModuleConfig
    from jaxformer.models import model_class
    if isinstance(cfg, ModuleConfig):
        return MODULE
    for name, (_, target) in MODELS.items():
        if target is not None and type(model) is model_class(name):
            return name
    raise ValueError(f"{type(model).__name__} is not a registered model class")


def parse_step(step) -> str | int | None:
    """None, "last", "best", or a step number (an int, or a string of digits)."""
    if step is None or step in STEPS:
        return step
    if isinstance(step, (int, np.integer)) and not isinstance(step, bool) and step >= 0:
        return int(step)
    if isinstance(step, str) and step.isdigit():
        return int(step)
    raise ValueError(f"step must be 'last', 'best' or a step number, got {step!r}")


# ----------------------------------------------------------------------------- loading
def load(path: str, *, step: str | int | None = None):
    """-> (model, cfg): the model built in eval mode with the weights of `path`, a model
    checkpoint dir or a training run dir (step: "last" (default), "best" or a step number;
    only for run dirs). The registry name is model_name(model). Hugging Face dirs: use
    jaxformer.load."""
    name, cfg, model = load_named(path, step=step)
    return model, cfg


def load_named(path: str, *, step: str | int | None = None):
    """load's (name, cfg, model), for callers that need the name (export, generate)."""
    kind = path_kind(path)
    step = parse_step(step)
    if kind == "hf":
        raise ValueError(f"{path} is a Hugging Face dir: read it with jaxformer.load or "
                         "jaxformer.hf.from_pretrained")
    if kind == "model":
        if step not in (None, "last"):
            raise ValueError(f"{path} is a model checkpoint (one set of weights); --step {step} "
                             "applies to training run dirs only")
        name, cfg, model = load_model(path)
    else:
        name, cfg, model = load_run(path, "last" if step is None else step)
    model.eval()
    return name, cfg, model


def run_steps(run_dir: str) -> list[int]:
    """The checkpointed steps of a run (JAX checkpoints/<N>, torch checkpoints/step_<N> or
    torch_checkpoints/step_<N>), ascending."""
    out = set()
    for sub in ("checkpoints", "torch_checkpoints"):
        d = os.path.join(run_dir, sub)
        for n in os.listdir(d) if os.path.isdir(d) else ():
            if n.isdigit() and os.path.isdir(os.path.join(d, n, "state")):
                out.add(int(n))
            elif n.startswith("step_") and n[5:].isdigit() and os.path.isfile(os.path.join(d, n, "model.safetensors")):
                out.add(int(n[5:]))
    return sorted(out)


def load_run(run_dir: str, step: str | int = "last"):
    """-> (name, cfg, model) of a training run: RUN/model/last or RUN/model/best (falling back
    to the newest checkpoint, or the best one of RUN/checkpoints/best.json, for runs that
    predate those exports), or the params of checkpoint step N."""
    import json
    step = parse_step(step)
    if step in STEPS:
        export = os.path.join(run_dir, "model", step)
        if os.path.isdir(export):
            return load_model(export)
        steps = run_steps(run_dir)
        if step == "last" and steps:
            return load_run(run_dir, steps[-1])
        best = os.path.join(run_dir, "checkpoints", "best.json")
        if step == "best" and os.path.isfile(best):
            with open(best) as f:
                return load_run(run_dir, int(json.load(f)["step"]))
        raise ValueError(f"run {run_dir} has no model/{step} and no "
                         f"{'checkpoint' if step == 'last' else 'checkpoints/best.json'} to take "
                         f"it from{' (no eval improved yet?)' if step == 'best' else ''}")
    jax_dir = os.path.join(run_dir, "checkpoints", str(step), "state")
    torch_files = [os.path.join(run_dir, sub, f"step_{step}", "model.safetensors")
                   for sub in ("checkpoints", "torch_checkpoints")]
    torch_file = next((f for f in torch_files if os.path.isfile(f)), None)
    if not os.path.isdir(jax_dir) and torch_file is None:
        have = run_steps(run_dir)
        raise ValueError(f"run {run_dir} has no checkpoint of step {step}; its steps: "
                         f"{', '.join(map(str, have)) if have else 'none'}")
    name, cfg = _model_section(os.path.join(run_dir, "config.yaml"), "run")
    from jaxformer.models import build_model
    lora = _run_lora(run_dir)
    model = build_model(name, cfg) if lora is not None else _model_to_load(name, cfg)
    if lora is not None:  # a train.lora run: its adapters, and its base as it trained
        _adapt_for_step(model, lora)
    if os.path.isdir(jax_dir):
        _restore_train_params(model, jax_dir)
    else:
        from jaxformer import convert
        tensors, _ = convert.read_safetensors(torch_file)
        convert.load_torch_state_dict(model, tensors)
    return name, cfg, model


def _run_lora(run_dir: str):
    """A run's `train.lora` section (config.yaml) as a plain dict, or None."""
    data = _read_yaml(os.path.join(run_dir, "config.yaml"))
    train = data.get("train") if isinstance(data, dict) else None
    return train.get("lora") if isinstance(train, dict) else None


def _run_adapter(lora: dict):
    """A run's `train.lora` section -> (its LoRAConfig, base_dtype): the base's storage while
    training is no part of the adapter."""
    from jaxformer.config.lora import lora_config_from_dict
    lora = dict(lora)
    base_dtype = lora.pop("base_dtype", "fp32")
    return lora_config_from_dict(lora, prefix="train.lora."), base_dtype


def _adapt_for_step(model, lora: dict) -> None:
    """The adapters of a train.lora run's checkpoint, and its base in the stored precision:
    LoRALinear layers, kernels as layers/kernels/quant.py weights for a bf16/int8 base."""
    from flax import nnx

    from jaxformer.layers.lora import apply_lora, quantize_base
    adapter, base_dtype = _run_adapter(lora)
    apply_lora(model, adapter, nnx.Rngs(0))
    if base_dtype != "fp32":
        quantize_base(model, base_dtype)


def _dequantize_lora_bases(model) -> None:
    """Each reduced-precision LoRA base back to the fp32 [in, out] kernel it stands for."""
    import jax.numpy as jnp

    from jaxformer.layers.kernels.quant import QuantizedWeight
    from jaxformer.layers.lora import lora_modules
    for m in lora_modules(model).values():
        k = m.kernel.get_value()
        if isinstance(k, QuantizedWeight):
            m.kernel.set_value(jnp.swapaxes(k.dequantized(), -1, -2))


def _saved_in_rest(rest, keys: set[str]):
    """The subtree of a checkpoint's `rest` metadata holding the saved arrays at `keys` (dotted
    paths; their `value` leaves) as zeros to restore into, or None."""
    if not isinstance(rest, dict):
        return None

    def walk(node, prefix):
        if not isinstance(node, dict):
            return None
        if "value" in node and prefix in keys and hasattr(node["value"], "shape"):
            return {"value": np.zeros(node["value"].shape, node["value"].dtype)}
        out = {k: sub for k, v in node.items()
               if (sub := walk(v, f"{prefix}.{k}" if prefix else str(k))) is not None}
        return out or None
    return walk(rest, "")


def _restore_train_params(model, state_dir: str) -> None:
    """Copy the params of an orbax train state (the "state" item of a JAX run's checkpoint
    step) into `model`, strictly: an orbax partial restore reads only the params subtree, as
    host numpy arrays (whatever mesh wrote them)."""
    import jax
    import orbax.checkpoint as ocp
    from etils import epath

    from jaxformer.convert import ConversionError, flax_key, param_leaves
    ckptr = ocp.PyTreeCheckpointer()
    where = os.path.abspath(state_dir)  # orbax refuses relative paths
    try:  # the handler's metadata: the item's tree, without a step-metadata lookup that warns
        tree = ocp.PyTreeCheckpointHandler().metadata(epath.Path(where)).tree
        # a LoRA run's base is the `frozen` subtree beside its adapters (jaxformer/train/lora.py)
        target = {part: jax.tree.map(lambda m: np.zeros(m.shape, m.dtype), tree[part])
                  for part in ("params", "frozen") if part in tree}
        saved = _saved_in_rest(tree.get("rest"), {flax_key(p) for p in param_leaves(model)})
        if saved:  # a model.module's buffers (a port's Buffer variables) sit in the state's `rest`
            target["rest"] = saved
        restored = ckptr.restore(where, args=ocp.args.PyTreeRestore(
            item=target, restore_args=jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), target),
            partial_restore=True))
    except Exception as e:  # orbax raises many types for a missing or damaged step
        first = (str(e).strip().splitlines() or [""])[0]
        raise ConversionError([f"cannot read the params of {state_dir}: {type(e).__name__}: {first}"]) from None
    from jaxformer.layers.kernels.quant import QuantizedWeight
    got = {}
    for path, x in jax.tree_util.tree_flatten_with_path(restored)[0]:
        keys = [str(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k)))) for k in path[1:]]
        if keys[-1] in ("data", "scale") and keys[-2] == "value":  # a reduced-precision LoRA base
            got.setdefault(".".join(keys[:-2]), {})[keys[-1]] = x
            continue
        got[".".join(keys[:-1] if keys[-1] == "value" else keys)] = x
    for k, v in got.items():
        if isinstance(v, dict):
            got[k] = QuantizedWeight(v["data"], v.get("scale"))
    leaves = {flax_key(p): var for p, var in param_leaves(model).items()}
    problems = [f"missing: {k}" for k in leaves if k not in got]
    problems += [f"unexpected: {k}" for k in got if k not in leaves]
    def sig(x):  # shape and dtype of each array (a QuantizedWeight has two)
        return [(tuple(a.shape), np.dtype(a.dtype).name) for a in jax.tree.leaves(x)]
    for k, var in leaves.items():
        if k in got and sig(got[k]) != sig(var.get_value()):
            problems.append(f"shape/dtype: {k} {sig(got[k])}, expected {sig(var.get_value())}")
    if problems:
        raise ConversionError(problems, header=f"the params of {state_dir} do not fit the run's model")
    for k, var in leaves.items():
        var.set_value(jax.tree.map(np.asarray, got[k]))
    _dequantize_lora_bases(model)  # a run's model, as load gives it: fp32 bases under its adapters
