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


# ----------------------------------------------------------------------------- seq2seq and classification
S2S_SRC, S2S_TGT = 32, 12  # the dates data's shortest source and target (jaxformer/train/data/dates.py)


class DateTranslator(torch.nn.Module):
    """torch.nn.Transformer (batch_first, Post-LN, ReLU) between token embeddings plus learned
    positions and a linear head: model(src [B, S], tgt_in [B, T]) -> logits [B, T, V]. The
    source's padding (id 0) is masked in the encoder and the cross-attention; the decoder is
    causal (a bool mask, True = may not attend)."""

    def __init__(self, vocab=VOCAB, d=32, heads=4, layers=2, ff=64, max_len=S2S_SRC):
        super().__init__()
        self.src_embed = torch.nn.Embedding(vocab, d)
        self.tgt_embed = torch.nn.Embedding(vocab, d)
        self.pos = torch.nn.Embedding(max_len, d)
        encoder = torch.nn.TransformerEncoder(  # as nn.Transformer builds it, without the nested-tensor fast path
            torch.nn.TransformerEncoderLayer(d, heads, ff, dropout=0.0, batch_first=True), layers,
            torch.nn.LayerNorm(d), enable_nested_tensor=False)
        self.transformer = torch.nn.Transformer(d, heads, layers, layers, ff, dropout=0.0, batch_first=True,
                                                custom_encoder=encoder)
        self.head = torch.nn.Linear(d, vocab)

    def forward(self, src, tgt_in):
        s, t = src.shape[1], tgt_in.shape[1]
        x = self.src_embed(src) + self.pos(torch.arange(s, device=src.device))
        y = self.tgt_embed(tgt_in) + self.pos(torch.arange(t, device=src.device))
        pad = src == 0
        causal = torch.triu(torch.ones(t, t, dtype=torch.bool, device=src.device), diagonal=1)
        out = self.transformer(x, y, tgt_mask=causal, src_key_padding_mask=pad, memory_key_padding_mask=pad,
                               tgt_is_causal=True)
        return self.head(out)


def make_translator():
    torch.manual_seed(0)
    return DateTranslator()


def translator_example():
    rs = np.random.RandomState(2)
    src = rs.randint(3, VOCAB, size=(B, S2S_SRC)).astype(np.int64)
    src[1, 20:] = 0  # a padded row, as the dates data has
    return make_translator().eval(), {"src": src, "tgt_in": rs.randint(1, VOCAB, size=(B, S2S_TGT)).astype(np.int64)}


class DigitsViT(torch.nn.Module):
    """A conv-patch ViT on torch.nn.TransformerEncoder (batch_first, Pre-LN, GELU) for the
    digits data's channels-last images: model(images [B, H, W, C]) -> logits [B, classes]."""

    def __init__(self, size=16, patch=4, channels=1, classes=10, d=32, heads=4, layers=2, ff=64):
        super().__init__()
        self.patch_embed = torch.nn.Conv2d(channels, d, kernel_size=patch, stride=patch)
        self.cls_token = torch.nn.Parameter(torch.randn(1, 1, d) * 0.02)
        self.pos_embed = torch.nn.Parameter(torch.randn(1, (size // patch) ** 2 + 1, d) * 0.02)
        layer = torch.nn.TransformerEncoderLayer(d, heads, ff, dropout=0.0, activation="gelu", batch_first=True,
                                                 norm_first=True)
        self.encoder = torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = torch.nn.LayerNorm(d)
        self.head = torch.nn.Linear(d, classes)

    def forward(self, images):
        x = self.patch_embed(images.permute(0, 3, 1, 2)).flatten(2).transpose(1, 2)  # [B, N, d]
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed
        return self.head(self.norm(self.encoder(x)[:, 0]))


def make_vit():
    torch.manual_seed(0)
    return DigitsViT()


def vit_example():
    return make_vit().eval(), {"images": np.random.RandomState(4).standard_normal((B, 16, 16, 1)).astype(np.float32)}


def make_vit_3_layers():
    """DigitsViT with a third encoder layer: not the module a 2-layer run's weights fit."""
    torch.manual_seed(0)
    return DigitsViT(layers=3)
