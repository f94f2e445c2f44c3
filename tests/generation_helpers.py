"""The models and inputs the generation tests share (tests/test_generation_*.py,
tests/test_decode_layout.py): small LM and seq2seq flavours, prompts of different lengths,
right-padded sources, and `pair`, a torch model with its JAX twin on the same weights.

A plain module, imported by name: tests/ and parity_tests/ each have a conftest.py, and with
both on the command line (the default testpaths) `from conftest import ...` finds the one
imported last.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxformer import convert
from jaxformer.config.models import LMConfig, Seq2SeqConfig
from jaxformer.models import build_model as jbuild
from jaxformer.parity import setup_precision
from jaxformer.parity.cases_models import GPT2, LLAMA, TINY, realistic_embeddings
from torch_ref.models import build_model as tbuild

setup_precision()
N = 32  # new tokens
BASE = {**TINY, "max_len": 64}
PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [3, 4], [12, 13, 14, 15]]  # different lengths
LMS = {
    "gpt2": LMConfig(**BASE, **GPT2),
    "llama_gqa": LMConfig(**BASE, **LLAMA),
    "alibi_postln": LMConfig(**BASE, position="alibi", norm_position="post", tie_embeddings=False),
    "t5bias_sliding_window": LMConfig(**BASE, position="t5", norm_position="pre", sliding_window=5),
    "sinusoidal_scaled": LMConfig(**BASE, position="sinusoidal", norm_position="pre"),
}
S2S = {
    "shared_tied": Seq2SeqConfig(**BASE),
    "separate_untied_pre": Seq2SeqConfig(**BASE, share_embeddings=False, tie_output=False, tgt_vocab_size=48,
                                         num_decoder_layers=3, norm_position="pre"),
}
SOURCES = np.array([[5, 6, 7, 8, 9, 0, 0], [10, 11, 12, 13, 14, 15, 16], [17, 18, 0, 0, 0, 0, 0]], np.int32)


def pair(name, cfg, seed=0):
    """torch model and its JAX twin with the same weights; token embeddings rescaled to
    N(0, 1/D) (see parity_tests/cases_models.realistic_embeddings: with the constructor's
    N(0, 1) tied tables, logits reach |x| ~ 100 where float32's spacing is 7.6e-6 and cached vs
    recomputed torch logits differed by 1.1e-5, measured, by summation order alone)."""
    t = realistic_embeddings(tbuild(name, cfg, seed=seed).eval())
    j = jbuild(name, cfg, seed=seed)
    convert.load_torch_state_dict(j, t.state_dict())
    j.eval()
    return t, j


def jitted(model):
    """model(*args) as one jitted pure function (eager JAX would compile every op for every
    new shape)."""
    graphdef, state = nnx.split(model)
    fn = jax.jit(lambda state, *a: nnx.merge(graphdef, state)(*a))
    return lambda *a: np.asarray(fn(state, *[jnp.asarray(x) for x in a]))

