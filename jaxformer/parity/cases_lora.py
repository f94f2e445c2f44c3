"""Parity cases for LoRA (layers/lora.py in both trees): the adapted Linear (outputs, adapter
gradients, the frozen base's zero gradient), rsLoRA, LoRA'd tiny LMs, a frozen bf16/int8 base,
and the checks the self-test's LoRA bugs need:

- a fresh adapter leaves the output unchanged (B = 0): the JAX side applies its own init to
  the base weights, compared with torch's base alone (no weights converted into the adapter);
- dropout on the adapter path only, in training mode, made deterministic with rate 1.0 (both
  frameworks return exact zeros: the adapter path vanishes, the base path must stay);
- which modules get an adapter: both sides apply LoRA themselves, and every adapter's weights
  are a function of its own path, so an adapter on the wrong module changes the output;
- an MoE's expert and router weights adapted in place (target_parameters, ParamLoRA), the
  fused gate_up_proj at its own rank.

Adapters get non-zero B (a trained adapter's state), so the gradients reach A.
"""
from __future__ import annotations

import zlib

import numpy as np

from jaxformer.config.lora import LoRAConfig
from jaxformer.config.models import TINY_SIZES, LMConfig
from jaxformer.config.moe import MoEConfig
from jaxformer.parity.cases import case, normal, twin
from jaxformer.parity.cases_models import realistic_embeddings, token_ids

B, T, IN, OUT = 2, 5, 24, 40
V = TINY_SIZES["vocab_size"]


def _adapter_values(path: str, r: int, d_in: int, d_out: int):
    """(A [r, in], B [out, r]) in torch's layout, a function of the module path alone."""
    rng = np.random.RandomState(zlib.crc32(path.encode()))
    a = rng.uniform(-1, 1, (r, d_in)) / np.sqrt(d_in)
    return a.astype(np.float32), (rng.standard_normal((d_out, r)) * 0.1).astype(np.float32)


def _stacked_values(path: str, a_shape: tuple, b_shape: tuple):
    """(A [..., r, in], B [..., out, r]) of a ParamLoRA, a function of the weight path alone."""
    rng = np.random.RandomState(zlib.crc32(path.encode()))
    a = rng.uniform(-1, 1, a_shape) / np.sqrt(a_shape[-1])
    return a.astype(np.float32), (rng.standard_normal(b_shape) * 0.1).astype(np.float32)


def fill_adapters(torch_model=None, flax_model=None) -> None:
    """Set every adapter of either model to _adapter_values (_stacked_values) of its path, in place."""
    if torch_model is not None:
        import torch

        from torch_ref.layers import lora as tl
        with torch.no_grad():
            for path, m in tl.lora_modules(torch_model).items():
                a, b = _adapter_values(path, m.r, m.in_features, m.out_features)
                m.lora_A.weight.copy_(torch.from_numpy(a))
                m.lora_B.weight.copy_(torch.from_numpy(b))
            for path, m in tl.parameter_adapters(torch_model).items():
                a, b = _stacked_values(path, tuple(m.lora_A.shape), tuple(m.lora_B.shape))
                m.lora_A.copy_(torch.from_numpy(a))
                m.lora_B.copy_(torch.from_numpy(b))
    if flax_model is not None:
        import jax.numpy as jnp

        from jaxformer.layers import lora as jl
        for path, m in jl.lora_modules(flax_model).items():
            a, b = _adapter_values(path, m.r, m.in_features, m.out_features)
            m.lora_A.kernel.set_value(jnp.asarray(a.T))
            m.lora_B.kernel.set_value(jnp.asarray(b.T))
        for path, m in jl.parameter_adapters(flax_model).items():
            a, b = _stacked_values(path, tuple(m.lora_A.shape), tuple(m.lora_B.shape))
            m.lora_A.set_value(jnp.asarray(a))
            m.lora_B.set_value(jnp.asarray(b))


def _linear_pair(cfg: LoRAConfig, *, bias: bool = True, train: bool = False):
    """torch / JAX LoRALinear(Linear(IN, OUT)); train: both stay in training mode (eval() is a
    no-op), so the adapter's dropout is active."""
    def build(seed: int):
        import torch
        from flax import nnx

        from jaxformer.layers import lora as jl
        from jaxformer.layers.linear import Linear
        from torch_ref.layers import lora as tl

        torch.manual_seed(seed)
        tcls, jcls = (_TrainTorch(), _TrainJax()) if train else (tl.LoRALinear, jl.LoRALinear)
        kw = dict(r=cfg.r, alpha=cfg.alpha, dropout=cfg.dropout, use_rslora=cfg.use_rslora, init=cfg.init)
        t = tcls(torch.nn.Linear(IN, OUT, bias=bias), **kw)
        j = jcls(Linear(IN, OUT, use_bias=bias, rngs=nnx.Rngs(seed)), **kw, rngs=nnx.Rngs(seed))
        fill_adapters(t)
        return t, j
    return build


def _TrainTorch():
    from torch_ref.layers import lora as tl

    class AlwaysTrain(tl.LoRALinear):
        def eval(self):
            return self.train()
    return AlwaysTrain


def _TrainJax():
    from jaxformer.layers import lora as jl

    class AlwaysTrain(jl.LoRALinear):
        def eval(self, **attributes):
            self.train(**attributes)
    return AlwaysTrain


def _fresh_linear(cfg: LoRAConfig):
    """torch's base Linear alone against the JAX LoRALinear freshly applied (JAX's own init) to
    the same base weights: B = 0 must leave the output and the input gradient unchanged."""
    def build(seed: int):
        import torch
        from flax import nnx

        from jaxformer import convert
        from jaxformer.layers import lora as jl
        from jaxformer.layers.linear import Linear

        torch.manual_seed(seed)
        base = torch.nn.Linear(IN, OUT)
        jbase = Linear(IN, OUT, rngs=nnx.Rngs(seed))
        convert.load_torch_state_dict(jbase, base.state_dict())
        j = jl.LoRALinear(jbase, r=cfg.r, alpha=cfg.alpha, init=cfg.init, rngs=nnx.Rngs(seed))
        return (lambda x: base(x)), (lambda x: j(x))
    return build


def _lm_pair(lm_cfg: LMConfig, cfg: LoRAConfig):
    """LoRA'd tiny LMs, the torch weights (base and adapters) converted into JAX by the harness.
    The parameters outside the LoRA layers (embeddings, norms) are unfrozen in torch, so their
    gradients, which flow back through every adapted layer, are compared too (the JAX twin
    freezes only through its optimiser's filter); the wrapped layers' weights and biases stay
    frozen: gradient zero on both sides."""
    def build(seed: int):
        from flax import nnx

        from jaxformer.layers import lora as jl
        from jaxformer.models import build_model as jbuild
        from torch_ref.layers import lora as tl
        from torch_ref.models import build_model as tbuild

        t = realistic_embeddings(tbuild("lm", lm_cfg, seed=seed))
        tl.apply_lora(t, cfg, seed=seed)
        fill_adapters(t)
        wrapped = {f"{p}.{leaf}" for p in tl.lora_modules(t) for leaf in ("weight", "bias")}
        for n, p in t.named_parameters():
            p.requires_grad_(n not in wrapped)

        def make():
            j = jbuild("lm", lm_cfg, seed=seed)
            jl.apply_lora(j, cfg, nnx.Rngs(seed))
            return j
        return t, twin(make, seed)  # built abstractly: the harness converts every weight, adapters too
    return build


def _lm_own_adapters(lm_cfg: LMConfig, cfg: LoRAConfig, *, fresh: bool = False, weights_dtype: str = "fp32"):
    """Both sides apply LoRA themselves to the same base weights (converted before LoRA), and the
    adapters are filled from their own paths (fresh: torch's base model alone against JAX's
    fresh adapters). weights_dtype bf16 | int8: both bases then go through quantize_base.
    Logits only (ids have no gradient)."""
    def build(seed: int):
        import jax.numpy as jnp
        import torch
        from flax import nnx

        from jaxformer import convert
        from jaxformer.layers import lora as jl
        from jaxformer.models import build_model as jbuild
        from torch_ref.layers import lora as tl
        from torch_ref.models import build_model as tbuild

        t = realistic_embeddings(tbuild("lm", lm_cfg, seed=seed)).eval()
        j = jbuild("lm", lm_cfg, seed=seed)
        convert.load_torch_state_dict(j, t.state_dict())
        j.eval()
        if not fresh:
            tl.apply_lora(t, cfg, seed=seed)
            fill_adapters(t)
        jl.apply_lora(j, cfg, nnx.Rngs(seed))
        if not fresh:
            fill_adapters(flax_model=j)
        if weights_dtype != "fp32":
            tl.quantize_base(t, weights_dtype)
            jl.quantize_base(j, weights_dtype)

        def run_torch(ids):
            with torch.no_grad():
                return t(ids)
        return run_torch, (lambda ids: j(jnp.asarray(ids)))
    return build


ids_input = (lambda r: {"ids": token_ids(B, 7, V)(r)})
LLAMA, GPT2 = LMConfig.tiny("llama"), LMConfig.tiny("gpt2")

case("lora_linear", "lora", _linear_pair(LoRAConfig(r=4, alpha=16)), lambda r: {"x": normal(B, T, IN)(r)})
case("lora_linear_rslora", "lora", _linear_pair(LoRAConfig(r=4, alpha=6, use_rslora=True, init="gaussian")),
     lambda r: {"x": normal(B, T, IN)(r)})
case("lora_linear_nobias_dropout_eval", "lora", _linear_pair(LoRAConfig(r=3, alpha=5, dropout=0.3), bias=False),
     lambda r: {"x": normal(B, T, IN)(r)})
case("lora_linear_dropout_train", "lora", _linear_pair(LoRAConfig(r=4, alpha=16, dropout=1.0), train=True),
     lambda r: {"x": normal(B, T, IN)(r)}, note="dropout 1.0 in training mode: exact zeros in both")
case("lora_fresh_linear_kaiming", "lora", _fresh_linear(LoRAConfig(r=4, alpha=16)),
     lambda r: {"x": normal(B, T, IN)(r)})
case("lora_fresh_linear_gaussian", "lora", _fresh_linear(LoRAConfig(r=4, alpha=16, init="gaussian")),
     lambda r: {"x": normal(B, T, IN)(r)})
case("lora_llama_lm", "lora", _lm_pair(LLAMA, LoRAConfig(r=4, alpha=8)), ids_input)
case("lora_gpt2_lm_regex", "lora", _lm_pair(GPT2, LoRAConfig(r=2, alpha=4, target_modules=r".*\.(q_proj|v_proj|up_proj)")),
     ids_input)
case("lora_fresh_llama_is_base", "lora", _lm_own_adapters(LLAMA, LoRAConfig(r=4, alpha=8), fresh=True), ids_input,
     grads=False)
case("lora_llama_targets_q_only", "lora", _lm_own_adapters(LLAMA, LoRAConfig(r=4, alpha=8, target_modules=["q_proj"])),
     ids_input, grads=False)
case("lora_moe_experts_lm", "lora", _lm_pair(
    LMConfig.tiny("llama", num_layers=2, moe=MoEConfig(num_experts=4, top_k=2, router="softmax_topk", d_expert=16)),
    LoRAConfig(r=2, alpha=4, target_modules=["q_proj"], target_parameters=["gate_up_proj", "down_proj", "router.weight"],
               rank_pattern={"gate_up_proj": 4}, alpha_pattern={"gate_up_proj": 6})), ids_input)
for _dtype in ("bf16", "int8"):
    case(f"lora_llama_{_dtype}_base", "lora",
         _lm_own_adapters(LLAMA, LoRAConfig(r=4, alpha=8), weights_dtype=_dtype), ids_input, grads=False)
