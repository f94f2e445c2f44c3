"""The token loss in sequence chunks (jaxformer/layers/kernels/chunked_loss.py): the loss, the
accuracy count and every gradient equal the unchunked cross-entropy within float32 rounding,
alone (label smoothing, weight-0 targets, padding to a multiple of the chunk count) and inside
the trainer's own step (the llama LM, tied embeddings with Gemma2's final soft-cap, the
seq2seq model with its label smoothing and pad targets); no float32 [B, T, V] array is left in
the chunked step's program; the chunk count rule.

Bounds: the project's fp32 rule (docs/numerics.md §19; per leaf, atol + rtol x max |unchunked
leaf|, outputs 1e-6 + 2e-6, gradients 1e-6 + 1e-5), for two sums of the same terms in another
order. Measured (fp32, matmuls at "highest"; worst leaf, max |difference| / max |leaf|): bare
head 1.5e-7 on the loss, 3.3e-7 on the gradients; the llama step 1.1e-7 / 5.0e-7; the tied,
soft-capped lm 0 / 6.5e-7; seq2seq 0 / 1.7e-7; llama on a mesh 0 / 2.6e-7: at most 0.075 of the
tolerance (docs/numerics.md §47).
"""
from __future__ import annotations

import contextlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxformer import lowering
from jaxformer.layers.kernels.chunked_loss import chunk_count, chunked_cross_entropy_sum
from jaxformer.layers.loss import cross_entropy_sum
from jaxformer.parity.results import GRAD_TOL, OUT_TOL
from jaxformer.train.config import load_config


def _worst(a, b, tol) -> tuple[float, float]:
    """-> (max over leaves of max |a - b| / max |a leaf|, of max |a - b| / the leaf's tolerance)."""
    rel = ratio = 0.0
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=False):
        scale, diff = float(jnp.max(jnp.abs(x))), float(jnp.max(jnp.abs(x - y)))
        rel = max(rel, diff / max(scale, 1e-30))
        ratio = max(ratio, diff / (tol.atol + tol.rtol * scale))
    return rel, ratio


def _check(name, loss0, loss1, grads0, grads1) -> None:
    (l_rel, l_ratio), (g_rel, g_ratio) = _worst(loss0, loss1, OUT_TOL), _worst(grads0, grads1, GRAD_TOL)
    print(f"{name}: loss {float(loss0):.8g} vs {float(loss1):.8g} ({l_rel:.1e} relative, {l_ratio:.3f} of tol), "
          f"gradients worst leaf {g_rel:.1e} relative, {g_ratio:.3f} of tol")
    assert l_ratio <= 1.0 and g_ratio <= 1.0


@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
def test_chunked_equals_unchunked(label_smoothing):
    """A [D, V] head over B = 3 rows of T = 37 tokens, ~20% of the targets weight 0, some targets
    the argmax (so `correct` counts), chunks of 8 tokens per row: 5 chunks, 3 padded tokens."""
    r = np.random.RandomState(0)
    b, t, d, v = 3, 37, 16, 50
    h = jnp.asarray(r.standard_normal((b, t, d)), jnp.float32)
    state = {"w": jnp.asarray(r.standard_normal((d, v)) * 0.5, jnp.float32)}
    head = lambda st, h: (h @ st["w"]).astype(jnp.float32)
    labels = np.asarray(r.randint(0, v, (b, t)))
    top = np.asarray(jnp.argmax(head(state, h), -1))
    labels[:, ::3] = top[:, ::3]
    labels = jnp.asarray(labels)
    weights = jnp.asarray(r.rand(b, t) > 0.2, jnp.float32)
    assert chunk_count(b, t, v, b * 8 * v * 4) == 5

    def f(chunked):
        def loss(st, h):
            if chunked:
                return chunked_cross_entropy_sum(head, st, h, labels, weights, label_smoothing, chunk_bytes=b * 8 * v * 4)
            return cross_entropy_sum(head(st, h), labels, weights, label_smoothing)
        return jax.jit(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True))(state, h)

    (l0, c0), g0 = f(False)
    (l1, c1), g1 = f(True)
    assert float(c0) == float(c1) > 0
    _check(f"bare head, eps {label_smoothing}", l0, l1, g0, g1)


TINY = ["model.d_model=32", "model.num_heads=4", "model.d_ff=64", "model.num_layers=2", "train.batch_size=4"]
TINY_LM = TINY + ["model.num_kv_heads=2", "data.seq_len=24"]
TINY_SEQ2SEQ = TINY + ["model.num_decoder_layers=2", "data.src_len=32", "data.tgt_len=12", "model.dropout=0.0",
                       "model.embed_dropout=0.0"]


def _step_terms(cfg, budget, batch):
    """The train step's loss terms and gradients (StepFns.loss_terms under value_and_grad) with
    the loss in chunks of at most `budget` bytes of logits per device (None: whole); on the
    config's mesh of the host devices when parallel.mode is mesh."""
    from jaxformer.train import aot
    mesh = aot.mesh_for(cfg, jax.devices()[:4]) if cfg.parallel.mode == "mesh" else None
    return _terms(cfg, budget, batch, mesh)


def _terms(cfg, budget, batch, mesh):
    from jaxformer.convert import scan_prefixes
    from jaxformer.train import init as init_lib
    from jaxformer.train.optim import make_optax
    from jaxformer.train.steps import StepFns
    model = init_lib.abstract_model(cfg.model_name, cfg.model, 0)
    tx, schedule = make_optax(cfg.train, init_lib.lora.split(model)[1], scan_prefixes(model))
    state = init_lib.create_state(cfg.model_name, cfg.model, "normal_0.02", 0, tx)
    fns = StepFns(cfg, model, tx, schedule)
    grad = jax.value_and_grad(lambda p, b: fns.loss_terms(fns.graphdef_train, p, state["rest"], b, True), has_aux=True)
    on_mesh = jax.set_mesh(mesh) if mesh is not None else contextlib.nullcontext()
    with lowering.tracing(loss_chunk_bytes=budget), on_mesh:
        (loss, (count, metrics, _)), g = jax.jit(grad)(state["params"], batch)
        jaxpr = jax.make_jaxpr(grad)(state["params"], batch)
    return loss, metrics["correct"], g, jaxpr


def _f32_shapes(jaxpr) -> set:
    """The shapes of every float32 value a jaxpr (and its sub-jaxprs) computes."""
    out = set()
    for eqn in jaxpr.eqns:
        out |= {tuple(v.aval.shape) for v in eqn.outvars if getattr(v.aval, "dtype", None) == jnp.float32}
        for p in eqn.params.values():
            for j in (p if isinstance(p, (tuple, list)) else (p,)):
                inner = getattr(j, "jaxpr", None)
                if inner is not None and hasattr(inner, "eqns"):
                    out |= _f32_shapes(inner)
                elif hasattr(j, "eqns"):
                    out |= _f32_shapes(j)
    return out


@pytest.mark.parametrize("config,sets", [
    ("llama", TINY_LM),
    ("lm", TINY_LM + ["model.final_logit_softcap=3.0", "train.label_smoothing=0.1"]),  # tied embeddings, soft-capped
    ("seq2seq", TINY_SEQ2SEQ),  # tied output, label smoothing 0.1, pad targets
    ("llama", TINY_LM + ["parallel.mode=mesh", "parallel.mesh.data=2", "parallel.mesh.fsdp=2"]),  # per device
])
def test_train_step_chunked_equals_unchunked(config, sets):
    """The trainer's step: loss, correct and every parameter gradient with the loss in 4+ chunks
    against the whole logits; the chunked program holds no float32 [B, T, V] array."""
    cfg = load_config(config, sets)
    r = np.random.RandomState(3)
    if cfg.model_name == "lm":
        batch = {"tokens": jnp.asarray(r.randint(3, 259, (4, 25)), jnp.int32)}
        b, t = 4, 24
    else:
        tgt = r.randint(3, 259, (4, 13))
        tgt[:, 9:] = 0  # pad targets: weight 0
        batch = {"src": jnp.asarray(r.randint(3, 259, (4, 32)), jnp.int32), "tgt_in": jnp.asarray(tgt[:, :-1], jnp.int32),
                 "tgt_out": jnp.asarray(tgt[:, 1:], jnp.int32)}
        b, t = 4, 12
    v = 259
    budget = b * 4 * v * 4  # 4 tokens of each row per chunk
    l0, c0, g0, jaxpr0 = _step_terms(cfg, None, batch)
    l1, c1, g1, jaxpr = _step_terms(cfg, budget, batch)
    assert float(c0) == float(c1)
    _check(config, l0, l1, g0, g1)
    def whole(jaxpr):  # float32 logits of every token at once ([B, T, V], or its rows flattened)
        return [s for s in _f32_shapes(jaxpr.jaxpr) if s[-1:] == (v,) and (s[:-1] == (b, t) or s[:-1] == (b * t,))]
    assert (b, t, v) in whole(jaxpr0) and not whole(jaxpr), whole(jaxpr)
    assert [s for s in _f32_shapes(jaxpr.jaxpr) if len(s) == 3 and s[1:] in ((4, v), (12, v))]  # a chunk's logits


def test_chunk_count():
    """The fewest chunks whose float32 logits per device fit the budget, or up to twice as many
    where a count divides T (no padding); one chunk when the whole fits or no budget is set."""
    budget = 1 << 30  # train.loss_chunk_mib: 1024
    assert chunk_count(3, 8192, 128256, budget) == 16  # Llama-3.1-8B, 3 rows a chip: 512 tokens (788 MB) a chunk
    assert chunk_count(32, 128, 259, budget) == 1  # the suite's configs: whole
    assert chunk_count(3, 8192, 128256, None) == 1  # the default (train.loss_chunk_mib unset)
    assert chunk_count(1, 10, 100, 3 * 100 * 4) == 5  # 3 tokens a chunk would take 4 chunks, padded; 5 divide 10
    assert chunk_count(1, 12, 100, 5 * 100 * 4) == 3  # 3 chunks of 4 (12 % 3 == 0)
    assert chunk_count(1, 13, 100, 1) == 13  # at least a token a chunk


def test_train_loss_chunk_mib_reaches_the_step():
    """train.loss_chunk_mib sets the lowering's budget inside the step (StepFns.tracing); unset,
    the loss takes the logits whole (the default: see docs/numerics.md §47 for why)."""
    import types

    from jaxformer.train.steps import StepFns
    for sets, want in (([], None), (["train.loss_chunk_mib=1024"], 1 << 30)):
        cfg = load_config("llama", TINY_LM + sets)
        with StepFns.tracing(types.SimpleNamespace(cfg=cfg)):
            assert lowering.active().loss_chunk_bytes == want
