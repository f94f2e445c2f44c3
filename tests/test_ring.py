"""Context parallelism: ring attention (jaxformer/layers/kernels/ring.py) against the plain path, outputs
and gradients, on data 2 x context 4 and context 4 x tensor 2 meshes of the 8 host devices
(tests/conftest.py); the blocks its steps skip; its torch twin; the zigzag layout; the LM's training trajectory on a
context 4 x data 2 mesh against one device (RoPE, GQA, a sliding-window layer, packed
documents) and the collectives of its train step; the config checks of parallel.mesh.context
and train.attention."""
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from helpers import step_losses

from jaxformer import lowering
from jaxformer.config import ConfigError
from jaxformer.layers.attention import AttentionMask, ScoreMods, dot_product_attention
from jaxformer.layers.kernels import ring
from jaxformer.train.config import config_from_dict

B, T, H, G, K = 2, 16, 4, 2, 8
SEGMENTS = np.array([[1] * 5 + [2] * 7 + [0] * 4, [1] * 9 + [2] * 7])  # two documents, then padding
VALID = np.array([[1] * 14 + [0] * 2, [1] * 16], bool)


def _mesh(axes=("data", "context")):
    return jax.make_mesh((2, 4) if axes[0] != "context" else (4, 2), axes,
                         axis_types=(jax.sharding.AxisType.Auto,) * 2)


def _inputs():
    ks = jax.random.split(jax.random.key(0), 4)
    return (jax.random.normal(ks[0], (B, T, H, K)), jax.random.normal(ks[1], (B, T, G, K)),
            jax.random.normal(ks[2], (B, T, G, K)), jax.random.normal(ks[3], (H,)))


# causal + padding + window + packed segments + GQA in the zigzag layout on data 2 x context 4;
# bidirectional + padding + ALiBi + soft-cap + sinks in the contiguous one on context 4 x
# tensor 2 (heads, slopes and sinks split over tensor)
CASES = {
    "causal_window_segments_zigzag": (dict(causal=True, key_valid=VALID, segment_ids=SEGMENTS), 5, False, True),
    "bidirectional_alibi_softcap_sinks_tensor": (dict(causal=False, key_valid=VALID), None, True, False),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_ring_attention_matches_plain(case):
    assert jax.device_count() == 8
    parts, window, extras, zigzag = CASES[case]
    q, k, v, sinks = _inputs()
    mask = AttentionMask.self_attention(1, T, **{n: None if a is None else jnp.asarray(a) for n, a in parts.items()})
    mask = mask.with_window(window) if window else mask
    kw = {}
    if extras:
        mask = AttentionMask(mask.q_slots, mask.k_slots, k_valid=mask.k_valid, causal=mask.causal,
                             alibi_slopes=jnp.asarray([0.5, 0.25, 0.125, 0.0625]))
        kw = dict(softcap=3.0)
    order = ring.zigzag_order(T, 4) if zigzag else np.arange(T)
    back = np.argsort(order)

    def ring_loss(q, k, v, sinks):
        with lowering.tracing(context_axis="context", attention="blockwise"):
            out = dot_product_attention(q[:, order], k[:, order], v[:, order], mask=ring.permute_mask(mask, order),
                                        scores=ScoreMods(sinks=sinks if extras else None, **kw))[:, back]
        return jnp.sum(jnp.sin(out)), out

    def plain_loss(q, k, v, sinks):
        out = dot_product_attention(q, k, v, mask=mask.dense(), bias=mask.dense_bias(),
                                    scores=ScoreMods(sinks=sinks if extras else None, **kw))
        return jnp.sum(jnp.sin(out)), out

    grad = lambda f: jax.jit(jax.grad(f, argnums=(0, 1, 2, 3), has_aux=True))
    with jax.set_mesh(_mesh(("context", "tensor") if extras else ("data", "context"))):
        g_ring, out_ring = grad(ring_loss)(q, k, v, sinks)
    g_plain, out_plain = grad(plain_loss)(q, k, v, sinks)
    d_out = float(jnp.max(jnp.abs(out_ring - out_plain)))
    d_grad = max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(g_ring, g_plain, strict=True))
    print(f"{case}: max |d out| {d_out:.1e}, max |d grad| {d_grad:.1e}")
    assert d_out <= 2e-6 and d_grad <= 5e-6
    assert float(jnp.max(jnp.abs(out_plain[0, 12:]))) == 0.0 if zigzag else True  # padding rows output 0
    assert float(jnp.max(jnp.abs(g_plain[3]))) > 0 if extras else True  # the sinks have a gradient


def test_zigzag_layout_balances_causal_work():
    order = ring.zigzag_order(16, 4)
    assert sorted(order) == list(range(16))
    np.testing.assert_array_equal(order[:4], [0, 1, 14, 15])  # device 0: chunks 0 and 7
    visible = [(np.add.outer(s, 0) >= np.add.outer(0, s)).sum() for s in order.reshape(4, 4)]
    assert len(set(visible)) == 1  # every device's queries see as many causal keys
    x = jnp.asarray(order)[None, :, None] * jnp.ones((2, 1, 3))  # [B, T, 3] holding its slots
    np.testing.assert_array_equal(ring.from_zigzag(x, 4)[1, :, 2], np.arange(16))
    with pytest.raises(ValueError, match="divisible by 2 x 4"):
        ring.zigzag_order(12, 4)


def test_ring_steps_skip_masked_blocks():
    """Each ring step is the blockwise kernel, whose plan skips the fully masked blocks: causal
    zigzag over 4 devices in blocks of one chunk computes n(2n+1) = 36 of the 64 (query block,
    key block) pairs of all devices and steps (docs/numerics.md §30)."""
    n, s = 4, T // 4
    order = ring.zigzag_order(T, n)
    assert ring.step_blocks(s) == (s // 2, s // 2)  # the default blocks, capped at a chunk

    @jax.jit
    def visited(slots):  # [n, T/n] the slots each device holds -> blocks computed, blocks in all
        def pair(qs, ks):
            x = jnp.zeros((1, s, 1, 1))
            _, args = ring._step_args(x, x, x, (qs[None], None), (ks[None], None, None), None, None, scale=1.0,
                                      softcap=None, causal=True, blocks=ring.step_blocks(s))
            return jnp.sum(args[-1]["count"]), args[-1]["order"].size
        return jax.vmap(lambda qs: jax.vmap(lambda ks: pair(qs, ks))(slots))(slots)
    count, size = visited(jnp.asarray(order.reshape(n, s)))
    assert (int(count.sum()), int(size.sum())) == (n * (2 * n + 1), 4 * n * n)


def test_torch_twin_matches_torch_plain():
    from torch_ref.layers.attention import AttentionMask as TMask
    from torch_ref.layers.attention import ScoreMods as TScoreMods
    from torch_ref.layers.attention import dot_product_attention as tdpa
    from torch_ref.layers.kernels import ring as tring
    q, k, v, sinks = (torch.from_numpy(np.array(a)) for a in _inputs())
    mask = TMask.self_attention(1, T, causal=True, segment_ids=torch.from_numpy(SEGMENTS)).with_window(5)
    order = tring.zigzag_order(T, 4)
    np.testing.assert_array_equal(order, ring.zigzag_order(T, 4))
    got = tring.ring_attention(q[:, order], k[:, order], v[:, order], tring.permute_mask(mask, order),
                               sinks=sinks, softcap=3.0, shards=4)[:, np.argsort(order)]
    want = tdpa(q, k, v, mask=mask.dense(), scores=TScoreMods(sinks=sinks, softcap=3.0))
    d = float((got - want).abs().max())
    print(f"torch ring (4 shards) vs plain: max |d out| {d:.1e}")
    assert d <= 2e-6


# ----------------------------------------------------------------------------- training
MODEL = {"name": "lm", "vocab_size": 259, "max_len": 32, "d_model": 32, "num_heads": 4, "num_kv_heads": 2,
         "d_ff": 64, "num_layers": 2, "dropout": 0.0, "position": "rope", "norm": "rmsnorm", "ffn": "swiglu",
         "bias": False, "tie_embeddings": False}
# normal_0.02 init and lr 1e-3: with the default init and lr 1e-2, plain data parallelism (data 2,
# no ring) already drifts 1.2e-4 from one device by step 3 (Adam's first steps are lr-sized sign
# steps, so fp32 summation-order noise in small gradients moves the weights by lr); here data 2
# and context 4 x data 2 both stay within 1e-6 of one device
TRAIN = {"steps": 3, "batch_size": 4, "lr": 1e-3, "schedule": "constant", "warmup_steps": 0, "eval_every": 3,
         "eval_batches": 1, "checkpoint_every": 3, "async_checkpoint": False, "sample_tokens": 0,
         "init": "normal_0.02"}
CONTEXT = {"mode": "mesh", "mesh": {"data": 2, "context": 4}}


def _tokens_dir(path):
    """Packed documents of 3-13 ids (so every window holds several), eos-separated."""
    from jaxformer.train.data.tokens import TokensWriter
    rng = np.random.default_rng(2)
    record = {"spec": "test", "kind": "tokenizers", "file": None, "sha256": "a" * 64}
    with TokensWriter(str(path), vocab_size=64, eos_id=2, tokenizer=record, overwrite=True) as w:
        for i, n in enumerate(rng.integers(3, 14, 80)):
            w.add("eval" if i % 5 == 4 else "train", rng.integers(3, 64, n))
    return str(path)


def _losses(cfg, workdir, steps: int, text: bool = True):
    """The trainer's first `steps` train-step losses (helpers.step_losses: its mesh, shardings,
    batches and jitted step; no eval or checkpoint), and the compiled text of its train step
    (None unless `text`: the one-device runs' text is never read, and getting it lowers and
    compiles again)."""
    from jaxformer.train.jax_trainer import JaxTrainer
    tr = JaxTrainer(cfg, workdir, progress=False)
    compiled = []
    losses = step_losses(tr, steps, (lambda state, batch: compiled.append(
        tr.train_step.lower(state, batch).compile().as_text())) if text else None)
    return losses, (compiled[0] if text else None), tr


def test_context_parallel_matches_single_device(tmp_path):
    """context 4 x data 2 (ring attention, zigzag, sequence-sharded activations) follows the
    one-device trajectory within 1e-5: an LM with RoPE and GQA, a sliding-window layer and a
    full one, on packed documents (segment ids)."""
    model = {**MODEL, "sliding_window": 5, "layer_types": ["sliding_attention", "full_attention"]}
    raw = {"model": model, "data": {"name": "tokens", "path": _tokens_dir(tmp_path / "tok"), "seq_len": 16},
           "train": TRAIN}
    single, _, _ = _losses(config_from_dict(raw), str(tmp_path / "single"), 3, text=False)
    ctx, text, tr = _losses(config_from_dict({**raw, "parallel": CONTEXT}), str(tmp_path / "context"), 3)
    assert tr.mesh.shape["context"] == 4 and tr.mesh.shape["data"] == 2 and tr.cfg.data.packing == "segments"
    assert "collective-permute(" in text  # the ring ran
    # the forward pass moves no whole sequence of activations [.., T, D] between devices (the
    # zigzag and its inverse go as shard-sized pieces; the gather form of the inverse all-gathers
    # the hidden states). The backward does: XLA's partitioner all-gathers the activations for
    # the weight gradients at these tiny shapes (docs/numerics.md §30)
    whole = []
    for line in text.splitlines():
        m = re.search(r"= (.*?) (all-gather|all-reduce|all-to-all)(-start)?\(", line)
        op = re.search(r'op_name="([^"]*)"', line)
        if m and op and "transpose(" not in op.group(1):
            shapes = [tuple(int(d) for d in dims.split(",")) for dims in re.findall(r"\[([\d,]+)\]", m.group(1))]
            whole += [(m.group(2), sh) for sh in shapes if len(sh) >= 3 and sh[-2:] == (16, 32)]
    assert not whole, whole
    d = max(abs(a - b) for a, b in zip(single, ctx, strict=False))
    print(f"context 4 x data 2 vs one device, losses {ctx}: max |d loss| {d:.1e}")
    assert len(ctx) == 3 and d <= 1e-5


def test_context_parallel_moe_matches_single_device(tmp_path):
    """An MoE LM (4 experts, top-2, a dense first layer, aux and z losses) under context 4 x
    data 2 follows the one-device trajectory: routing is per token, the aux losses are means
    over the global batch. Measured: max |d loss| 4.8e-7 over 3 steps."""
    moe = {"num_experts": 4, "top_k": 2, "router": "softmax_topk", "d_expert": 32, "dense_layers": [0],
           "aux_loss_coef": 0.1, "z_loss_coef": 0.01}
    raw = {"model": {**MODEL, "moe": moe}, "train": TRAIN,
           "data": {"name": "tokens", "path": _tokens_dir(tmp_path / "tok"), "seq_len": 16}}
    single, _, _ = _losses(config_from_dict(raw), str(tmp_path / "single"), 3, text=False)
    ctx, text, _ = _losses(config_from_dict({**raw, "parallel": CONTEXT}), str(tmp_path / "context"), 3)
    assert "collective-permute(" in text  # the ring ran
    assert len(ctx) == 3 and max(abs(a - b) for a, b in zip(single, ctx, strict=False)) <= 1e-5


# ----------------------------------------------------------------------------- config
def _cfg(parallel=None, model=None, data=None, **train):
    return config_from_dict({"model": {**MODEL, **(model or {})}, "data": data or {"name": "stdlib_docs", "seq_len": 16},
                             "train": {**TRAIN, **train}, "parallel": parallel or {}})


def test_context_and_attention_config_checks():
    cfg = _cfg(CONTEXT, attention="blockwise", attention_blocks=[8, 4])
    assert cfg.parallel.mesh.context == 4 and cfg.train.attention_blocks == (8, 4)
    for kw, match in [
        (dict(parallel={"mode": "mesh", "mesh": {"context": 3}}), r"seq_len=16 does not divide by 2 x parallel.mesh.context = 6"),
        (dict(parallel={"mode": "none", "mesh": {"context": 2}}), r"context=2 needs parallel.mode: mesh"),
        (dict(parallel={"mode": "mesh", "mesh": {"context": 0}}), r"context"),
        (dict(parallel=CONTEXT, model={"attn_dropout": 0.1}), r"attention dropout"),
        (dict(attention="flash"), r"attention"),
        (dict(attention="blockwise", attention_blocks=[0, 4]), r"attention_blocks"),
        (dict(attention="blockwise", dropout=0.1), r"train.attention=blockwise does not apply attention dropout"),
    ]:
        with pytest.raises(ConfigError, match=match):
            _cfg(**kw)
    with pytest.raises(ConfigError, match="lm only"):
        config_from_dict({"model": {"name": "seq2seq", "vocab_size": 259, "max_len": 32, "d_model": 32,
                                    "num_heads": 4, "d_ff": 64, "num_layers": 1},
                          "data": {"name": "dates"}, "parallel": CONTEXT})

