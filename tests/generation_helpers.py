"""The models and inputs the generation tests share (tests/test_generation_*.py,
tests/test_decode_layout.py): small LM and seq2seq flavours, prompts of different lengths,
right-padded sources; `pair` (helpers.converted_pair) gives a torch model and its JAX twin on
the same weights.

A plain module, imported by name: tests/ and parity_tests/ each have a conftest.py, and with
both on the command line (the default testpaths) `from conftest import ...` finds the one
imported last.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from helpers import converted_pair

from jaxformer.config.models import LMConfig, Seq2SeqConfig
from jaxformer.parity import setup_precision

setup_precision()
pair = converted_pair
N = 32  # new tokens
PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [3, 4], [12, 13, 14, 15]]  # different lengths
LMS = {
    "gpt2": LMConfig.tiny("gpt2", max_len=64),
    "llama_gqa": LMConfig.tiny("llama", max_len=64),
    "alibi_postln": LMConfig.tiny(max_len=64, position="alibi", norm_position="post", tie_embeddings=False),
    "t5bias_sliding_window": LMConfig.tiny(max_len=64, position="t5", norm_position="pre", sliding_window=5),
    "sinusoidal_scaled": LMConfig.tiny(max_len=64, position="sinusoidal", norm_position="pre"),
}
S2S = {
    "shared_tied": Seq2SeqConfig.tiny(max_len=64),
    "separate_untied_pre": Seq2SeqConfig.tiny(max_len=64, share_embeddings=False, tie_output=False, tgt_vocab_size=48,
                                         num_decoder_layers=3, norm_position="pre"),
}
SOURCES = np.array([[5, 6, 7, 8, 9, 0, 0], [10, 11, 12, 13, 14, 15, 16], [17, 18, 0, 0, 0, 0, 0]], np.int32)


def jitted(model):
    """model(*args) as one jitted pure function (eager JAX would compile every op for every
    new shape). One jit for every call: a model of a structure (graphdef) and input shapes seen
    before in the process, in this test or another, reuses its compilation."""
    graphdef, state = nnx.split(model)
    return lambda *a: np.asarray(_forward(graphdef, state, *[jnp.asarray(x) for x in a]))


_forward = jax.jit(lambda graphdef, state, *a: nnx.merge(graphdef, state)(*a), static_argnums=0)

