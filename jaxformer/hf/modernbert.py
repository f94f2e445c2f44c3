"""ModernBERT (`ModernBertModel` <-> `encoder`, `ModernBertForSequenceClassification` <->
`classifier`; `ModernBertForMaskedLM` -> `encoder`).

Mapping and its deliberate details (docs/numerics.md §36):
  * A Pre-LN encoder: norm_position="pre", a LayerNorm (norm_eps, norm_bias) on the token
    embeddings (embed_norm, no absolute positions, no token types, no scaling), none before
    layer 0's attention (HF's Identity attn_norm -> first_attn_norm=False), a final norm.
  * RoPE with two bases: rope_parameters["full_attention"]["rope_theta"] (legacy
    global_rope_theta) -> rope_base, rope_parameters["sliding_attention"]["rope_theta"]
    (local_rope_theta) -> rope_local_base, the base of the sliding-window layers. Positions
    are 0..T-1 whatever the padding, as HF's.
  * Local layers: layer_types (or, without it, every global_attn_every_n_layers-th layer
    global, the rest sliding, as HF derives them). HF's bidirectional window lets a query see
    keys with |i - j| <= local_attention // 2; jaxformer's band is |i - j| < sliding_window,
    so sliding_window = local_attention // 2 + 1 (an odd local_attention exports as the even
    number below it, which computes the same).
  * GeGLU: the fused `mlp.Wi` [2F, D] holds the activated half first -> gate_proj, then the
    multiplied half -> up_proj (split at import, fused at export); hidden_activation "gelu" ->
    geglu, the tanh GELUs -> geglu_tanh (exported as gelu_pytorch_tanh), "silu" -> swiglu. The fused `attn.Wqkv` [3D, D] ->
    q/k/v_proj. attention_bias -> the q/k/v/o biases, mlp_bias -> the FFN biases.
  * The classification head: pooling classifier_pooling ("cls": token 0, "mean": over the
    attention mask), then `head.dense` (classifier_bias) + classifier_activation + `head.norm`
    -> pooler, pooler_act, pooler_norm; classifier_dropout; `classifier` (always a bias).
  * Dropouts: embedding_dropout -> embed_dropout, mlp_dropout -> ffn_dropout (inside the MLP),
    attention_dropout -> attn_dropout. HF also drops the attention output with
    attention_dropout (no residual dropout after the MLP); jaxformer's residual dropout is 0
    here, so a nonzero attention_dropout gets a note (training only; eval outputs equal).
  * Ignored: deterministic_flash_attn and reference_compile (kernel choices), the masked-LM
    head's options (decoder_bias, sparse_prediction, sparse_pred_ignore_index,
    tie_word_embeddings), initializer_cutoff_factor, bos/eos token ids; layer_norm_eps and
    position_embedding_type, which some published configs carry and transformers does not read
    (a layer_norm_eps unlike norm_eps gets a note).
  * Unsupported (an error naming the option): a rope_type other than "default" in either
    entry of rope_parameters (or rope_scaling), activations without a jaxformer gated FFN.
  * HF attends to every token when attention_mask is None (and mean-pools all of them);
    jaxformer's classifier masks ids == pad_id then: pass attention_mask to compare.
"""
from __future__ import annotations

import numpy as np

from jaxformer.config import TransformerConfig
from jaxformer.config.models import ClassifierConfig
from jaxformer.convert import ConversionError
from jaxformer.hf.common import Family, MappingError, Options, Renamer, build_config, rename_all, token_ids
from jaxformer.hf.exports import WRITES, Need

ARCHITECTURES = {"ModernBertModel": "encoder", "ModernBertForSequenceClassification": "classifier",
                 "ModernBertForMaskedLM": "encoder"}
MODEL_TYPE = "modernbert"
MODEL_TYPES = dict.fromkeys(ARCHITECTURES, MODEL_TYPE)
DEFAULTS = dict(vocab_size=50368, hidden_size=768, intermediate_size=1152, num_hidden_layers=22,
                num_attention_heads=12, hidden_activation="gelu", max_position_embeddings=8192,
                initializer_cutoff_factor=2.0, norm_eps=1e-5, norm_bias=False, pad_token_id=50283,
                eos_token_id=50282, bos_token_id=50281, attention_bias=False, attention_dropout=0.0,
                layer_types=None, rope_parameters=None, rope_scaling=None, global_rope_theta=160000.0,
                local_rope_theta=10000.0, global_attn_every_n_layers=3, local_attention=128,
                embedding_dropout=0.0, mlp_bias=False, mlp_dropout=0.0, decoder_bias=True,
                classifier_pooling="cls", classifier_dropout=0.0, classifier_bias=False,
                classifier_activation="gelu", deterministic_flash_attn=False, sparse_prediction=False,
                sparse_pred_ignore_index=-100, tie_word_embeddings=True, reference_compile=None)
IGNORED = {"deterministic_flash_attn": "a flash-attention kernel choice", "reference_compile": "torch.compile only",
           "initializer_cutoff_factor": "initialisation only", "bos_token_id": "no generation (tokenizer metadata)",
           "eos_token_id": "no generation (tokenizer metadata)",
           "decoder_bias": "ModernBertForMaskedLM's head, which is not imported",
           "sparse_prediction": "ModernBertForMaskedLM's loss, which is not imported",
           "sparse_pred_ignore_index": "ModernBertForMaskedLM's loss, which is not imported",
           "tie_word_embeddings": "ties ModernBertForMaskedLM's decoder, which is not imported",
           "repad_logits_with_grad": "ModernBertForMaskedLM's flash-attention path only",
           "position_embedding_type": "not read by transformers' ModernBertConfig (RoPE is built in)"}
# HF activation -> jaxformer kind; export writes the first name of a kind (gelu_pytorch_tanh for
# the tanh GELU: HF's gelu_new computes the same formula with other rounding)
GATED = {"gelu": "geglu", "gelu_pytorch_tanh": "geglu_tanh", "gelu_new": "geglu_tanh", "gelu_fast": "geglu_tanh",
         "silu": "swiglu"}
POOLER_ACTS = {"gelu": "gelu", "gelu_pytorch_tanh": "gelu_tanh", "gelu_new": "gelu_tanh", "gelu_fast": "gelu_tanh",
               "relu": "relu", "silu": "silu", "tanh": "tanh"}
LAYER = "layers.{i}."
RULES = Renamer([
    ("embeddings.tok_embeddings.weight", "embed.embed_tokens.weight"),
    ("embeddings.norm.{leaf}", "embed.norm.{leaf}"),
    (LAYER + "attn_norm.{leaf}", "encoder.layers.{i}.attn_norm.{leaf}"),
    (LAYER + "attn.Wo.{leaf}", "encoder.layers.{i}.self_attn.o_proj.{leaf}"),
    (LAYER + "mlp_norm.{leaf}", "encoder.layers.{i}.ffn_norm.{leaf}"),
    (LAYER + "mlp.Wo.{leaf}", "encoder.layers.{i}.ffn.down_proj.{leaf}"),
    ("final_norm.{leaf}", "encoder.final_norm.{leaf}"),
])
HEAD = Renamer([("head.dense.{leaf}", "pooler.{leaf}"), ("head.norm.{leaf}", "pooler_norm.{leaf}"),
                ("classifier.{leaf}", "classifier.{leaf}")])


def _layer_types(o: Options, n: int) -> list[str]:
    every = o.require("global_attn_every_n_layers", lambda v: isinstance(v, int) and v > 0, "must be an int > 0")
    every = every if isinstance(every, int) and every > 0 else 3
    derived = ["sliding_attention" if i % every else "full_attention" for i in range(n)]
    types = o["layer_types"]
    if types is None:
        return derived
    kinds = ("full_attention", "sliding_attention")
    if not (isinstance(types, list) and len(types) == n and all(t in kinds for t in types)):
        o.problem("layer_types", f"must be {n} entries (num_hidden_layers) of {kinds}")
        return derived
    return types


def _rope_theta(o: Options, kind: str, legacy: str) -> float:
    """The RoPE base of one layer type: rope_parameters[kind]["rope_theta"], else the legacy
    key, else HF's default; any rope_type but "default" (or a rope_scaling) is a problem."""
    params, scaling = o["rope_parameters"], o["rope_scaling"]
    if scaling:
        o.problem("rope_scaling", "ModernBERT's RoPE scaling is not implemented (default RoPE only)")
    spec = {} if params is None else params.get(kind) if isinstance(params, dict) else None
    if spec is None or not isinstance(spec, dict):
        if params is not None:
            o.problem("rope_parameters", f"expected a mapping with a {kind!r} entry")
        spec = {}
    if spec.get("rope_type", "default") != "default" or set(spec) - {"rope_type", "rope_theta"}:
        o.problem("rope_parameters", f"{kind}: only the default RoPE (rope_type, rope_theta) is implemented")
    theta = spec.get("rope_theta", o[legacy])
    if not (isinstance(theta, (int, float)) and not isinstance(theta, bool) and theta > 0):
        o.problem("rope_parameters", f"{kind}: rope_theta={theta!r} must be a number > 0")
        theta = DEFAULTS[legacy]
    return float(theta)


def config_from_hf(raw: dict, arch: str, keys=()) -> tuple[str, TransformerConfig, list[str]]:
    o = Options(raw, DEFAULTS, family=f"modernbert {arch}", ignored=IGNORED)
    act = o.require("hidden_activation", GATED, f"jaxformer's gated FFNs take {sorted(GATED)}")
    n = o["num_hidden_layers"]
    types = _layer_types(o, n)
    local = "sliding_attention" in types
    window = o.require("local_attention", lambda v: isinstance(v, int) and v >= 0, "must be an int >= 0")
    global_theta = _rope_theta(o, "full_attention", "global_rope_theta")
    local_theta = _rope_theta(o, "sliding_attention", "local_rope_theta")
    attn_drop = float(o["attention_dropout"])
    if attn_drop:
        o.notes.append(f"attention_dropout={attn_drop}: HF also drops the attention output with it; "
                       "jaxformer drops only the attention weights (training only)")
    eps = float(o["norm_eps"])
    if "layer_norm_eps" in raw:  # sentence-transformers' spelling; transformers reads norm_eps only
        o.used.add("layer_norm_eps")
        if raw["layer_norm_eps"] != eps:
            o.notes.append(f"layer_norm_eps={raw['layer_norm_eps']!r} is not read by transformers; "
                           f"norm_eps={eps} is the eps, as in HF")
    vocab = o["vocab_size"]
    fields = dict(
        vocab_size=vocab, d_model=o["hidden_size"], num_heads=o["num_attention_heads"],
        d_ff=o["intermediate_size"], num_layers=n, ffn=GATED.get(act, "geglu"), norm="layernorm",
        norm_eps=eps, norm_bias=bool(o["norm_bias"]), norm_position="pre", final_norm=True,
        first_attn_norm=False, embed_norm=True, bias=bool(o["attention_bias"]), ffn_bias=bool(o["mlp_bias"]),
        dropout=0.0, attn_dropout=attn_drop, ffn_dropout=float(o["mlp_dropout"]),
        embed_dropout=float(o["embedding_dropout"]), position="rope", max_len=o["max_position_embeddings"],
        rope_base=global_theta, rope_local_base=local_theta if local else None, scale_embedding=False,
        sliding_window=window // 2 + 1 if local and isinstance(window, int) else None,
        layer_types=tuple(types) if local else None, **token_ids(o, vocab, need_bos_eos=False))
    for k in ("classifier_pooling", "classifier_dropout", "classifier_bias", "classifier_activation"):
        o.used.add(k)  # read below for the classifier; the encoder has no head
    if arch == "ModernBertForMaskedLM":
        o.notes.append("ModernBertForMaskedLM: the encoder is imported (as transformers' AutoModel loads it); "
                       "the masked-LM head.* and decoder.* are not")
    if ARCHITECTURES[arch] == "encoder":
        return "encoder", build_config(TransformerConfig, fields, o), o.notes
    pooling = o.require("classifier_pooling", ("cls", "mean"), "HF pools cls or mean")
    head_act = o.require("classifier_activation", POOLER_ACTS, f"jaxformer's pooler takes {sorted(POOLER_ACTS)}")
    head_drop = o.require("classifier_dropout", lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)
                          and 0 <= v <= 1, "must be in [0, 1]")
    fields.update(pooler=True, pooler_act=POOLER_ACTS.get(head_act, "gelu"), pooler_bias=bool(o["classifier_bias"]),
                  pooler_norm=True, pooling=pooling if pooling in ("cls", "mean") else "cls",
                  num_classes=o.num_labels(), dtype="float32",
                  classifier_dropout=float(head_drop) if isinstance(head_drop, (int, float)) else 0.0)
    return "classifier", build_config(ClassifierConfig, fields, o), o.notes


def _strip(key: str, arch: str) -> str | None:
    """The ModernBertModel-relative name of a key (`model.` removed)."""
    if arch == "ModernBertModel":
        return key[len("model."):] if key.startswith("model.") else key
    return key[len("model."):] if key.startswith("model.") else None


def tensor_fn(name: str, cfg, arch: str):
    d, f = cfg.d_model, cfg.feedforward.d_ff

    def fn(key: str, x: np.ndarray):
        if arch != "ModernBertModel" and not key.startswith("model."):
            if arch == "ModernBertForMaskedLM" and (key.startswith("head.") or key.startswith("decoder.")):
                return None  # the masked-LM head (a note says so)
            new = HEAD.to_torch(key) if name == "classifier" else None
            if new is None:
                raise MappingError(f"unmapped: {key} has no jaxformer {name} (ModernBERT) equivalent")
            return {new: x}
        k = _strip(key, arch)
        parts = k.split(".")
        if len(parts) == 5 and parts[0] == "layers" and parts[2:4] == ["attn", "Wqkv"]:
            p = f"encoder.layers.{parts[1]}.self_attn."  # [3D, D] / [3D]: q, k, v rows
            return {p + f"{n}_proj.{parts[4]}": x[j * d:(j + 1) * d] for j, n in enumerate("qkv")}
        if len(parts) == 5 and parts[0] == "layers" and parts[2:4] == ["mlp", "Wi"]:
            p = f"encoder.layers.{parts[1]}.ffn."  # [2F, D] / [2F]: the activated half, then the multiplier
            return {p + f"gate_proj.{parts[4]}": x[:f], p + f"up_proj.{parts[4]}": x[f:]}
        new = RULES.to_torch(k)
        if new is None:
            raise MappingError(f"unmapped: {key} has no jaxformer {name} (ModernBERT) equivalent")
        return {new: x}
    return fn


# ----------------------------------------------------------------------------- export
# Written: the sizes, the norms' bias, the dropouts, the biases, the local layers' window and
# RoPE; required: RoPE, Pre-LN with the embedding norm before layer 0, a gated MLP, full
# multi-head attention, no pooler on ModernBertModel
ENCODER = dict(
    vocab_size=WRITES, d_model=WRITES, num_heads=WRITES, d_ff=WRITES, num_layers=WRITES, max_len=WRITES,
    norm_eps=WRITES, norm_bias=WRITES, pad_id=WRITES, attn_dropout=WRITES, embed_dropout=WRITES, ffn_dropout=WRITES,
    sliding_window=WRITES, layer_types=WRITES, rope_base=WRITES, rope_local_base=WRITES, bias=WRITES,
    attn_qkv_bias=WRITES, ffn_bias=WRITES,
    attn_out_bias=Need(lambda c: c.resolved_out_bias == c.resolved_qkv_bias,
                       "attention.attn_out_bias={resolved_out_bias}: q/k/v and output biases differ "
                       "(ModernBERT's attention_bias sets both)"),
    position="rope", norm="layernorm", norm_position="pre", final_norm=True, first_attn_norm=False, embed_norm=True,
    scale_embedding=False, type_vocab_size=0, positions_from_padding=False, rope_scaling=None, qk_norm=False,
    attn_logit_softcap=None, query_pre_attn_scalar=None, moe=None, mla=None, attn_sinks=False, dropout=0.0,
    head_dim=None, pooler=False,
    ffn=Need(lambda c: c.feedforward.kind in set(GATED.values()),
             f"feedforward.kind={{feedforward.kind!r}} (ModernBERT's MLP is gated: {sorted(set(GATED.values()))})"),
    num_kv_heads=Need(lambda c: c.resolved_kv_heads == c.attention.num_heads,
                      "attention.num_kv_heads={attention.num_kv_heads} (ModernBERT has no grouped-query attention)"))
# The head: dense + activation + norm (export float32 models)
EXPORTS = {"encoder": ENCODER, "classifier": dict(
    ENCODER, num_classes=WRITES, classifier_dropout=WRITES, pooling=WRITES, pooler_bias=WRITES, pooler=True,
    pooler_norm=True, dtype="float32",
    pooler_act=Need(lambda c: c.pooler_act in POOLER_ACTS.values(),
                    "pooler_act={pooler_act!r} (ModernBERT's head is dense + activation + norm)"))}


def config_to_hf(name: str, cfg) -> dict:
    arch = "ModernBertModel" if name == "encoder" else "ModernBertForSequenceClassification"
    local = cfg.local_layers()
    act = next(k for k, v in GATED.items() if v == cfg.feedforward.kind)
    local_base = cfg.positions.rope_base if cfg.positions.rope_local_base is None else cfg.positions.rope_local_base
    out = {"architectures": [arch], "model_type": MODEL_TYPE, "vocab_size": cfg.vocab_size,
           "hidden_size": cfg.d_model, "intermediate_size": cfg.feedforward.d_ff, "num_hidden_layers": cfg.num_layers,
           "num_attention_heads": cfg.attention.num_heads, "hidden_activation": act,
           "max_position_embeddings": cfg.max_len, "norm_eps": cfg.norms.norm_eps, "norm_bias": cfg.norms.norm_bias,
           "pad_token_id": cfg.pad_id, "bos_token_id": None, "eos_token_id": None, "cls_token_id": None,
           "sep_token_id": None, "attention_bias": cfg.resolved_qkv_bias,
           "attention_dropout": cfg.attention.attn_dropout, "embedding_dropout": cfg.embed_dropout,
           "mlp_bias": cfg.resolved_ffn_bias, "mlp_dropout": cfg.feedforward.ffn_dropout,
           "layer_types": ["sliding_attention" if x else "full_attention" for x in local],
           "local_attention": 2 * (cfg.attention.sliding_window - 1) if any(local) else 128,
           "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": float(cfg.positions.rope_base)},
                               "sliding_attention": {"rope_type": "default", "rope_theta": float(local_base)}},
           "initializer_range": 0.02, "dtype": "float32"}
    if name == "classifier":
        out.update(classifier_pooling=cfg.pooling, classifier_bias=cfg.pooler_bias,
                   classifier_activation=next(k for k, v in POOLER_ACTS.items() if v == cfg.pooler_act),
                   classifier_dropout=cfg.dropout if cfg.classifier_dropout is None else cfg.classifier_dropout,
                   id2label={str(i): f"LABEL_{i}" for i in range(cfg.num_classes)},
                   label2id={f"LABEL_{i}": i for i in range(cfg.num_classes)})
    return out


def state_dict_to_hf(sd: dict[str, np.ndarray], name: str, cfg) -> dict[str, np.ndarray]:
    sd = dict(sd)
    prefix = "" if name == "encoder" else "model."

    def take(key: str) -> np.ndarray:
        if key not in sd:
            raise ConversionError([f"missing: {key} (needed by ModernBERT)"])
        return sd.pop(key)

    out = {}
    leaves = ("weight", "bias") if cfg.resolved_qkv_bias else ("weight",)
    for i in range(cfg.num_layers):
        p = f"encoder.layers.{i}."
        for leaf in leaves:
            out[f"{prefix}layers.{i}.attn.Wqkv.{leaf}"] = np.concatenate(
                [take(p + f"self_attn.{n}_proj.{leaf}") for n in "qkv"])
        for leaf in ("weight", "bias") if cfg.resolved_ffn_bias else ("weight",):
            out[f"{prefix}layers.{i}.mlp.Wi.{leaf}"] = np.concatenate(
                [take(p + f"ffn.gate_proj.{leaf}"), take(p + f"ffn.up_proj.{leaf}")])

    def rename(key: str) -> str | None:
        if name == "classifier" and HEAD.to_hf(key) is not None:
            return HEAD.to_hf(key)
        new = RULES.to_hf(key)
        return None if new is None else prefix + new
    out.update(rename_all(sd, rename, "ModernBERT"))
    return out


FAMILY = Family(name="modernbert", architectures=ARCHITECTURES, model_types=MODEL_TYPES, config_from_hf=config_from_hf,
                tensor_fn=tensor_fn, config_to_hf=config_to_hf, state_dict_to_hf=state_dict_to_hf,
                hf_defaults=dict.fromkeys(ARCHITECTURES, DEFAULTS), exports=EXPORTS,
                claims=lambda c: c.positions.kind == "rope")  # a RoPE encoder
