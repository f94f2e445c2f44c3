"""Autoregressive generation with a KV cache for `lm` and `seq2seq`: greedy, sampling
(temperature, top-k, top-p) and beam search. Twin: jaxformer/generation.py.

Same algorithm step for step as the JAX twin (prefill, then one token per step into a cache
preallocated at a fixed size), as a Python loop under torch.no_grad. Greedy and beam search
give the same token ids in both frameworks from the same weights; sampling cannot (the RNG
streams differ, docs/numerics.md §9), but filter_logits is deterministic and matches.
"""
from __future__ import annotations

import copy

import numpy as np
import torch
from torch import nn

from jaxformer.config import inputs
from jaxformer.config.models import (  # noqa: F401 (re-exported)
    GenerationConfig,
    check_lengths,
    check_longrope_switch,
    check_prefill_chunk,
    eos_ids,
    pad_prompts,
)
from torch_ref.layers.kernels import quant
from torch_ref.models.common import check_tokens


# ----------------------------------------------------------------------------- token choice
def filter_logits(logits: torch.Tensor, *, temperature: float = 1.0, top_k: int = 0,
                  top_p: float = 1.0) -> torch.Tensor:
    """logits [B, V] -> [B, V] float32 divided by temperature, -inf outside the top-k tokens
    and outside the top-p nucleus (the smallest set of most likely tokens whose probability
    reaches top_p). Ties at a threshold are kept."""
    x = logits.float() / temperature
    if top_k > 0:
        kth = torch.topk(x, min(top_k, x.shape[-1]), dim=-1).values[:, -1:]  # [B, 1]
        x = x.masked_fill(x < kth, float("-inf"))
    if top_p < 1.0:
        sorted_x = torch.sort(x, dim=-1, descending=True).values  # [B, V] descending
        probs = torch.softmax(sorted_x, dim=-1)
        before = torch.cumsum(probs, dim=-1) - probs  # mass of the more likely tokens
        n_keep = (before < top_p).sum(dim=-1, keepdim=True)  # [B, 1], >= 1
        x = x.masked_fill(x < torch.gather(sorted_x, -1, n_keep - 1), float("-inf"))
    return x


def select_tokens(logits: torch.Tensor, generator: torch.Generator, gen: GenerationConfig) -> torch.Tensor:
    """logits [B, V] -> token ids [B]: argmax (greedy) or a sample of filter_logits."""
    if gen.strategy == "greedy":
        return torch.argmax(logits, dim=-1)
    x = filter_logits(logits, temperature=gen.temperature, top_k=gen.top_k, top_p=gen.top_p)
    return torch.multinomial(torch.softmax(x, dim=-1), 1, generator=generator)[:, 0]


# ----------------------------------------------------------------------------- loops
def is_eos(tok: torch.Tensor, eos_ids: tuple[int, ...]) -> torch.Tensor:
    """tok [B] -> bool [B]: the token is one of eos_ids (HF's eos_token_id list)."""
    out = torch.zeros(tok.shape, dtype=torch.bool, device=tok.device)
    for e in eos_ids:
        out = out | (tok == e)
    return out


def decode_loop(step, carry, first_logits, generator, gen: GenerationConfig, eos_ids: tuple[int, ...], pad_id: int):
    """Greedy/sampling: step(tok [B], i, carry) -> (logits [B, V], carry) feeds generated token i.
    Runs until max_new_tokens or every row has produced EOS. -> tokens [B, N] (pad after EOS)."""
    b, n = first_logits.shape[0], gen.max_new_tokens
    tok = select_tokens(first_logits, generator, gen)  # [B]
    out = torch.full((b, n), pad_id, dtype=torch.long)
    out[:, 0] = tok  # [B, N]
    done = is_eos(tok, eos_ids) & gen.stop_at_eos
    i = 1
    while i < n and not bool(done.all()):
        logits, carry = step(tok, i - 1, carry)
        nxt = torch.where(done, pad_id, select_tokens(logits, generator, gen))  # [B]
        out[:, i] = nxt
        tok, done, i = nxt, done | (is_eos(nxt, eos_ids) & gen.stop_at_eos), i + 1
    return out


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
    neg = float("-inf")
    alive_lp = torch.cat([torch.zeros(1), torch.full((w - 1,), neg)]).repeat(b, 1)  # [B, W]
    alive_seq = torch.full((b, w, n), pad_id, dtype=torch.long)  # [B, W, N]
    fin_seq, fin_score = alive_seq, torch.full((b, w), neg)  # [B, W, N], [B, W]
    is_open = torch.ones(b, dtype=torch.bool)  # the item may still take finished hypotheses
    first_w = torch.arange(k) < w  # [K]: only these candidates may finish
    logits = first_logits
    for i in range(n):
        logp = torch.log_softmax(logits.float(), dim=-1).reshape(b, w, v)  # [B, W, V]
        top_lp, top_idx = torch.topk((alive_lp[:, :, None] + logp).reshape(b, w * v), k, dim=1)  # [B, K]
        beam, tok = top_idx // v, top_idx % v  # [B, K]
        seqs = torch.gather(alive_seq, 1, beam[:, :, None].expand(b, k, n)).clone()  # [B, K, N]
        seqs[:, :, i] = tok
        is_eos_ = is_eos(tok, eos_ids)
        norm = float(i + 1) ** gen.length_penalty
        finishes = (is_eos_ | (i == n - 1)) & first_w[None, :] & is_open[:, None]  # [B, K]
        fin_new = torch.where(finishes, top_lp / norm, neg)  # [B, K]
        fin_score, sel = torch.topk(torch.cat([fin_score, fin_new], dim=1), w, dim=1)  # [B, W]
        fin_seq = torch.gather(torch.cat([fin_seq, seqs], dim=1), 1, sel[:, :, None].expand(b, w, n))
        alive_lp, sel = torch.topk(torch.where(is_eos_, neg, top_lp), w, dim=1)  # [B, W]
        alive_seq = torch.gather(seqs, 1, sel[:, :, None].expand(b, w, n))  # [B, W, N]
        is_open = is_open & (alive_lp[:, 0] / norm > fin_score.min(dim=1).values)  # HF's heuristic
        parent = torch.gather(beam, 1, sel)  # [B, W]
        rows = (torch.arange(b)[:, None] * w + parent).reshape(bw)  # [B*W]
        carry = reorder(carry, rows)
        last = torch.gather(tok, 1, sel).reshape(bw)  # [B*W]
        logits, carry = step(last, i, carry)
    return fin_seq[:, 0], fin_score[:, 0]


def _reorder_self(cache, rows):
    """Gather the self-attention caches of `rows`; the cross-attention keys/values are the
    same for every beam of an item and stay."""
    return [{**c, "self": c["self"].take_rows(rows)} for c in cache]


# ----------------------------------------------------------------------------- decode weights
def decode_model(model: nn.Module, weights_dtype: str = "fp32") -> nn.Module:
    """A copy of `model` whose matmul weights are reduced to weights_dtype (bf16 | int8; fp32:
    the model itself): every nn.Linear becomes a quant.QuantizedLinear and a tied output table
    a quant.QuantizedWeight (torch_ref/layers/kernels/quant.py). Generation decodes with it, as the
    JAX twin's decode_model / generate do."""
    if weights_dtype == "fp32":
        return model
    if weights_dtype not in quant.WEIGHTS_DTYPES:
        raise ValueError(f"weights dtype must be one of {quant.WEIGHTS_DTYPES}, got {weights_dtype!r}")
    out = copy.deepcopy(model).eval()
    for _, module in list(out.named_modules()):
        for child_name, child in list(module.named_children()):
            if isinstance(child, nn.Linear):
                setattr(module, child_name, quant.QuantizedLinear(child, weights_dtype))
    table = _tied_table(out)
    if table is not None:
        reduced = quant.reduce_weight(table.weight, weights_dtype)
        del table.weight  # a QuantizedWeight is not a Parameter
        table.weight = reduced
    return out


def _tied_table(model):
    """The Embedding whose table is also the output projection (lm_head None), else None."""
    if getattr(model, "lm_head", True) is not None:
        return None
    embed = model.target_embedding() if hasattr(model, "target_embedding") else model.embed
    return embed.embed_tokens


# ----------------------------------------------------------------------------- LM
@torch.no_grad()
def _lm_generate(model, ids, mask, generator, *, gen, cache_len, eos_ids, pad_id):
    b, p = ids.shape
    if gen.strategy == "beam":  # every beam starts from the prompt
        ids, mask = ids.repeat_interleave(gen.num_beams, 0), mask.repeat_interleave(gen.num_beams, 0)
        b = b * gen.num_beams
    slot_mask = torch.zeros((b, cache_len), dtype=torch.long)
    slot_mask[:, :p] = mask  # [B, L]
    last, cache = lm_prefill(model, ids, slot_mask, model.init_cache(b, cache_len), gen.prefill_chunk)

    def step(tok, i, carry):
        cache, slot_mask = carry
        slot = p + i  # generated token i sits in slot P + i
        slot_mask = slot_mask.clone()
        slot_mask[:, slot] = 1
        out = model(tok[:, None], slot_mask, cache=cache, cache_index=slot)
        logits, cache = out.logits, out.cache
        return logits[:, 0], (cache, slot_mask)

    if gen.strategy == "beam":
        reorder = lambda carry, rows: (_reorder_self(carry[0], rows), carry[1][rows])
        return beam_loop(step, reorder, (cache, slot_mask), last, gen, eos_ids, pad_id)
    return decode_loop(step, (cache, slot_mask), last, generator, gen, eos_ids, pad_id)


@torch.no_grad()
def lm_prefill(model, ids, slot_mask, cache, chunk: int | None = None):
    """Write the prompt ids [B, P] into the empty cache (slots 0..P-1; slot_mask [B, L]) ->
    (logits [B, V] of the last prompt token, cache). chunk None (or >= P): one model call.
    Else chunked prefill (docs/numerics.md §31): the first P mod chunk tokens in one call,
    then the rest in calls of `chunk` tokens (a Python loop; the JAX twin scans), each
    attending over the cache its predecessors wrote."""
    p = ids.shape[1]
    if chunk is None or chunk >= p:
        out = model(ids, slot_mask, cache=cache, cache_index=0)
        logits, cache = out.logits, out.cache
        return logits[:, -1], cache
    head = p % chunk  # the odd part goes first, as the JAX twin does
    if head:
        cache = model(ids[:, :head], slot_mask, cache=cache, cache_index=0).cache
    for start in range(head, p, chunk):
        out = model(ids[:, start:start + chunk], slot_mask, cache=cache, cache_index=start)
        logits, cache = out.logits, out.cache
    return logits[:, -1], cache


def lm_generate(model, ids, attention_mask=None, gen: GenerationConfig = GenerationConfig()):  # noqa: B008 (a frozen dataclass)
    """Generate after a batch of (left-padded) prompts. ids [B, P] int, attention_mask [B, P]
    (1 = token; None = all) -> tokens [B, N] int32 numpy (pad_id after EOS); with beam search
    (tokens, scores [B])."""
    cfg = model.cfg
    ids = inputs.as_host_array(ids, "prompt token id")
    check_tokens(torch.as_tensor(ids), cfg.vocab_size, cfg.max_len, "prompt token id")
    ids = torch.as_tensor(ids, dtype=torch.long)
    mask = np.ones(tuple(ids.shape), np.int32) if attention_mask is None else inputs.check_generation_mask(
        attention_mask, tuple(ids.shape))
    inputs.check_left_padded(mask)
    inputs.check_eos_in_vocab(eos_ids(gen.eos_id), cfg.vocab_size)
    mask = torch.as_tensor(mask).long()
    cache_len = check_lengths(ids.shape[1], gen, cfg.max_len)
    check_prefill_chunk(cfg, gen)
    check_longrope_switch(cfg, ids.shape[1], gen)
    model = decode_model(model.eval(), gen.weights_dtype)
    out = _lm_generate(model, ids, mask, torch.Generator().manual_seed(gen.seed), gen=gen,
                       cache_len=cache_len, eos_ids=_eos(gen, cfg), pad_id=cfg.pad_id)
    return _to_numpy(out)



# ----------------------------------------------------------------------------- seq2seq
@torch.no_grad()
def _seq2seq_generate(model, src_ids, src_mask, generator, *, gen, cache_len, eos_ids, pad_id):
    memory, memory_mask = model.encode(src_ids, src_mask)  # [B, S, D], [B, 1, 1, S]
    if gen.strategy == "beam":
        memory = memory.repeat_interleave(gen.num_beams, 0)
        memory_mask = memory_mask.repeat_interleave(gen.num_beams, 0)
    b = memory.shape[0]
    bos = torch.full((b, 1), model.cfg.bos_id, dtype=torch.long)
    out = model.decode(bos, None, memory_mask, cache=model.init_cache(memory, cache_len), cache_index=0)
    logits, cache = out.logits, out.cache

    def step(tok, i, cache):
        out = model.decode(tok[:, None], None, memory_mask, cache=cache, cache_index=i + 1)
        return out.logits[:, 0], out.cache

    if gen.strategy == "beam":
        return beam_loop(step, _reorder_self, cache, logits[:, -1], gen, eos_ids, pad_id)
    return decode_loop(step, cache, logits[:, -1], generator, gen, eos_ids, pad_id)


def seq2seq_generate(model, src_ids, src_mask=None, gen: GenerationConfig = GenerationConfig()):  # noqa: B008 (a frozen dataclass)
    """Translate a batch: src_ids [B, S] int (right-padded with pad_id), src_mask [B, S]
    (None = src_ids != pad_id) -> tokens [B, N] int32 numpy after BOS (pad_id after EOS);
    with beam search (tokens, scores [B])."""
    cfg = model.cfg
    src_ids = inputs.as_host_array(src_ids, "source token id")
    check_tokens(torch.as_tensor(src_ids), cfg.vocab_size, cfg.max_len, "source token id")
    src_ids = torch.as_tensor(src_ids, dtype=torch.long)
    mask = (src_ids != cfg.pad_id) if src_mask is None else torch.as_tensor(inputs.check_generation_mask(
        src_mask, tuple(src_ids.shape), "src_mask")).bool()
    if not bool(mask.any(dim=1).all()):
        raise ValueError(f"every source needs at least one token (row {int(torch.argmin(mask.any(dim=1).int()))} "
                         f"is all padding)")
    inputs.check_eos_in_vocab(eos_ids(gen.eos_id), cfg.resolved_tgt_vocab)
    if gen.prefill_chunk is not None:
        raise ValueError("prefill_chunk applies to LM prompts; a seq2seq model's encoder reads the source "
                         "in one pass and its decoder starts from BOS (nothing to prefill)")
    cache_len = check_lengths(0, gen, cfg.max_len, start=1)
    model = decode_model(model.eval(), gen.weights_dtype)
    out = _seq2seq_generate(model, src_ids, mask, torch.Generator().manual_seed(gen.seed), gen=gen,
                            cache_len=cache_len, eos_ids=_eos(gen, cfg), pad_id=cfg.pad_id)
    return _to_numpy(out)


def _eos(gen: GenerationConfig, cfg) -> tuple[int, ...]:
    """The ids generation stops at: gen.eos_id, else the model's (a tuple; () = none, as with
    gen.stop_at_eos False: every sequence, every beam hypothesis included, runs to the end, as
    HF generate with eos_token_id=None)."""
    if not gen.stop_at_eos:
        return ()
    return eos_ids(cfg.eos_id if gen.eos_id is None else gen.eos_id)


def _to_numpy(out):
    if isinstance(out, tuple):
        return out[0].numpy().astype(np.int32), out[1].numpy()
    return out.numpy().astype(np.int32)


def generate(model, *args, gen: GenerationConfig = GenerationConfig(), **kw):  # noqa: B008 (a frozen dataclass)
    """lm_generate or seq2seq_generate, by the model's type."""
    return (seq2seq_generate if hasattr(model, "encode") else lm_generate)(model, *args, gen=gen, **kw)
