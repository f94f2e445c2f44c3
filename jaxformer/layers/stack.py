"""How a stack runs its layers: a Python loop, or (scan_layers) one lax.scan over params stacked
on a leading layer axis; remat (jax.checkpoint with train.remat's policy) around each layer; and
what each layer sows (named intermediates, the MoE's auxiliary outputs), collected per layer by
sow.capture (nnx.capture). The stacks in transformer.py call these. Twin:
torch_ref/layers/stack.py (the loop and the captures; torch has no scan or remat here).

A layer is run as call(layer, x, local), `local` saying whether it is a sliding-window layer
(layer_flags). When the stack's caller wants intermediates or aux outputs, each call runs under
sow.capture: inside the scan's body under scan_layers, inside the jax.checkpoint'd function
under remat, so the sown values leave those transforms as explicit outputs and never as module
state. The layer sows its sub-layer outputs (SUBLAYERS) and a sparse layer's MoE its AUX outputs.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx
from jax.ad_checkpoint import checkpoint_name

from jaxformer import lowering
from jaxformer.config import ConfigError, TransformerConfig
from jaxformer.layers import sow
from jaxformer.layers.kernels import partitioning, pipeline, ring

# the sub-layer intermediates of one layer in depth order (transformer.py's docstring): output
# name -> the name the layer sows it under (a sub-layer's output as "<name>_output": the bare
# names "cross_attn" and "ffn" are the layer's submodules', sow.py)
SUBLAYERS = {"attn_weights": "attn_weights", "attn": "attn_output", "attn_residual": "attn_residual",
             "cross_attn_weights": "cross_attn_weights", "cross_attn": "cross_attn_output",
             "cross_attn_residual": "cross_attn_residual", "ffn": "ffn_output"}
# what a sparse layer's MoE sows (models/lm.py return_aux)
AUX = ("router_logits", "expert_load")


def layer_flags(cfg: TransformerConfig, scan: bool):
    """Per layer, is it a sliding-window layer: a tuple of Python bools, or for a scanned
    stack of mixed layers a [num_layers] bool array (scanned over with the params)."""
    local = cfg.local_layers()
    if not scan or len(set(local)) == 1:
        return local
    return jnp.asarray(local)


def make_layers(cfg: TransformerConfig, make, rngs: nnx.Rngs):
    """num_layers layers from make(rngs, options) (options: the layer's cfg.layer_options(i),
    e.g. sparse: its FFN is the MoE): a list, or with cfg.scan_layers one module whose params
    carry a leading layer axis [L, ...] (nnx.vmap over split RNG streams; its layers must be
    alike)."""
    n = cfg.num_layers
    options = [cfg.layer_options(i) for i in range(n)]
    if not cfg.scan_layers:
        return nnx.List([make(rngs, options[i]) for i in range(n)])
    check_alike(cfg, options)

    @nnx.split_rngs(splits=n)
    @nnx.vmap(in_axes=(0,), out_axes=0, axis_size=n,
              transform_metadata={nnx.PARTITION_NAME: partitioning.LAYERS_AXIS})
    def stacked(rngs):
        return make(rngs, options[0])
    return stacked(rngs)


def check_alike(cfg: TransformerConfig, options: list[dict]) -> None:
    """ConfigError unless every layer has the same construction options (scan_layers stacks
    one layer's structure)."""
    if len({o["sparse"] for o in options}) > 1:
        raise ConfigError("model.scan_layers: the scanned layers must be alike, but moe.dense_layers "
                          f"{list(cfg.feedforward.moe.dense_layers)} mixes dense and MoE layers; set "
                          "scan_layers: false (or make every layer sparse)")
    if len({o["local"] for o in options}) > 1:  # two RoPE tables (§33, §36)
        raise ConfigError(f"model.scan_layers: the scanned layers must be alike, but rope_local_base="
                          f"{cfg.positions.rope_local_base} gives the sliding-window layers a RoPE of their own "
                          f"(rope_base={cfg.positions.rope_base} elsewhere); set scan_layers: false")
    if len({o["attn_norm"] for o in options}) > 1:
        raise ConfigError("model.scan_layers: the scanned layers must be alike, but first_attn_norm=false "
                          "removes layer 0's attn_norm only; set scan_layers: false")


def run_layers(stack, x, call, intermediates: dict | None, aux: dict | None = None, rows=None):
    """x -> call(layer, x, local) for every layer of `stack` (a stack module: its `layers`,
    `cfg`, `scan_layers`, `remat_policy`), as a Python loop or (scan_layers) one lax.scan over
    the stacked params. With remat_policy, each layer's activations are recomputed in the
    backward pass (jax.checkpoint with that policy), also inside the scan. With intermediates
    (a dict), each layer's sown sub-layer outputs go to it as "layers.i.<name>" (SUBLAYERS
    order) before "layers.i". With `aux` (a dict), the sparse layers' sown AUX outputs go to
    it, stacked in layer order ([n_sparse, ...]). `rows`: the layers' other inputs with a batch
    dim (the mask record, positions), given to call(layer, x, local, rows); a pipelined stack
    (lowering's pipeline_stages > 1: kernels/pipeline.py) splits them by microbatch with x."""
    if rows is not None:
        inner, call = call, (lambda layer, h, local: inner(layer, h, local, rows))
    if lowering.active().pipeline_stages > 1 and stack.scan_layers and rows is not None:
        if intermediates is not None or aux is not None:
            raise ValueError("a pipelined stack returns no intermediates or MoE aux outputs")
        return pipeline.run(stack, x, inner, rows, layer_flags(stack.cfg, True),
                            lowering.remat_policy(stack.remat_policy))
    policy = lowering.remat_policy(stack.remat_policy)
    keep = intermediates is not None
    run = sow.capture(call) if keep or aux is not None else lambda *a: (call(*a), {})
    flags = layer_flags(stack.cfg, stack.scan_layers)
    if not stack.scan_layers:
        layer_aux = []
        for i, layer in enumerate(stack.layers):
            x, layer_sown = _remat_call(layer, x, run, policy, flags[i]) if policy else run(layer, x, flags[i])
            x = ring.shard_sequence(x)  # split over the context axis between layers, if any
            if keep:
                store_layer(intermediates, f"layers.{i}", layer_sown, x)
            layer_aux.append(aux_of(layer_sown))
        for k in AUX if aux is not None else ():
            found = [a[k] for a in layer_aux if k in a]
            if found:
                aux[k] = jnp.stack(found)
        return x
    graphdef, state = nnx.split(stack.layers)
    uniform = isinstance(flags, tuple)

    def body(h, xs):
        h = checkpoint_name(h, lowering.LAYER_INPUT)  # what an offloading policy keeps on the host
        layer_state, local = (xs, flags[0]) if uniform else xs
        layer = nnx.merge(graphdef, jax.tree.map(lambda a: a, layer_state))
        h, layer_sown = run(layer, h, local)
        h = ring.shard_sequence(h)  # split over the context axis, if any
        return h, ((h if keep else None, layer_sown), nnx.state(layer))

    if policy:
        body = jax.checkpoint(body, policy=policy)
    x, (ys, new_state) = jax.lax.scan(body, x, state if uniform else (state, flags))
    nnx.update(stack.layers, new_state)  # advanced dropout RNG counts
    hs, sown = ys  # stacked along a leading layer axis
    if aux is not None:
        aux.update(aux_of(sown))
    if keep:
        for i in range(stack.cfg.num_layers):
            store_layer(intermediates, f"layers.{i}", {k: v[i] for k, v in sown.items()}, hs[i])
    return x


def scan_cached(stack, x, cache: dict, call, intermediates: dict | None, flags):
    """The cached call of a scanned stack: one lax.scan over the layers, each step taking its
    layer's params and its slice of the stacked cache ([L, B, G, S, K] leaves) and giving back
    that slice updated; call(layer, h, layer_cache, local). -> (x, new stacked cache). The layer copies inside the scan are not written back: decoding draws no dropout
    (generate runs in eval mode), and a decode loop traces this call inside its own loop, where
    the model's variables belong to an outer trace and cannot be set."""
    graphdef, state = nnx.split(stack.layers)
    keep = intermediates is not None
    uniform = isinstance(flags, tuple)

    def body(h, xs):
        if uniform:
            (layer_state, layer_cache), local = xs, flags[0]
        else:
            layer_state, layer_cache, local = xs
        layer = nnx.merge(graphdef, jax.tree.map(lambda a: a, layer_state))
        h, layer_cache = call(layer, h, layer_cache, local)
        return h, (h if keep else None, layer_cache)

    x, (ys, new_cache) = jax.lax.scan(body, x, (state, cache) if uniform else (state, cache, flags))
    if keep:
        for i in range(stack.cfg.num_layers):
            intermediates[f"layers.{i}"] = ys[i]
    return x, new_cache


def _remat_call(layer, x, run, policy, local: bool = False):
    """run(layer, x, local) -> (y, sown) under jax.checkpoint, threading the layer's state
    (dropout RNG) through; the sown values come out of the checkpoint as outputs."""
    graphdef, state = nnx.split(layer)

    def f(state, h):
        h = checkpoint_name(h, lowering.LAYER_INPUT)  # what an offloading policy keeps on the host
        inner = nnx.merge(graphdef, jax.tree.map(lambda a: a, state))
        y, sown = run(inner, h, local)
        return y, sown, nnx.state(inner)

    y, sown, new_state = jax.checkpoint(f, policy=policy)(state, x)
    nnx.update(layer, new_state)
    return y, sown


def store_layer(intermediates: dict, prefix: str, sown: dict, x) -> None:
    """prefix.<sub-layer> from the layer's sown values in SUBLAYERS (depth) order, then prefix
    (e.g. "layers.3") itself: x."""
    for name, sown_as in SUBLAYERS.items():
        if sown_as in sown:
            intermediates[f"{prefix}.{name}"] = sown[sown_as]
    intermediates[prefix] = x


def aux_of(sown: dict) -> dict:
    """The AUX outputs among a layer's sown values, in AUX order, by their own names (the MoE's
    "ffn.router_logits" -> "router_logits")."""
    by_name = {k.rsplit(".", 1)[-1]: v for k, v in sown.items()}
    return {k: by_name[k] for k in AUX if k in by_name}
