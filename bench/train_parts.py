"""Where bench/train_step.py's time goes: forward + backward of each part of the seed
classifier's train step at its shapes (batch 32 x 128 tokens, d_model 256, 8 heads, d_ff 1024,
vocab 30000), JAX (jit) against torch eager, 2 threads, fp32, medians in ms.

    python bench/train_parts.py

Not a test: it times things.
"""
import functools
import json
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
import torch

torch.set_num_threads(2)
B, T, D, H, F, V = 32, 128, 256, 8, 1024, 30000
K = D // H
rng = np.random.default_rng(0)
def tm(fn, n=7):
    fn(); fn(); ts = []
    for _ in range(n):
        t = time.perf_counter(); fn(); ts.append(time.perf_counter() - t)
    return statistics.median(ts) * 1e3
ROWS = []
def row(name, j, t):
    ROWS.append({"part": name, "jax_ms": round(j, 2), "torch_ms": round(t, 2), "ratio": round(j / t, 3)})
    print(f"{name:34s} jax {j:7.1f} ms  torch {t:7.1f} ms  ratio {j/t:5.2f}", flush=True)
x_np = rng.standard_normal((B, T, D)).astype(np.float32)
# 1) FFN
W1, W2 = rng.standard_normal((D, F)).astype(np.float32) * .05, rng.standard_normal((F, D)).astype(np.float32) * .05
from jaxformer.layers.linear import matmul  # the Linear layers' matmul (hand-written backward)


def jffn(p, x): return jnp.sum(matmul(jax.nn.relu(matmul(x, p[0])), p[1]) ** 2)
g = jax.jit(jax.grad(jffn)); pj = (jnp.asarray(W1), jnp.asarray(W2)); xj = jnp.asarray(x_np)
tw1, tw2 = torch.tensor(W1.T.copy(), requires_grad=True), torch.tensor(W2.T.copy(), requires_grad=True)
xt = torch.tensor(x_np)
def tffn():
    y = torch.nn.functional.linear(torch.relu(torch.nn.functional.linear(xt, tw1)), tw2); (y ** 2).sum().backward()
row("ffn fwd+bwd", tm(lambda: jax.block_until_ready(g(pj, xj))), tm(tffn))
# 2) attention core (explicit, dropout 0.1) fwd+bwd wrt q,k,v
q_np = rng.standard_normal((B, T, H, K)).astype(np.float32)
def jattn(qkv, key, drop):
    q, k, v = qkv
    s = jnp.einsum("bthk,bshk->bhts", q, k) / np.sqrt(K)
    w = jax.nn.softmax(s, -1)
    if drop: w = jnp.where(jax.random.bernoulli(key, 0.9, w.shape), w / 0.9, 0)
    return jnp.sum(jnp.einsum("bhts,bshk->bthk", w, v) ** 2)
qj = jnp.asarray(q_np); key = jax.random.key(0)
qt = [torch.tensor(q_np, requires_grad=True) for _ in range(3)]
for drop in (False, True):
    ga = jax.jit(jax.grad(functools.partial(jattn, drop=drop)))
    def tattn(drop=drop):
        q, k, v = [a.transpose(1, 2) for a in qt]
        w = torch.softmax(q @ k.transpose(-1, -2) / np.sqrt(K), -1)
        if drop: w = torch.nn.functional.dropout(w, 0.1)
        ((w @ v) ** 2).sum().backward()
    row(f"attention core fwd+bwd drop={drop}", tm(lambda ga=ga: jax.block_until_ready(ga((qj, qj, qj), key))), tm(tattn))
# fused jax path
gf = jax.jit(jax.grad(lambda a: jnp.sum(jax.nn.dot_product_attention(*a) ** 2)))
def tsdpa():
    q, k, v = [a.transpose(1, 2) for a in qt]
    (torch.nn.functional.scaled_dot_product_attention(q, k, v) ** 2).sum().backward()
row("attention fused fwd+bwd", tm(lambda: jax.block_until_ready(gf((qj, qj, qj)))), tm(tsdpa))
# 3) projections 4 x DxD fwd+bwd
Wq = rng.standard_normal((4, D, D)).astype(np.float32) * .05
gp = jax.jit(jax.grad(lambda W, x: sum(jnp.sum(matmul(x, W[i]) ** 2) for i in range(4))))
tW = [torch.tensor(Wq[i].T.copy(), requires_grad=True) for i in range(4)]
def tproj(): sum(((torch.nn.functional.linear(xt, w)) ** 2).sum() for w in tW).backward()
row("4 projections fwd+bwd", tm(lambda: jax.block_until_ready(gp(jnp.asarray(Wq), xj))), tm(tproj))
# 4) layernorm fwd+bwd
gl = jax.jit(jax.grad(lambda s, x: jnp.sum(((x - x.mean(-1, keepdims=True)) * jax.lax.rsqrt(x.var(-1, keepdims=True) + 1e-5) * s) ** 2)))
ts_ = torch.ones(D, requires_grad=True); xtg = torch.tensor(x_np)
def tln(): (torch.nn.functional.layer_norm(xtg, (D,), ts_, None, 1e-5) ** 2).sum().backward()
row("layernorm fwd+bwd", tm(lambda: jax.block_until_ready(gl(jnp.ones(D), xj))), tm(tln))
# 5) embedding gather + grad
E = rng.standard_normal((V, D)).astype(np.float32); ids = rng.integers(0, V, (B, T))
ge = jax.jit(jax.grad(lambda E, i: jnp.sum(jnp.take(E, i, axis=0) ** 2)))
tE = torch.tensor(E, requires_grad=True); tids = torch.tensor(ids)
def temb(): (torch.nn.functional.embedding(tids, tE) ** 2).sum().backward()
row("embedding fwd+bwd", tm(lambda: jax.block_until_ready(ge(jnp.asarray(E), jnp.asarray(ids)))), tm(temb))
# 6) AdamW over 12.4M params
n = V * D + 6 * (4 * D * D + 2 * D * F)
pa = {"w": jnp.zeros((n,))}; tx = optax.adamw(1e-4, weight_decay=0.01); st = tx.init(pa)
@jax.jit
def upd_(p, s, g):
    u, s = tx.update(g, s, p); return optax.apply_updates(p, u), s
gr = {"w": jnp.ones((n,))}
upd_d = jax.jit(upd_.__wrapped__ if hasattr(upd_, "__wrapped__") else upd_, donate_argnums=(0, 1))
hold = [pa, st]
def upd(p, s, g):
    hold[0], hold[1] = upd_d(hold[0], hold[1], g); return hold[0]
tp = torch.zeros(n, requires_grad=True); topt = torch.optim.AdamW([tp], 1e-4, weight_decay=0.01); tp.grad = torch.ones(n)
row("adamw 12.4M", tm(lambda: jax.block_until_ready(upd(pa, st, gr))), tm(lambda: topt.step()))
print(json.dumps(ROWS))  # the figures, as JSON on the last line
