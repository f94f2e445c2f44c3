"""JAX training: one pair of pure step functions (StepFns, jaxformer/train/steps.py), wrapped
per `parallel.mode`: `jax.jit` on one device (none), `jax.jit` over a sharded mesh (mesh), or
`jax.pmap` over the local devices (pmap), where the steps' one reduction becomes a psum over
the data axis.

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
import json
import math
import os
import signal
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxformer import lowering
from jaxformer.config.base import ConfigError, replace
from jaxformer.config.module import MODULE
from jaxformer.train import data as data_lib
from jaxformer.train import faults, tasks
from jaxformer.train import init as init_lib
from jaxformer.train import lora as lora_lib
from jaxformer.train import workdir as workdir_lib
from jaxformer.train.checkpoint import Checkpointer
from jaxformer.train.config import RunConfig, save_config
from jaxformer.train.data import pipeline
from jaxformer.train.logging_utils import MetricsWriter, Progress
from jaxformer.train.optim import make_optax
from jaxformer.train.steps import StepFns  # cli/eval.py and the benches import it from here

DATA_AXIS = "data"  # pmap's device axis: the one the steps' psum reduces over
# The jitted steps of this process's recent one-device trainers, by the config they are traced
# from: another trainer of that config (a resume, a test's second run) reuses them, so it
# neither traces nor compiles its steps again. Mesh and pmap trainers, and trainers given a
# model, build their own. The train fields below steer only the host loop, never the steps.
_STEPS: dict[str, tuple] = {}
_STEPS_KEPT = 4
_LOOP_FIELDS = ("eval_every", "eval_batches", "checkpoint_every", "keep_checkpoints", "async_checkpoint",
                "log_every", "on_nonfinite", "sample_tokens", "sample_temperature", "sample_top_p")


# lr schedules that never read train.steps (optim.lr_multiplier): under them a run's steps are
# the same program whatever its length, so a longer resume shares a shorter run's steps
_STEP_FREE_SCHEDULES = ("constant", "inverse_sqrt")


def _steps_key(cfg: RunConfig) -> str:
    """The whole config but the host-loop fields (and train.steps under a schedule that does
    not read it), as sorted JSON."""
    raw = cfg.to_dict()
    skip = _LOOP_FIELDS + (("steps",) if cfg.train.schedule in _STEP_FREE_SCHEDULES else ())
    raw["train"] = {k: v for k, v in raw["train"].items() if k not in skip}
    return json.dumps(raw, sort_keys=True, default=str)


def model_config_for_training(cfg: RunConfig):
    """The model config with train-time overrides applied: train.dropout sets every dropout
    rate of the model (`dropout` and each `*_dropout` field)."""
    mcfg = cfg.model
    if cfg.train.dropout is not None:
        mcfg = replace(mcfg, **dict.fromkeys(dropout_fields(mcfg), cfg.train.dropout))
    return mcfg


def dropout_fields(mcfg) -> list[str]:
    """The dropout rates of a model config: `dropout` and each `*_dropout` field, a record's by
    its path (`attention.attn_dropout`)."""
    out = [f.name for f in dataclasses.fields(mcfg) if f.init and (f.name == "dropout" or f.name.endswith("_dropout"))]
    return out + [p for p in getattr(type(mcfg), "FLAT_PATHS", {}).values() if p.endswith("_dropout")]


def build_jax_model(cfg: RunConfig):
    """The whole model on one device, with the values the trainer starts from (its init on a
    single device, or train.init_from)."""
    name, mcfg, tc = cfg.model_name, model_config_for_training(cfg), cfg.train
    abstract = init_lib.abstract_model(name, mcfg, tc.seed)
    graphdef, params, rest = nnx.split(abstract, nnx.Param, ...)
    rest = init_lib.create_rest(name, mcfg, tc.seed)
    if tc.init_from:  # fine-tune: start from a converted / imported checkpoint (its buffers too)
        from jaxformer.checkpoint_io import check_init_from_layout, load_params_sharded
        check_init_from_layout(tc.init_from, mcfg)
        params, rest = load_params_sharded(tc.init_from, params, init_lib.single_device(params), rest)
    else:
        params = init_lib.create_params(name, mcfg, tc.init, tc.seed, params)
    model = nnx.merge(graphdef, params, rest)
    if tc.lora is not None:  # the adapters on the loaded/initialised base
        lora_lib.adapt(model, tc.lora, tc.seed)
    set_remat(model, tc.remat_policy if tc.remat else None)
    return model


def check_module(cfg: RunConfig) -> None:
    """A model.module against its task, before a run touches its workdir: built abstractly (a
    bad class, kwargs or axes override is a ConfigError there) and its call traced on two train
    examples (tasks.check_call). Other models: nothing to do."""
    if cfg.model_name != MODULE:
        return
    train, _ = data_lib.load_sources(cfg.data_name, cfg.data, cfg.train.seed)
    model = init_lib.abstract_model(MODULE, model_config_for_training(cfg), cfg.train.seed)
    tasks.check_call(cfg, model, pipeline.read_rows(train, np.arange(min(2, len(train)))))


def unannotated_params(cfg: RunConfig) -> str:
    """What the mesh does with a parameter without logical axes (train/sharding.py): an error for
    our own models, replicated for a model.module's."""
    return "replicate" if cfg.model_name == MODULE else "error"


def set_remat(model, policy: str | None) -> None:
    """Activation checkpointing per layer: every stack with a `remat_policy` attribute."""
    for _, m in nnx.iter_graph(model):
        if isinstance(m, nnx.Module) and hasattr(m, "remat_policy"):
            m.remat_policy = policy


def init_state(cfg: RunConfig, model, tx):
    _, params, frozen, rest = lora_lib.split(model)
    state = {"params": params, "opt_state": tx.init(params), "rest": rest, "step": jnp.zeros((), jnp.int32)}
    return state if frozen is None else {**state, "frozen": frozen}


def shape_batch(batch: dict, accum: int, devices: int | None = None) -> dict:
    """[B, ...] -> [A, B/A, ...], or [D, A, B/(A D), ...] for pmap."""
    def f(x):
        b = x.shape[0]
        if devices:
            return x.reshape((devices, accum, b // (accum * devices)) + x.shape[1:])
        return x.reshape((accum, b // accum) + x.shape[1:])
    return {k: f(v) for k, v in batch.items()}


class JaxTrainer:
    """Runs a whole config: data, steps, eval, checkpoints, metrics. See jaxformer/cli/train.py
    and jaxformer/train/workdir.py for what a run may do to its workdir.

    Construction checks everything that can be checked before training (workdir rules, the
    resumed step against train.steps) and writes nothing in the workdir until they pass."""

    def __init__(self, cfg: RunConfig, workdir: str, *, resume: bool = False, overwrite: bool = False,
                 progress: bool = True, model=None, quiet: bool = False):
        self.cfg, self.workdir = cfg, workdir
        self.quiet = quiet
        self.primary = jax.process_index() == 0
        if model is None:
            check_module(cfg)  # before the workdir is touched
        ckpt_dir = os.path.join(workdir, "checkpoints")
        steps = checkpoint_steps(ckpt_dir)
        self.lock, self.config_changes = workdir_lib.open_workdir(
            workdir, cfg, resume=resume, overwrite=overwrite, has_checkpoint=bool(steps),
            primary=self.primary)
        if resume:  # before the (slow) restore; checked again against the step restored
            try:
                workdir_lib.check_resumed_step(steps[-1], cfg.train.steps, workdir)
            except ValueError:
                if self.lock is not None:
                    self.lock.release(remove=True)
                raise
        try:
            self._setup(model, ckpt_dir, resume)
        except BaseException:
            if self.lock is not None:
                self.lock.release(remove=True)
            raise
        self.progress_enabled = progress and self.primary
        self.last_eval: dict = {}
        self.history: list[dict] = []
        self.stopped_by: str | None = None  # "SIGTERM" when a preemption signal ended the run
        self.preemption_grace: float | None = None  # seconds a preemption stop may take (faults.py)

    def _setup(self, model, ckpt_dir: str, resume: bool) -> None:
        """The run's parts, phase by phase (each reads what the ones before it set); the run
        writes its config, checkpoints and metrics only from _setup_claim on."""
        self._setup_data()
        given = self._setup_model(model)
        key, cached = self._setup_optimizer(given)
        self._setup_parallel(cached)
        self._setup_state(given, resume, key, cached)
        newer = self._setup_resume(ckpt_dir, resume)
        self._setup_claim()
        self._setup_checkpoints(ckpt_dir, newer)
        self._setup_metrics(resume)

    def _setup_data(self) -> None:
        """The random-access sources (grain reads them in run(); train/data/pipeline.py) and the
        tokenizer they were made with."""
        cfg = self.cfg
        self.train_data, self.eval_data = data_lib.load_sources(cfg.data_name, cfg.data, cfg.train.seed)
        self.tokenizer, self.tokenizer_file = data_lib.tokenizer_info(cfg.data_name, cfg.data)

    def _setup_model(self, model) -> bool:
        """self.model: the config's, abstract (the state is created later, directly in its
        shardings), or a caller's (`model`; adapters added under train.lora unless it has
        them, and a module's call checked against the task). -> whether a caller gave it."""
        cfg, tc = self.cfg, self.cfg.train
        given = model is not None
        if not given:  # abstract: the state is created below, directly in its shardings
            model = init_lib.abstract_model(cfg.model_name, model_config_for_training(cfg), tc.seed, tc.lora)
            set_remat(model, tc.remat_policy if tc.remat else None)
        elif tc.lora is not None:  # a caller's model: adapters added unless it has them
            lora_lib.adapt(model, tc.lora, tc.seed)
        self.model = model
        if given and cfg.model_name == MODULE:  # a caller's module: its call and logits against the task
            tasks.check_call(cfg, model, pipeline.read_rows(self.train_data, np.arange(min(2, len(self.train_data)))))
        return given

    def _setup_optimizer(self, given: bool):
        """The optimiser and its schedule (a cached config's own), the abstract train state and
        the check that it fits. -> (key, cached): this config's _STEPS key (None: not cached)
        and its cached (StepFns, train step, eval step), or None."""
        cfg, tc = self.cfg, self.cfg.train
        _, params, _, _ = lora_lib.split(self.model)  # what trains: the adapters under train.lora
        from jaxformer.convert import scan_prefixes
        key = _steps_key(cfg) if not given and cfg.parallel.mode == "none" else None
        cached = _STEPS.get(key)  # (StepFns, jitted train step, jitted eval step) of this config
        if cached is not None:
            self.model.train()  # as StepFns leaves the model it splits
        self.tx, self.schedule = (cached[0].tx, cached[0].schedule) if cached else \
            make_optax(tc, params, scan_prefixes(self.model))
        self.abstract_state = init_lib.abstract_state_of(self.model, self.tx)
        init_lib.check_fits(self.abstract_state, "the train state (parameters and optimiser state)")
        return key, cached

    def _setup_parallel(self, cached) -> None:
        """The parallel mode: pmap's local devices (the batch checked against them) or a mesh
        and the state's shardings (_setup_mesh); the step functions for it; the rows of each
        batch this process reads."""
        cfg, tc = self.cfg, self.cfg.train
        self.mode = cfg.parallel.mode
        if cfg.parallel.slices > 1 and self.mode != "mesh":
            raise ConfigError(f"parallel.slices: {cfg.parallel.slices} slices need parallel.mode: mesh (a hybrid mesh "
                              f"over them), got {self.mode!r}")
        self.mesh = None
        self.devices = None  # pmap: the number of local devices the steps are mapped over
        if self.mode == "pmap":
            self.devices = cfg.parallel.num_devices or jax.local_device_count()
            if tc.batch_size % (tc.grad_accum_steps * self.devices):
                raise ValueError(f"train.batch_size={tc.batch_size} is not divisible by grad_accum_steps="
                                 f"{tc.grad_accum_steps} x {self.devices} devices = "
                                 f"{tc.grad_accum_steps * self.devices}: use a multiple of "
                                 f"{tc.grad_accum_steps * self.devices}")
        self.fns = cached[0] if cached else StepFns(cfg, self.model, self.tx, self.schedule,
                                                    axis_name=DATA_AXIS if self.mode == "pmap" else None)
        self.shardings = None
        if self.mode == "mesh":
            self._setup_mesh()
        # the processes that read the data: on a mesh each reads its own rows of every batch
        self.readers = (jax.process_index(), jax.process_count()) if self.mesh is not None else (0, 1)
        self.train_rows = pipeline.process_rows(tc.batch_size, tc.grad_accum_steps, *self.readers)
        self.eval_rows = pipeline.process_rows(tc.batch_size, 1, *self.readers)
        self.batches = None  # the train iterator, while run() runs
        self.data_state: dict | None = None  # the checkpoint's pipeline state, on resume

    def _setup_state(self, given: bool, resume: bool, key, cached) -> None:
        """The train state (_initial_state: a restore's target on resume) and the wrapped train
        and eval steps, kept in _STEPS under `key`."""
        self.state = self._initial_state(given, resume)
        self.train_step, self.eval_step = cached[1:] if cached else self._wrap_steps()
        if key is not None and cached is None:
            _STEPS[key] = (self.fns, self.train_step, self.eval_step)
            while len(_STEPS) > _STEPS_KEPT:
                _STEPS.pop(next(iter(_STEPS)))

    def _setup_resume(self, ckpt_dir: str, resume: bool) -> list[int]:
        """The step to start from, the skipped steps and the best eval loss so far; on resume the
        newest checkpoint restored into the state (read-only until the resumed step is
        accepted), with the pipeline's saved state. -> the saved steps past the restored one."""
        tc, workdir = self.cfg.train, self.workdir
        self.start_step = 0
        self.skipped_steps = 0
        self.best_eval = workdir_lib.best_eval_loss(workdir) if resume else float("inf")
        newer: list[int] = []
        if resume:  # read-only until the resumed step is accepted
            reader = Checkpointer(ckpt_dir, keep=tc.keep_checkpoints, read_only=True)
            try:  # onto abstract params and optimiser state in their shardings
                self.state, record = reader.restore(self.state)
                saved = pipeline.SavedState()
                if reader.restore_data(int(record["step"]), saved):
                    self.data_state = saved.state
            finally:
                reader.close()
            self.start_step = int(record["step"])
            workdir_lib.check_tokenizer(record.get("tokenizer"), self.tokenizer, workdir)
            self.skipped_steps = int(record.get("skipped_steps", 0))
            newer = [s for s in checkpoint_steps(ckpt_dir) if s > self.start_step]
            workdir_lib.check_resumed_step(self.start_step, tc.steps, workdir)
        return newer

    def _setup_claim(self) -> None:
        """The run accepted: from here on it writes (the workdir's lock claimed, the config's
        changes on resume printed, config.yaml saved)."""
        if self.lock is not None:
            self.lock.claim()
            for line in self.config_changes:
                print(f"resume: changed {line}", flush=True)
        if self.primary:
            save_config(self.cfg, os.path.join(self.workdir, "config.yaml"))

    def _setup_checkpoints(self, ckpt_dir: str, newer: list[int]) -> None:
        """The checkpointer the run saves with, and `newer` (_setup_resume's) deleted."""
        tc = self.cfg.train
        self.ckpt = Checkpointer(ckpt_dir, keep=tc.keep_checkpoints, async_save=tc.async_checkpoint,
                                 primary=self.primary)
        for s in newer:  # unreadable steps past the restored one would block saving those steps
            self.ckpt.manager.delete(s)

    def _setup_metrics(self, resume: bool) -> None:
        """metrics.jsonl and TensorBoard, continued from the resumed step on resume."""
        self.metrics = MetricsWriter(self.workdir, resume_step=self.start_step if resume else None,
                                     enabled=self.primary)

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
        return (jax.jit(self.fns.train_step, donate_argnums=0, compiler_options=lowering.train_compiler_options(),
                        **train_kw),
                jax.jit(self.fns.eval_step, **eval_kw))

    # ------------------------------------------------------------------ mesh
    def _setup_mesh(self) -> None:
        """A (data, fsdp, expert, context, tensor) mesh and the state's shardings, from each param's logical
        axes and the parallel config's axis rules; see train/sharding.py."""
        from jaxformer.train import sharding
        m = self.cfg.parallel.mesh
        n = self.cfg.parallel.num_devices
        devices = jax.devices()[:n] if n else jax.devices()
        self.mesh = sharding.make_mesh(m.data, m.fsdp, m.tensor, m.expert, devices=devices, context=m.context,
                                       slices=self.cfg.parallel.slices, dcn_axis=self.cfg.parallel.dcn_axis,
                                       pipeline=m.pipeline)
        rules = self.cfg.parallel.logical_axis_rules()
        batch_axes = rules["batch"]
        shards = math.prod(self.mesh.shape[a] for a in batch_axes)
        tc = self.cfg.train
        if tc.micro_batch % shards:
            raise ValueError(f"train.batch_size / grad_accum_steps = {tc.micro_batch} is not divisible by "
                             f"{' x '.join(batch_axes) or 'one'} = {shards}: use a batch_size that is a "
                             f"multiple of {tc.grad_accum_steps * shards}")
        self.shardings = sharding.state_shardings(self.abstract_state, self.mesh, rules, unannotated_params(self.cfg))
        self.batch_sharding = sharding.batch_sharding(self.mesh, axes=batch_axes)
        self.eval_sharding = sharding.batch_sharding(self.mesh, accum_axis=False, axes=batch_axes)

    def _initial_state(self, given: bool, resume: bool) -> dict:
        """The train state, created directly in its shardings (train/init.py): no host builds
        the whole model. A caller's concrete model keeps its values (placed on the mesh). On
        resume: the restore target, abstract params and optimiser state carrying their
        shardings (orbax reads each device's shards), with fresh RNG streams and step."""
        cfg, tc = self.cfg, self.cfg.train
        if given:
            state = init_state(cfg, self.model, self.tx)
            if self.shardings is None:
                return state
            from jaxformer.train import sharding
            return sharding.place(state, self.shardings)
        name, mcfg = cfg.model_name, model_config_for_training(cfg)
        if resume:  # orbax needs a sharding per leaf: one device when there is no mesh
            shardings = self.shardings or init_lib.single_device(self.abstract_state)
            target = init_lib.with_shardings(self.abstract_state, shardings)
            mesh_sh = self.shardings or {"rest": None, "step": None}
            return {**target, "rest": init_lib.create_rest(name, mcfg, tc.seed, mesh_sh["rest"], tc.lora),
                    "step": init_lib.zero_step(mesh_sh["step"])}
        if not tc.init_from and tc.lora is None:
            return init_lib.create_state(name, mcfg, tc.init, tc.seed, self.tx, self.shardings,
                                         start=init_lib.StartFrom(abstract_params=self.abstract_state["params"]))
        # the params init_from loads: the whole model's, or under train.lora the base's
        abstract_params, params_sh = self.abstract_state["params"], (self.shardings or {}).get("params")
        if tc.lora is not None:
            abstract_params = nnx.split(init_lib.abstract_model(name, mcfg, tc.seed), nnx.Param, ...)[1]
            if self.mesh is not None:
                from jaxformer.train import sharding
                params_sh = sharding.param_shardings(abstract_params, self.mesh, self.cfg.parallel.logical_axis_rules())
        params = rest = None
        if tc.init_from:  # fine-tune: each param restored into its sharding, and the saved buffers (MoE score_bias)
            from jaxformer.checkpoint_io import check_init_from_layout, load_params_sharded
            check_init_from_layout(tc.init_from, mcfg)
            # a LoRA run's rest is placed by adapt_state, so its buffers load onto the default device
            rest_sh = None if tc.lora is not None else (self.shardings or init_lib.single_device(self.abstract_state))["rest"]
            rest = init_lib.create_rest(name, mcfg, tc.seed, rest_sh)
            params, rest = load_params_sharded(tc.init_from, abstract_params,
                                               params_sh or init_lib.single_device(abstract_params), rest)
        return init_lib.create_state(name, mcfg, tc.init, tc.seed, self.tx, self.shardings, lora_cfg=tc.lora,
                                     base_shardings=params_sh, start=init_lib.StartFrom(params=params, rest=rest))

    def _global(self, local_batch: dict, sharding, axis: int) -> dict:
        """Global arrays from each process's own slice of the global batch (dim `axis`, split
        over the reading processes; pipeline.process_rows says which rows a process reads)."""
        n = self.readers[1]

        def f(v):
            shape = v.shape[:axis] + (v.shape[axis] * n,) + v.shape[axis + 1:]
            return jax.make_array_from_process_local_data(sharding, v, shape)
        return {k: f(v) for k, v in local_batch.items()}

    def memory_report(self) -> dict:
        """Per-device bytes of parameters and optimiser state (device 0 of this process)."""
        from jaxformer.train.sharding import per_device_bytes
        p, o = per_device_bytes(self.state["params"]), per_device_bytes(self.state["opt_state"])
        d0 = next(k for k in p if k.startswith("device"))
        return {"param_bytes_total": p["total"], "param_bytes_per_device": p[d0],
                "opt_bytes_total": o["total"], "opt_bytes_per_device": o.get(d0, 0)}

    # ------------------------------------------------------------------ per-mode placement
    def _replicate(self, tree):
        """pmap: one copy per device along a leading axis, placed one per device (as pmap
        shards its inputs: a restored checkpoint's arrays are committed to one device, which
        pmap refuses, and a fresh state's are not); other modes: the tree itself."""
        if not self.devices:
            return tree
        from jax.sharding import Mesh, NamedSharding, PartitionSpec
        mesh = Mesh(np.array(jax.local_devices()[: self.devices]), (DATA_AXIS,))
        per_device = NamedSharding(mesh, PartitionSpec(DATA_AXIS))

        def put(x):
            if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key) or x.weak_type:
                return jax.device_put(jnp.broadcast_to(x, (self.devices,) + x.shape), per_device)
            # broadcast on the host and transferred: device_put of a device array into another
            # sharding, and the broadcast, would each be a compiled program per leaf shape
            host = np.asarray(x)
            return jax.device_put(np.broadcast_to(host, (self.devices,) + host.shape), per_device)
        return jax.tree.map(put, tree)

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
        """This process's rows of a batch [B/P, ...] (pipeline.process_rows) -> the train step's
        [A, B/A, ...] ([D, A, B/(A D), ...] under pmap; global arrays on a mesh)."""
        batch = shape_batch(host_batch, self.cfg.train.grad_accum_steps, self.devices)
        return self._global(batch, self.batch_sharding, axis=1) if self.mesh is not None else batch

    def _place(self, host_batch: dict):
        """The pipeline's device stage (a grain thread, while the previous step runs): this
        process's host rows -> (the train step's batch on the devices, items in the global batch)."""
        items = tasks.tokens_in(self.cfg.family, host_batch) * self.readers[1]
        batch = self._train_batch(host_batch)
        if self.mesh is None and not self.devices:
            batch = jax.device_put(batch)
        # pmap keeps the host batch: pmap splits it over its devices when the step is dispatched
        return batch, items

    def _eval_batch(self, host_batch: dict) -> dict:
        """This process's rows of an eval batch -> the eval step's [B, ...] ([D, B/D, ...] under
        pmap; global arrays on a mesh)."""
        if self.devices:
            return {k: v.reshape((self.devices, -1) + v.shape[1:]) for k, v in host_batch.items()}
        return self._global(host_batch, self.eval_sharding, axis=0) if self.mesh is not None else host_batch

    def evaluate(self, state) -> dict:
        params, rest, frozen = state["params"], state["rest"], state.get("frozen")
        totals: dict[str, float] = {}
        for batch in pipeline.eval_batches(self.eval_data, self.cfg.train.batch_size,
                                           self.cfg.train.eval_batches, self.eval_rows):
            sums = self._unreplicate(self.eval_step(params, rest, self._eval_batch(batch), frozen))
            for k, v in sums.items():
                totals[k] = totals.get(k, 0.0) + float(v)
        return tasks.eval_metrics(self.cfg.family, totals) if totals else {}

    # ------------------------------------------------------------------ loop
    def _fetch(self, outs: list) -> list[dict]:
        """The per-step metrics of a block of steps, brought to the host in one transfer. The
        loop calls this every train.log_every steps (and at eval/checkpoint/last steps) and
        otherwise leaves the metrics on the device, so steps are dispatched without a sync."""
        return jax.device_get([self._unreplicate(o) for o in outs])

    def _compilations(self) -> int:
        """How many programs the train step has compiled (jit's cache size; pmap keeps no
        count, so there only the first step is known to compile)."""
        size = getattr(self.train_step, "_cache_size", None)
        return size() if size is not None else 0

    def _records(self, first_step: int, outs: list[dict]) -> list[dict]:
        """Host metrics -> metrics.jsonl records (one per step). Stops the run at the first
        non-finite step unless train.on_nonfinite is skip."""
        records = []
        for i, out in enumerate(outs):
            step = first_step + i
            bad = int(out.pop("nonfinite"))
            record = {"step": step, **{k: float(v) for k, v in out.items()}}
            if bad:
                what = workdir_lib.nonfinite_names(bad)
                record["nonfinite"] = what
                if self.cfg.train.on_nonfinite == "stop":
                    records.append(record)
                    self.history.extend(records)
                    self.metrics.write_many(records)
                    raise workdir_lib.NonFiniteError(what, step, self.ckpt.all_steps())
                self.skipped_steps += 1
                record["skipped"] = True
            if self.skipped_steps:
                record["skipped_steps"] = self.skipped_steps
            records.append(record)
        return records

    def _export(self, state, kind: str, info: dict) -> None:
        """WORKDIR/model/{last,best}: the standalone model checkpoint (checkpoint_io.save_model,
        flax layout) that export, generate and init_from read, plus metrics.json (step, eval).
        Every process calls it: with several, the params are gathered to host copies first (a
        collective), then process 0 alone writes them."""
        from jaxformer.checkpoint_io import save_model
        params, frozen = state["params"], state.get("frozen")
        if jax.process_count() > 1:
            from jax.experimental import multihost_utils
            params, frozen = multihost_utils.process_allgather((params, frozen), tiled=True)  # numpy, full values
        if not self.primary:
            return
        # fresh Variables: the model below must not share (and change) the train state's
        params, frozen, rest = jax.tree.map(lambda x: x, (params, frozen, state["rest"]))
        model = lora_lib.merge(self.fns.graphdef_eval, params, frozen, rest)
        lora = self.cfg.train.lora
        if lora is not None:  # a bf16/int8 base is written as the fp32 values it stands for
            lora_lib.dequantize_base(model)
        d = os.path.join(self.workdir, "model", kind)
        save_model(model, self.cfg.model_name, self.cfg.model, d, **self._tokenizer_files(),
                   lora=None if lora is None else lora.adapter())
        workdir_lib.write_info(os.path.join(d, "metrics.json"), info)

    def _tokenizer_files(self) -> dict:
        """save_model's tokenizer arguments: the data's tokenizer record and file, if any."""
        return {"tokenizer": self.tokenizer, "tokenizer_file": self.tokenizer_file}

    def _train_iterator(self):
        """The grain iterator of this process's train batches, placed on the devices ahead of
        use, positioned at the run's first step (from the checkpoint's saved state on resume)."""
        tc = self.cfg.train
        ds = pipeline.train_dataset(self.train_data, batch_size=tc.batch_size, seed=tc.seed, steps=tc.steps,
                                    rows=self.train_rows, place=self._place)
        it = iter(ds)
        try:
            pipeline.start_at(it, self.start_step, self.data_state)
        except BaseException:
            it.close()
            raise
        return it

    def run(self) -> list[dict]:
        tc = self.cfg.train
        state = self._replicate(self.state)
        unit = "tok" if self.cfg.family in tasks.TOKEN_MODELS + ("classifier",) else "samples"
        bar = Progress(tc.steps, self.start_step, unit, enabled=self.progress_enabled)
        step = self.start_step
        pending: list = []  # device metrics of the steps not fetched yet
        items = 0
        saved = -1
        # Throughput counts only the time steps run: a block of steps is timed from the end of
        # the previous block's host work (eval, checkpoints, logs) to its metrics fetch, which
        # waits for the device. The first step (compilation) and any block in which the step
        # compiled again are left out (self.timing holds what was counted).
        self.timing = {"steps": 0, "seconds": 0.0, "items": 0}
        compiled = self._compilations()
        t_block = None  # start of the current timed block; None until the first step finished
        on_mesh = jax.set_mesh(self.mesh) if self.mesh is not None else contextlib.nullcontext()
        # Preemption (jaxformer/train/faults.py). One process: SIGTERM sets a flag, and the run
        # saves the step it is at and ends. Several: JAX's preemption sync manager owns SIGTERM
        # (a Python handler would replace its C++ one, and each process would stop at its own
        # step), and every process stops at the step it agrees on; NoticeWatch starts the grace
        # watchdog when any process's notice reaches the coordination service.
        multi = jax.process_count() > 1
        watchdog = faults.GraceWatchdog(self.preemption_grace)
        stop = workdir_lib.StopSignal(signals=() if multi else (signal.SIGTERM,), on_signal=watchdog.start)
        notice = faults.NoticeWatch(watchdog) if multi else contextlib.nullcontext()
        faults.RUN.ckpt_dir, faults.RUN.workdir, faults.RUN.step = self.ckpt.directory, self.workdir, step
        try:
            self.batches = self._train_iterator()
            with on_mesh, stop, notice:
                while step < tc.steps:
                    batch, batch_items = next(self.batches)  # already on the devices
                    state, out = self.train_step(state, batch)
                    step += 1
                    faults.RUN.step = step
                    pending.append(out)
                    if t_block is None:  # the first step compiles: wait for it, time from its end
                        jax.block_until_ready(out)
                        t_block, compiled, untimed = time.perf_counter(), self._compilations(), len(pending)
                    else:
                        items += batch_items
                    # several processes: orbax/JAX's sync point, asked at every step with the steps
                    # run so far (the same count on every process: 0, the sync manager's own start,
                    # before the first, so a notice during start-up stops at this run's first step)
                    stopping = stop.requested or (multi and self.ckpt.manager.reached_preemption(step - self.start_step))
                    is_eval = step % tc.eval_every == 0 or step == tc.steps
                    is_ckpt = step % tc.checkpoint_every == 0 or step == tc.steps or stopping
                    if not (is_eval or is_ckpt or step % tc.log_every == 0):
                        continue
                    fetched = self._fetch(pending)
                    t_fetched, timed = time.perf_counter(), len(pending) - untimed
                    recompiled = self._compilations() != compiled
                    compiled, untimed = self._compilations(), 0
                    records = self._records(step - len(pending) + 1, fetched)
                    pending = []
                    if is_eval or is_ckpt:  # every checkpoint carries its eval loss (BestN ranks by it)
                        self._evaluate_into(records[-1], state, step, bar)
                    self.history.extend(records)
                    self.metrics.write_many(records)
                    if timed and not recompiled:
                        self._count_time(bar, step, timed, t_fetched - t_block, items, unit)
                    for r in records:
                        bar.update(r["loss"] if r["loss"] is not None else float("nan"), r["lr"])
                    items = 0
                    saved = self._save(state, step, is_ckpt and step != saved, is_eval or is_ckpt, saved)
                    if stopping:
                        self.stopped_by = stop.name or "a preemption notice"
                        break
                    t_block = time.perf_counter()  # the next block starts after this host work
                self.metrics.write_hparams(self.cfg.to_dict(), self.last_eval, step)  # TensorBoard
        finally:
            bar.close()
            if self.batches is not None:
                self.batches.close()
                self.batches = None
            try:
                self.ckpt.close()
            finally:
                self.metrics.close()
                self.close()
        self.state = self._unreplicate(state)
        return self.history

    def _evaluate_into(self, record: dict, state, step: int, bar) -> None:
        """Run the eval at `step`, keep it as last_eval and add it to the step's record."""
        self.last_eval = self.evaluate(state)
        record.update(self.last_eval)
        if self.primary:
            bar.write(f"step {step}: " + ", ".join(f"{k} {v:.4f}" for k, v in self.last_eval.items()))

    def _count_time(self, bar, step: int, timed: int, seconds: float, items: int, unit: str) -> None:
        """A timed block of `timed` steps (run's comment): into self.timing, the bar and the log."""
        self.timing["steps"] += timed
        self.timing["seconds"] += seconds
        self.timing["items"] += items
        bar.timed(items, seconds)
        self.metrics.write_throughput(step, items // timed, unit, step_time=seconds / timed)

    def _save(self, state, step: int, checkpoint: bool, evaluated: bool, saved: int) -> int:
        """The checkpoint at `step` (when `checkpoint`) with the last model's export, and the best
        model's export when this step's eval loss is the best yet -> the step last saved."""
        eval_loss = self.last_eval.get("eval_loss") if evaluated else None
        host_state = None
        if checkpoint:
            host_state = self._unreplicate(state)
            self.ckpt.save(step, host_state, {"config": self.cfg.to_dict(), "skipped_steps": self.skipped_steps,
                                              "tokenizer": self.tokenizer},
                           eval_loss=eval_loss, data=self.batches)
            saved = step
            self._export(host_state, "last", {"step": step, **self.last_eval})
        if eval_loss is not None and eval_loss < self.best_eval:  # the same on every process
            self.best_eval = eval_loss
            self._export(host_state or self._unreplicate(state), "best", {"step": step, **self.last_eval})
        return saved

    def close(self) -> None:
        """Release the workdir lock (run() does it when it ends)."""
        if getattr(self, "lock", None) is not None:
            self.lock.release()

    def trained_model(self):
        """The model with the trained params (eval mode)."""
        return lora_lib.merge(self.fns.graphdef_eval, self.state["params"], self.state.get("frozen"),
                              self.state["rest"])


def checkpoint_steps(directory: str) -> list[int]:
    """Complete orbax steps in a checkpoints folder (orbax names a step by its number only once
    it is complete), without opening a manager (which would create the folder)."""
    from jaxformer.train.checkpoint import committed_steps
    return committed_steps(directory)


def params_numpy(state, prefixes: tuple = ()) -> dict:
    """Flat {torch key: array in torch layout} of a train state's params (for comparisons);
    `prefixes`: the model's scanned stacks (jaxformer.convert.scan_prefixes)."""
    from jaxformer import convert
    out = {}
    for part in ("params", "frozen"):  # a LoRA run's base is `frozen` (reduced-precision bases left out)
        for path, v in nnx.to_flat_state(state.get(part) or nnx.State({})):
            if not lora_lib.is_quantized(v.get_value()):
                out.update(convert.flax_leaf_to_torch(tuple(path), np.asarray(v.get_value()), prefixes))
    return out
