"""Import live torch.nn Transformer modules: the equivalent jaxformer module, weights copied.

    from jaxformer import interop
    jmod = interop.from_torch(torch_module)        # nn.MultiheadAttention, nn.TransformerEncoder(Layer),
                                                   # nn.TransformerDecoder(Layer), nn.Transformer
    mask, bias = interop.masks_from_torch(key_padding_mask=kpm, attn_mask=am)  # True = ignore -> True = attend
    # torch called with is_causal=True: pass both its flags (and the module, for appended slots)
    mask, bias = interop.masks_from_torch(attn_mask=am, is_causal=True, need_weights=False, attention=jmod)
    out = jmod(x_btd, mask=mask)

torch.nn module             jaxformer module (built here)                      torch key -> jaxformer key
nn.MultiheadAttention       TorchMultiheadAttention (below, a MultiHeadAttention) in_proj_weight/bias -> q/k/v_proj (split),
                                                                                q/k/v_proj_weight (kdim/vdim) -> q/k/v_proj,
                                                                                out_proj -> o_proj, bias_k/v [1, 1, E] -> [E]
nn.TransformerEncoderLayer  layers.transformer.EncoderLayer                    linear1/2 -> ffn.up_proj/down_proj,
                                                                                norm1/2 -> attn_norm/ffn_norm
nn.TransformerDecoderLayer  layers.transformer.DecoderLayer                    multihead_attn -> cross_attn,
                                                                                norm1/2/3 -> attn_norm/cross_attn_norm/ffn_norm
nn.TransformerEncoder       layers.transformer.Encoder                         layers.i -> layers.i, norm -> final_norm
nn.TransformerDecoder       layers.transformer.Decoder(causal=False)           idem; causal=True adds the causal mask
nn.Transformer              EncoderDecoder (below)                             encoder.*, decoder.*

Layout: every jaxformer module is batch-first, x [B, T, D], whatever the torch module's
`batch_first`: feed a batch_first=False module's (T, B, D) input as x.swapaxes(0, 1). Masks are
boolean, True = attend, broadcastable to [B, H, T, S]; `masks_from_torch` converts torch's
(True = ignore, or additive float). norm_first, layer_norm_eps, bias=False (on the
projections and the norms), the activation (relu, exact-erf gelu, tanh gelu, silu) and the
dropout rates carry over; anything the jaxformer module cannot express is refused with a
ValueError that names it. What the mapping does and what was measured: docs/numerics.md §23.

Weights are copied by the strict converter (jaxformer.convert) from `torch_state(module)`,
the module's state dict under jaxformer's names; the same function maps gradients, so
`assert_parity(..., ParityOptions(state_map=...))` compares a torch.nn module with its import leaf by leaf.
"""
from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch
import torch.nn.functional as F
from flax import nnx
from torch import nn

from jaxformer import convert
from jaxformer.config import Dropouts, Projections, TransformerConfig
from jaxformer.layers.attention import AttentionMask, MultiHeadAttention, combine_masks
from jaxformer.layers.kernels import partitioning
from jaxformer.layers.linear import Linear
from jaxformer.layers.transformer import Decoder, DecoderLayer, Encoder, EncoderLayer


class TorchMultiheadAttention(MultiHeadAttention):
    """MultiHeadAttention with torch.nn.MultiheadAttention's own options, which from_torch
    builds; its torch reference is nn.MultiheadAttention itself (docs/numerics.md §23).

    Args (beyond MultiHeadAttention's):
        kdim, vdim: input widths of k_proj and v_proj; None = D (keys and values that come
            from a stream of another width).
        add_bias_kv: append one learned key slot `bias_k` and value slot `bias_v` ([G * K]) to
            the projected keys and values, always visible.
        add_zero_attn: then append one all-zero key and value slot, always visible (score 0).
    Shapes: kv [B, S, kdim], value [B, S, vdim]. The appended slots extend S by one each; mask
    and bias get them visible. They have no position, so they cannot be combined with RoPE,
    and no KV cache holds them.
    """

    def __init__(self, d_model: int, num_heads: int, *, kdim: int | None = None, vdim: int | None = None,
                 add_bias_kv: bool = False, add_zero_attn: bool = False, rngs: nnx.Rngs, **options):
        super().__init__(d_model, num_heads, rngs=rngs, **options)
        self.slots = int(add_bias_kv) + int(add_zero_attn)
        if self.rope is not None and self.slots:
            raise ValueError("add_bias_kv / add_zero_attn append key slots that have no position; "
                             "they cannot be combined with RoPE (rope)")
        width = self.num_kv_heads * self.head_dim
        for name, dim in (("k_proj", kdim), ("v_proj", vdim)):
            if dim is not None and dim != d_model:
                setattr(self, name, Linear(dim, width, use_bias=getattr(self, name).use_bias,
                                           axes=("embed", "heads"), rngs=rngs))
        # learned key/value slots appended after the projected keys/values (add_bias_kv), [G * K]
        self.bias_k = (partitioning.param(0.02 * jax.random.normal(rngs.params(), (width,)), (None,))
                       if add_bias_kv else None)
        self.bias_v = (partitioning.param(0.02 * jax.random.normal(rngs.params(), (width,)), (None,))
                       if add_bias_kv else None)
        self.add_zero_attn = add_zero_attn

    def append_slots(self, k: jax.Array, v: jax.Array, mask, bias):
        """k, v [B, S, G, K] -> [B, S + n, G, K] with the bias_k/bias_v slot, then the zero slot
        (torch's order); mask and bias (broadcastable to [B, H, T, S]) get the n new keys
        visible with bias 0, unless they already have S + n columns (then they say it)."""
        if isinstance(mask, AttentionMask):  # the slots have no place in the parts: make it dense
            extra = mask.dense_bias()
            mask, bias = mask.dense(), extra if bias is None else (bias if extra is None else bias + extra)
        b, _, g, d = k.shape
        new_k, new_v = [k], [v]
        if self.bias_k is not None:
            new_k.append(jnp.broadcast_to(self.bias_k[...].reshape(1, 1, g, d), (b, 1, g, d)).astype(k.dtype))
            new_v.append(jnp.broadcast_to(self.bias_v[...].reshape(1, 1, g, d), (b, 1, g, d)).astype(v.dtype))
        if self.add_zero_attn:
            new_k.append(jnp.zeros((b, 1, g, d), k.dtype))
            new_v.append(jnp.zeros((b, 1, g, d), v.dtype))
        n, s = len(new_k) - 1, k.shape[1]

        def pad(m, value):  # -> 4-D, S columns, then n more (a mask of S + n covers them itself)
            m = m.reshape((1,) * (4 - m.ndim) + m.shape)
            if m.shape[-1] == s + n:
                return m
            m = jnp.broadcast_to(m, m.shape[:3] + (s,))
            return jnp.concatenate([m, jnp.full(m.shape[:3] + (n,), value, m.dtype)], axis=-1)
        mask = None if mask is None else pad(mask, True)
        bias = None if bias is None else pad(bias, 0)
        return jnp.concatenate(new_k, axis=1), jnp.concatenate(new_v, axis=1), mask, bias


class EncoderDecoder(nnx.Module):
    """The jaxformer twin of torch.nn.Transformer: an Encoder and a Decoder with
    cross-attention, each with its final norm; no embeddings and no output head (torch's has
    none either).

    Shapes: src [B, S, D], tgt [B, T, D]; src_mask [B?, H?, S, S], tgt_mask [B?, H?, T, T],
    memory_mask [B?, H?, T, S], bool, True = attend -> [B, T, D].
    """

    def __init__(self, encoder: TransformerConfig, decoder: TransformerConfig, *, causal: bool = False,
                 rngs: nnx.Rngs):
        self.encoder = Encoder(encoder, rngs=rngs)
        self.decoder = Decoder(decoder, cross_attention=True, causal=causal, rngs=rngs)

    def __call__(self, src: jax.Array, tgt: jax.Array, *, src_mask=None, tgt_mask=None, memory_mask=None):
        memory = self.encoder(src, mask=src_mask)  # [B, S, D]
        return self.decoder(tgt, memory, mask=tgt_mask, memory_mask=memory_mask)  # [B, T, D]


# ----------------------------------------------------------------------------- masks
def _concrete(x) -> np.ndarray | None:
    """x as numpy when its values are known here (not a jit tracer), else None."""
    if isinstance(x, jax.core.Tracer):
        return None
    return np.asarray(convert.to_numpy(x))


def check_key_mask(valid, name: str = "key mask") -> None:
    """A key mask in jaxformer's polarity (True = attend, [B, ..., S]) must leave every batch
    row at least one key. A row that attends to nothing is what a mask of the wrong polarity
    gives (torch's True = ignore passed over unchanged, or inverted twice); ValueError naming
    the rows. Values under jit are not known and not checked."""
    v = _concrete(valid)
    if v is None or v.size == 0:
        return
    flat = v.reshape(v.shape[0], -1) if v.ndim > 1 else v.reshape(1, -1)
    empty = np.flatnonzero(~flat.astype(bool).any(axis=-1))
    if empty.size:
        raise ValueError(f"{name}: batch row(s) {empty.tolist()} may attend to no key at all; the mask "
                         "looks inverted (torch's key_padding_mask is True = ignore, jaxformer's "
                         "masks are True = attend): pass torch masks through masks_from_torch once")


def _to_jnp(x) -> jax.Array:
    return x if isinstance(x, jax.Array) else jnp.asarray(convert.to_numpy(x))


def _split_float(m: jax.Array, known: np.ndarray | None):
    """An additive float mask -> (bool mask: False where -inf, bias: the finite values, or None
    when `known`, its values if known here, has no finite value other than 0)."""
    keep = ~jnp.isneginf(m)
    if known is not None and not np.where(np.isneginf(known), 0.0, known).any():
        return keep, None
    return keep, jnp.where(keep, m, 0.0).astype(jnp.float32)


def masks_from_torch(key_padding_mask=None, attn_mask=None, *, num_heads: int | None = None,
                     is_causal: bool = False, need_weights: bool | None = None, attention=None):
    """torch's attention masks -> jaxformer's (mask, bias) for the same attention.

    key_padding_mask: [B, S]; bool True = ignore this key (padding), or float, added.
    attn_mask: [T, S] or [B * H, T, S] (then num_heads is needed); bool True = not allowed,
        or float, added (torch's generate_square_subsequent_mask: 0 / -inf).
    Returns (mask, bias): mask bool, True = attend, [B, 1, 1, S] / [1, 1, T, S] / [B, H, T, S]
    and combined; bias float broadcastable alike, or None when the float masks hold only 0 and
    -inf (-inf entries become False in mask). The stacks (Encoder, Decoder, EncoderDecoder)
    take a boolean mask only; an additive mask with other values goes to the layers or to
    MultiHeadAttention as bias=.

    A mask of the wrong polarity is refused where its values are known (not under jit): a
    batch row of key_padding_mask that ignores every key, or a query row of a bool attn_mask
    that ignores every key (torch returns NaN there), names the rows (check_key_mask).

    is_causal, need_weights: the flags of the nn.MultiheadAttention call, for its is_causal
    hint. torch requires attn_mask with it, then uses attn_mask (slots of add_bias_kv /
    add_zero_attn visible) when key_padding_mask is given or need_weights is True; otherwise it
    drops attn_mask and runs SDPA's causal mask over all S + n keys, which hides the n appended
    slots from every query (docs/numerics.md §23). That path needs `attention`, the imported
    MultiHeadAttention, to know n: the mask returned then has S + n columns. With is_causal and
    no key_padding_mask, need_weights must be given (torch's default is True, but a module torch
    runs the SDPA way differs by up to 0.9), unless `attention` has no slots (the paths agree).
    """
    if is_causal and attn_mask is None:
        raise ValueError("is_causal=True needs attn_mask, as in torch (the hint says what attn_mask is)")
    if is_causal and key_padding_mask is None and need_weights is None and _slots(attention) != 0:
        raise ValueError("masks_from_torch(is_causal=True) without key_padding_mask: pass need_weights= as in the "
                         "torch call (False: SDPA's causal path, which hides add_bias_kv / add_zero_attn slots)")
    if is_causal and key_padding_mask is None and need_weights is False:
        return _sdpa_causal(attn_mask, attention), None
    parts = ([] if key_padding_mask is None else [_from_key_padding(key_padding_mask)]) + (
        [] if attn_mask is None else [_from_attn_mask(attn_mask, num_heads)])
    biases = [b for _, b in parts if b is not None]
    bias = None
    for b in biases:
        bias = b if bias is None else bias + b
    return combine_masks(*[m for m, _ in parts]), bias


def _from_key_padding(key_padding_mask):
    """torch's key_padding_mask [B, S] -> (mask [B, 1, 1, S] True = attend, bias or None)."""
    bias = None
    known = _concrete(key_padding_mask)  # checked before any jnp op (jit stages those)
    kpm = _to_jnp(key_padding_mask)
    if kpm.ndim != 2:
        raise ValueError(f"key_padding_mask must be [B, S], got shape {tuple(kpm.shape)}")
    if kpm.dtype == jnp.bool_:
        valid = ~kpm
        if known is not None:
            check_key_mask(~known, "key_padding_mask (converted to True = attend)")
    elif jnp.issubdtype(kpm.dtype, jnp.floating):
        valid, b = _split_float(kpm, known)
        if known is not None:
            check_key_mask(~np.isneginf(known), "key_padding_mask (converted to True = attend)")
        if b is not None:
            bias = b[:, None, None, :]
    else:
        raise ValueError(f"key_padding_mask must be bool (True = ignore) or float (added), got "
                         f"{kpm.dtype}; an int 0/1 attention_mask (1 = attend) is attention_mask == 0 here")
    return valid[:, None, None, :], bias  # [B, 1, 1, S]


def _from_attn_mask(attn_mask, num_heads: int | None):
    """torch's attn_mask [T, S] or [B * H, T, S] -> (mask True = attend, bias or None), 4-D."""
    known = _concrete(attn_mask)
    am = _to_jnp(attn_mask)
    if am.ndim == 2:
        am = am[None, None]  # [1, 1, T, S]
    elif am.ndim == 3:
        if num_heads is None or am.shape[0] % num_heads:
            raise ValueError(f"a 3-D attn_mask [B * H, T, S] (shape {tuple(am.shape)}) needs "
                             f"num_heads dividing its first axis, got num_heads={num_heads}")
        am = am.reshape(am.shape[0] // num_heads, num_heads, *am.shape[1:])  # [B, H, T, S]
    else:
        raise ValueError(f"attn_mask must be [T, S] or [B * H, T, S], got shape {tuple(am.shape)}")
    if am.dtype == jnp.bool_:
        if known is not None and known.all(axis=-1).any():
            where = sorted(set(np.argwhere(known.all(axis=-1))[:, -1].tolist()))[:8]
            raise ValueError(f"attn_mask: query row(s) {where} ignore every key (torch's bool "
                             "attn_mask is True = not allowed, and returns NaN there); the mask "
                             "looks inverted (jaxformer's polarity is True = attend)")
        return ~am, None
    elif jnp.issubdtype(am.dtype, jnp.floating):
        return _split_float(am, known)
    raise ValueError(f"attn_mask must be bool (True = not allowed) or float (added), got {am.dtype}")


def _slots(attention) -> int | None:
    """How many key slots an imported MultiHeadAttention appends (add_bias_kv, add_zero_attn);
    None when `attention` is None (not known)."""
    if attention is None:
        return None
    if not isinstance(attention, MultiHeadAttention):
        raise ValueError(f"attention must be the imported MultiHeadAttention, got {type(attention).__name__}")
    return attention.slots


def _sdpa_causal(attn_mask, attention) -> jax.Array:
    """torch's MultiheadAttention under is_causal=True, need_weights=False and no
    key_padding_mask: attn_mask is not used; SDPA's causal mask (query i sees key j <= i,
    top-left) spans the S keys and the n appended slots, so it hides the slots: [1, 1, T, S + n]."""
    if attention is None:
        raise ValueError("is_causal=True with need_weights=False and no key_padding_mask is torch's SDPA "
                         "causal path, which hides add_bias_kv / add_zero_attn slots: pass attention=<the "
                         "imported MultiHeadAttention> so the mask covers them")
    t, s = attn_mask.shape[-2:]
    n = _slots(attention)
    return jnp.asarray(np.tril(np.ones((t, s + n), bool)))[None, None]  # [1, 1, T, S + n]


# ----------------------------------------------------------------------------- reading torch modules
_KINDS = (nn.MultiheadAttention, nn.TransformerEncoderLayer, nn.TransformerDecoderLayer,
          nn.TransformerEncoder, nn.TransformerDecoder, nn.Transformer)


def _activation(fn: Any, where: str) -> str:
    """The FFN kind of a torch activation callable, or ValueError naming it."""
    if isinstance(fn, functools.partial) and fn.func is F.gelu and not fn.args \
            and set(fn.keywords) <= {"approximate"}:
        return {"none": "gelu", "tanh": "gelu_tanh"}.get(fn.keywords.get("approximate", "none"), "?")
    if fn in (F.relu, torch.relu) or type(fn) is nn.ReLU:
        return "relu"
    if fn is F.gelu or (type(fn) is nn.GELU and fn.approximate == "none"):
        return "gelu"  # exact (erf) GELU, torch's default (docs/numerics.md §2)
    if type(fn) is nn.GELU and fn.approximate == "tanh":
        return "gelu_tanh"
    if fn is F.silu or type(fn) is nn.SiLU:
        return "silu"
    raise ValueError(f"{where}: activation {fn!r} is not one jaxformer can identify; supported: "
                     "'relu', 'gelu', F.relu, F.gelu (exact or approximate='tanh'), F.silu, "
                     "nn.ReLU(), nn.GELU(), nn.SiLU()")


def _norm_fields(norms: dict[str, nn.Module], where: str) -> dict:
    """LayerNorm eps and bias shared by `norms` (they share one config field in jaxformer)."""
    for name, n in norms.items():
        if type(n) is not nn.LayerNorm:
            raise ValueError(f"{where}.{name}: {type(n).__name__} is not an nn.LayerNorm")
        if not n.elementwise_affine:
            raise ValueError(f"{where}.{name}: LayerNorm(elementwise_affine=False) has no "
                             "jaxformer equivalent (its norms always scale)")
    eps = {name: n.eps for name, n in norms.items()}
    has_bias = {name: n.bias is not None for name, n in norms.items()}
    if len(set(eps.values())) > 1:
        raise ValueError(f"{where}: the LayerNorms have different eps {eps}; jaxformer's share one")
    if len(set(has_bias.values())) > 1:
        raise ValueError(f"{where}: some LayerNorms have a bias and some not {has_bias}")
    first = next(iter(norms))
    return dict(norm="layernorm", norm_eps=float(eps[first]), norm_bias=has_bias[first])


def _plain_attention(mha: nn.MultiheadAttention, where: str, d_model: int) -> dict:
    """Checks an attention inside a layer (which jaxformer builds without torch's extras) and
    returns its config fields."""
    if type(mha) is not nn.MultiheadAttention:
        raise ValueError(f"{where}: {type(mha).__name__} is not an nn.MultiheadAttention")
    for flag, bad in (("kdim/vdim", not mha._qkv_same_embed_dim), ("add_bias_kv", mha.bias_k is not None),
                      ("add_zero_attn", mha.add_zero_attn)):
        if bad:
            raise ValueError(f"{where} uses {flag}; jaxformer imports that option only on a standalone "
                             "nn.MultiheadAttention, not inside a Transformer layer")
    if mha.embed_dim != d_model:
        raise ValueError(f"{where}: embed_dim {mha.embed_dim} differs from the layer's d_model {d_model}")
    return dict(num_heads=mha.num_heads, attn_dropout=float(mha.dropout),
                attn_qkv_bias=mha.in_proj_bias is not None, attn_out_bias=mha.out_proj.bias is not None)


def _layer_config(layer: nn.Module, where: str) -> TransformerConfig:
    """The TransformerConfig of an nn.TransformerEncoderLayer / nn.TransformerDecoderLayer."""
    decoder = type(layer) is nn.TransformerDecoderLayer
    d_model, d_ff = layer.linear1.in_features, layer.linear1.out_features
    attn = _plain_attention(layer.self_attn, f"{where}.self_attn", d_model)
    if decoder:
        cross = _plain_attention(layer.multihead_attn, f"{where}.multihead_attn", d_model)
        if cross != attn:
            raise ValueError(f"{where}: self_attn {attn} and multihead_attn {cross} differ; jaxformer's "
                             "decoder layer builds both from one config")
    if (layer.linear1.bias is None) != (layer.linear2.bias is None):
        raise ValueError(f"{where}: linear1 and linear2 disagree on having a bias")
    norms = {"norm1": layer.norm1, "norm2": layer.norm2, **({"norm3": layer.norm3} if decoder else {})}
    return TransformerConfig(
        d_model=d_model, d_ff=d_ff, num_layers=1, ffn=_activation(layer.activation, f"{where}.activation"),
        norm_position="pre" if layer.norm_first else "post", final_norm=False,
        ffn_bias=layer.linear1.bias is not None, dropout=float(layer.dropout1.p),
        ffn_dropout=float(layer.dropout.p), position="none", **attn, **_norm_fields(norms, where))


def _stack_config(stack: nn.Module, where: str) -> TransformerConfig:
    """The TransformerConfig of an nn.TransformerEncoder / nn.TransformerDecoder: every layer's
    config (they must agree), the layer count and the final norm."""
    layer_type = nn.TransformerDecoderLayer if type(stack) is nn.TransformerDecoder else nn.TransformerEncoderLayer
    configs = []
    for i, layer in enumerate(stack.layers):
        if type(layer) is not layer_type:
            raise ValueError(f"{where}.layers.{i}: {type(layer).__name__} is not an nn.{layer_type.__name__}")
        configs.append(_layer_config(layer, f"{where}.layers.{i}"))
    if not configs:
        raise ValueError(f"{where} has no layers")
    for i, c in enumerate(configs[1:], 1):
        if c != configs[0]:
            diff = {f: (getattr(configs[0], f), getattr(c, f)) for f in c.__dataclass_fields__
                    if getattr(configs[0], f) != getattr(c, f)}
            raise ValueError(f"{where}.layers.{i} differs from layers.0 in {diff}; jaxformer's stacks "
                             "repeat one layer config")
    cfg = configs[0]
    if stack.norm is not None:
        final = _norm_fields({"norm": stack.norm}, where)
        if (final["norm_eps"], final["norm_bias"]) != (cfg.norms.norm_eps, cfg.norms.norm_bias):
            raise ValueError(f"{where}.norm: eps {final['norm_eps']} / bias {final['norm_bias']} differ "
                             f"from the layers' ({cfg.norms.norm_eps} / {cfg.norms.norm_bias}); jaxformer's share one")
    return cfg.replace(num_layers=len(configs), final_norm=stack.norm is not None)


def _check_type(module, where: str = "module") -> None:
    if type(module) not in _KINDS:
        sub = next((k for k in _KINDS if isinstance(module, k)), None)
        if sub is not None:
            raise ValueError(f"{where}: {type(module).__name__} subclasses nn.{sub.__name__}; its forward "
                             "may differ, so only the torch.nn classes themselves are imported")
        raise ValueError(f"{where}: {type(module).__name__} is not one of "
                         f"{', '.join('nn.' + k.__name__ for k in _KINDS)}")


def twin_spec(module: nn.Module, causal: bool = False) -> tuple[type, tuple, dict]:
    """(jaxformer class, positional args, keyword args) that from_torch builds for `module`
    (rngs aside): the constructor call of its twin. ValueError names what cannot be imported."""
    _check_type(module)
    kind = type(module)
    if kind is nn.MultiheadAttention:
        e = module.embed_dim
        kw = dict(projections=Projections(module.in_proj_bias is not None, module.out_proj.bias is not None),
                  dropouts=Dropouts(attn=float(module.dropout)))
        torch_only = {k: v for k, v in (("kdim", module.kdim), ("vdim", module.vdim)) if v != e}
        torch_only.update({k: True for k, on in (("add_bias_kv", module.bias_k is not None),
                                                 ("add_zero_attn", bool(module.add_zero_attn))) if on})
        return (TorchMultiheadAttention, (e, module.num_heads), {**kw, **torch_only}) if torch_only else (
            MultiHeadAttention, (e, module.num_heads), kw)
    if kind is nn.TransformerEncoderLayer:
        return EncoderLayer, (_layer_config(module, "TransformerEncoderLayer"),), {}
    if kind is nn.TransformerDecoderLayer:
        return DecoderLayer, (_layer_config(module, "TransformerDecoderLayer"),), {}
    if kind is nn.TransformerEncoder:
        return Encoder, (_stack_config(module, "TransformerEncoder"),), {}
    if kind is nn.TransformerDecoder:
        return Decoder, (_stack_config(module, "TransformerDecoder"),), dict(cross_attention=True, causal=causal)
    for part, part_kind in (("encoder", nn.TransformerEncoder), ("decoder", nn.TransformerDecoder)):
        if type(getattr(module, part)) is not part_kind:
            raise ValueError(f"Transformer.{part}: a custom {type(getattr(module, part)).__name__} is not "
                             f"an nn.{part_kind.__name__}")
    enc = _stack_config(module.encoder, "Transformer.encoder")
    dec = _stack_config(module.decoder, "Transformer.decoder")
    if enc.d_model != dec.d_model:
        raise ValueError(f"Transformer: encoder d_model {enc.d_model} != decoder d_model {dec.d_model}")
    return EncoderDecoder, (enc, dec), dict(causal=causal)


def _build(module: nn.Module, causal: bool, rngs: nnx.Rngs) -> nnx.Module:
    cls, args, kwargs = twin_spec(module, causal)
    return cls(*args, **kwargs, rngs=rngs)


def from_torch(module: nn.Module, *, causal: bool | None = None, seed: int = 0) -> nnx.Module:
    """The jaxformer module equivalent to a live torch.nn module, with its weights copied.

    module: nn.MultiheadAttention, nn.TransformerEncoderLayer, nn.TransformerEncoder,
        nn.TransformerDecoderLayer, nn.TransformerDecoder or nn.Transformer (not a subclass).
    causal: decoder stacks and nn.Transformer only. False (the default) is torch's behaviour:
        self-attention sees what the mask passed at call time allows, as torch sees what
        tgt_mask allows. True builds the causal mask into the stack (no tgt_mask needed).
    The result takes batch-first inputs ([B, T, D]) and boolean masks, True = attend
    (masks_from_torch); it is in eval mode when the torch module is. The torch call's flags
    (is_causal, need_weights) enter through masks_from_torch: the module is the same for both.
    """
    _check_type(module)
    stacks = (nn.TransformerDecoder, nn.Transformer)
    if causal is not None and type(module) not in stacks:
        raise ValueError(f"causal= applies to nn.TransformerDecoder and nn.Transformer, not "
                         f"nn.{type(module).__name__} (a layer takes its mask at call time)")
    jmodule = _build(module, bool(causal), nnx.Rngs(seed))
    convert.load_torch_state_dict(jmodule, torch_state(module))
    if not module.training:
        jmodule.eval()
    return jmodule


# ----------------------------------------------------------------------------- names and tensors
# torch child name -> jaxformer attribute path, per module kind (a MultiheadAttention child is
# mapped by _mha_state; Linear and LayerNorm leaves keep torch's names for the converter)
_CHILDREN = {
    nn.TransformerEncoderLayer: {"self_attn": "self_attn", "linear1": "ffn.up_proj", "linear2": "ffn.down_proj",
                                 "norm1": "attn_norm", "norm2": "ffn_norm"},
    nn.TransformerDecoderLayer: {"self_attn": "self_attn", "multihead_attn": "cross_attn",
                                 "linear1": "ffn.up_proj", "linear2": "ffn.down_proj", "norm1": "attn_norm",
                                 "norm2": "cross_attn_norm", "norm3": "ffn_norm"},
    nn.TransformerEncoder: {"layers": "layers", "norm": "final_norm"},
    nn.TransformerDecoder: {"layers": "layers", "norm": "final_norm"},
    nn.Transformer: {"encoder": "encoder", "decoder": "decoder"},
}


def _mha_state(state: Mapping[str, Any]) -> dict[str, Any]:
    out = {}
    for k, v in state.items():
        if k in ("in_proj_weight", "in_proj_bias"):  # [3E, ...]: q, k, v stacked
            leaf = k.rpartition("_")[2]
            for name, part in zip("qkv", v.chunk(3, dim=0), strict=True):
                out[f"{name}_proj.{leaf}"] = part
        elif k in ("q_proj_weight", "k_proj_weight", "v_proj_weight"):  # kdim / vdim: kept apart
            out[f"{k[0]}_proj.weight"] = v
        elif k in ("bias_k", "bias_v"):
            out[k] = v.reshape(-1)  # [1, 1, E] -> [E]
        elif k.startswith("out_proj."):
            out["o_proj." + k.removeprefix("out_proj.")] = v
        else:
            out[k] = v  # unknown: the strict converter names it
    return out


def _map_state(module: nn.Module, state: Mapping[str, Any]) -> dict[str, Any]:
    if isinstance(module, nn.MultiheadAttention):
        return _mha_state(state)
    table = _CHILDREN.get(type(module))
    groups: dict[str, dict[str, Any]] = {}
    for k, v in state.items():
        child, _, rest = k.partition(".")
        groups.setdefault(child, {})[rest] = v
    out = {}
    for child, sub in groups.items():
        target = table.get(child, child) if table else child
        sub_module = getattr(module, child, None)
        if isinstance(sub_module, nn.ModuleList):  # layers.i.<...>
            inner = {}
            for k, v in sub.items():
                i, _, rest = k.partition(".")
                inner.setdefault(i, {})[rest] = v
            for i, layer_state in inner.items():
                for k, v in _map_state(sub_module[int(i)], layer_state).items():
                    out[f"{target}.{i}.{k}"] = v
        elif isinstance(sub_module, nn.Module) and type(sub_module) in (*_CHILDREN, nn.MultiheadAttention):
            for k, v in _map_state(sub_module, sub).items():
                out[f"{target}.{k}"] = v
        else:
            for k, v in sub.items():
                out[f"{target}.{k}" if k else target] = v
    return out


def torch_state(module: nn.Module, state: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """{jaxformer torch-layout key: tensor} for a torch.nn module's state (default: its
    state_dict; or any dict under the module's own names, e.g. its parameters' gradients:
    the mapping is slices and reshapes, so it maps gradients alike)."""
    _check_type(module)
    return _map_state(module, module.state_dict() if state is None else state)
