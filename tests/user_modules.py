"""Models for tests/test_user_module.py, named by its YAMLs (`model.torch: .../user_modules.py:make_gpt`,
`model.module: .../user_modules.py:TinyClassifier`): torch factories of a nanoGPT-style LM and a
Hugging Face OPT (a family jaxformer does not import) at the byte datasets' vocab (259), with
their port inputs, and a hand-written NNX classifier that takes constructor arguments."""
import numpy as np
import torch
from flax import nnx

B, T, VOCAB = 2, 8, 259


def _ids(seed: int) -> dict:
    return np.random.RandomState(seed).randint(1, VOCAB, size=(B, T)).astype(np.int64)


def make_gpt():
    """tests/port_corpus/nanogpt.py's GPT: tied head, a registered causal-mask buffer, 16 positions."""
    from port_corpus.nanogpt import GPT, GPTConfig  # this file's folder is on the path while it loads
    torch.manual_seed(0)
    return GPT(GPTConfig(block_size=16, vocab_size=VOCAB, n_layer=2, n_head=4, n_embd=32, dropout=0.0))


def make_opt():
    """transformers' OPTForCausalLM from a tiny config (learned positions offset by 2, pre-LN,
    ReLU FFN, head tied to the embedding)."""
    from transformers import OPTConfig, OPTForCausalLM
    torch.manual_seed(0)
    cfg = OPTConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, ffn_dim=64, num_attention_heads=4,
                    max_position_embeddings=32, word_embed_proj_dim=32, use_cache=False, dropout=0.0,
                    attention_dropout=0.0, activation_dropout=0.0, layerdrop=0.0, pad_token_id=1,
                    attn_implementation="eager")
    return OPTForCausalLM(cfg)


def gpt_example():
    return make_gpt().eval(), {"idx": _ids(0)}


def opt_example():
    return make_opt().eval(), {"input_ids": _ids(1)}


class TinyClassifier(nnx.Module):
    """Mean-pooled embeddings -> a linear head: model(ids [B, T]) -> logits [B, classes]."""

    def __init__(self, vocab: int, width: int, classes: int, *, rngs: nnx.Rngs):
        self.embed = nnx.Embed(vocab, width, rngs=rngs)
        self.head = nnx.Linear(width, classes, rngs=rngs)

    def __call__(self, ids):
        return self.head(self.embed(ids).mean(axis=1))
