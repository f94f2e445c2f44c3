"""Hugging Face checkpoints in and out of jaxformer: the Python API behind
`jaxformer convert --from hf|flax`.

    from jaxformer import hf
    model, name, cfg = hf.from_pretrained("path/to/hf_dir")     # a built Flax NNX model
    hf.save_pretrained(model, name, cfg, "out_dir")              # AutoModel*.from_pretrained(out_dir)
    hf.convert_hf_to_flax("path/to/hf_dir", "ckpt_dir")          # streaming, bounded memory
    hf.convert_flax_to_hf("ckpt_dir", "out_dir")

Families (one module each): GPT-2 (`GPT2LMHeadModel` <-> `lm`), LLaMA (`LlamaForCausalLM`
<-> `lm`), Qwen (`Qwen2ForCausalLM`, `Qwen3ForCausalLM` <-> `lm`), Mistral (`MistralForCausalLM`
<-> `lm`), Mixtral (`MixtralForCausalLM` <-> `lm`), Qwen-MoE (`Qwen2MoeForCausalLM`,
`Qwen3MoeForCausalLM` <-> `lm`), Phi-3 (`Phi3ForCausalLM` <-> `lm`, longrope), DeepSeek-V3
(`DeepseekV3ForCausalLM` <-> `lm`), Gemma2
(`Gemma2ForCausalLM` <-> `lm`), Gemma3 (`Gemma3ForCausalLM` <-> `lm`, text only), gpt-oss (`GptOssForCausalLM` <-> `lm`, MXFP4 experts
dequantized by `mxfp4`), GPT-NeoX / Pythia (`GPTNeoXForCausalLM` <-> `lm`), OLMo 2
(`Olmo2ForCausalLM` <-> `lm`), BERT (`BertModel` <-> `encoder`, `BertForSequenceClassification` <->
`classifier`), RoBERTa and XLM-R (`RobertaModel`, `XLMRobertaModel` <-> `encoder`, their
`*ForSequenceClassification` <-> `classifier`), ModernBERT (`ModernBertModel` <-> `encoder`,
`ModernBertForSequenceClassification` <-> `classifier`),
ViT (`ViTForImageClassification`, `ViTModel` <-> `vit`), Swin (`SwinForImageClassification` <-> `swin`),
DINOv2 (`Dinov2Model`, `Dinov2ForImageClassification` <-> `vit` with LayerScale),
T5 (`T5ForConditionalGeneration` <-> `seq2seq`, v1.0 and v1.1 / flan).

Modules: files (reading checkpoint directories safely), streaming (the shard-by-shard
conversion), common (config.json options, the activation table, key renaming), one per family,
exports (how a family declares the fields of our configs it writes: the export check), families
(the one ordered registry of families, and `exporter`).

Import: config.json -> our config (family.config_from_hf: every option mapped, ignored for a
stated reason, or an error naming it); weights: HF tensor -> torch_ref key and layout
(family.tensor_fn) -> jaxformer.convert's rule table, shard by shard (streaming.convert_stream),
with the converter's per-tensor check run on the whole plan before any data is read.
Export: the first family that claims our config, whose declaration must cover every field of
it away from its default (hf/exports.py); our params -> torch_ref state_dict
(jaxformer.convert.flax_to_torch_arrays) -> HF names and layout (family.state_dict_to_hf) ->
config.json + model.safetensors.

Every output directory is written under a temporary name and renamed into place at the end,
so a failed conversion leaves nothing at OUT.
"""
from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from jaxformer import fileio
from jaxformer.config import ConfigError
from jaxformer.convert import ConversionError
from jaxformer.hf.common import typed_for_hf
from jaxformer.hf.families import FAMILIES, exporter


def supported_architectures() -> dict[str, str]:
    """HF architecture -> jaxformer model name."""
    out = {}
    for fam in FAMILIES:
        out.update(fam.architectures)
    return out


def family_for_architecture(config: dict):
    """-> (Family, architecture) of a config.json dict. Its one architecture must be
    supported, and its model_type (when given) must be that architecture's."""
    archs = config.get("architectures") or []
    if not isinstance(archs, list) or len(archs) != 1 or not isinstance(archs[0], str):
        raise ConfigError(f"config.json: architectures={archs!r}; expected a list of exactly one of "
                          f"{sorted(supported_architectures())}")
    arch = archs[0]
    fam = next((f for f in FAMILIES if arch in f.architectures), None)
    if fam is None:
        raise ConfigError(f"config.json: architecture {arch!r} is not supported; supported: "
                          f"{sorted(supported_architectures())}")
    model_type = config.get("model_type", fam.model_types[arch])
    if model_type != fam.model_types[arch]:
        raise ConfigError(f"config.json: model_type={model_type!r} does not match architectures="
                          f"[{arch!r}] (whose model_type is {fam.model_types[arch]!r}); the file "
                          "is inconsistent, so jaxformer does not guess which one is right")
    return fam, arch


def read_config(ckpt, max_len: int | None = None) -> tuple[Any, str, str, Any, list[str]]:
    """-> (Family, architecture, model name, config, notes) of an HFCheckpoint. A
    config problem (ConfigError) names the checkpoint directory. max_len: a longer context
    than max_position_embeddings for a RoPE model (RoPE is defined at every position, and
    HF runs past that length too); a learned position table cannot grow."""
    try:
        fam, arch = family_for_architecture(ckpt.config)
        name, cfg, notes = fam.config_from_hf(ckpt.config, arch, tuple(ckpt.tensors))
        if fam.resolve_checkpoint is not None:  # what only the weights say (T5's untied head)
            cfg = fam.resolve_checkpoint(ckpt, name, cfg, notes)
    except ConfigError as e:  # the messages start "config.json..."
        text = str(e)
        raise ConfigError(os.path.join(ckpt.path, text if text.startswith("config.json")
                                       else f"config.json: {text}")) from None
    cfg = _untie_distinct_head(ckpt, fam, name, cfg, notes)
    if max_len is not None and max_len != cfg.max_len:
        if getattr(getattr(cfg, "positions", None), "kind", None) != "rope":
            raise ConfigError(f"max_len={max_len}: only a RoPE model's context can differ from the "
                              f"checkpoint's ({cfg.max_len}, positions.kind="
                              f"{getattr(getattr(cfg, 'positions', None), 'kind', None)!r})")
        import dataclasses
        notes.append(f"max_len={max_len} (config.json max_position_embeddings={cfg.max_len})")
        cfg = dataclasses.replace(cfg, max_len=max_len)
    return fam, arch, name, cfg, notes


def _untie_distinct_head(ckpt, fam, name: str, cfg, notes: list[str]):
    """A tied config whose checkpoint stores both the embedding and an lm_head.weight with
    different values: transformers 5.x loads both and does not tie them (with a warning), so
    the model is untied here too, never a stored tensor dropped. Reads those two tensors."""
    import dataclasses
    embed = next((k for k in fam.embed_keys if k in ckpt.tensors), None)
    if name != "lm" or not cfg.tie_embeddings or embed is None or "lm_head.weight" not in ckpt.tensors:
        return cfg
    if np.array_equal(ckpt.read(embed), ckpt.read("lm_head.weight")):
        return cfg  # an identical copy: HF ties them; the copy is skipped
    notes.append(f"tie_word_embeddings is true but lm_head.weight differs from {embed}: loaded "
                 "untied (tie_embeddings=False) with both, as transformers 5.x does")
    return dataclasses.replace(cfg, tie_embeddings=False)


def tensor_fn(ckpt, fam, name: str, cfg, arch: str):
    """The family's HF key -> torch_ref key map; a tied checkpoint that stores only
    lm_head.weight (no embedding) gives the embedding from it, as HF ties it."""
    fn = fam.tensor_fn(name, cfg, arch)
    embeds = fam.embed_keys
    if name != "lm" or not cfg.tie_embeddings or "lm_head.weight" not in ckpt.tensors or any(
            k in ckpt.tensors for k in embeds):
        return fn
    return lambda key, x: {"embed.embed_tokens.weight": x} if key == "lm_head.weight" else fn(key, x)


# ----------------------------------------------------------------------------- import
def from_pretrained(path: str, *, seed: int = 0, return_report: bool = False, max_len: int | None = None,
                    param_dtype: str = "float32", adapter: str | None = None):
    """Load a Hugging Face model directory as a built Flax NNX model. max_len: a RoPE model's
    context beyond max_position_embeddings (read_config). param_dtype: the params' storage
    dtype, "float32", "bfloat16" or "auto" (the checkpoint's own; resolve_param_dtype).
    adapter: a PEFT LoRA adapter directory applied on top (hf/adapters.py; the report's
    "lora" is the LoRAConfig to save the model with).

    -> (model, name, cfg), or (model, name, cfg, report) with return_report. Raises
    ConfigError (unsupported option, named) or ConversionError (every weight problem)."""
    from jaxformer.hf import mxfp4
    from jaxformer.hf.files import HFCheckpoint
    from jaxformer.hf.streaming import ModelSink, convert_stream
    from jaxformer.models import abstract_model, cast_params
    peft = None
    if adapter is not None:  # its options and keys are checked before the base is read
        from jaxformer.hf.adapters import load_adapter, read_adapter, untie_for_head
        peft = read_adapter(adapter)
    ckpt = mxfp4.unpacked(HFCheckpoint(path))  # MXFP4 pairs read dequantized
    fam, arch, name, cfg, notes = read_config(ckpt, max_len)
    # The abstract model (nnx.eval_shape) gets the checkpoint's arrays: no random init, which
    # in eager JAX compiles one initializer per parameter shape (seconds on a small Swin).
    model = abstract_model(name, cfg)
    dtype, downcast = resolve_param_dtype(ckpt, param_dtype)
    cast_params(model, dtype)
    from flax import nnx

    from jaxformer import memory  # before a byte is read (issue 51 §4): the weights as they will be held
    memory.check_fits(nnx.state(model), f"{arch}'s weights ({dtype})")
    report = convert_stream(ckpt, tensor_fn(ckpt, fam, name, cfg, arch), model, ModelSink(model),
                            allow_downcast=downcast)
    materialize_rng_state(model, seed)
    model.eval()
    report.update(architecture=arch, model=name, notes=notes, lora=None)
    if adapter is not None:
        model, cfg, note = untie_for_head(model, name, cfg, peft)
        report["notes"] += [note] if note else []
        report["lora"] = load_adapter(model, name, cfg, adapter, seed=seed, adapter=peft)
    return (model, name, cfg, report) if return_report else (model, name, cfg)


def materialize_rng_state(model, seed: int) -> None:
    """Give an abstract model's remaining state (the dropout RNG keys and counts) concrete
    values: distinct keys split from `seed` (not the exact forks build_model would draw; they
    only seed dropout). Raises if any other abstract state is left."""
    import jax
    import jax.numpy as jnp
    from flax import nnx
    flat = [(p, v) for p, v in nnx.to_flat_state(nnx.state(model, nnx.Not(nnx.Param)))]
    keys = jax.random.split(jax.random.key(seed), max(1, len(flat)))
    for i, (path, var) in enumerate(flat):
        value = var.get_value()
        if not isinstance(value, jax.ShapeDtypeStruct):
            continue
        if isinstance(var, nnx.RngKey) and value.shape == ():
            var.set_value(keys[i])
        elif isinstance(var, nnx.RngCount):
            var.set_value(jnp.zeros(value.shape, value.dtype))
        else:
            raise TypeError(f"cannot materialize abstract state {'.'.join(map(str, path))} "
                            f"({type(var).__name__})")


def convert_hf_to_flax(src: str, out: str, *, overwrite: bool = False, flush_bytes: int = 256 << 20,
                       extra_files: Callable[[str, Any], Mapping[str, str]] | None = None,
                       max_len: int | None = None, param_dtype: str = "float32") -> dict:
    """HF directory -> jaxformer model checkpoint (OUT/model.yaml + orbax OUT/params, as
    checkpoint_io.save_model writes). Streams shard by shard: peak memory is about one batch
    of `flush_bytes` converted arrays or twice the largest tensor, not the model (see
    streaming.py). `extra_files(name, cfg) -> {file name: text}` adds files to OUT (the CLI's
    train.yaml) inside the same atomic write. max_len, param_dtype: as from_pretrained (a
    bfloat16 output is recorded in model.yaml and loads back as bfloat16). Returns a report."""
    import yaml

    from jaxformer.checkpoint_io import model_yaml
    from jaxformer.config import to_dict
    from jaxformer.hf import mxfp4
    from jaxformer.hf.files import HFCheckpoint
    from jaxformer.hf.streaming import ParamsWriter, convert_stream
    from jaxformer.models import abstract_model, cast_params
    _refuse_same(src, out)
    ckpt = mxfp4.unpacked(HFCheckpoint(src))  # MXFP4 pairs read dequantized
    fam, arch, name, cfg, notes = read_config(ckpt, max_len)
    abstract = abstract_model(name, cfg)
    dtype, downcast = resolve_param_dtype(ckpt, param_dtype)
    cast_params(abstract, dtype)
    fn = tensor_fn(ckpt, fam, name, cfg, arch)
    out = os.path.abspath(out)
    _check_stream_fits(ckpt, abstract, flush_bytes, out, arch)
    with fileio.atomic_dir(out, overwrite=overwrite) as tmp:
        with open(os.path.join(tmp, "model.yaml"), "w") as f:
            yaml.safe_dump(model_yaml(name, to_dict(cfg), dtype), f, sort_keys=False)
        writer = ParamsWriter(tmp)
        report = convert_stream(ckpt, fn, abstract, writer, flush_bytes=flush_bytes, allow_downcast=downcast)
        writer.close()
        report["batches"] = writer.batches
        files = dict(extra_files(name, cfg)) if extra_files else {}
        for file_name, text in files.items():
            if os.path.basename(file_name) != file_name or file_name in ("model.yaml", "params"):
                raise ValueError(f"extra_files: {file_name!r} is not a new file name inside OUT")
            with open(os.path.join(tmp, file_name), "w") as f:
                f.write(text)
    report.update(architecture=arch, model=name, out=out, notes=notes, files=sorted(files), param_dtype=dtype,
                  shards=len(ckpt.shards), bytes=ckpt.nbytes)
    return report


def _check_stream_fits(ckpt, abstract, flush_bytes: int, out: str, arch: str) -> None:
    """Before a byte is read (issue 51 §4): the stream's peak host memory (one batch of
    flush_bytes, or twice the largest tensor: streaming.py) against the host's available
    memory, and the output's bytes against the free space where OUT goes; one line with the
    numbers when either cannot fit, nothing written."""
    import shutil

    import jax
    from flax import nnx

    from jaxformer import memory
    largest = max((int(np.prod(t.shape)) * 4 for t in ckpt.tensors.values()), default=0)  # read as float32
    memory.check_bytes(max(flush_bytes, 2 * largest), f"converting {arch} (its largest tensor "
                       f"{largest / 2**30:,.2f} GiB as float32, twice, or one {flush_bytes / 2**30:,.2f} GiB batch)",
                       host=True, advice="free memory or lower the batch (flush_bytes)")
    need = sum(int(np.prod(x.shape)) * x.dtype.itemsize for x in jax.tree.leaves(nnx.state(abstract))
               if hasattr(x, "shape"))
    parent = os.path.dirname(out)
    while parent and not os.path.isdir(parent):  # OUT's first existing folder
        parent = os.path.dirname(parent)
    free = shutil.disk_usage(parent or ".").free
    if need > free:
        raise ValueError(f"converting {arch} writes {need / 2**30:,.1f} GiB of weights, more than the "
                         f"{free / 2**30:,.1f} GiB free on {parent}; write OUT elsewhere")


def resolve_param_dtype(ckpt, param_dtype: str) -> tuple[str, bool]:
    """-> (storage dtype, allow_downcast). "auto" keeps a bfloat16 checkpoint bfloat16 (every
    floating tensor bfloat16) and loads anything else as float32, which holds float16 and
    float32 exactly. Asking for bfloat16 on a float32 checkpoint is a deliberate downcast, so
    it is allowed."""
    from jaxformer.models import PARAM_DTYPES
    if param_dtype not in PARAM_DTYPES + ("auto",):
        raise ValueError(f"param dtype {param_dtype!r}: expected auto, {', '.join(PARAM_DTYPES)}")
    floats = {np.dtype(t.dtype).name for t in ckpt.tensors.values() if np.dtype(t.dtype).kind == "f"
              or np.dtype(t.dtype).name == "bfloat16"}
    if param_dtype == "auto":
        return ("bfloat16" if floats == {"bfloat16"} else "float32"), False
    return param_dtype, param_dtype != "float32"


def _refuse_same(src: str, out: str, **inputs: str | None) -> None:
    """--overwrite replaces OUT: never when OUT is an input (the input directory, or a named
    one: adapter="path" reads as --adapter), holds one or lies inside one (links resolved)."""
    from jaxformer.convert import same_file
    if same_file(src, out):
        raise ValueError(f"{out} is the input directory {src}; write the output elsewhere")
    fileio.refuse_overlap(out, {"the input directory": src,
                                **{f"--{k.replace('_', '-')}": v for k, v in inputs.items()}})


# ----------------------------------------------------------------------------- generation_config.json
# generation_config.json keys that are housekeeping or token metadata, not decoding settings
GENERATION_IGNORED = {"transformers_version", "_from_model_config", "bos_token_id", "pad_token_id",
                      "decoder_start_token_id", "use_cache", "return_dict_in_generate", "output_scores",
                      "output_attentions", "output_hidden_states"}


def generation_defaults(path: str) -> tuple[dict, list[str]]:
    """-> (GenerationConfig fields, notes) from an HF directory's generation_config.json ({}
    without one): eos_token_id (an int or a list) -> eos_id, max_new_tokens, do_sample ->
    strategy (num_beams > 1 -> beam), temperature, top_k, top_p, num_beams, length_penalty.
    Types are validated (ConfigError naming the key); a key that would change decoding but
    jaxformer does not implement (repetition_penalty != 1, ...) is reported in the notes."""
    from jaxformer.config import ConfigError
    from jaxformer.hf.files import read_json_object
    file = os.path.join(path, "generation_config.json")
    if not os.path.isfile(file):
        return {}, []
    raw = read_json_object(file, "generation_config.json")
    out, notes = {}, []

    def typed(key, kinds, ok=lambda v: True, want=""):
        v = raw[key]
        if isinstance(v, bool) and bool not in kinds or not isinstance(v, kinds) or not ok(v):
            raise ConfigError(f"{file}: {key}={v!r} must be {want}")
        return v
    for key in raw:
        if key == "eos_token_id":
            v = raw[key]
            ids = v if isinstance(v, list) else [v]
            if v is not None and not (ids and all(isinstance(i, int) and not isinstance(i, bool) and i >= 0
                                                  for i in ids)):
                raise ConfigError(f"{file}: eos_token_id={v!r} must be a token id >= 0 or a list of them")
            if v is not None:
                out["eos_id"] = tuple(ids) if len(ids) > 1 else ids[0]
        elif key in ("max_new_tokens", "top_k", "num_beams"):
            out[key] = typed(key, (int,), lambda v, key=key: v >= (0 if key == "top_k" else 1), "an int")
        elif key in ("temperature", "top_p", "length_penalty"):
            out[key] = float(typed(key, (int, float), lambda v: v == v, "a number"))
        elif key == "do_sample":
            out["strategy"] = "sample" if typed(key, (bool,), want="true or false") else "greedy"
        elif key not in GENERATION_IGNORED:
            notes.append(f"generation_config.json: {key}={raw[key]!r} is not implemented by jaxformer "
                         "generate; not applied")
    if out.get("num_beams", 1) > 1 and out.get("strategy") != "sample":
        out["strategy"] = "beam"
    return out, notes


# ----------------------------------------------------------------------------- export
def config_to_hf(name: str, cfg) -> dict:
    """The config.json of `cfg`'s Hugging Face export, numbers typed as transformers validates
    them (common.typed_for_hf against the family's HF class defaults)."""
    fam = exporter(name, cfg)
    out = fam.config_to_hf(name, cfg)
    return typed_for_hf(out, fam.hf_defaults[out["architectures"][0]])


def save_pretrained(model, name: str, cfg, path: str, *, overwrite: bool = True,
                    files: Mapping[str, bytes] | None = None) -> dict:
    """Write `model` as a Hugging Face directory (config.json + model.safetensors) that
    transformers' AutoModel*.from_pretrained loads. Atomic: nothing at `path` on failure.
    files: more files for the directory, {name: content} (the tokenizer.json)."""
    from safetensors.numpy import save_file

    from jaxformer.convert import flax_to_torch_arrays
    fam = exporter(name, cfg)
    hf_config = config_to_hf(name, cfg)
    hf_sd = fam.state_dict_to_hf(flax_to_torch_arrays(model), name, cfg)
    floats = {np.dtype(v.dtype).name for v in hf_sd.values()}
    if floats == {"bfloat16"}:  # a model stored in bfloat16 (cast_params) exports as bfloat16
        hf_config["dtype"] = "bfloat16"
    with fileio.atomic_dir(os.path.abspath(path), overwrite=overwrite) as tmp:
        with open(os.path.join(tmp, "config.json"), "w") as f:
            json.dump(hf_config, f, indent=2, sort_keys=True)
        save_file({k: np.ascontiguousarray(v) for k, v in hf_sd.items()},
                  os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
        for file_name, content in (files or {}).items():
            if os.path.basename(file_name) != file_name or file_name in ("config.json", "model.safetensors"):
                raise ValueError(f"files: {file_name!r} is not a new file name inside {path}")
            with open(os.path.join(tmp, file_name), "wb") as f:
                f.write(content)
    return {"architecture": hf_config["architectures"][0], "tensors": len(hf_sd)}


def convert_flax_to_hf(ckpt: str, out: str, *, overwrite: bool = False) -> dict:
    """A jaxformer model checkpoint directory -> a Hugging Face directory."""
    from jaxformer.checkpoint_io import load_model
    _refuse_same(ckpt, out)
    name, cfg, model = load_model(ckpt)
    report = save_pretrained(model, name, cfg, out, overwrite=overwrite)
    report.update(model=name, out=os.path.abspath(out))
    return report


__all__ = ["from_pretrained", "save_pretrained", "config_to_hf", "generation_defaults", "convert_hf_to_flax", "convert_flax_to_hf",
           "supported_architectures", "ConfigError", "ConversionError"]
