"""PEFT's target_parameters LoRA (its ParamWrapper) on MoE expert and router weights, in and out
of jaxformer (layers/lora.py ParamLoRA); hf/adapters.py reads and writes the rest of the adapter.

Which HF parameter. PEFT adapts transformers 5's in-memory parameters: the experts'
`mlp.experts.gate_up_proj` (gate and up fused) and `mlp.experts.down_proj`, and the router's
`mlp.gate.weight` (gpt-oss: `mlp.router.weight`). Our router weight maps by the family's export
(the module holding it), the experts are its sibling `experts` on both sides, and our
experts.gate_up_proj_lora is HF's gate_up_proj: gate rows then up rows [E, 2F, D] (Mixtral,
Qwen3-MoE, DeepSeek-V3; Mixtral's block_sparse_moe is `mlp` in memory), or gpt-oss's [E, D, 2F] with gate and up interleaved (columns 0::2 and
1::2), whose adapter rows are interleaved the same way. Other families have no such parameter,
so an expert adapter on them is refused by name.

Layout (peft/tuners/lora/layer.py ParamWrapper). For a stacked [E, ...] weight PEFT keeps one
lora_A.weight [E*r, in] (expert-major: rows e*r .. e*r+r-1 are expert e's A) and one
lora_B.weight [out, r*E] (expert-minor: column j*E + e is expert e's B column j), and adds
scaling * B_e @ A_e to expert e's [out, in] weight (gpt-oss's [in, out] gets its transpose): ours
are lora_A [E, r, in] and lora_B [E, out, r]. A 2-D weight (the router's [E, D]) is a plain
Linear's pair. Keys: PEFT nests one wrapper per adapted parameter of a module, in the module's
parameter order (gate_up_proj, then down_proj), the first innermost, so with both adapted
gate_up_proj's pair is `experts.base_layer.lora_A.weight` and down_proj's `experts.lora_A.weight`.
Rank and alpha per parameter: PEFT's rank_pattern / alpha_pattern rule on the HF parameter path
(PEFT writes {".*\\.gate_up_proj": 2r} and 2 alpha when it fuses gate_proj and up_proj targets).

Linear layers PEFT cannot name. For model types whose MLP names PEFT 0.21 turns into
target_parameters on load (deepseek_v3, qwen3_moe: gate_proj, up_proj, down_proj), an adapter on
a dense or shared-expert Linear layer of that name would be dropped by PeftModel.from_pretrained,
so exporting one is refused by name.
"""
from __future__ import annotations

import dataclasses
import re

import numpy as np

from jaxformer.config.lora import LoRAConfig, pattern_value

# family -> how its HF gate_up_proj orders the gate and up rows
GATE_UP = {"mixtral": "stacked", "qwen_moe": "stacked", "deepseek": "stacked", "gpt_oss": "interleaved"}
# the export's (published) module names that transformers 5 renames in memory, where PEFT adapts
IN_MEMORY = {".block_sparse_moe.": ".mlp."}  # Mixtral
HF_ORDER = ("gate_up_proj", "down_proj")  # HF experts' parameter order, which PEFT nests by
# HF model types whose target_modules PEFT before 0.22 rewrites into the experts'
# target_parameters on load, dropping a Linear of the same name (DeepSeek-V3's shared experts,
# Qwen3-MoE's dense layers). PEFT 0.22 keeps such a Linear adapter and adds the experts' one
# (its #3945), so the refusal applies only where an older PEFT is installed.
PEFT_REWRITES = {"deepseek_v3": ("gate_proj", "up_proj", "down_proj"),
                 "qwen3_moe": ("gate_proj", "up_proj", "down_proj")}


def peft_drops_same_named_linear() -> bool:
    """Whether the installed PEFT drops a Linear adapter whose name PEFT_REWRITES lists (< 0.22);
    False without PEFT (the current release's rule)."""
    try:
        import peft
    except ImportError:
        return False
    from packaging.version import Version
    return Version(peft.__version__) < Version("0.22")
PREFIX = "base_model.model."


def weight_names(model, family: str, by_id: dict, base: dict) -> dict[str, str]:
    """{our adaptable weight path: HF parameter path} of every router and gated expert stack;
    {} when the family has no HF parameter PEFT could target. by_id / base: the export's
    {id: HF key} and our torch-named arrays (adapters.export_ids)."""
    from flax import nnx

    from jaxformer.layers.moe import Experts, Router
    if family not in GATE_UP:
        return {}
    modules = {".".join(map(str, p)): m for p, m in nnx.iter_modules(model)}
    out = {}
    for dotted, m in modules.items():
        hf = by_id.get(id(base.get(dotted + ".weight"))) if isinstance(m, Router) else None
        if hf is None:
            continue
        for published, memory in IN_MEMORY.items():
            hf = hf.replace(published, memory)
        out[dotted + ".weight"] = hf
        ours, theirs = dotted.rsplit(".", 1)[0] + ".experts", hf.rsplit(".", 2)[0] + ".experts"
        experts = modules.get(ours)
        if isinstance(experts, Experts) and experts.gate_proj is not None:
            out.update({f"{ours}.{n}": f"{theirs}.{n}" for n in HF_ORDER})
    return out


def peft_prefixes(hf_params) -> dict[str, str]:
    """{HF parameter path: the module path PEFT saves its pair under}: per module, the adapted
    parameters in HF_ORDER, the last outermost, each inner one a `.base_layer` deeper."""
    by_module: dict[str, list[str]] = {}
    for p in hf_params:
        by_module.setdefault(p.rsplit(".", 1)[0], []).append(p)
    out = {}
    for module, params in by_module.items():
        params.sort(key=lambda q: HF_ORDER.index(q.rsplit(".", 1)[1]) if q.rsplit(".", 1)[1] in HF_ORDER else -1)
        for i, q in enumerate(params):
            out[q] = module + ".base_layer" * (len(params) - 1 - i)
    return out


def _shapes(model) -> dict[str, tuple]:
    from jaxformer.layers.lora import parameter_candidates
    return {p: c[2] for p, c in parameter_candidates(model).items() if not isinstance(c, str)}


def _peft_shapes(shape: tuple, r: int) -> tuple[tuple, tuple]:
    """PEFT's (lora_A.weight, lora_B.weight) shapes for our [E, out, in] or [out, in] weight."""
    *lead, out, inn = shape
    e = lead[0] if lead else 1
    return (e * r, inn), (out, r * e)


def to_ours(a: np.ndarray, b: np.ndarray, shape: tuple, r: int, interleaved: bool):
    """PEFT's flat pair -> ours (lora_A [E, r, in], lora_B [E, out, r]; 2-D as they are)."""
    if len(shape) == 2:
        return a, b
    e = shape[0]
    a = a.reshape(e, r, a.shape[-1])
    b = b.reshape(b.shape[0], r, e).transpose(2, 0, 1)  # [E, out, r]
    if interleaved:  # gpt-oss: gate rows 0::2, up rows 1::2 -> gate rows, then up rows
        b = np.concatenate([b[:, 0::2], b[:, 1::2]], axis=1)
    return np.ascontiguousarray(a), np.ascontiguousarray(b)


def to_peft(a: np.ndarray, b: np.ndarray, interleaved: bool):
    """to_ours' inverse."""
    if a.ndim == 2:
        return a, b
    e, r, inn = a.shape
    if interleaved:
        f = b.shape[1] // 2
        b = np.stack([b[:, :f], b[:, f:]], axis=2).reshape(b.shape)
    return a.reshape(e * r, inn), np.ascontiguousarray(b.transpose(1, 2, 0).reshape(b.shape[1], r * e))


@dataclasses.dataclass
class Read:
    """The expert/router part of a PEFT adapter: pairs {our weight path: (A, B)} in our layout,
    their r and alpha, the tensors left for the Linear loader, and the problems found."""
    pairs: dict
    ranks: dict
    alphas: dict
    rest: dict
    problems: list


def read(model, family: str, ids: tuple, lora: LoRAConfig, tensors: dict) -> Read:
    """Take the target_parameters pairs out of `tensors` (PEFT keys): every module that has
    any must have all its targeted parameters' pairs, with PEFT's shapes at their pattern rank."""
    names = weight_names(model, family, *ids)
    theirs = {hf: p for p, hf in names.items()}
    targets = lora.target_parameters or ()
    hit = [hf for hf in theirs if any(hf == t or hf.endswith("." + t) for t in targets)]
    problems = [f"target_parameters: {t!r} names no expert or router weight jaxformer maps in {family} "
                f"({'none' if not names else 'experts.gate_up_proj, experts.down_proj, the router weight'})"
                for t in targets if not any(hf == t or hf.endswith("." + t) for hf in theirs)]
    rest = dict(tensors)
    present = {PREFIX + m for m in {k[len(PREFIX):].split(".lora_")[0] for k in tensors if ".lora_" in k}}
    shapes, interleaved = _shapes(model), GATE_UP.get(family) == "interleaved"
    out = Read({}, {}, {}, rest, problems)
    for hf, module in peft_prefixes(hit).items():
        keys = {ab: f"{PREFIX}{module}.lora_{ab}.weight" for ab in "AB"}
        if PREFIX + hf.rsplit(".", 1)[0] not in {p.split(".base_layer")[0] for p in present}:
            continue  # no pair on this module (layers_to_transform, exclude_modules)
        missing = [k for k in keys.values() if k not in rest]
        if missing:
            problems += [f"missing: {k} (target_parameters adapts {hf})" for k in missing]
            continue
        ours = theirs[hf]
        r, alpha = pattern_value(lora.rank_pattern, hf, lora.r), pattern_value(lora.alpha_pattern, hf, lora.alpha)
        a, b = rest.pop(keys["A"]), rest.pop(keys["B"])
        want = _peft_shapes(shapes[ours], r)
        bad = [f"shape: {keys[ab]} is {tuple(x.shape)}, expected {w} (r={r} for {hf})"
               for ab, x, w in (("A", a, want[0]), ("B", b, want[1])) if tuple(x.shape) != w]
        if bad:
            problems += bad
            continue
        out.pairs[ours] = to_ours(np.asarray(a, np.float32), np.asarray(b, np.float32), shapes[ours], r,
                                  interleaved and hf.endswith(".gate_up_proj"))
        out.ranks[ours], out.alphas[ours] = r, alpha
    return out


def patterns(values: dict[str, float], default) -> dict:
    """{path: value} -> PEFT-rule patterns giving each path its value: a path's last name
    when every path of that name has the same value, else the path itself; defaults omitted."""
    out = {}
    for path, v in sorted(values.items()):
        if v == default:
            continue
        leaf = path.rsplit(".", 1)[-1]
        same = all(w == v for q, w in values.items() if q.rsplit(".", 1)[-1] == leaf)
        out[re.escape(leaf if same else path)] = v
    return out


def target_names(adapted, candidates) -> list[str]:
    """target_parameters naming exactly `adapted` among `candidates` (weight paths): the last
    two names ("experts.down_proj", "gate.weight") when they select no other, else the paths."""
    names = sorted({".".join(p.rsplit(".", 2)[-2:]) for p in adapted})
    hit = {c for c in candidates if any(c == n or c.endswith("." + n) for n in names)}
    return names if hit == set(adapted) else sorted(adapted)


def our_config(model, lora: LoRAConfig, target_modules: tuple, linear: dict[str, str], got: Read) -> LoRAConfig:
    """The LoRAConfig, in our paths, of the adapter load_adapter applies: linear {our Linear
    path: HF module path} of the Linear pairs, `got` the expert/router ones."""
    from jaxformer.layers.lora import parameter_candidates
    ranks = {p: pattern_value(lora.rank_pattern, hf, lora.r) for p, hf in linear.items()} | got.ranks
    alphas = {p: pattern_value(lora.alpha_pattern, hf, lora.alpha) for p, hf in linear.items()} | got.alphas
    candidates = parameter_candidates(model)
    params = target_names(got.pairs, candidates) if got.pairs else None
    return dataclasses.replace(lora, target_modules=target_modules, target_parameters=params,
                               rank_pattern=patterns(ranks, lora.r) or None,
                               alpha_pattern=patterns(alphas, lora.alpha) or None)


def set_values(model, pairs: dict) -> None:
    """Fill the ParamLoRAs apply_lora made with the pairs read (our layout)."""
    import jax.numpy as jnp

    from jaxformer.layers.lora import parameter_adapters
    adapters = parameter_adapters(model)
    assert set(adapters) == set(pairs), (sorted(adapters), sorted(pairs))
    for p, (a, b) in pairs.items():
        adapters[p].lora_A.set_value(jnp.asarray(a))
        adapters[p].lora_B.set_value(jnp.asarray(b))


def write(model, name: str, cfg, lora: LoRAConfig, fam, ids: tuple, linear: dict[str, str]):
    """The expert/router part of save_adapter: -> (PEFT tensors, target_parameters or None,
    patterns of r and alpha for every adapter (linear {our path: HF module path} too), problems)."""
    from jaxformer.layers.lora import parameter_adapters
    adapters = parameter_adapters(model)
    names = weight_names(model, fam.name, *ids)
    problems = [f"{p}: adapted, but the {fam.name} HF model has no parameter PEFT's target_parameters could "
                f"adapt for it" for p in adapters if p not in names]
    rewritten = PEFT_REWRITES.get(fam.config_to_hf(name, cfg).get("model_type"), ()) \
        if peft_drops_same_named_linear() else ()
    problems += [f"{p}: PEFT < 0.22 (installed) turns target_modules {hf.rsplit('.', 1)[-1]!r} of this model type into the experts' "
                 f"target_parameters on load, so PeftModel.from_pretrained would drop this Linear adapter"
                 for p, hf in linear.items() if hf.rsplit(".", 1)[-1] in rewritten]
    tensors, ranks, alphas = {}, {}, {}
    prefixes = peft_prefixes([names[p] for p in adapters if p in names])
    for p, m in sorted(adapters.items()):
        if p not in names:
            continue
        hf = names[p]
        a, b = to_peft(np.asarray(m.lora_A[...], np.float32), np.asarray(m.lora_B[...], np.float32),
                       GATE_UP[fam.name] == "interleaved" and hf.endswith(".gate_up_proj"))
        tensors[f"{PREFIX}{prefixes[hf]}.lora_A.weight"], tensors[f"{PREFIX}{prefixes[hf]}.lora_B.weight"] = a, b
        ranks[hf], alphas[hf] = m.r, lora.alpha_of(p)
    ranks |= {hf: lora.rank_of(p) for p, hf in linear.items()}
    alphas |= {hf: lora.alpha_of(p) for p, hf in linear.items()}
    params = target_names(list(ranks.keys() - set(linear.values())), names.values()) if tensors else None
    return tensors, params, patterns(ranks, lora.r), patterns(alphas, lora.alpha), problems


__all__ = ["read", "write", "our_config", "set_values", "weight_names", "peft_prefixes", "to_ours", "to_peft",
           "GATE_UP"]
