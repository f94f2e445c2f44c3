"""`jaxformer port` on a GPT-2-size hand-written model: how long the port takes and its memory.

The model is nanoGPT-style (12 layers, d_model 768, 12 heads, vocab 50257, context 1024, tied
head, causal-mask buffer, dropout 0.1), written here, traced at batch 2 x 64 tokens. Timed, in
one run: `port_source` (torch.export of the eval and train graphs, the source written and
formatted) and `from_torch` (the same, plus building the NNX module and loading the 124M
weights through jaxformer.convert); then one forward of the ported module against torch.
Target: the port under 60 s on this machine.

    python bench/port_gpt2.py [--layers 12] [--seq 64]

Not a test: it times things. The last line of the output is one JSON value.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import resource
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import torch
import torch.nn as nn
import torch.nn.functional as F


class SelfAttention(nn.Module):
    def __init__(self, d, heads, ctx, p):
        super().__init__()
        self.c_attn = nn.Linear(d, 3 * d)
        self.c_proj = nn.Linear(d, d)
        self.attn_dropout = nn.Dropout(p)
        self.resid_dropout = nn.Dropout(p)
        self.n_head = heads
        self.register_buffer("bias", torch.tril(torch.ones(ctx, ctx)).view(1, 1, ctx, ctx))

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(C, dim=2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        att = self.attn_dropout(F.softmax(att, dim=-1))
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class Block(nn.Module):
    def __init__(self, d, heads, ctx, p):
        super().__init__()
        self.ln_1 = nn.LayerNorm(d)
        self.attn = SelfAttention(d, heads, ctx, p)
        self.ln_2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(approximate="tanh"), nn.Linear(4 * d, d),
                                 nn.Dropout(p))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, vocab=50257, ctx=1024, d=768, heads=12, layers=12, p=0.1):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(ctx, d)
        self.drop = nn.Dropout(p)
        self.h = nn.ModuleList([Block(d, heads, ctx, p) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.wte.weight = self.lm_head.weight

    def forward(self, idx):
        t = idx.size(1)
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--seq", type=int, default=64)
    args = ap.parse_args()
    import jax
    import numpy as np

    from jaxformer.parity import setup_precision
    from jaxformer.port import from_torch, port_source
    setup_precision()
    torch.manual_seed(0)
    model = GPT(layers=args.layers).eval()
    params = sum(p.numel() for p in model.parameters())
    inputs = {"idx": np.random.RandomState(0).randint(0, 50257, (2, args.seq)).astype(np.int64)}
    print(f"torch {torch.__version__}, jax {jax.__version__} ({jax.default_backend()}), {os.cpu_count()} CPUs; "
          f"GPT {args.layers} layers, {params / 1e6:.1f}M parameters, traced at {inputs['idx'].shape}", flush=True)
    rss_model = peak_rss_mib()

    start = time.perf_counter()
    source = port_source(model, inputs)
    t_source = time.perf_counter() - start
    print(f"port_source: {t_source:.1f} s, {len(source.splitlines())} lines, peak RSS {peak_rss_mib():.0f} MiB",
          flush=True)

    start = time.perf_counter()
    ported = from_torch(model, inputs)
    t_module = time.perf_counter() - start
    print(f"from_torch (port + build + load weights): {t_module:.1f} s, peak RSS {peak_rss_mib():.0f} MiB", flush=True)

    want = model(torch.from_numpy(inputs["idx"])).detach().numpy()
    got = np.asarray(ported(jax.numpy.asarray(inputs["idx"])))
    diff = float(np.abs(got - want).max())
    print(f"one forward: max |jax - torch| = {diff:.2e} (max |torch| {np.abs(want).max():.2f})")
    print(json.dumps({"layers": args.layers, "params": params, "seq": args.seq,
                      "port_source_s": round(t_source, 2), "from_torch_s": round(t_module, 2),
                      "peak_rss_mib": round(peak_rss_mib()), "rss_before_port_mib": round(rss_model),
                      "lines": len(source.splitlines()), "max_abs_out": diff, "target_s": 60,
                      "ok": t_source < 60 and t_module < 60}))


if __name__ == "__main__":
    main()
