"""The pure train and eval steps of the JAX trainer (jaxformer/train/jax_trainer.py), shared
by every parallel mode: `jax.jit` on one device or over a mesh, `jax.pmap` over local devices.

Losses are (sum, count) pairs, summed over micro-batches (gradient accumulation as a lax.scan)
and over devices (psum), and divided once by the global count: the step computes the same loss
and gradient however the global batch is split (jaxformer/train/tasks.py says how the MoE aux
losses compose).
"""
from __future__ import annotations

import contextlib

import jax
import jax.numpy as jnp
import optax

from jaxformer import lowering
from jaxformer.layers.kernels import quant_train
from jaxformer.train import lora, tasks
from jaxformer.train.config import CONTEXT_AXIS, RunConfig


def _cast_floats(tree, dtype):
    return jax.tree.map(lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x, tree)


class StepFns:
    """The pure train and eval steps for one model/config, shared by every parallel mode.

    `axis_name`: under pmap, the mapped device axis; the per-device sums are then psummed over
    it in `_psum`, the one place where the steps reduce across devices. Without it (jit, on one
    device or a mesh) `_psum` is the identity and XLA inserts any cross-device reductions."""

    def __init__(self, cfg: RunConfig, model, tx, schedule, axis_name: str | None = None):
        self.cfg, self.tx, self.schedule, self.axis_name = cfg, tx, schedule, axis_name
        model.train()
        self.graphdef_train = lora.split(model)[0]
        model.eval()
        self.graphdef_eval = lora.split(model)[0]
        model.train()
        self.compute_dtype = jnp.bfloat16 if cfg.train.precision == "bf16" else jnp.float32
        self.pad_id = getattr(cfg.model, "pad_id", 0)
        self.moe = tasks.moe_of(cfg.model) if cfg.model_name == "lm" else None

    @contextlib.contextmanager
    def tracing(self):
        """The switches the model is traced under: jaxformer/lowering.py's (train.attention and
        its blocks, train.loss_chunk_mib; with parallel.mesh.context > 1 the context axis: ring
        attention, the sequence split over it) and train.quantization's
        (layers/kernels/quant_train.py). Entered inside the step, so every wrapper (jit on one device or
        a mesh, pmap, a bench's own jit) traces the same program."""
        tc, mesh = self.cfg.train, self.cfg.parallel.mesh
        on_mesh = self.cfg.parallel.mode == "mesh"
        context = CONTEXT_AXIS if on_mesh and mesh.context > 1 else None
        rules = self.cfg.parallel.logical_axis_rules() if on_mesh else {}
        switches = lowering.tracing(attention=tc.attention, attention_blocks=tuple(tc.attention_blocks),
                                    context_axis=context, batch_axes=tuple(rules.get("batch", ())),
                                    head_axes=tuple(rules.get("heads", ())),
                                    pipeline_stages=mesh.pipeline if on_mesh else 1,
                                    pipeline_microbatches=self.cfg.parallel.microbatches if on_mesh else 1,
                                    **({} if tc.loss_chunk_mib is None else {"loss_chunk_bytes": tc.loss_chunk_mib << 20}))
        with switches, quant_train.training(tc.quantization):  # int8 / fp8 products, or float
            yield

    def _psum(self, x):
        return jax.lax.psum(x, self.axis_name) if self.axis_name else x

    def loss_terms(self, graphdef, params, rest, batch, train: bool = False, frozen=None):
        """`frozen`: a LoRA run's base params (train/lora.py), never differentiated."""
        if self.compute_dtype != jnp.float32:
            params = _cast_floats(params, self.compute_dtype)
            frozen = None if frozen is None else lora.cast_frozen(frozen, self.compute_dtype)
            batch = {k: (v.astype(self.compute_dtype) if jnp.issubdtype(v.dtype, jnp.floating) else v)
                     for k, v in batch.items()}
        # fresh Variable objects at this trace level: NNX refuses to mutate (advance the dropout
        # RNG count of) Variables that were unflattened at an outer level (jit vs grad)
        rest = jax.tree.map(lambda x: x, rest)
        model = lora.merge(graphdef, params, frozen, rest)
        kw = {"axis_name": self.axis_name} if self.axis_name else {}  # pmap: MoE aux over all devices
        with self.tracing():
            loss, count, metrics = tasks.forward_loss(self.cfg.family, model, batch,
                                                      self.cfg.train.label_smoothing, self.pad_id, **kw)
        if train:  # the objective adds the MoE aux losses; eval reports the task's loss alone
            loss = tasks.objective(loss, metrics, self.moe)
        new_rest = lora.split(model)[-1]
        return loss.astype(jnp.float32), (count, metrics, new_rest)

    def train_step(self, state, batch):
        """state: {params, opt_state, rest, step}; batch: arrays [A, micro, ...]."""
        params, frozen = state["params"], state.get("frozen")
        grad_fn = jax.value_and_grad(lambda p, r, b: self.loss_terms(self.graphdef_train, p, r, b, True, frozen),
                                     has_aux=True)

        def terms(rest, mb):  # one micro-batch -> (grads, loss, count, metrics, rest)
            (loss, (count, metrics, rest)), g = grad_fn(params, rest, mb)
            return g, loss, count, metrics, rest

        def micro(carry, mb):
            *new, rest = terms(carry[-1], mb)
            return (*jax.tree.map(jnp.add, carry[:-1], tuple(new)), rest), None

        if jax.tree.leaves(batch)[0].shape[0] == 1:
            # one micro-batch: no accumulation loop, whose zero-filled gradient sums and adds
            # cost time and whose boundary stops XLA fusing across it.
            g_sum, l_sum, c_sum, m_sum, rest = terms(state["rest"], jax.tree.map(lambda x: x[0], batch))
        else:
            zeros = jax.tree.map(jnp.zeros_like, params)
            m0 = tasks.metric_zeros(self.cfg.family, self.cfg.model)
            init = (zeros, jnp.zeros((), jnp.float32), jnp.zeros((), jnp.float32), m0, state["rest"])
            (g_sum, l_sum, c_sum, m_sum, rest), _ = jax.lax.scan(micro, init, batch)
        g_sum, l_sum, c_sum, m_sum = self._psum((g_sum, l_sum, c_sum, m_sum))
        c_sum = jnp.maximum(c_sum, 1.0)  # a loss-masked step may hold no target: loss 0, not NaN
        load = m_sum.pop(tasks.EXPERT_LOAD, None)  # [n_sparse, E] over the step's micro-batches and devices
        grads = jax.tree.map(lambda g: g / c_sum, g_sum)
        updates, opt_state = self.tx.update(grads, state["opt_state"], params)
        new_params = optax.apply_updates(params, updates)
        loss, grad_norm = l_sum / c_sum, optax.tree.norm(grads)
        # A NaN/inf loss or gradient norm: this step leaves params and optimiser state as they
        # were (a select inside the jitted step, no host round trip), and says which quantity.
        # train.on_nonfinite decides on the host whether the run stops or goes on.
        bad = (~jnp.isfinite(loss)).astype(jnp.int32) + 2 * (~jnp.isfinite(grad_norm)).astype(jnp.int32)
        keep = bad == 0
        if self.moe is not None and self.moe.bias_update_rate:  # DeepSeek's aux-loss-free balancing
            rest = tasks.update_score_bias(rest, load, self.moe.bias_update_rate * keep.astype(jnp.float32))
        new_params = jax.tree.map(lambda n, o: jnp.where(keep, n, o), new_params, params)
        opt_state = jax.tree.map(lambda n, o: jnp.where(keep, n, o), opt_state, state["opt_state"])
        out = {"loss": loss, "grad_norm": grad_norm, "lr": self.schedule(state["step"]),
               "nonfinite": bad, **{k: v / c_sum for k, v in m_sum.items()}}
        new = {"params": new_params, "opt_state": opt_state, "rest": rest, "step": state["step"] + 1}
        if frozen is not None:  # a LoRA base passes through unchanged (bit-identical)
            new["frozen"] = frozen
        return new, out

    def eval_step(self, params, rest, batch, frozen=None):
        loss, (count, metrics, _) = self.loss_terms(self.graphdef_eval, params, rest, batch, frozen=frozen)
        metrics = {k: v for k, v in metrics.items() if not k.startswith("moe_")}
        return self._psum({"loss": loss, "count": count, **metrics})
