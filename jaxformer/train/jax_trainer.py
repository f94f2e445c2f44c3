"""JAX training: one pair of pure step functions (StepFns), wrapped per `parallel.mode`:
`jax.jit` on one device (none), `jax.jit` over a sharded mesh (mesh), or `jax.pmap` over the
local devices (pmap), where the steps' one reduction becomes a psum over the data axis.

Why it is built this way:
- The NNX model is split once into (graphdef, params, rest). The step is a pure function of
  plain pytrees, jitted once; we never pay nnx.jit's graph traversal per step.
- `rest` holds the non-parameter state, i.e. the dropout RNG streams; it is threaded through
  the step and checkpointed, so a resumed run draws the same dropout masks.
- Losses are (sum, count) pairs, summed over micro-batches (gradient accumulation as a
  lax.scan) and over devices (psum), and divided once by the global count: the step computes
  the same loss and gradient however the global batch is split.
- bf16 compute casts the fp32 params inside the loss, so the gradients, the params and the
  optimiser state stay fp32.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from jaxformer.models import build_model
from jaxformer.train import data as data_lib
from jaxformer.train import init as init_lib
from jaxformer.train import tasks
from jaxformer.train.checkpoint import Checkpointer
from jaxformer.train.config import RunConfig, save_config
from jaxformer.train.logging_utils import MetricsWriter, Progress
from jaxformer.train.optim import make_optax

DATA_AXIS = "data"  # pmap's device axis: the one the steps' psum reduces over


def model_config_for_training(cfg: RunConfig):
    """The model config with train-time overrides applied (dropout)."""
    mcfg = cfg.model
    if cfg.train.dropout is not None and hasattr(mcfg, "dropout"):
        mcfg = dataclasses.replace(mcfg, dropout=cfg.train.dropout)
    return mcfg


def build_jax_model(cfg: RunConfig):
    model = build_model(cfg.model_name, model_config_for_training(cfg), seed=cfg.train.seed)
    init_lib.init_flax(model, cfg.train.init, cfg.train.seed)
    if cfg.train.init_from:  # fine-tune: start from a converted / imported checkpoint
        from jaxformer.checkpoint_io import load_params_into
        load_params_into(model, cfg.train.init_from)
    set_remat(model, cfg.train.remat_policy if cfg.train.remat else None)
    return model


def set_remat(model, policy: str | None) -> None:
    """Activation checkpointing per layer: every stack with a `remat_policy` attribute."""
    for _, m in nnx.iter_graph(model):
        if isinstance(m, nnx.Module) and hasattr(m, "remat_policy"):
            m.remat_policy = policy


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
        self.graphdef_train, _, _ = nnx.split(model, nnx.Param, ...)
        model.eval()
        self.graphdef_eval, _, _ = nnx.split(model, nnx.Param, ...)
        model.train()
        self.compute_dtype = jnp.bfloat16 if cfg.train.precision == "bf16" else jnp.float32
        self.pad_id = getattr(cfg.model, "pad_id", 0)

    def _psum(self, x):
        return jax.lax.psum(x, self.axis_name) if self.axis_name else x

    def loss_terms(self, graphdef, params, rest, batch):
        if self.compute_dtype != jnp.float32:
            params = _cast_floats(params, self.compute_dtype)
            batch = {k: (v.astype(self.compute_dtype) if jnp.issubdtype(v.dtype, jnp.floating) else v)
                     for k, v in batch.items()}
        # fresh Variable objects at this trace level: NNX refuses to mutate (advance the dropout
        # RNG count of) Variables that were unflattened at an outer level (jit vs grad)
        rest = jax.tree.map(lambda x: x, rest)
        model = nnx.merge(graphdef, params, rest)
        loss, count, metrics = tasks.forward_loss(self.cfg.model_name, model, batch,
                                                  self.cfg.train.label_smoothing, self.pad_id)
        _, _, new_rest = nnx.split(model, nnx.Param, ...)
        return loss.astype(jnp.float32), (count, metrics, new_rest)

    def train_step(self, state, batch):
        """state: {params, opt_state, rest, step}; batch: arrays [A, micro, ...]."""
        params = state["params"]
        grad_fn = jax.value_and_grad(lambda p, r, b: self.loss_terms(self.graphdef_train, p, r, b),
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
            m0 = {k: jnp.zeros((), jnp.float32) for k in tasks.metric_keys(self.cfg.model_name)}
            init = (zeros, jnp.zeros((), jnp.float32), jnp.zeros((), jnp.float32), m0, state["rest"])
            (g_sum, l_sum, c_sum, m_sum, rest), _ = jax.lax.scan(micro, init, batch)
        g_sum, l_sum, c_sum, m_sum = self._psum((g_sum, l_sum, c_sum, m_sum))
        grads = jax.tree.map(lambda g: g / c_sum, g_sum)
        updates, opt_state = self.tx.update(grads, state["opt_state"], params)
        new_params = optax.apply_updates(params, updates)
        out = {"loss": l_sum / c_sum, "grad_norm": optax.tree.norm(grads),
               "lr": self.schedule(state["step"]),
               **{k: v / c_sum for k, v in m_sum.items()}}
        return {"params": new_params, "opt_state": opt_state, "rest": rest,
                "step": state["step"] + 1}, out

    def eval_step(self, params, rest, batch):
        loss, (count, metrics, _) = self.loss_terms(self.graphdef_eval, params, rest, batch)
        return self._psum({"loss": loss, "count": count, **metrics})


def init_state(cfg: RunConfig, model, tx):
    _, params, rest = nnx.split(model, nnx.Param, ...)
    return {"params": params, "opt_state": tx.init(params), "rest": rest,
            "step": jnp.zeros((), jnp.int32)}


def shape_batch(batch: dict, accum: int, devices: int | None = None) -> dict:
    """[B, ...] -> [A, B/A, ...], or [D, A, B/(A D), ...] for pmap."""
    def f(x):
        b = x.shape[0]
        if devices:
            return x.reshape((devices, accum, b // (accum * devices)) + x.shape[1:])
        return x.reshape((accum, b // accum) + x.shape[1:])
    return {k: f(v) for k, v in batch.items()}


class JaxTrainer:
    """Runs a whole config: data, steps, eval, checkpoints, metrics. See jaxformer/cli/train.py."""

    def __init__(self, cfg: RunConfig, workdir: str, *, resume: bool = False, progress: bool = True,
                 model=None, quiet: bool = False):
        self.cfg, self.workdir = cfg, workdir
        self.quiet = quiet
        os.makedirs(workdir, exist_ok=True)
        self.primary = jax.process_index() == 0
        if self.primary:
            save_config(cfg, os.path.join(workdir, "config.yaml"))
        tc = cfg.train
        self.train_data, self.eval_data = data_lib.load_dataset(cfg.data_name, cfg.data, tc.seed)
        self.model = model if model is not None else build_jax_model(cfg)
        _, params, _ = nnx.split(self.model, nnx.Param, ...)
        from jaxformer.convert import scan_prefixes
        self.tx, self.schedule = make_optax(tc, params, scan_prefixes(self.model))
        self.mode = cfg.parallel.mode
        self.mesh = None
        self.devices = None  # pmap: the number of local devices the steps are mapped over
        if self.mode == "pmap":
            self.devices = cfg.parallel.num_devices or jax.local_device_count()
            if tc.batch_size % (tc.grad_accum_steps * self.devices):
                raise ValueError(f"train.batch_size={tc.batch_size} must divide into "
                                 f"grad_accum_steps={tc.grad_accum_steps} x {self.devices} devices")
        self.fns = StepFns(cfg, self.model, self.tx, self.schedule,
                           axis_name=DATA_AXIS if self.mode == "pmap" else None)
        self.state = init_state(cfg, self.model, self.tx)
        if self.mode == "mesh":
            self._setup_mesh()
        self.train_step, self.eval_step = self._wrap_steps()
        self.ckpt = Checkpointer(os.path.join(workdir, "checkpoints"), keep=tc.keep_checkpoints,
                                 async_save=tc.async_checkpoint, primary=self.primary)
        self.start_step = 0
        if resume and self.ckpt.all_steps():
            self.state, record = self.ckpt.restore(self.state)
            self.start_step = int(record["step"])
        self.metrics = MetricsWriter(workdir, resume_step=self.start_step if resume else None,
                                     enabled=self.primary)
        self.progress_enabled = progress and self.primary
        self.last_eval: dict = {}
        self.history: list[dict] = []

    def _wrap_steps(self):
        """-> (train_step, eval_step): the shared StepFns, pmapped over the local devices or
        jitted (on a mesh, with the state's shardings out). The train state is donated."""
        if self.mode == "pmap":
            devs = jax.local_devices()[: self.devices]
            return (jax.pmap(self.fns.train_step, axis_name=DATA_AXIS, donate_argnums=0, devices=devs),
                    jax.pmap(self.fns.eval_step, axis_name=DATA_AXIS, devices=devs))
        train_kw, eval_kw = {}, {}
        if self.mesh is not None:
            from jax.sharding import NamedSharding, PartitionSpec
            replicated = NamedSharding(self.mesh, PartitionSpec())
            train_kw, eval_kw = {"out_shardings": (self.shardings, replicated)}, {"out_shardings": replicated}
        return (jax.jit(self.fns.train_step, donate_argnums=0, **train_kw),
                jax.jit(self.fns.eval_step, **eval_kw))

    # ------------------------------------------------------------------ mesh
    def _setup_mesh(self) -> None:
        """A (data, fsdp, tensor) mesh, the state's shardings, and the state placed on them;
        see train/sharding.py."""
        from jaxformer.train import sharding
        m = self.cfg.parallel.mesh
        n = self.cfg.parallel.num_devices
        devices = jax.devices()[:n] if n else jax.devices()
        self.mesh = sharding.make_mesh(m.data, m.fsdp, m.tensor, devices=devices)
        shards = self.mesh.shape["data"] * self.mesh.shape["fsdp"]
        tc = self.cfg.train
        if tc.micro_batch % shards:
            raise ValueError(f"train.batch_size / grad_accum_steps = {tc.micro_batch} must divide by "
                             f"data x fsdp = {shards}")
        from jaxformer.convert import scan_prefixes
        prefixes = [".".join(map(str, p)) + "." for p in scan_prefixes(self.model)]
        stacked = (lambda key: int(any(key.startswith(p) for p in prefixes))) if prefixes else None
        self.shardings = sharding.state_shardings(self.state, self.mesh, stacked)
        self.state = sharding.place(self.state, self.shardings)
        self.batch_sharding = sharding.batch_sharding(self.mesh)
        self.eval_sharding = sharding.batch_sharding(self.mesh, accum_axis=False)

    def _global(self, host_batch: dict, sharding, axis: int) -> dict:
        """Each process feeds its own slice of the global batch (dim `axis`, split over data x fsdp)."""
        n, i = jax.process_count(), jax.process_index()

        def f(v):
            per = v.shape[axis] // n
            local = np.take(v, np.arange(i * per, (i + 1) * per), axis=axis)
            return jax.make_array_from_process_local_data(sharding, local, v.shape)
        return {k: f(v) for k, v in host_batch.items()}

    def memory_report(self) -> dict:
        """Per-device bytes of parameters and optimiser state (device 0 of this process)."""
        from jaxformer.train.sharding import per_device_bytes
        p, o = per_device_bytes(self.state["params"]), per_device_bytes(self.state["opt_state"])
        d0 = next(k for k in p if k.startswith("device"))
        return {"param_bytes_total": p["total"], "param_bytes_per_device": p[d0],
                "opt_bytes_total": o["total"], "opt_bytes_per_device": o.get(d0, 0)}

    # ------------------------------------------------------------------ per-mode placement
    def _replicate(self, tree):
        """pmap: one copy per device along a leading axis; other modes: the tree itself."""
        if not self.devices:
            return tree
        return jax.tree.map(lambda x: jnp.broadcast_to(x, (self.devices,) + x.shape), tree)

    def _unreplicate(self, tree):
        """pmap: the first device's copy (all are equal after the psum); other modes: the tree
        itself. The copy is read from that device's own buffer and reshaped there: `x[0]` on a
        pmapped array is instead a program over all the devices that all-reduces (a static
        slice of a sharded array), one cross-device collective per leaf, and XLA:CPU aborts
        the whole process when a collective's devices do not all arrive within its rendezvous
        timeout (40 s), which a loaded machine reaches. The reshape makes a new buffer, so a
        later donation of `tree` to the train step cannot delete the result."""
        if not self.devices:
            return tree
        return jax.tree.map(lambda x: x.addressable_data(0).reshape(x.shape[1:]), tree)

    def _train_batch(self, host_batch: dict) -> dict:
        """[B, ...] -> the train step's [A, B/A, ...] ([D, A, B/(A D), ...] under pmap; global
        arrays on a mesh)."""
        batch = shape_batch(host_batch, self.cfg.train.grad_accum_steps, self.devices)
        return self._global(batch, self.batch_sharding, axis=1) if self.mesh is not None else batch

    def _eval_batch(self, host_batch: dict) -> dict:
        """[B, ...] -> the eval step's [B, ...] ([D, B/D, ...] under pmap; global arrays on a mesh)."""
        if self.devices:
            return {k: v.reshape((self.devices, -1) + v.shape[1:]) for k, v in host_batch.items()}
        return self._global(host_batch, self.eval_sharding, axis=0) if self.mesh is not None else host_batch

    def evaluate(self, state) -> dict:
        params, rest = state["params"], state["rest"]
        totals: dict[str, float] = {}
        for batch in data_lib.eval_batches(self.eval_data, self.cfg.train.batch_size, self.cfg.train.eval_batches):
            sums = self._unreplicate(self.eval_step(params, rest, self._eval_batch(batch)))
            for k, v in sums.items():
                totals[k] = totals.get(k, 0.0) + float(v)
        return tasks.eval_metrics(self.cfg.model_name, totals) if totals else {}

    # ------------------------------------------------------------------ loop
    def run(self) -> list[dict]:
        tc = self.cfg.train
        state = self._replicate(self.state)
        unit = "tok" if self.cfg.model_name in tasks.TOKEN_MODELS + ("classifier",) else "samples"
        bar = Progress(tc.steps, self.start_step, unit, enabled=self.progress_enabled)
        step = self.start_step
        on_mesh = jax.set_mesh(self.mesh) if self.mesh is not None else contextlib.nullcontext()
        try:
            with on_mesh:
                while step < tc.steps:
                    host_batch = data_lib.batch_at(self.train_data, step, tc.batch_size, tc.seed)
                    state, out = self.train_step(state, self._train_batch(host_batch))
                    step += 1
                    out = jax.device_get(self._unreplicate(out))
                    record = {"step": step, **{k: float(v) for k, v in out.items()}}
                    if step % tc.eval_every == 0 or step == tc.steps:
                        self.last_eval = self.evaluate(state)
                        record.update(self.last_eval)
                        if self.primary:
                            bar.write(f"step {step}: "
                                      + ", ".join(f"{k} {v:.4f}" for k, v in self.last_eval.items()))
                    self.history.append(record)
                    self.metrics.write(record)
                    bar.update(record["loss"], record["lr"], tasks.tokens_in(self.cfg.model_name, host_batch))
                    if step % tc.checkpoint_every == 0 or step == tc.steps:
                        self.ckpt.save(step, self._unreplicate(state), {"config": self.cfg.to_dict()},
                                       eval_loss=record.get("eval_loss"))
        finally:
            bar.close()
            self.ckpt.close()
            self.metrics.close()
        self.state = self._unreplicate(state)
        return self.history

    def trained_model(self):
        """The model with the trained params (eval mode)."""
        model = nnx.merge(self.fns.graphdef_eval, self.state["params"], self.state["rest"])
        return model


def params_numpy(state, prefixes: tuple = ()) -> dict:
    """Flat {torch key: array in torch layout} of a train state's params (for comparisons);
    `prefixes`: the model's scanned stacks (jaxformer.convert.scan_prefixes)."""
    from jaxformer import convert
    out = {}
    for path, v in nnx.to_flat_state(state["params"]):
        out.update(convert.flax_leaf_to_torch(tuple(path), np.asarray(v.get_value()), prefixes))
    return out
