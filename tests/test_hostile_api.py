"""Hostile inputs to the Python API (issue 35): what JAX computes silently (an id outside the
vocabulary under jit, float ids cast to ints, a NaN or additive mask, integer images, a
right-padded prompt batch, an eos the model cannot generate, a NaN length penalty) must be
refused with one line naming the problem, at the Python boundary (jaxformer/config/inputs.py,
models/common.py, generation.py and their torch twins), or inside jit through
models.common.checked (checkify). One table of cases, each expecting a one-line ValueError
matching `error`, or a correct result (`check`). The models are tiny and built once; the
refusals come before anything is computed, so only the correct-result cases compile.
"""
from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx

from jaxformer import generation as G
from jaxformer.config import ConfigError
from jaxformer.config.models import ClassifierConfig, GenerationConfig, LMConfig, Seq2SeqConfig, pad_prompts
from jaxformer.config.transformer import TransformerConfig
from jaxformer.config.vision import SwinConfig, TimeSeriesConfig, ViTConfig
from jaxformer.models import abstract_model, build_model
from jaxformer.models.common import checked
from torch_ref import generation as TG
from torch_ref.models import build_model as torch_model

V = 64  # every text model's vocabulary
TEXT = dict(vocab_size=V, max_len=16, d_model=16, num_heads=2, d_ff=32, num_layers=1)
VIT = dict(image_size=8, patch_size=4, num_channels=1, num_classes=3, d_model=16, num_heads=2, d_ff=32, num_layers=1)
SWIN = dict(image_size=8, patch_size=2, num_channels=1, num_classes=3, embed_dim=8, depths=[1], num_heads=[2],
            window_size=4)
SERIES = dict(input_len=8, num_channels=2, target_channels=[0], horizon=2, d_model=16, num_heads=2, d_ff=32,
              num_layers=1, conv_layers=1, kernel_size=3, padding="causal")
IDS = np.array([[3, 4, 5, 6]], np.int32)
GEN = GenerationConfig(max_new_tokens=2)


@functools.cache
def model(name: str, torch_twin: bool = False):
    """A tiny model in eval mode, built once per module run (abstract but for the LM)."""
    cfg = {"lm": lambda: LMConfig.tiny("llama", **TEXT), "seq2seq": lambda: Seq2SeqConfig.tiny(**TEXT),
           "classifier": lambda: ClassifierConfig.tiny(**TEXT, num_classes=3),
           "encoder": lambda: TransformerConfig(**TEXT), "vit": lambda: ViTConfig(**VIT),
           "swin": lambda: SwinConfig(**SWIN), "timeseries": lambda: TimeSeriesConfig(**SERIES)}[name]()
    if torch_twin:
        return torch_model(name, cfg).eval()
    # lm: the one model that computes here; the others only refuse, before any weight is read
    m = build_model(name, cfg) if name == "lm" else abstract_model(name, cfg)
    m.eval()
    return m


@functools.cache
def lm_checked():
    """(checked forward, jit forward, state) of the tiny LM: each compiled once."""
    graphdef, state = nnx.split(model("lm"))
    forward = lambda s, ids, mask: nnx.merge(graphdef, s)(ids, mask)
    return checked(forward), jax.jit(forward), state


def _checked_call(ids, mask=None):
    run, _, state = lm_checked()
    return run(state, jnp.asarray(ids), jnp.ones(np.shape(ids), jnp.int32) if mask is None else jnp.asarray(mask))


def _images(value, dtype=np.float32, shape=(1, 8, 8, 1)):
    x = np.zeros(shape, dtype)
    x.flat[0] = value
    return x


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    call: Callable[[], Any]
    error: str | None = None  # regex of the one-line ValueError; None: a correct result
    check: Callable[[Any], None] | None = None


def _refuse(name, call, error):
    return Case(name, call, error)


def _lm(*args, **kw):
    return lambda: model("lm")(*args, **kw)


def _torch_lm(*args, **kw):
    return lambda: model("lm", True)(*args, **kw)


NAN_MASK = np.array([[1.0, np.nan, 1.0, 1.0]], np.float32)
ADDITIVE = np.array([[0.0, -np.inf, 0.0, 0.0]], np.float32)
MASK_MSG = r"a mask is 1 \(token\) or 0 \(padding\)"
IDS2 = np.array([[3, 4, 5, 6], [7, 8, 9, 10]], np.int32)
PAD_ROW = np.array([[1, 1, 1, 1], [0, 0, 0, 0]], np.int32)
ALL_PAD = r"^{} row {} is all padding: every row needs at least one token"

# --- token ids: dtype and rank (JAX computes with them, or gives an unpacking traceback)
IDS_CASES = [
    _refuse("lm float ids", _lm(jnp.asarray(IDS, jnp.float32)), r"^token ids must be integers, got dtype float32$"),
    _refuse("lm bool ids", _lm(jnp.asarray(IDS > 3)), r"^token ids must be integers, got dtype bool$"),
    _refuse("lm 1-D ids", _lm(jnp.asarray(IDS[0])), r"^token ids must be \[batch, length\], got shape \(4,\)$"),
    _refuse("lm 3-D ids", _lm(jnp.asarray(IDS[None])), r"^token ids must be \[batch, length\], got shape"),
    _refuse("lm list ids", _lm([[3, 4]]), r"^token ids must be an array \[batch, length\], got list$"),
    _refuse("lm float segment ids", _lm(jnp.asarray(IDS), segment_ids=jnp.ones((1, 4), jnp.float32)),
            r"^segment ids must be integers"),
    _refuse("lm float position ids", _lm(jnp.asarray(IDS), position_ids=jnp.zeros((1, 4), jnp.float32)),
            r"^position ids must be integers"),
    _refuse("seq2seq float target ids", lambda: model("seq2seq").decode(jnp.ones((1, 2), jnp.float32), None, None),
            r"^target token ids must be integers, got dtype float32$"),
    _refuse("classifier float token types",
            lambda: model("classifier")(jnp.asarray(IDS), token_type_ids=jnp.zeros((1, 4), jnp.float32)),
            r"^token type ids must be integers"),
    _refuse("encoder float ids", lambda: model("encoder")(jnp.asarray(IDS, jnp.float32)),
            r"^token ids must be integers, got dtype float32$"),
    _refuse("encoder ids past max_len", lambda: model("encoder")(jnp.zeros((1, 17), jnp.int32)),
            r"^token id sequence length 17 exceeds max_len=16$"),
    _refuse("torch lm float ids", _torch_lm(torch.tensor([[1.0, 2.0]])), r"^token ids must be integers, got dtype float32$"),
]

# --- under jit: checkify through models.common.checked (jax.jit clamps a negative id to a row
# and gives NaN rows for one past the table)
JIT_CASES = [
    _refuse("jit negative id", lambda: _checked_call([[3, -1, 5]]), r"^token id -1 is out of range \[0, 64\) \(vocab_size=64\)$"),
    _refuse("jit id = vocab", lambda: _checked_call([[3, 64, 5]]), r"^token id 64 is out of range \[0, 64\)"),
    _refuse("jit huge id", lambda: _checked_call([[2**30]]), r"^token id 1073741824 is out of range"),
    _refuse("jit NaN mask", lambda: _checked_call(IDS, NAN_MASK), r"^attention_mask holds a value other than 0 and 1"),
    Case("jit valid ids: the unchecked program's logits",
         lambda: (_checked_call(IDS), lm_checked()[1](lm_checked()[2], jnp.asarray(IDS), jnp.ones((1, 4), jnp.int32))),
         check=lambda r: np.testing.assert_array_equal(np.asarray(r[0]), np.asarray(r[1]))),
]

# --- masks: NaN, additive, fractional, out of {0, 1}, wrong shape (all read as "token" before)
MASK_CASES = [
    _refuse("lm NaN mask", _lm(jnp.asarray(IDS), jnp.asarray(NAN_MASK)), rf"^attention_mask holds nan at \[0, 1\]: {MASK_MSG}"),
    _refuse("lm additive mask", _lm(jnp.asarray(IDS), jnp.asarray(ADDITIVE)), r"^attention_mask holds -inf at \[0, 1\]"),
    _refuse("lm mask 0.5", _lm(jnp.asarray(IDS), jnp.asarray([[1, 0.5, 1, 1]])), r"^attention_mask holds 0.5 at \[0, 1\]"),
    _refuse("lm mask 2", _lm(jnp.asarray(IDS), jnp.asarray([[1, 2, 1, 1]])), r"^attention_mask holds 2 at \[0, 1\]"),
    _refuse("lm bf16 NaN mask", _lm(jnp.asarray(IDS), jnp.asarray(NAN_MASK, jnp.bfloat16)), r"^attention_mask holds nan"),
    _refuse("classifier NaN mask", lambda: model("classifier")(jnp.asarray(IDS), jnp.asarray(NAN_MASK)),
            r"^attention_mask holds nan at \[0, 1\]"),
    _refuse("classifier mask shape", lambda: model("classifier")(jnp.asarray(IDS), jnp.ones((1, 2))),
            r"^attention_mask must be \[batch, length\] = \(1, 4\), got \(1, 2\)$"),
    _refuse("encoder NaN mask", lambda: model("encoder")(jnp.asarray(IDS), jnp.asarray(NAN_MASK)),
            r"^attention_mask holds nan"),
    _refuse("seq2seq NaN src_mask", lambda: model("seq2seq")(jnp.asarray(IDS), jnp.asarray([[1, 2]]), jnp.asarray(NAN_MASK)),
            r"^src_mask holds nan at \[0, 1\]"),
    _refuse("seq2seq src_mask shape", lambda: model("seq2seq")(jnp.asarray(IDS), jnp.asarray([[1, 2]]), jnp.ones((1, 2))),
            r"^src_mask must be \[batch, length\] = \(1, 4\)"),
    _refuse("torch lm NaN mask", _torch_lm(torch.tensor(IDS), torch.tensor(NAN_MASK)), r"^attention_mask holds nan at \[0, 1\]"),
    # an all-padding row: attention gives it exactly 0 (docs/numerics.md §4), so its outputs mean nothing
    _refuse("lm all-padding row", _lm(jnp.asarray(IDS2), jnp.asarray(PAD_ROW)), ALL_PAD.format("attention_mask", 1)),
    _refuse("lm all-padding bool row", _lm(jnp.asarray(IDS2), jnp.asarray(PAD_ROW > 0)), ALL_PAD.format("attention_mask", 1)),
    _refuse("classifier all-padding row", lambda: model("classifier")(jnp.asarray(IDS2), jnp.asarray(PAD_ROW)),
            ALL_PAD.format("attention_mask", 1)),
    _refuse("encoder all-padding row", lambda: model("encoder")(jnp.asarray(IDS2), jnp.asarray(PAD_ROW)),
            ALL_PAD.format("attention_mask", 1)),
    _refuse("seq2seq all-padding src row", lambda: model("seq2seq")(jnp.asarray(IDS2), jnp.asarray(IDS2), jnp.asarray(PAD_ROW)),
            ALL_PAD.format("src_mask", 1)),
    _refuse("torch lm all-padding row", _torch_lm(torch.tensor(IDS2), torch.tensor(PAD_ROW)),
            ALL_PAD.format("attention_mask", 1)),
    _refuse("torch classifier all-padding row", lambda: model("classifier", True)(torch.tensor(IDS2), torch.tensor(PAD_ROW)),
            ALL_PAD.format("attention_mask", 1)),
    _refuse("torch seq2seq all-padding src row",
            lambda: model("seq2seq", True)(torch.tensor(IDS2), torch.tensor(IDS2), torch.tensor(PAD_ROW)),
            ALL_PAD.format("src_mask", 1)),
    Case("lm padded rows with a token each", lambda: model("lm")(jnp.asarray(IDS2), jnp.asarray([[1, 1, 1, 1], [0, 0, 0, 1]])),
         check=lambda r: np.isfinite(np.asarray(r)).all()),
    Case("lm bool mask = int mask", lambda: (model("lm")(jnp.asarray(IDS), jnp.asarray([[False, True, True, True]])),
                                              model("lm")(jnp.asarray(IDS), jnp.asarray([[0, 1, 1, 1]]))),
         check=lambda r: np.testing.assert_array_equal(np.asarray(r[0]), np.asarray(r[1]))),
]

# --- images and series: integer pixels (ViT's conv saw a blank image), NaN / inf values
FLOAT_MSG = r"must be floating point, got dtype {}; convert them"
VALUE_CASES = [
    _refuse("vit uint8 images", lambda: model("vit")(jnp.asarray(_images(200, np.uint8))), r"^images " + FLOAT_MSG.format("uint8")),
    _refuse("vit int32 images", lambda: model("vit")(jnp.asarray(_images(1, np.int32))), r"^images " + FLOAT_MSG.format("int32")),
    _refuse("vit bool images", lambda: model("vit")(jnp.asarray(_images(1, bool))), r"^images " + FLOAT_MSG.format("bool")),
    _refuse("vit NaN pixel", lambda: model("vit")(jnp.asarray(_images(np.nan))), r"^images hold nan at \[0, 0, 0, 0\]: inputs must be finite"),
    _refuse("vit inf pixel", lambda: model("vit")(jnp.asarray(_images(np.inf))), r"^images hold inf at \[0, 0, 0, 0\]"),
    _refuse("vit bf16 NaN pixel", lambda: model("vit")(jnp.asarray(_images(np.nan), jnp.bfloat16)), r"^images hold nan"),
    _refuse("swin uint8 images", lambda: model("swin")(jnp.asarray(_images(200, np.uint8))), r"^images " + FLOAT_MSG.format("uint8")),
    _refuse("swin NaN pixel", lambda: model("swin")(jnp.asarray(_images(np.nan))), r"^images hold nan"),
    _refuse("timeseries NaN", lambda: model("timeseries")(jnp.asarray(_images(np.nan, shape=(1, 8, 2)))),
            r"^series hold nan at \[0, 0, 0\]"),
    _refuse("timeseries int series", lambda: model("timeseries")(jnp.zeros((1, 8, 2), jnp.int32)),
            r"^series " + FLOAT_MSG.format("int32")),
    _refuse("torch vit uint8 images", lambda: model("vit", True)(torch.zeros((1, 8, 8, 1), dtype=torch.uint8)),
            r"^images " + FLOAT_MSG.format("uint8")),
    _refuse("torch vit NaN pixel", lambda: model("vit", True)(torch.tensor(_images(np.nan))), r"^images hold nan at \[0, 0, 0, 0\]"),
]


def _gen(*args, **kw):
    return lambda: G.lm_generate(model("lm"), *args, **kw)


def _s2s_gen(*args, **kw):
    return lambda: G.seq2seq_generate(model("seq2seq"), *args, **kw)


RIGHT_PADDED = (np.array([[3, 4, 0, 0], [3, 4, 5, 6]]), np.array([[1, 1, 0, 0], [1, 1, 1, 1]]))
LEFT_PADDED = (np.array([[0, 0, 3, 4], [3, 4, 5, 6]]), np.array([[0, 0, 1, 1], [1, 1, 1, 1]]))


def _same_as_unpadded(r):
    alone = G.lm_generate(model("lm"), np.array([[3, 4]]), gen=GEN)
    np.testing.assert_array_equal(r[0], alone[0])


# --- generate: prompts, masks, padding side, eos
GENERATE_CASES = [
    _refuse("generate right-padded batch", _gen(*RIGHT_PADDED, gen=GEN),
            r"^attention_mask row 0 ends in padding \(a right-padded prompt\).*left-padded"),
    _refuse("generate right padding, one row", _gen(np.array([[3, 4, 0]]), np.array([[1, 1, 0]]), gen=GEN),
            r"^attention_mask row 0 ends in padding"),
    Case("generate left-padded batch: the unpadded row's tokens", _gen(*LEFT_PADDED, gen=GEN), check=_same_as_unpadded),
    _refuse("generate eos outside vocab", _gen(IDS, gen=GenerationConfig(max_new_tokens=2, eos_id=64)),
            r"^eos_id 64 is out of range \[0, 64\) \(vocab_size=64\): the model can never generate it$"),
    _refuse("generate one eos of two outside", _gen(IDS, gen=GenerationConfig(max_new_tokens=2, eos_id=(2, 99))),
            r"^eos_id 99 is out of range \[0, 64\)"),
    _refuse("seq2seq generate eos outside vocab", _s2s_gen(IDS, gen=GenerationConfig(max_new_tokens=2, eos_id=70)),
            r"^eos_id 70 is out of range \[0, 64\)"),
    _refuse("generate float prompt ids", _gen(IDS.astype(np.float32), gen=GEN), r"^prompt token ids must be integers, got dtype float32$"),
    _refuse("generate fractional ids", _gen(IDS + 0.7, gen=GEN), r"^prompt token ids must be integers, got dtype float64$"),
    _refuse("generate bool ids", _gen(IDS > 3, gen=GEN), r"^prompt token ids must be integers, got dtype bool$"),
    _refuse("generate string ids", _gen(np.array([["a", "b"]]), gen=GEN), r"^prompt token ids must be numbers, got dtype <U1$"),
    _refuse("generate ragged lists", _gen([[3, 4], [5]], gen=GEN), r"^prompt token ids: rows of different lengths"),
    _refuse("generate NaN mask", _gen(IDS, NAN_MASK, gen=GEN), r"^attention_mask holds nan at \[0, 1\]"),
    _refuse("generate mask 0.5", _gen(IDS, np.array([[0.5, 1, 1, 1]]), gen=GEN), r"^attention_mask holds 0.5 at \[0, 0\]"),
    _refuse("generate additive mask", _gen(IDS, ADDITIVE, gen=GEN), r"^attention_mask holds -inf at \[0, 1\]"),
    _refuse("seq2seq generate all-pad source", _s2s_gen(np.zeros((1, 4), np.int32), gen=GEN),
            r"^every source needs at least one token \(row 0 is all padding\)$"),
    _refuse("seq2seq generate NaN src_mask", _s2s_gen(IDS, NAN_MASK, gen=GEN), r"^src_mask holds nan at \[0, 1\]"),
    _refuse("seq2seq generate src_mask shape", _s2s_gen(IDS, np.ones((1, 2)), gen=GEN), r"^src_mask shape \(1, 2\) != ids shape \(1, 4\)$"),
    _refuse("seq2seq generate float source", _s2s_gen(IDS.astype(np.float32), gen=GEN), r"^source token ids must be integers"),
    _refuse("pad_prompts float id", lambda: pad_prompts([[3, 4.5]], 0), r"^prompt 0: token ids must be integers, got float64$"),
    _refuse("pad_prompts bool ids", lambda: pad_prompts([[3], [True]], 0), r"^prompt 1: token ids must be integers, got bool$"),
    _refuse("torch generate right-padded batch", lambda: TG.lm_generate(model("lm", True), *RIGHT_PADDED, gen=GEN),
            r"^attention_mask row 0 ends in padding"),
    _refuse("torch generate eos outside vocab",
            lambda: TG.lm_generate(model("lm", True), IDS, gen=GenerationConfig(max_new_tokens=2, eos_id=64)),
            r"^eos_id 64 is out of range \[0, 64\)"),
    _refuse("torch generate float ids", lambda: TG.lm_generate(model("lm", True), IDS + 0.5, gen=GEN),
            r"^prompt token ids must be integers, got dtype float64$"),
    _refuse("torch seq2seq generate all-pad source",
            lambda: TG.seq2seq_generate(model("seq2seq", True), np.zeros((1, 4), np.int32), gen=GEN),
            r"^every source needs at least one token"),
]


def _config(**kw):
    return lambda: GenerationConfig(**kw)


# --- GenerationConfig: options that were accepted and silently wrong (or a TypeError traceback)
OPTION_CASES = [
    _refuse("length_penalty NaN", _config(strategy="beam", length_penalty=float("nan")), r"^length_penalty: must be a finite number, got nan$"),
    _refuse("length_penalty inf", _config(strategy="beam", length_penalty=float("inf")), r"^length_penalty: must be a finite number, got inf$"),
    _refuse("length_penalty string", _config(strategy="beam", length_penalty="1"), r"^length_penalty: must be a finite number, got '1'$"),
    _refuse("temperature inf", _config(strategy="sample", temperature=float("inf")), r"^temperature: must be a finite number > 0, got inf$"),
    _refuse("temperature string", _config(strategy="sample", temperature="1"), r"^temperature: must be a finite number > 0, got '1'$"),
    _refuse("top_p string", _config(strategy="sample", top_p="0.9"), r"^top_p: must be in \(0, 1\], got '0.9'$"),
    _refuse("top_k bool", _config(strategy="sample", top_k=True), r"^top_k: must be an int >= 0, got True$"),
    _refuse("seed float", _config(seed=1.5), r"^seed: must be an int, got 1.5$"),
    _refuse("stop_at_eos string", _config(stop_at_eos="no"), r"^stop_at_eos: must be true or false, got 'no'$"),
    _refuse("duplicate eos ids", _config(eos_id=(2, 2)), r"^eos_id: lists an id twice: \(2, 2\)$"),
]

CASES = IDS_CASES + JIT_CASES + MASK_CASES + VALUE_CASES + GENERATE_CASES + OPTION_CASES


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_hostile_api(case: Case):
    if case.error is None:
        case.check(case.call())
        return
    with pytest.raises(ValueError) as info:  # ConfigError is a ValueError
        case.call()
    message = str(info.value)
    assert isinstance(info.value, (ValueError, ConfigError))
    assert "\n" not in message, message
    assert re.search(case.error, message), message
