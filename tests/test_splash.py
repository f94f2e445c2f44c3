"""Pallas' splash-attention kernel, the TPU kernel of attention="splash" (jaxformer/layers/kernels/blockwise.py,
`_splash`): run in Pallas' interpret mode on CPU against dot_product_attention's plain path with the
same mask made dense (outputs, and the gradients of q, k, v and sinks), alone and under a mesh of
the host devices; the calls it refuses by name; and compiled for a TPU slice (v5e 2x2, by
libtpu's compiler on this host) in which the kernel runs per device under shard_map.

Measured (fp32, matmuls at "highest", B = 2, T = 256 in 128 x 128 blocks, H = 4, G = 2 unless
said, K = 16): max |splash - plain|, against bounds (OUT_TOL / GRAD_TOL of max |plain|) of
3.4e-6..7.2e-6 on outputs and 1.1e-5..6.6e-5 on gradients:
  case                      out      dq       dk       dv       dsinks
  bidirectional (G = H)     3.9e-7   6.0e-7   6.0e-7   4.8e-7
  bidirectional_window      5.4e-7   6.0e-7   1.3e-6   4.2e-7
  causal                    4.2e-7   4.2e-7   2.1e-6   1.9e-6
  causal_window_softcap     3.0e-7   4.2e-7   8.3e-7   7.2e-7
  key_padding               4.0e-7   4.8e-7   3.6e-6   1.9e-6
  segments (0 = padding)    6.0e-7   6.0e-7   2.0e-6   2.4e-6
  unmatched_segments_sinks  6.0e-7   4.8e-7   2.2e-6   1.7e-6   4.8e-7
fp32 sums in another order (the kernel's blocks and its online softmax); the same on the mesh
(bitwise equal to the run without one, but dsinks: 6e-8, summed over the devices).
The whole file takes ~45 s on 2 CPU cores, ~4 s per interpreted case.
"""
import contextlib
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxformer import lowering
from jaxformer.layers.attention import AttentionMask, ScoreMods, dot_product_attention
from jaxformer.layers.kernels import blockwise
from jaxformer.parity.results import GRAD_TOL, OUT_TOL

B, T, H, G, K = 2, 256, 4, 2, 16
BLOCKS = (128, 128)  # 2 x 2 blocks of splash's smallest size: skipped and partial blocks both occur


def _inputs(t=T, g=G, kv_width=K):
    r = np.random.RandomState(0)
    q, k = (jnp.asarray(r.standard_normal((B, t, n, K)), jnp.float32) for n in (H, g))
    v = jnp.asarray(r.standard_normal((B, t, g, kv_width)), jnp.float32)
    return q, k, v


def _segments():
    """Two packed documents and trailing padding in row 0; leading padding then one document in
    row 1 (segment 0 = padding)."""
    seg = np.zeros((B, T), np.int32)
    seg[0, :100], seg[0, 100:200], seg[1, 30:] = 1, 2, 3
    return jnp.asarray(seg)


def _unmatched():
    """Key segments other than the query ones: the queries 0..49 of row 0 (segment 1) see no key
    under the causal mask (keys 0..49 are segment 2), the rows the kernel must output as 0."""
    seg = _segments()
    mask = AttentionMask.self_attention(B, T, causal=True, segment_ids=seg)
    return dataclasses.replace(mask, k_segments=seg.at[0, :50].set(2))


CASES = {
    "causal": (AttentionMask.self_attention(1, T, causal=True), {}),
    "causal_window_softcap": (AttentionMask.self_attention(1, T, causal=True).with_window(40), dict(softcap=5.0)),
    "bidirectional": (AttentionMask.self_attention(1, T, causal=False), dict(g=H)),
    "bidirectional_window": (AttentionMask.self_attention(1, T, causal=False).with_window(70), {}),
    "segments": (AttentionMask.self_attention(B, T, causal=True, segment_ids=_segments()), {}),
    # the first 140 keys of row 0 padded: its queries 0..139 see nothing (output 0)
    "key_padding": (AttentionMask.self_attention(B, T, causal=True,
                                                 key_valid=jnp.arange(T)[None] >= jnp.array([[140], [0]])), {}),
    "unmatched_segments_sinks": (_unmatched(), dict(sinks=jnp.array([0.5, -1.0, 2.0, 0.0]))),
}


def _max_diff(a, b):
    return float(jnp.max(jnp.abs(a - b))), float(jnp.max(jnp.abs(b)))


def _check(name):
    """Output and gradients of the kernel (interpret mode) for CASES[name] against the plain path's."""
    mask, kw = CASES[name]
    softcap, sinks = kw.get("softcap"), kw.get("sinks")
    q, k, v = _inputs(g=kw.get("g", G))
    d_out = jnp.asarray(np.random.RandomState(1).standard_normal((B, T, H, K)), jnp.float32)

    def splash(q, k, v, sinks):
        return blockwise._splash(q, k, v, mask, bias=None, scale=None, softcap=softcap, sinks=sinks,
                                 interpret=True)

    def plain(q, k, v, sinks):
        return dot_product_attention(q, k, v, mask=mask.dense(), scores=ScoreMods(softcap=softcap, sinks=sinks))

    n = 3 if sinks is None else 4

    def out_and_grads(f):
        # one program per path: the output and, by its VJP with d_out, the gradients of
        # sum(f * d_out) with respect to q, k, v (and the sinks)
        def run(q, k, v, sinks):
            out, vjp = jax.vjp(lambda *a: f(*a, *(q, k, v, sinks)[n:]), *(q, k, v, sinks)[:n])
            return out, vjp(d_out)
        return jax.jit(run)(q, k, v, sinks)

    runs = {}
    with jax.default_matmul_precision("highest"), lowering.tracing(attention_blocks=BLOCKS):
        for label, f in (("splash", splash), ("plain", plain)):
            with lowering.recording_kernels() as log:
                runs[label] = out_and_grads(f)
            if label == "splash":
                assert set(log) == {"splash"}, log
    (out, grads), (out_ref, grads_ref) = runs["splash"], runs["plain"]
    err, ref = _max_diff(out, out_ref)
    assert err <= OUT_TOL.bound(ref), (name, "out", err, ref)
    for what, g, g_ref in zip(("dq", "dk", "dv", "dsinks"), grads, grads_ref, strict=False):
        err, ref = _max_diff(g, g_ref)
        assert err <= GRAD_TOL.bound(ref), (name, what, err, ref)
    if name in ("segments", "key_padding", "unmatched_segments_sinks"):  # rows that see nothing are 0
        empty = ~jnp.any(mask.dense(), axis=-1)[:, 0]  # [B, T]
        assert bool(jnp.any(empty)) and not bool(jnp.any(jnp.where(empty[:, :, None, None], out, 0)))
    return splash, (q, k, v, sinks)


@pytest.mark.parametrize("name", sorted(CASES))
def test_splash_matches_plain(name):
    """The kernel in interpret mode against the plain path (measured differences: the table above)."""
    _check(name)


def test_splash_on_a_mesh():
    """Under a mesh of the 8 host devices (data 2 x tensor 2 x fsdp 2) the kernel runs in shard_map,
    the batch split over data, the heads over tensor, replicated over fsdp: output and gradients
    (those of the sinks summed over the devices by shard_map's transpose) as without a mesh."""
    mesh = jax.make_mesh((2, 2, 2), ("data", "tensor", "fsdp"), axis_types=(jax.sharding.AxisType.Auto,) * 3)
    with jax.set_mesh(mesh), lowering.tracing(batch_axes=("data",), head_axes=("tensor",)):
        splash, args = _check("unmatched_segments_sinks")
        assert "shard_map" in str(jax.make_jaxpr(splash)(*args))


# ----------------------------------------------------------------------------- refused by name
def _refused(reason):
    """-> dot_product_attention's q, k, v, mask and bias for a call refused for `reason` (the traced
    slots and window are made inside the test's traced function)."""
    mask = AttentionMask.self_attention(1, T, causal=True)
    q, k, v = _inputs()
    bias = None
    if reason == "attention bias":
        bias = jnp.asarray(np.random.RandomState(3).standard_normal((1, H, T, T)), jnp.float32)
    elif reason == "ALiBi":
        mask = dataclasses.replace(mask, alibi_slopes=jnp.array([0.5, 0.25, 0.125, 0.0625]))
    elif reason == "value head dim differs":
        q, k, v = _inputs(kv_width=8)
    elif reason == "slots not 0..T-1":
        mask = AttentionMask.self_attention(1, T, causal=True, offset=3)
    elif reason == "window < 1":
        mask = mask.with_window(0)
    elif reason == "length not a multiple of 128":
        q, k, v = _inputs(t=96)
        mask = AttentionMask.self_attention(1, 96, causal=True)
    return q, k, v, mask, bias


@pytest.mark.parametrize("reason", ["attention bias", "ALiBi", "value head dim differs", "traced slots",
                                    "slots not 0..T-1", "traced window", "window < 1",
                                    "length not a multiple of 128", "matmul precision high"])
def test_refused_runs_blockwise(reason):
    """With attention="splash" traced for a TPU, what the kernel cannot take runs the blockwise
    path, noted as "blockwise (splash refused: <reason>)", and gives the blockwise path's output."""
    q, k, v, mask, bias = _refused(reason)
    precision = jax.default_matmul_precision("high") if reason == "matmul precision high" else contextlib.nullcontext()

    def attend(q, k, v, window):
        m = mask
        if reason == "traced slots":  # slots from a traced offset (a run-time start, e.g. a cache index)
            m = AttentionMask.self_attention(1, q.shape[1], causal=True, offset=window - window)
        if reason == "traced window":
            m = m.with_window(window)
        return dot_product_attention(q, k, v, mask=m, bias=bias)

    outs = {}
    for attention, platform in (("splash", "tpu"), ("blockwise", None)):
        with (precision, lowering.tracing(attention=attention, platform=platform, attention_blocks=BLOCKS),
              lowering.recording_kernels() as log):
            outs[attention] = jax.jit(lambda *a: attend(*a))(q, k, v, jnp.int32(40))  # traced anew
        if attention == "splash":
            assert log == [f"blockwise (splash refused: {reason})"], log
    np.testing.assert_array_equal(outs["splash"], outs["blockwise"])


def test_taken_through_dot_product_attention():
    """The same route with a mask the kernel takes notes "splash" (traced only: off a TPU only
    interpret mode could run it)."""
    q, k, v = _inputs()
    mask = AttentionMask.self_attention(1, T, causal=True).with_window(40)
    with lowering.tracing(attention="splash", platform="tpu"), lowering.recording_kernels() as log:
        jax.make_jaxpr(lambda q, k, v: dot_product_attention(q, k, v, mask=mask))(q, k, v)
    assert log == ["splash"]


# ----------------------------------------------------------------------------- compiled for a TPU
@pytest.mark.parametrize("precision, kernel_dtype", [("default", "bf16"), ("highest", "f32")])
def test_compiles_for_tpu_per_device(monkeypatch, precision, kernel_dtype):
    """value_and_grad of splash attention (causal window, packed documents, bf16 inputs) compiled for
    a v5e 2x2 slice from this host: the forward, dq and dkv kernels are TPU custom calls on each
    device's shard (batch over "data", heads over "tensor": 2 of the 4 query heads, T = 256,
    K = 128), and no collective moves q, k or v (the only one sums the scalar loss). Under the
    matmul precision "highest" the kernel runs on fp32 copies (Mosaic's fp32 contract precision
    takes no bf16 operands)."""
    from jax.experimental import topologies
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P
    # other processes on this host (jaxformer compile) may hold libtpu's lock: compiling needs no chip
    monkeypatch.setenv("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    topo = topologies.get_topology_desc(platform="tpu", topology_name="v5e:2x2")
    mesh = jax.sharding.Mesh(np.array(topo.devices).reshape(2, 2), ("data", "tensor"))
    t, kw = 256, 128
    base = AttentionMask.self_attention(1, t, causal=True).with_window(128)  # slots and window known

    def loss(q, k, v, segment_ids):
        mask = dataclasses.replace(base, q_segments=segment_ids, k_segments=segment_ids)
        return jnp.sum(dot_product_attention(q, k, v, mask=mask).astype(jnp.float32) ** 2)

    def arg(shape, spec, dtype=jnp.bfloat16):
        return jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, spec))
    heads = P("data", None, "tensor")
    args = (arg((B, t, H, kw), heads), arg((B, t, G, kw), heads), arg((B, t, G, kw), heads),
            arg((B, t), P("data"), jnp.int32))
    with (jax.set_mesh(mesh), jax.default_matmul_precision(precision), lowering.recording_kernels() as log,
          lowering.tracing(platform="tpu", attention="splash", batch_axes=("data",), head_axes=("tensor",))):
        compiled = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2))).lower(*args).compile()
    assert log == ["splash"]
    text = compiled.as_text()
    calls = [line for line in text.splitlines() if "tpu_custom_call" in line]
    assert len(calls) == 3, calls  # splash_mha_fwd, _dq, _dkv
    fwd = next(line for line in calls if "splash_mha_fwd" in line)
    assert f"{kernel_dtype}[{H // 2},{t},{kw}]" in fwd.split("custom-call(")[0], fwd  # its output: the local heads
    for op in ("all-gather", "all-to-all", "collective-permute", "reduce-scatter"):
        assert op not in text, op
    reduces = [line for line in text.splitlines() if " all-reduce(" in line]
    assert len(reduces) == 1 and "f32[]" in reduces[0].split("all-reduce(")[0], reduces
