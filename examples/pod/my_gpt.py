"""A user's own PyTorch model, as research code has it: a nanoGPT-style causal LM (pre-LN blocks,
learned positions, a causal-mask buffer, GELU MLP, the head tied to the token embedding).
Nothing here knows about jaxformer. docs/own-model.md's "Your own model on a pod" ports it, trains
the port on a device mesh, compiles it for a TPU slice and loads the trained weights back here.

    make()      -> (model, example inputs): what `jaxformer port my_gpt:make` traces
    make_gpt()  -> the model: what the YAML's `model.torch` names (the torch trainer, the export)"""
import math

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB, WIDTH, HEADS, LAYERS, CONTEXT = 259, 64, 4, 2, 64  # 259: jaxformer's byte-level vocabulary


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(WIDTH, 3 * WIDTH)
        self.proj = nn.Linear(WIDTH, WIDTH)
        self.register_buffer("causal", torch.tril(torch.ones(CONTEXT, CONTEXT)).view(1, 1, CONTEXT, CONTEXT))

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        q, k, v = (t.view(B, T, HEADS, C // HEADS).transpose(1, 2) for t in (q, k, v))  # (B, nh, T, hs)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(C // HEADS)
        att = att.masked_fill(self.causal[:, :, :T, :T] == 0, float("-inf")).softmax(dim=-1)
        return self.proj((att @ v).transpose(1, 2).reshape(B, T, C))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1 = nn.LayerNorm(WIDTH)
        self.attn = Attention()
        self.ln_2 = nn.LayerNorm(WIDTH)
        self.fc = nn.Linear(WIDTH, 4 * WIDTH)
        self.out = nn.Linear(4 * WIDTH, WIDTH)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.out(F.gelu(self.fc(self.ln_2(x))))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(VOCAB, WIDTH)
        self.wpe = nn.Embedding(CONTEXT, WIDTH)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.ln_f = nn.LayerNorm(WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB, bias=False)
        self.head.weight = self.wte.weight  # weight tying

    def forward(self, idx):
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def make_gpt():
    torch.manual_seed(0)
    return GPT()


def make():
    return make_gpt().eval(), {"idx": np.random.RandomState(0).randint(0, VOCAB, (2, 16))}
