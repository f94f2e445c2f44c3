"""LoRA: low-rank adapters on Linear layers (Hu et al. 2021), as PEFT computes them.
Twin: jaxformer/layers/lora.py. Config: jaxformer/config/lora.py.

    y = x @ W^T + b + lora_B(lora_A(dropout(x))) * scaling     W, b frozen

Checkpoint keys. A LoRALinear keeps the wrapped nn.Linear's `weight` and `bias` Parameters under
the same names, so the base keys stay decoder.layers.0.self_attn.q_proj.weight; the adapter adds
`q_proj.lora_A.weight` [r, in] and `q_proj.lora_B.weight` [out, r] (PEFT's layout and names,
without PEFT's adapter-name level).

Training only the adapter: apply_lora sets requires_grad False on every parameter of the model
but the adapters (PEFT does the same), so an optimiser over the parameters that require a
gradient trains the adapters only. Stacked weights (PEFT's target_parameters): a ParamLoRA beside
an MoE's expert or router weight (experts.gate_up_proj_lora, router.weight_lora), lora_A [E, r, in]
and lora_B [E, out, r]; the owner multiplies by W + scaling * B @ A. Frozen base in reduced precision (QLoRA style):
quantize_base(model, "bf16" | "int8"), the adapter stays fp32.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from jaxformer.config.lora import LoRAConfig, lora_scaling, select_parameters, select_targets
from torch_ref.layers.kernels import quant
from torch_ref.layers.moe import Experts, Router


class LoRALinear(nn.Module):
    """An nn.Linear (its own weight and bias, frozen) plus a trainable low-rank update.

    Args:
        base: the nn.Linear to wrap; its weight/bias Parameters are taken over as they are.
        r: rank.  alpha: lora_alpha.  dropout: on the adapter's input only.
        use_rslora: scaling alpha / sqrt(r).  init: "kaiming" | "gaussian" (LoRAConfig.init).
        generator: the torch.Generator the adapter's init draws from (None: the global one).
    Shapes: x [..., in] -> [..., out]; lora_A.weight [r, in], lora_B.weight [out, r].
    """

    def __init__(self, base: nn.Linear, *, r: int, alpha: float, dropout: float = 0.0, use_rslora: bool = False,
                 init: str = "kaiming", generator: torch.Generator | None = None):
        super().__init__()
        if not isinstance(base, nn.Linear):
            raise ValueError(f"LoRA wraps an nn.Linear, got {type(base).__name__}")
        self.in_features, self.out_features = base.in_features, base.out_features
        self.weight = base.weight
        self.bias = base.bias
        self.weight.requires_grad_(False)
        if self.bias is not None:
            self.bias.requires_grad_(False)
        self.r = r
        self.scaling = lora_scaling(alpha, r, use_rslora)
        # skip_init: no draw from the global RNG for an init that is redone below
        kw = dict(bias=False, device=base.weight.device, dtype=torch.float32)
        self.lora_A = nn.utils.skip_init(nn.Linear, self.in_features, r, **kw)
        self.lora_B = nn.utils.skip_init(nn.Linear, r, self.out_features, **kw)
        self.lora_dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.reset_lora_parameters(init, generator)

    @torch.no_grad()
    def reset_lora_parameters(self, init: str, generator: torch.Generator | None = None) -> None:
        """PEFT's reset_lora_parameters: A kaiming-uniform (a = sqrt 5, nn.Linear's default) or
        N(0, (1/r)^2) ("gaussian"); B zeros."""
        if init == "kaiming":
            nn.init.kaiming_uniform_(self.lora_A.weight, a=5 ** 0.5, generator=generator)
        elif init == "gaussian":
            nn.init.normal_(self.lora_A.weight, std=1.0 / self.r, generator=generator)
        else:
            raise ValueError(f"LoRA init must be 'kaiming' or 'gaussian', got {init!r}")
        nn.init.zeros_(self.lora_B.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., in] -> [..., out]."""
        if isinstance(self.weight, quant.QuantizedWeight):  # a bf16/int8 frozen base [out, in]
            result = quant.matmul(x, self.weight)
            if self.bias is not None:
                result = result + self.bias.float()
            result = result.to(x.dtype)
        else:
            result = F.linear(x, self.weight, self.bias)
        # PEFT's order: dropout on the adapter input only, then A, B, then the scaling
        return result + (self.lora_B(self.lora_A(self.lora_dropout(x))) * self.scaling).to(result.dtype)

    def delta(self) -> torch.Tensor:
        """scaling * B @ A: the [out, in] update merge_lora adds to the weight."""
        return (self.lora_B.weight @ self.lora_A.weight) * self.scaling


class ParamLoRA(nn.Module):
    """A low-rank update of a stacked weight W [..., out, in] (PEFT's ParamWrapper): the owner
    multiplies by W + delta(), W frozen. One (A, B) pair per leading index (per expert).

    Args: shape of W; r, alpha, use_rslora, init as LoRALinear; generator for the init.
    Params: lora_A [..., r, in] (kaiming: U(-1/sqrt(in), 1/sqrt(in)), torch's nn.Linear init of
    PEFT's lora_A; gaussian: N(0, 1/r^2)), lora_B [..., out, r] zeros; fp32.
    """

    def __init__(self, shape: tuple, *, r: int, alpha: float, use_rslora: bool = False, init: str = "kaiming",
                 generator: torch.Generator | None = None, device=None):
        super().__init__()
        *lead, out, inn = shape
        if init == "kaiming":
            a = (torch.rand(*lead, r, inn, generator=generator) * 2 - 1) / inn ** 0.5
        else:
            a = torch.randn(*lead, r, inn, generator=generator) / r
        self.r = r
        self.scaling = lora_scaling(alpha, r, use_rslora)
        self.lora_A = nn.Parameter(a.to(device))
        self.lora_B = nn.Parameter(torch.zeros(*lead, out, r, device=device))

    def delta(self) -> torch.Tensor:
        """scaling * B @ A: [..., out, in], float32."""
        return (self.lora_B @ self.lora_A) * self.scaling


# ----------------------------------------------------------------------------- model surgery
def _set_child(model: nn.Module, dotted: str, child: nn.Module) -> None:
    parent_name, _, name = dotted.rpartition(".")
    setattr(model.get_submodule(parent_name) if parent_name else model, name, child)


def find_targets(model: nn.Module, cfg: LoRAConfig) -> list[str]:
    """The dotted paths of the nn.Linear layers cfg.target_modules selects
    (config.lora.select_targets: same matching and errors as the JAX twin)."""
    return select_targets(cfg, {n: isinstance(m, nn.Linear) for n, m in model.named_modules() if n})


def parameter_candidates(model: nn.Module) -> dict[str, tuple | str]:
    """{dotted weight path: (owner path, attribute, shape) when a ParamLoRA can adapt it, else
    why not} (the JAX twin's, same paths and reasons)."""
    out = {}
    for dotted, m in model.named_modules():
        if isinstance(m, Experts):
            gated = m.gate_proj is not None
            for name in ("gate_proj", "up_proj", "down_proj") if gated else ("up_proj", "down_proj"):
                out[f"{dotted}.{name}"] = "the gated experts' gate and up weights take one adapter: gate_up_proj" \
                    if gated and name != "down_proj" else (dotted, name, m.stacked_shape(name))
            if gated:
                out[f"{dotted}.gate_up_proj"] = (dotted, "gate_up_proj", m.stacked_shape("gate_up_proj"))
        elif isinstance(m, Router):
            out[f"{dotted}.weight"] = (dotted, "weight", tuple(m.weight.shape))
        elif isinstance(m, nn.Linear) and dotted:
            out[f"{dotted}.weight"] = "a Linear layer's weight: name the layer in target_modules"
    return out


def apply_lora(model: nn.Module, cfg: LoRAConfig, seed: int = 0) -> list[str]:
    """Wrap every targeted nn.Linear of `model` in a LoRALinear and give every targeted stacked
    weight (cfg.target_parameters) a ParamLoRA, in place, and freeze every other parameter
    (requires_grad False); -> the adapted dotted paths, sorted (Linear layers, then weights). The
    adapters' init draws from a torch.Generator seeded with `seed` (the global RNG is untouched)."""
    if has_adapters(model):
        raise ValueError("the model already has LoRA adapters")
    targets = find_targets(model, cfg)
    candidates = parameter_candidates(model)
    chosen = select_parameters(cfg, {p: c if isinstance(c, str) else None for p, c in candidates.items()})
    generator = torch.Generator().manual_seed(seed)
    for p in model.parameters():
        p.requires_grad_(False)
    for dotted in targets:
        _set_child(model, dotted, LoRALinear(model.get_submodule(dotted), r=cfg.rank_of(dotted),
                                             alpha=cfg.alpha_of(dotted), dropout=cfg.dropout,
                                             use_rslora=cfg.use_rslora, init=cfg.init, generator=generator))
    for dotted in chosen:
        owner, name, shape = candidates[dotted]
        module = model.get_submodule(owner)
        device = getattr(module, "up_proj", getattr(module, "weight", None)).device
        setattr(module, f"{name}_lora", ParamLoRA(shape, r=cfg.rank_of(dotted), alpha=cfg.alpha_of(dotted),
                                                  use_rslora=cfg.use_rslora, init=cfg.init, generator=generator,
                                                  device=device))
    return targets + chosen


def lora_modules(model: nn.Module) -> dict[str, LoRALinear]:
    """{dotted path: LoRALinear} of the model."""
    return {n: m for n, m in model.named_modules() if isinstance(m, LoRALinear)}


def parameter_adapters(model: nn.Module) -> dict[str, ParamLoRA]:
    """{dotted path of the adapted weight (decoder.layers.0.ffn.experts.gate_up_proj): ParamLoRA}."""
    return {n.removesuffix("_lora"): m for n, m in model.named_modules() if isinstance(m, ParamLoRA)}


def has_adapters(model: nn.Module) -> bool:
    return bool(lora_modules(model) or parameter_adapters(model))


@torch.no_grad()
def merge_lora(model: nn.Module) -> list[str]:
    """Fold every adapter into its base, weight += scaling * B @ A, and turn each LoRALinear back
    into a plain nn.Linear (same weight/bias Parameters, so the keys are the base model's); in
    place; -> the merged paths. requires_grad is left as it was (frozen)."""
    merged = lora_modules(model)
    for dotted, m in merged.items():
        if isinstance(m.weight, quant.QuantizedWeight):
            raise ValueError(f"{dotted}: cannot merge an adapter into a reduced-precision base "
                             f"(quantize_base); merge into the fp32 weights")
        m.weight.add_(m.delta().to(m.weight.dtype))
        plain = nn.utils.skip_init(nn.Linear, m.in_features, m.out_features, bias=m.bias is not None,
                                   device="meta")
        plain.weight, plain.bias = m.weight, m.bias
        _set_child(model, dotted, plain)
    return sorted(merged) + _merge_parameters(model)


def _merge_parameters(model: nn.Module) -> list[str]:
    """merge_lora of the ParamLoRAs: each weight += its update (Experts.weight's), the adapter removed."""
    merged = parameter_adapters(model)
    for dotted in merged:
        owner_path, name = dotted.rsplit(".", 1)
        owner = model.get_submodule(owner_path)
        names = ("gate_proj", "up_proj") if name == "gate_up_proj" else (name,)
        new = {n: owner.weight(n) if isinstance(owner, Experts) else owner.effective_weight() for n in names}
        for n, w in new.items():
            getattr(owner, n).copy_(w)
        setattr(owner, f"{name}_lora", None)
    return sorted(merged)


def quantize_base(model: nn.Module, weights_dtype: str) -> None:
    """Store every LoRALinear's frozen weight as a bf16 or int8 quant.QuantizedWeight (QLoRA
    style: the adapter stays fp32), in place. The reduced weight is not a Parameter, so it
    leaves the state_dict."""
    for m in lora_modules(model).values():
        reduced = quant.reduce_weight(m.weight, weights_dtype)
        del m.weight  # a QuantizedWeight is not a Parameter
        m.weight = reduced


__all__ = ["LoRALinear", "ParamLoRA", "apply_lora", "find_targets", "lora_modules", "parameter_adapters",
           "parameter_candidates", "has_adapters", "merge_lora", "quantize_base"]
