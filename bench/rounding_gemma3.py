"""How far jaxformer's fp32 Gemma 3 lands from float64, against HF's fp32 (issue 36 point 4,
docs/numerics.md §44). No timing.

The model is the parity registry's `lm_gemma3_all_sliding_final_cap_left_padding` (five
sliding layers, window 3, query_pre_attn_scalar 7, head_dim 8, final cap 3, rows of 0, 4 and 9
left pads), exported as an HF Gemma3ForCausalLM config. Per seed: HF's model with every weight
redrawn (tests/helpers.randomize's scales, times --scale), imported into jaxformer; the same
HF model in float64 is the referee, with its RoPE recomputed in float64 (transformers' Gemma3
rotary embedding casts to float32 whatever the model's dtype). Distance: max |logit - float64|
over the positions that hold a token. Per seed the ratio jaxformer / HF; over seeds the
geometric mean, the standard error of the mean log and a 95% interval (t quantile).

    JAX_PLATFORMS=cpu python bench/rounding_gemma3.py --seeds 40

The last line printed is JSON.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _rope64(module, x, position_ids, layer_type):
    """Gemma3RotaryEmbedding.forward in float64: inverse frequencies from the base, angles,
    cos and sin all float64 (only default RoPE, the registry case's)."""
    import torch
    cfg = module.config
    params = cfg.rope_parameters[layer_type]
    assert params.get("rope_type", "default") == "default", params
    dim = cfg.attention.head_dim
    inv = 1.0 / (params["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    ang = position_ids[..., None].to(torch.float64) * inv
    emb = torch.cat((ang, ang), dim=-1)
    return emb.cos().to(x.dtype), emb.sin().to(x.dtype)


def _randomize(model, seed: int, scale: float):
    import torch
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * (0.5 if p.ndim == 1 else 0.2) * scale)
    return model.eval()


def _hf_logits(model, ids, mask):
    import torch
    m = torch.from_numpy(mask)
    with torch.no_grad():
        return model(torch.from_numpy(ids), attention_mask=m,
                     position_ids=(m.cumsum(-1) - 1).clamp(min=0)).logits.double().numpy()


def measure(seed: int, scale: float, tmp: str, forward) -> dict:
    """One seed: {"jax": distance, "hf": distance, "ratio": jax / hf}."""
    import copy
    import types

    import torch
    import transformers

    from jaxformer import hf
    from jaxformer.parity.cases_models import GEMMA3_SLIDING, left_padding, token_ids
    cfg = GEMMA3_SLIDING
    hf_cfg = hf.config_to_hf("lm", cfg)
    cls = getattr(transformers, hf_cfg["architectures"][0])
    model = _randomize(cls(cls.config_class(**hf_cfg)), seed, scale)
    path = os.path.join(tmp, f"s{seed}")
    model.save_pretrained(path)
    jmodel, _, _ = hf.from_pretrained(path)
    ids = token_ids(3, 11, cfg.vocab_size, lengths=[11, 7, 2], left=True)(np.random.RandomState(seed))
    mask = left_padding(3, 11, [11, 7, 2])
    m64 = copy.deepcopy(model).double()
    rot = m64.model.rotary_emb
    rot.forward = types.MethodType(_rope64, rot)
    ref = _hf_logits(m64, ids, mask)
    keep = mask.astype(bool)
    dist = lambda x: float(np.abs(np.asarray(x, np.float64) - ref)[keep].max())
    d_jax, d_hf = dist(forward(jmodel, ids, mask)), dist(_hf_logits(model, ids, mask))
    torch.set_num_threads(1)
    return {"seed": seed, "jax": d_jax, "hf": d_hf, "ratio": d_jax / d_hf}


def _exact(name: str):
    """Replace jax.numpy.`name` (jnp.tanh: the soft-caps and jax.nn.gelu's tanh form) with the
    float64 value rounded once to float32, through a host callback: the ideal a float32 kernel
    could reach, for bisecting (CPU only)."""
    import jax
    import jax._src.lax as src_lax
    import jax._src.numpy as src_jnp
    import jax.numpy as jnp
    from scipy import special
    f64 = {"tanh": np.tanh, "erf": special.erf, "erfc": special.erfc}

    def op(fn):
        def host(x):
            return fn(np.asarray(x, np.float64)).astype(np.float32)

        def call(x):
            x = jnp.asarray(x, jnp.float32)
            return jax.pure_callback(host, jax.ShapeDtypeStruct(x.shape, jnp.float32), x,
                                     vmap_method="expand_dims")
        return call
    if name == "erf":  # jax.nn.gelu(approximate=False) reads lax.erfc
        jax.lax.erf = src_lax.erf = op(f64["erf"])
        jax.lax.erfc = src_lax.erfc = op(f64["erfc"])
    else:  # jax.nn.gelu(approximate=True) reads jax._src.numpy.tanh
        jnp.tanh = src_jnp.tanh = op(f64["tanh"])


def summarize(ratios) -> dict:
    """Geometric mean of the ratios, the standard error of the mean log, a 95% interval."""
    logs = np.log(np.asarray(ratios, np.float64))
    n = len(logs)
    se = float(logs.std(ddof=1) / math.sqrt(n)) if n > 1 else float("nan")
    try:
        from scipy.stats import t as student
        q = float(student.ppf(0.975, n - 1))
    except ImportError:
        q = 1.96
    m = float(logs.mean())
    return {"n": n, "geomean": math.exp(m), "se_log": se, "ci95": [math.exp(m - q * se), math.exp(m + q * se)],
            "min": float(np.min(ratios)), "max": float(np.max(ratios)),
            "jax_nearer": int(np.sum(logs < 0))}


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=40)
    p.add_argument("--first", type=int, default=0)
    p.add_argument("--scale", type=float, default=1.0)
    p.add_argument("--exact", action="append", default=[], choices=("tanh", "erf"),
                   help="compute this op in float64 inside jaxformer's fp32 model (bisecting)")
    p.add_argument("--xla-kernels", action="store_true",
                   help="jaxformer.layers.special's tanh falls back to XLA's (jnp.tanh)")
    a = p.parse_args(argv)
    import jax.numpy as jnp
    import transformers
    from flax import nnx

    from jaxformer.layers import special
    from jaxformer.parity import setup_precision
    setup_precision()
    transformers.utils.logging.disable_progress_bar()
    if a.xla_kernels:
        special._tanh32 = jnp.tanh
    for name in a.exact:
        _exact(name)
    jit = nnx.jit(lambda m, i, k: m(i, k))
    forward = lambda m, i, k: np.asarray(jit(m, jnp.asarray(i), jnp.asarray(k)))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for s in range(a.first, a.first + a.seeds):
            rows.append(measure(s, a.scale, tmp, forward))
            print(f"seed {s}: jax {rows[-1]['jax']:.3e} hf {rows[-1]['hf']:.3e} ratio {rows[-1]['ratio']:.3f}",
                  flush=True)
    out = {"config": "lm_gemma3_all_sliding_final_cap_left_padding", "scale": a.scale, "exact": a.exact, "xla_kernels": a.xla_kernels,
           **summarize([r["ratio"] for r in rows]),
           "jax_median": float(np.median([r["jax"] for r in rows])),
           "hf_median": float(np.median([r["hf"] for r in rows])), "per_seed": rows}
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
