"""Autoregressive generation with a KV cache for `lm` and `seq2seq`: greedy, sampling
(temperature, top-k, top-p) and beam search. Twin: torch_ref/generation.py.

The model is split once (nnx.split) into a static graphdef and its state; everything after
that is a pure function of arrays, jitted whole: prefill, then a lax.while_loop over a cache
preallocated at a fixed size, so one compilation serves every step and no token goes back to
the host until the end. `TRACES` counts how often each jitted function was traced.

How the model is lowered for decoding (the [out, in] kernel copies and their keeping, the
one-token attention form, the XLA:CPU compiler options) is jaxformer/lowering.py's business:
the generate functions take one `layout` argument (a lowering.DecodeLayout, or the name of
its kernel layout; "auto" = transposed on the CPU backend) and trace their programs inside
lowering.decoding. Measured figures: bench/README.md, "Decode layout on CPU".

GenerationConfig.weights_dtype (bf16 | int8) decodes with reduced-precision copies of the matmul
weights (jaxformer/layers/kernels/quant.py, docs/numerics.md §24), made and kept like the layout's
copies; `decode_model` gives a model that computes what that program computes.

Batched LM prompts of different lengths are left-padded (`pad_prompts`); positions come from
the attention mask, so a left-padded row computes what the unpadded row would.

GenerationConfig.prefill_chunk prefills a long prompt through the cache in fixed-size chunks
(`lm_prefill`, one compiled chunk program under lax.scan): prefill memory O(chunk x L) instead
of O(P x L), the same ids (docs/numerics.md §31).
"""
from __future__ import annotations

import collections
import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxformer import lowering
from jaxformer.config import inputs
from jaxformer.config.models import (  # noqa: F401 (re-exported)
    GenerationConfig,
    check_lengths,
    check_longrope_switch,
    check_prefill_chunk,
    eos_ids,
    pad_prompts,
)
from jaxformer.layers import linear
from jaxformer.layers.kernels import quant
from jaxformer.lowering import DecodeLayout, release_decode_weights  # noqa: F401 (re-exported)
from jaxformer.models.common import check_tokens

TRACES: collections.Counter = collections.Counter()  # jitted function name -> times traced


# ----------------------------------------------------------------------------- token choice
def filter_logits(logits: jax.Array, *, temperature: float = 1.0, top_k: int = 0,
                  top_p: float = 1.0) -> jax.Array:
    """logits [B, V] -> [B, V] float32 divided by temperature, -inf outside the top-k tokens
    and outside the top-p nucleus (the smallest set of most likely tokens whose probability
    reaches top_p). Ties at a threshold are kept."""
    x = logits.astype(jnp.float32) / temperature
    if top_k > 0:
        kth = jax.lax.top_k(x, min(top_k, x.shape[-1]))[0][:, -1:]  # [B, 1]
        x = jnp.where(x < kth, -jnp.inf, x)
    if top_p < 1.0:
        sorted_x = jnp.flip(jnp.sort(x, axis=-1), axis=-1)  # [B, V] descending
        probs = jax.nn.softmax(sorted_x, axis=-1)
        before = jnp.cumsum(probs, axis=-1) - probs  # mass of the more likely tokens
        n_keep = jnp.sum(before < top_p, axis=-1, keepdims=True)  # [B, 1], >= 1
        x = jnp.where(x < jnp.take_along_axis(sorted_x, n_keep - 1, axis=-1), -jnp.inf, x)
    return x


def select_tokens(logits: jax.Array, key: jax.Array, gen: GenerationConfig) -> jax.Array:
    """logits [B, V] -> token ids [B] int32: argmax (greedy) or a sample of filter_logits."""
    if gen.strategy == "greedy":
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)
    x = filter_logits(logits, temperature=gen.temperature, top_k=gen.top_k, top_p=gen.top_p)
    return jax.random.categorical(key, x, axis=-1).astype(jnp.int32)


# ----------------------------------------------------------------------------- loops (inside jit)
def is_eos(tok: jax.Array, eos_ids: tuple[int, ...]) -> jax.Array:
    """tok [B] -> bool [B]: the token is one of eos_ids (HF's eos_token_id list)."""
    out = jnp.zeros(tok.shape, jnp.bool_)
    for e in eos_ids:
        out = out | (tok == e)
    return out


def decode_loop(step, carry, first_logits, key, gen: GenerationConfig, eos_ids: tuple[int, ...], pad_id: int):
    """Greedy/sampling: step(tok [B], i, carry) -> (logits [B, V], carry) feeds generated token i.
    Runs until max_new_tokens or every row has produced EOS. -> tokens [B, N] (pad after EOS)."""
    b, n = first_logits.shape[0], gen.max_new_tokens
    key, sub = jax.random.split(key)
    tok = select_tokens(first_logits, sub, gen)  # [B]
    out = jnp.full((b, n), pad_id, jnp.int32).at[:, 0].set(tok)  # [B, N]
    done = is_eos(tok, eos_ids) & gen.stop_at_eos

    def cond(s):
        return (s[0] < n) & ~jnp.all(s[3])

    def body(s):
        i, tok, out, done, carry, key = s
        logits, carry = step(tok, i - 1, carry)
        key, sub = jax.random.split(key)
        nxt = jnp.where(done, pad_id, select_tokens(logits, sub, gen))  # [B]
        out = jax.lax.dynamic_update_slice(out, nxt[:, None], (jnp.int32(0), i))
        return i + 1, nxt, out, done | (is_eos(nxt, eos_ids) & gen.stop_at_eos), carry, key

    return jax.lax.while_loop(cond, body, (jnp.int32(1), tok, out, done, carry, key))[2]


def beam_loop(step, reorder, carry, first_logits, gen: GenerationConfig, eos_ids: tuple[int, ...], pad_id: int):
    """Beam search over B x W rows (row b * W + w is beam w of item b), as transformers 5.x's
    _beam_search with its default early_stopping=False (docs/numerics.md §22). step as in
    decode_loop; reorder(carry, rows [B*W]) gathers the per-row state of the surviving beams.
    Each step takes the K = max(2, 1 + #eos) * W best continuations; of those, an EOS among
    the first W finishes (score = sum log p / length ** length_penalty, length counting the
    EOS; at max_new_tokens the first W all finish) and the W best others stay alive. The W
    best finished are kept. An item stops taking finished hypotheses once its best alive
    beam, scored at its current length, cannot beat its worst finished one (HF's heuristic).
    -> (tokens [B, N], scores [B]) of the best hypothesis."""
    bw, v = first_logits.shape
    w, n = gen.num_beams, gen.max_new_tokens
    b, k = bw // w, min(max(2, 1 + len(eos_ids)) * w, w * v)  # K, at most all W * V
    neg = jnp.float32(-jnp.inf)
    alive_lp = jnp.tile(jnp.concatenate([jnp.zeros((1,), jnp.float32), jnp.full((w - 1,), neg)]), (b, 1))  # [B, W]
    alive_seq = jnp.full((b, w, n), pad_id, jnp.int32)  # [B, W, N]
    fin_seq, fin_score = alive_seq, jnp.full((b, w), neg)  # [B, W, N], [B, W]
    is_open = jnp.ones((b,), jnp.bool_)  # the item may still take finished hypotheses
    first_w = jnp.arange(k) < w  # [K]: only these candidates may finish

    def body(i, s):
        logits, carry, alive_lp, alive_seq, fin_seq, fin_score, is_open = s
        logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1).reshape(b, w, v)  # [B, W, V]
        top_lp, top_idx = jax.lax.top_k((alive_lp[:, :, None] + logp).reshape(b, w * v), k)  # [B, K]
        beam, tok = top_idx // v, (top_idx % v).astype(jnp.int32)  # [B, K]
        seqs = jnp.take_along_axis(alive_seq, beam[:, :, None], axis=1).at[:, :, i].set(tok)  # [B, K, N]
        is_eos_ = is_eos(tok, eos_ids)
        norm = (i + 1).astype(jnp.float32) ** gen.length_penalty
        finishes = (is_eos_ | (i == n - 1)) & first_w[None, :] & is_open[:, None]  # [B, K]
        fin_new = jnp.where(finishes, top_lp / norm, neg)  # [B, K]
        fin_score, sel = jax.lax.top_k(jnp.concatenate([fin_score, fin_new], axis=1), w)  # [B, W]
        fin_seq = jnp.take_along_axis(jnp.concatenate([fin_seq, seqs], axis=1), sel[:, :, None], axis=1)
        alive_lp, sel = jax.lax.top_k(jnp.where(is_eos_, neg, top_lp), w)  # [B, W]
        alive_seq = jnp.take_along_axis(seqs, sel[:, :, None], axis=1)  # [B, W, N]
        is_open = is_open & (alive_lp[:, 0] / norm > jnp.min(fin_score, axis=1))  # HF's heuristic
        parent = jnp.take_along_axis(beam, sel, axis=1)  # [B, W]
        rows = (jnp.arange(b, dtype=parent.dtype)[:, None] * w + parent).reshape(bw)  # [B*W]
        carry = reorder(carry, rows)
        last = jnp.take_along_axis(tok, sel, axis=1).reshape(bw)  # [B*W]
        logits, carry = step(last, i, carry)
        return logits, carry, alive_lp, alive_seq, fin_seq, fin_score, is_open

    s = jax.lax.fori_loop(0, n, body, (first_logits, carry, alive_lp, alive_seq, fin_seq, fin_score, is_open))
    return s[4][:, 0], s[5][:, 0]


def _reorder_self(cache, rows):
    """Gather the self-attention caches (their entries, KVCache.take_rows) of `rows`; the
    cross-attention keys/values are the same for every beam of an item and stay. A scanned
    stack's cache is one dict of [num_layers, B, ...] leaves: rows index axis 1."""
    if isinstance(cache, dict):
        return {**cache, "self": cache["self"].take_rows(rows, axis=1)}
    return [{**c, "self": c["self"].take_rows(rows)} for c in cache]


# ----------------------------------------------------------------------------- LM
def lm_forward(graphdef, state, ids, slot_mask, cache, cache_index, elementwise=None):
    """Pure function: one cached LM call. -> (logits [B, T, V], new cache). elementwise: the
    one-token attention form (lowering's elementwise_attention); None = as generate runs it on
    this backend."""
    TRACES["lm_forward"] += 1
    with lowering.decoding(False, elementwise):
        out = nnx.merge(graphdef, state)(ids, slot_mask, cache=cache, cache_index=cache_index)
        return out.logits, out.cache


def lm_step(graphdef, state, ids, slot_mask, cache, cache_index, elementwise=None):
    """lm_forward jitted and compiled as generate is, cache donated: the caller's loop (tests,
    debugging) compiles prefill once and the one-token step once, whatever the number of steps.
    elementwise None is resolved here as lowering.decoding resolves it, so a caller passing the
    backend's form explicitly shares the compilation."""
    elementwise = lowering.on_cpu() if elementwise is None else elementwise
    return lowering.decode_jit(lm_forward, static_argnums=(0,), static_argnames=_STEP_STATIC, donate_argnums=(4,))(
        graphdef, state, ids, slot_mask, cache, cache_index, elementwise=elementwise)


# ----------------------------------------------------------------------------- decode layout
def decode_kernels(model: nnx.Module, layout: DecodeLayout | str = "auto", weights_dtype: str = "fp32"):
    """The decode copies of the model's matmul weights that generate decodes with, or None to
    decode with the stored kernels. fp32: [out, in] copies of the Linear kernels under the
    transposed layout, else None. bf16 / int8 (weights_dtype): {"linear": [out, in]
    quant.QuantizedWeight per Linear, "tied": the tied output table's, or None} under every
    layout (the layout then picks the product's form). Kept or made per call as
    lowering.kernel_copies says."""
    layout = DecodeLayout.of(layout)
    if weights_dtype == "fp32" and not layout.transposed():
        return None
    source = [m.kernel.get_value() for m in linear.linear_modules(model)]
    if weights_dtype == "fp32":
        return lowering.kernel_copies(model, source, keep=layout.keep_weights)
    table = _tied_table(model)
    if table is not None:
        source.append(table.embedding.get_value())

    def make(kernels):
        return _reduce_jit(kernels[:len(kernels) - (table is not None)], None if table is None else kernels[-1],
                           weights_dtype=weights_dtype)

    return lowering.kernel_copies(model, source, keep=layout.keep_weights, make=make, tag=weights_dtype)


@functools.partial(jax.jit, static_argnames=("weights_dtype",))
def _reduce_jit(kernels, table, *, weights_dtype):
    """[in, out] kernels (and a [V, D] table, already [out, in]) -> their reduced copies."""
    return {"linear": [quant.reduce_weight(jnp.swapaxes(k, -1, -2), weights_dtype) for k in kernels],
            "tied": None if table is None else quant.reduce_weight(table, weights_dtype)}


def _tied_table(model):
    """The Embedding whose table is also the output projection (lm_head None), else None."""
    if getattr(model, "lm_head", True) is not None:
        return None
    embed = model.target_embedding() if hasattr(model, "target_embedding") else model.embed
    return embed.embed_tokens


def _merge_for_decoding(graphdef, state, kernels, copy: bool = False):
    """The model inside a generate jit, its Linear kernels replaced by the [out, in] copies
    when given (the caller traces under lowering.decoding(True)), or by the reduced-precision
    copies and tied table of decode_kernels. copy: new Variables (outside jit, merge would
    hand back the model's own and set_value would change it)."""
    model = nnx.merge(graphdef, state, copy=copy)
    if isinstance(kernels, dict):
        for module, kernel in zip(linear.linear_modules(model), kernels["linear"], strict=True):
            module.kernel.set_value(kernel)
        if kernels["tied"] is not None:
            _tied_table(model).embedding.set_value(kernels["tied"])
    elif kernels is not None:
        for module, kernel in zip(linear.linear_modules(model), kernels, strict=True):
            module.kernel.set_value(kernel)
    return model


def decode_model(model: nnx.Module, weights_dtype: str = "fp32") -> nnx.Module:
    """A copy of `model` whose matmul weights are the reduced-precision decode copies that
    generate uses for weights_dtype (the model itself for fp32): it computes what generate's
    program computes, for tests and step-by-step decoding (lm_step, seq2seq_step)."""
    if weights_dtype == "fp32":
        return model
    graphdef, state = nnx.split(model)
    return _merge_for_decoding(graphdef, state, decode_kernels(model, DecodeLayout("stored", False), weights_dtype),
                               copy=True)


_STEP_STATIC = ("elementwise",)
_GENERATE_STATIC = ("graphdef", "gen", "cache_len", "eos_ids", "pad_id", "transposed")


def _lm_generate(graphdef, state, kernels, ids, mask, key, *, gen, cache_len, eos_ids, pad_id, transposed):
    TRACES["lm_generate"] += 1
    with lowering.decoding(transposed):
        return _lm_generate_body(_merge_for_decoding(graphdef, state, kernels), ids, mask, key,
                                 gen, cache_len, eos_ids, pad_id)


def _lm_generate_body(model, ids, mask, key, gen, cache_len, eos_ids, pad_id):
    b, p = ids.shape
    if gen.strategy == "beam":  # every beam starts from the prompt
        ids, mask = jnp.repeat(ids, gen.num_beams, axis=0), jnp.repeat(mask, gen.num_beams, axis=0)
        b = b * gen.num_beams
    slot_mask = jnp.zeros((b, cache_len), jnp.int32).at[:, :p].set(mask.astype(jnp.int32))  # [B, L]
    last, cache = lm_prefill(model, ids, slot_mask, model.init_cache(b, cache_len), gen.prefill_chunk)

    def step(tok, i, carry):
        cache, slot_mask = carry
        slot = p + i  # generated token i sits in slot P + i
        slot_mask = jax.lax.dynamic_update_slice(slot_mask, jnp.ones((b, 1), jnp.int32), (jnp.int32(0), slot))
        out = model(tok[:, None], slot_mask, cache=cache, cache_index=slot)
        logits, cache = out.logits, out.cache
        return logits[:, 0], (cache, slot_mask)

    if gen.strategy == "beam":
        reorder = lambda carry, rows: (_reorder_self(carry[0], rows), carry[1][rows])
        return beam_loop(step, reorder, (cache, slot_mask), last, gen, eos_ids, pad_id)
    return decode_loop(step, (cache, slot_mask), last, key, gen, eos_ids, pad_id)


def lm_prefill(model, ids, slot_mask, cache, chunk: int | None = None):
    """Write the prompt ids [B, P] into the empty cache (slots 0..P-1; slot_mask [B, L]) ->
    (logits [B, V] of the last prompt token, cache). chunk None (or >= P): one model call.
    Else chunked prefill (docs/numerics.md §31): the first P mod chunk tokens in one call,
    then the rest in calls of `chunk` tokens under one lax.scan (one compiled chunk program),
    each attending over the cache its predecessors wrote. Every token keeps its slot and sees
    the keys the one-pass prefill shows it, so attention holds [B, H, chunk, L] scores (ring
    layers [chunk, W + chunk]) and the logits [B, chunk, V], instead of P rows of each."""
    b, p = ids.shape
    if chunk is None or chunk >= p:
        out = model(ids, slot_mask, cache=cache, cache_index=0)
        logits, cache = out.logits, out.cache
        return logits[:, -1], cache
    head = p % chunk  # the odd part goes first, so the scanned chunks all have one shape
    if head:
        cache = model(ids[:, :head], slot_mask, cache=cache, cache_index=0).cache
    n = (p - head) // chunk  # >= 1
    chunks = jnp.swapaxes(ids[:, head:].reshape(b, n, chunk), 0, 1)  # [n, B, C]

    def body(carry, xs):
        cache, _ = carry
        i, x = xs
        out = model(x, slot_mask, cache=cache, cache_index=head + i * chunk)
        logits, cache = out.logits, out.cache
        return (cache, logits[:, -1]), None

    (cache, last), _ = jax.lax.scan(body, (cache, jnp.zeros((b, model.cfg.vocab_size), jnp.float32)),
                                    (jnp.arange(n, dtype=jnp.int32), chunks))
    return last, cache


def lm_generate(model, ids, attention_mask=None, gen: GenerationConfig = GenerationConfig(),  # noqa: B008 (a frozen dataclass)
                layout: DecodeLayout | str = "auto"):
    """Generate after a batch of (left-padded) prompts. ids [B, P] int, attention_mask [B, P]
    (1 = token; None = all) -> tokens [B, N] int32 numpy (pad_id after EOS); with beam search
    (tokens, scores [B]). layout: the kernel layout to decode with (lowering.DecodeLayout)."""
    layout = DecodeLayout.of(layout)
    cfg = model.cfg
    ids = inputs.as_host_array(ids, "prompt token id")
    check_tokens(ids, cfg.vocab_size, cfg.max_len, "prompt token id")
    mask = np.ones_like(ids, np.int32) if attention_mask is None else inputs.check_generation_mask(
        attention_mask, ids.shape)
    inputs.check_left_padded(mask)
    inputs.check_eos_in_vocab(eos_ids(gen.eos_id), cfg.vocab_size)
    check_prefill_chunk(cfg, gen)
    check_longrope_switch(cfg, ids.shape[1], gen)
    return _run(_lm_generate, model, ids, mask, gen, check_lengths(ids.shape[1], gen, cfg.max_len), layout)



# ----------------------------------------------------------------------------- seq2seq
def seq2seq_decode_forward(graphdef, state, tgt_ids, memory_mask, cache, cache_index, elementwise=None):
    """Pure function: one cached decoder call. -> (logits [B, T, V], new cache). elementwise:
    as in lm_forward."""
    TRACES["seq2seq_decode_forward"] += 1
    with lowering.decoding(False, elementwise):
        out = nnx.merge(graphdef, state).decode(tgt_ids, None, memory_mask, cache=cache, cache_index=cache_index)
        return out.logits, out.cache


def seq2seq_step(graphdef, state, tgt_ids, memory_mask, cache, cache_index, elementwise=None):
    """seq2seq_decode_forward jitted as lm_step is (elementwise None resolved as there)."""
    elementwise = lowering.on_cpu() if elementwise is None else elementwise
    return lowering.decode_jit(seq2seq_decode_forward, static_argnums=(0,), static_argnames=_STEP_STATIC,
                               donate_argnums=(4,))(
        graphdef, state, tgt_ids, memory_mask, cache, cache_index, elementwise=elementwise)


def _seq2seq_generate(graphdef, state, kernels, src_ids, src_mask, key, *, gen, cache_len, eos_ids, pad_id,
                      transposed):
    TRACES["seq2seq_generate"] += 1
    with lowering.decoding(transposed):
        return _seq2seq_generate_body(_merge_for_decoding(graphdef, state, kernels), src_ids,
                                      src_mask, key, gen, cache_len, eos_ids, pad_id)


def _seq2seq_generate_body(model, src_ids, src_mask, key, gen, cache_len, eos_ids, pad_id):
    memory, memory_mask = model.encode(src_ids, src_mask)  # [B, S, D], [B, 1, 1, S]
    if gen.strategy == "beam":
        memory = jnp.repeat(memory, gen.num_beams, axis=0)
        memory_mask = jnp.repeat(memory_mask, gen.num_beams, axis=0)
    b = memory.shape[0]
    bos = jnp.full((b, 1), model.cfg.bos_id, jnp.int32)
    out = model.decode(bos, None, memory_mask, cache=model.init_cache(memory, cache_len), cache_index=0)
    logits, cache = out.logits, out.cache

    def step(tok, i, cache):
        out = model.decode(tok[:, None], None, memory_mask, cache=cache, cache_index=i + 1)
        return out.logits[:, 0], out.cache

    if gen.strategy == "beam":
        return beam_loop(step, _reorder_self, cache, logits[:, -1], gen, eos_ids, pad_id)
    return decode_loop(step, cache, logits[:, -1], key, gen, eos_ids, pad_id)


def seq2seq_generate(model, src_ids, src_mask=None, gen: GenerationConfig = GenerationConfig(),  # noqa: B008 (a frozen dataclass)
                     layout: DecodeLayout | str = "auto"):
    """Translate a batch: src_ids [B, S] int (right-padded with pad_id), src_mask [B, S]
    (None = src_ids != pad_id) -> tokens [B, N] int32 numpy after BOS (pad_id after EOS);
    with beam search (tokens, scores [B]). layout: as in lm_generate."""
    layout = DecodeLayout.of(layout)
    cfg = model.cfg
    src_ids = inputs.as_host_array(src_ids, "source token id")
    check_tokens(src_ids, cfg.vocab_size, cfg.max_len, "source token id")
    mask = (src_ids != cfg.pad_id) if src_mask is None else inputs.check_generation_mask(
        src_mask, src_ids.shape, "src_mask").astype(bool)
    if not mask.any(axis=1).all():
        raise ValueError(f"every source needs at least one token (row {int(np.argmin(mask.any(axis=1)))} "
                         f"is all padding)")
    inputs.check_eos_in_vocab(eos_ids(gen.eos_id), cfg.resolved_tgt_vocab)
    if gen.prefill_chunk is not None:
        raise ValueError("prefill_chunk applies to LM prompts; a seq2seq model's encoder reads the source "
                         "in one pass and its decoder starts from BOS (nothing to prefill)")
    return _run(_seq2seq_generate, model, src_ids, mask, gen, check_lengths(0, gen, cfg.max_len, start=1), layout)


def _run(program, model, ids, mask, gen: GenerationConfig, cache_len: int, layout):
    """Run a compiled generate program (_lm_generate or _seq2seq_generate) on the model's
    weights, in the decode layout, -> numpy outputs."""
    cfg = model.cfg
    model.eval()
    graphdef, state = nnx.split(model)
    out = lowering.decode_jit(program, static_argnames=_GENERATE_STATIC)(
        graphdef, state, decode_kernels(model, layout, gen.weights_dtype), jnp.asarray(ids, jnp.int32),
        jnp.asarray(mask), jax.random.key(gen.seed), gen=_static(gen), cache_len=cache_len, eos_ids=_eos(gen, cfg),
        pad_id=cfg.pad_id, transposed=layout.transposed())
    return jax.tree.map(np.asarray, out)


def _static(gen: GenerationConfig) -> GenerationConfig:
    """The part of gen the traced program depends on (the seed is a traced key), so every seed
    shares one compilation."""
    return dataclasses.replace(gen, seed=0)


def _eos(gen: GenerationConfig, cfg) -> tuple[int, ...]:
    """The ids generation stops at: gen.eos_id, else the model's (a tuple; () = none, as with
    gen.stop_at_eos False: every sequence, every beam hypothesis included, runs to the end, as
    HF generate with eos_token_id=None)."""
    if not gen.stop_at_eos:
        return ()
    return eos_ids(cfg.eos_id if gen.eos_id is None else gen.eos_id)


def generate(model, *args, gen: GenerationConfig = GenerationConfig(), layout: DecodeLayout | str = "auto", **kw):  # noqa: B008 (a frozen dataclass)
    """lm_generate or seq2seq_generate, by the model's type."""
    return (seq2seq_generate if hasattr(model, "encode") else lm_generate)(model, *args, gen=gen, layout=layout, **kw)


# ----------------------------------------------------------------------------- any causal LM
def module_generate(model, ids, gen: GenerationConfig = GenerationConfig(), eos: tuple[int, ...] = (),  # noqa: B008 (a frozen dataclass)
                    pad_id: int = 0):
    """Greedy or sampled decoding without a KV cache, for any causal LM whose call is
    model(ids [B, T]) -> logits [B, T, V] (or an output holding them), such as a model.module:
    every step runs the model on the whole [B, P + N] buffer (the positions not yet written are
    pad_id, which a causal model's earlier positions never see), so one program serves every
    step. ids [B, P]: prompts of one length (the call takes no mask). -> tokens [B, N] numpy."""
    from jaxformer.config.module import logits_of
    ids = inputs.as_host_array(ids, "prompt token id")
    if gen.strategy == "beam":
        raise ValueError("beam search needs a KV-cache model (an lm); a model.module decodes greedy or sampled")
    b, p = ids.shape
    graphdef, state = nnx.split(model)

    def run(state, ids, key):
        m = nnx.merge(graphdef, state)
        buf = jnp.full((b, p + gen.max_new_tokens), pad_id, jnp.int32).at[:, :p].set(ids)

        def logits_at(buf, i):
            out = logits_of(m(buf))  # [B, P + N, V]
            return jax.lax.dynamic_index_in_dim(out, i, axis=1, keepdims=False)

        def step(tok, i, buf):
            buf = jax.lax.dynamic_update_slice(buf, tok[:, None], (jnp.int32(0), p + i))
            return logits_at(buf, p + i), buf
        return decode_loop(step, buf, logits_at(buf, p - 1), key, gen, eos, pad_id)
    return np.asarray(jax.jit(run)(state, jnp.asarray(ids, jnp.int32), jax.random.key(gen.seed)))


# ----------------------------------------------------------------------------- memory, predicted
def request_bytes(name: str, cfg, batch: int, prompt_len: int, gen: GenerationConfig) -> dict[str, int]:
    """The arrays a generate call of `batch` prompts of up to `prompt_len` tokens allocates
    beyond the weights, from shapes alone (nothing is allocated): the KV cache (batch x beams
    rows of the cache length, ring layers their window; jax.eval_shape of the model's own
    init_cache on an abstract model, so every cache form is counted as built), the prefill's
    float32 logits [B', P or prefill_chunk, V], and, for beam search, the beams' token buffers.
    A lower bound (the activations of one layer come on top), as training's state check is:
    a request it refuses cannot fit. -> {part: bytes}."""
    from jaxformer.models import abstract_model
    rows = batch * (gen.num_beams if gen.strategy == "beam" else 1)
    start = 1 if name == "seq2seq" else 0
    cache_len = check_lengths(0 if name == "seq2seq" else prompt_len, gen, cfg.max_len, start)
    graphdef, state = nnx.split(abstract_model(name, cfg))  # the state's leaves: ShapeDtypeStructs
    if name == "seq2seq":  # the cross-attention keys/values are projected from the memory
        memory = jax.ShapeDtypeStruct((rows, prompt_len, cfg.d_model), jnp.float32)
        cache = jax.eval_shape(lambda st, m: nnx.merge(graphdef, st).init_cache(m, cache_len), state, memory)
        chunk, vocab = 1, getattr(cfg, "tgt_vocab_size", None) or cfg.vocab_size
    else:
        cache = jax.eval_shape(lambda st: nnx.merge(graphdef, st).init_cache(rows, cache_len), state)
        chunk, vocab = min(prompt_len, gen.prefill_chunk or prompt_len), cfg.vocab_size
    leaves = [x for x in jax.tree.leaves(cache) if hasattr(x, "shape")]
    return {"KV cache": sum(int(np.prod(x.shape)) * x.dtype.itemsize for x in leaves),
            "prefill logits": rows * max(chunk, 1) * vocab * 4,
            "tokens": rows * (cache_len + gen.max_new_tokens) * 4 * (2 if gen.strategy == "beam" else 1)}

