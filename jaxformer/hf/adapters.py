"""PEFT LoRA adapters in and out of jaxformer: the adapter directory `peft.PeftModel` saves and
loads (adapter_config.json + adapter_model.safetensors), on top of a Hugging Face base model.

    save_adapter(model, name, cfg, lora, "out")   # `jaxformer export RUN --to peft OUT`
    lora = load_adapter(model, name, cfg, "dir")  # hf.from_pretrained(base, adapter=DIR)

Key names. PEFT names an adapter weight after the module it wraps, inside the HF model, under
PEFT's own two levels: base_model.model.<HF module path>.lora_A.weight [r, in] and .lora_B.weight
[out, r] (torch_ref's layout, so no transpose beyond the converter's kernel rule). Our module
paths become HF module paths through the family's own export (family.state_dict_to_hf, its
Renamer's to_hf): a Linear whose weight the export writes unchanged under a new name is the same
module in HF. One the export fuses (GPT-2's c_attn), transposes (GPT-2's Conv1D) or splits has no
HF module of its own, so an adapter on it is refused by name, as is an adapter key on a module
that has no jaxformer equivalent when loading.

The maths: y = W x + b + B A dropout(x) * scaling with PEFT's scaling (alpha / r, or alpha /
sqrt(r) with rslora): LoRAConfig.from_peft / to_peft map the options and refuse the ones jaxformer
does not implement (DoRA, modules_to_save, bias, other peft_types...) by name. r and alpha per
adapter follow rank_pattern / alpha_pattern. LoRA on MoE expert and router weights (PEFT's
target_parameters) is read and written by hf/expert_adapters.py.
"""
from __future__ import annotations

import json
import os
import re

import numpy as np

from jaxformer import fileio
from jaxformer.config import ConfigError
from jaxformer.config.lora import LoRAConfig
from jaxformer.convert import ConversionError
from jaxformer.hf import expert_adapters

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
BIN_FILE = "adapter_model.bin"
PREFIX = "base_model.model."  # PeftModel.base_model (LoraModel) .model (the HF model)
_KEY = re.compile(r"base_model\.model\.(?P<module>.+)\.lora_(?P<ab>[AB])\.weight")
# the wrapped layer's own weight, which PEFT saves beside an adapter on lm_head by default
# (save_embedding_layers="auto": an embedding name is targeted)
_BASE_KEY = re.compile(r"base_model\.model\.(?P<module>.+)\.base_layer\.(?P<leaf>weight|bias)")
TASK_TYPES = {"lm": "CAUSAL_LM", "seq2seq": "SEQ_2_SEQ_LM"}


def _is_adapter_key(torch_key: str) -> bool:
    """A LoRALinear's pair (q_proj.lora_A.weight) or a ParamLoRA's (experts.down_proj_lora.lora_A)."""
    return ".lora_A." in torch_key or ".lora_B." in torch_key or "_lora.lora_" in torch_key


def export_ids(model, name: str, cfg):
    """-> (family module, ({id: HF key}, {our torch key: array})) of the family's HF export run on
    placeholder arrays (broadcast views, no memory): a weight the export writes unchanged keeps
    its object, so its HF key is by_id[id(base[our key])]."""
    from jaxformer import convert
    from jaxformer.hf.families import exporter
    fam = exporter(name, cfg)
    prefixes = convert.scan_prefixes(model)
    base = {}
    for path, var in convert.param_leaves(model).items():
        value = var.get_value()
        placeholder = np.broadcast_to(np.zeros((), np.dtype(value.dtype)), value.shape)
        base.update(convert.flax_leaf_to_torch(path, placeholder, prefixes))
    base = {k: v for k, v in base.items() if not _is_adapter_key(k)}
    hf_sd = fam.state_dict_to_hf(base, name, cfg)
    return fam, ({id(v): k for k, v in hf_sd.items()}, base)


def hf_module_names(model, name: str, cfg):
    """-> (family module, {our Linear module path: HF module path}) for every Linear whose weight
    the family's HF export writes unchanged (export_ids)."""
    from flax import nnx

    from jaxformer.layers.linear import Linear
    fam, (by_id, base) = export_ids(model, name, cfg)
    out = {}
    for path, module in nnx.iter_modules(model):
        dotted = ".".join(map(str, path))
        hf_key = by_id.get(id(base.get(dotted + ".weight")))
        if isinstance(module, Linear) and hf_key is not None and hf_key.endswith(".weight"):
            out[dotted] = hf_key[:-len(".weight")]
    return fam, out


def _targets(adapted: list[str], linears: list[str], rewritten=()) -> list[str]:
    """PEFT-style target_modules naming exactly `adapted` among `linears` (module paths): the
    last names ("q_proj", ...) when they select no other Linear, else the full paths. Full paths
    too where a last name is one PEFT rewrites into the experts' target_parameters for this model
    type (`rewritten`, expert_adapters.PEFT_REWRITES): PEFT >= 0.22 would add the experts' stack
    for a bare "up_proj" (and refuse it without "gate_proj"), a full path names the Linear only."""
    names = sorted({p.rsplit(".", 1)[-1] for p in adapted})
    hit = {p for p in linears if p.rsplit(".", 1)[-1] in names}
    return names if hit == set(adapted) and not set(names) & set(rewritten) else sorted(adapted)


# ----------------------------------------------------------------------------- export
def save_adapter(model, name: str, cfg, lora: LoRAConfig, out: str, *, overwrite: bool = False,
                 base_model: str | None = None) -> dict:
    """Write the model's LoRA adapters as a PEFT adapter directory (atomic: nothing at `out` on
    failure). base_model: adapter_config.json's base_model_name_or_path (a hub id or the HF
    base's path). -> {"modules", "tensors", "target_modules", "family"}."""
    from safetensors.numpy import save_file

    from jaxformer.checkpoint_io import check_lora
    from jaxformer.layers.lora import has_adapters, lora_modules
    adapted = lora_modules(model)
    if not has_adapters(model):
        raise ValueError("the model has no LoRA adapters: nothing to export --to peft (export the "
                         "model itself with --to hf|flax|torch)")
    check_lora(model, lora)
    fam, names = hf_module_names(model, name, cfg)
    family = fam.name
    missing = [p for p in adapted if p not in names]
    extra, params, ranks, alphas, why = expert_adapters.write(model, name, cfg, lora, fam, export_ids(model, name, cfg)[1],
                                                              {p: names[p] for p in adapted if p in names})
    if missing or why:
        raise ConversionError([f"{p}: adapted, but the {family} HF export fuses, transposes or splits its "
                               "weight, so HF (and PEFT) has no module for it" for p in missing] + why,
                              header="LoRA adapter on a module with no Hugging Face equivalent")
    tensors = {}
    for p, m in sorted(adapted.items()):
        tensors[f"{PREFIX}{names[p]}.lora_A.weight"] = np.asarray(m.lora_A.kernel[...], np.float32).T  # [r, in]
        tensors[f"{PREFIX}{names[p]}.lora_B.weight"] = np.asarray(m.lora_B.kernel[...], np.float32).T  # [out, r]
    tensors.update(extra)
    rewritten = expert_adapters.PEFT_REWRITES.get(fam.config_to_hf(name, cfg).get("model_type"), ())
    targets = _targets([names[p] for p in adapted], list(names.values()), rewritten) if adapted else None
    alpha = int(lora.alpha) if float(lora.alpha).is_integer() else lora.alpha
    config = {**lora.to_peft(), "lora_alpha": alpha, "target_modules": targets,
              "task_type": TASK_TYPES.get(name), "base_model_name_or_path": base_model, "revision": None,
              "inference_mode": True, "layers_to_transform": None, "layers_pattern": None,
              "target_parameters": params, "rank_pattern": ranks, "alpha_pattern": alphas, "lora_bias": False}
    with fileio.atomic_dir(os.path.abspath(out), overwrite=overwrite) as tmp:
        with open(os.path.join(tmp, CONFIG_FILE), "w") as f:
            json.dump(config, f, indent=2, sort_keys=True)
        save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, os.path.join(tmp, WEIGHTS_FILE),
                  metadata={"format": "pt"})
    return {"modules": len(adapted) + len(extra) // 2, "tensors": len(tensors), "target_modules": targets,
            "target_parameters": params, "family": family}


# ----------------------------------------------------------------------------- import
def read_adapter(directory: str) -> tuple[LoRAConfig, dict[str, np.ndarray]]:
    """-> (LoRAConfig, {PEFT key: array}) of a PEFT adapter directory. adapter_model.bin is read
    with torch.load(weights_only=True) only; unsupported options are refused by name."""
    from jaxformer.hf.files import (
        outside_problem,
        read_json_object,
        read_safetensors_header,
        read_tensor,
        torch_load_safely,
    )
    config_path = os.path.join(directory, CONFIG_FILE)
    if not os.path.isdir(directory) or not os.path.isfile(config_path):
        raise FileNotFoundError(f"{directory} is not a PEFT adapter directory (no {CONFIG_FILE})")
    for name in (CONFIG_FILE, WEIGHTS_FILE, BIN_FILE):  # a link out of the dir is refused, as in HF dirs
        if os.path.lexists(os.path.join(directory, name)):
            why = outside_problem(directory, name, f"PEFT adapter {directory}")
            if why:
                raise ConversionError([why], header="")
    try:
        lora = LoRAConfig.from_peft(read_json_object(config_path, "PEFT adapter config"), with_tensors=True)
    except ConfigError as e:
        raise ConfigError(f"{config_path}: {e}") from None
    weights = os.path.join(directory, WEIGHTS_FILE)
    if os.path.isfile(weights):
        infos, _ = read_safetensors_header(weights)
        tensors = {k: read_tensor(weights, info) for k, info in infos.items()}
    elif os.path.isfile(os.path.join(directory, BIN_FILE)):
        from jaxformer.convert import to_numpy
        tensors = {k: to_numpy(v) for k, v in torch_load_safely(os.path.join(directory, BIN_FILE)).items()}
    else:
        raise FileNotFoundError(f"{directory}: no {WEIGHTS_FILE} (or {BIN_FILE}) beside {CONFIG_FILE}")
    return lora, tensors


def untie_for_head(model, name: str, cfg, adapter):
    """-> (model, cfg, note or None). A PEFT LoRA on the lm_head of a tied LM wraps HF's head,
    which shares the embedding's weight: jaxformer's tied head is no Linear, so the model is
    rebuilt untied, lm_head a copy of the embedding (the same logits), for load_adapter to wrap.
    adapter: read_adapter's result."""
    import dataclasses

    from flax import nnx

    from jaxformer.models import abstract_model
    if name != "lm" or not cfg.tie_embeddings or not any(k.startswith(PREFIX + "lm_head.lora_") for k in adapter[1]):
        return model, cfg, None
    cfg = dataclasses.replace(cfg, tie_embeddings=False)
    untied = abstract_model(name, cfg)
    nnx.update(untied, nnx.state(model))  # every leaf but lm_head's, RNG state included
    untied.lm_head.kernel.set_value(model.embed.embed_tokens.embedding[...].T)  # [D, V]
    untied.eval()
    return untied, cfg, ("the adapter's LoRA on lm_head wraps the tied head: loaded untied "
                         "(tie_embeddings=False), lm_head a copy of the embedding")


def _sort_keys(tensors: dict, ours: dict[str, str], modules: dict, name: str):
    """{PEFT key: array} -> ({our module path: {"A"|"B": array}}, problems). A stored base
    weight (base_layer.weight|bias) is checked, not loaded: it must equal the base model's."""
    pairs: dict[str, dict[str, np.ndarray]] = {}
    problems = []
    for key, x in tensors.items():
        m = _KEY.fullmatch(key) or _BASE_KEY.fullmatch(key)
        if m is None:
            problems.append(f"unexpected: {key} is not a LoRA A/B weight of a Linear module "
                            "(base_model.model.<module>.lora_A|lora_B.weight)")
        elif m["module"] not in ours:
            problems.append(f"unmapped: {key}: HF module {m['module']} has no jaxformer Linear equivalent "
                            f"(or its weight is fused or transposed in jaxformer's {name})")
        elif "leaf" in m.groupdict():
            lin = modules[ours[m["module"]]]
            mine = lin.kernel if m["leaf"] == "weight" else lin.bias
            why = _base_mismatch(x, None if mine is None else np.asarray(mine[...]))
            if why:
                problems.append(f"base weight: {key} {why}: the adapter was saved on another base model")
        else:
            pairs.setdefault(ours[m["module"]], {})[m["ab"]] = x
    return pairs, problems


def _base_mismatch(stored: np.ndarray, mine: np.ndarray | None) -> str | None:
    """Why a base weight the adapter stores ([out, in] or [out]) is not the model's (kernel
    [in, out] or bias), or None. Exact equality, in the narrower of the two dtypes: a base
    loaded with param_dtype bfloat16 holds the checkpoint's fp32 weight rounded to nearest,
    as a bfloat16 copy of the stored one is."""
    if mine is None:
        return "exists, but the model's layer has no bias"
    mine = mine.T
    if tuple(stored.shape) != mine.shape:
        return f"is {tuple(stored.shape)}, the model's is {mine.shape}"
    narrow = stored.dtype if stored.dtype.itemsize < mine.dtype.itemsize else mine.dtype
    if np.array_equal(stored.astype(narrow), mine.astype(narrow)):
        return None
    diff = np.abs(stored.astype(np.float32) - mine.astype(np.float32)).max()
    return f"differs from the model's (max |diff| {diff:.3g})"


def load_adapter(model, name: str, cfg, directory: str, *, seed: int = 0, adapter=None) -> LoRAConfig:
    """Apply the PEFT adapter in `directory` to `model` (a jaxformer model of the adapter's HF
    base, e.g. hf.from_pretrained's), in place, in eval mode. -> the LoRAConfig applied (its
    target_modules name our module paths). Every key problem is listed in one ConversionError.
    adapter: read_adapter(directory)'s result, when already read."""
    import jax.numpy as jnp
    from flax import nnx

    from jaxformer.layers.linear import Linear
    from jaxformer.layers.lora import apply_lora, lora_modules
    lora, tensors = read_adapter(directory) if adapter is None else adapter
    fam, names = hf_module_names(model, name, cfg)
    got = expert_adapters.read(model, fam.name, export_ids(model, name, cfg)[1], lora, tensors)
    tensors = got.rest
    modules = {".".join(map(str, p)): mod for p, mod in nnx.iter_modules(model)}
    pairs, problems = _sort_keys(tensors, {hf: p for p, hf in names.items()}, modules, name)
    for p, ab in pairs.items():
        hf = names[p]
        if set(ab) != {"A", "B"}:
            problems.append(f"missing: {PREFIX}{hf}.lora_{'B' if 'A' in ab else 'A'}.weight")
            continue
        lin = modules[p]
        r = lora.rank_of(hf)
        want = {"A": (r, lin.in_features), "B": (lin.out_features, r)}
        problems += [f"shape: {PREFIX}{hf}.lora_{k}.weight is {tuple(ab[k].shape)}, expected {want[k]} (r={r})"
                     for k in "AB" if tuple(ab[k].shape) != want[k]]
    problems += got.problems
    if not pairs and not got.pairs and not problems:
        problems.append(f"{directory}: the adapter holds no LoRA weights")
    if problems:
        raise ConversionError(problems, header=f"the PEFT adapter {directory} does not fit the {name} model")
    linears = [p for p, mod in modules.items() if isinstance(mod, Linear)]
    lora = expert_adapters.our_config(model, lora, tuple(_targets(sorted(pairs), linears)),
                                      {p: names[p] for p in pairs}, got)
    apply_lora(model, lora, nnx.Rngs(seed))
    expert_adapters.set_values(model, got.pairs)
    adapted = lora_modules(model)
    assert set(adapted) == set(pairs), (sorted(adapted), sorted(pairs))
    for p, ab in pairs.items():
        adapted[p].lora_A.kernel.set_value(jnp.asarray(np.asarray(ab["A"], np.float32).T))  # [in, r]
        adapted[p].lora_B.kernel.set_value(jnp.asarray(np.asarray(ab["B"], np.float32).T))  # [r, out]
    model.eval()
    return lora


__all__ = ["save_adapter", "load_adapter", "read_adapter", "untie_for_head", "hf_module_names", "CONFIG_FILE", "WEIGHTS_FILE"]
