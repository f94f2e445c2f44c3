"""The torch_ref trainer: the same config, data order, batches, loss, optimiser, schedule,
clipping, accumulation and init as jaxformer/train/jax_trainer.py, step for step.

Checkpoints are WORKDIR/torch_checkpoints/step_N/ (the last train.keep_checkpoints):
`model.safetensors` (a torch_ref state_dict, which `jaxformer convert --to flax` accepts) and
`train_state.pt` (optimiser, scheduler and RNG state, loadable with torch.load(weights_only=True)).
The weights for use go to WORKDIR/model/last and model/best in the flax layout, exactly as the
JAX trainer writes them (converted with jaxformer.convert). Under train.lora only the adapters
require a gradient, so the optimiser, its state and the clipping hold the adapters alone; the
checkpoint's model.safetensors holds no bf16/int8 base (rebuilt from the seed on resume, as
it was built at the start). The workdir rules, the lock,
non-finite handling and SIGTERM are the JAX trainer's (jaxformer/train/workdir.py).
"""
from __future__ import annotations

import json
import math
import os
import shutil
import sys

import numpy as np
import torch

from jaxformer import fileio
from jaxformer.config.base import check
from jaxformer.config.module import MODULE
from jaxformer.train import data as data_lib
from jaxformer.train import init as init_lib
from jaxformer.train import tasks
from jaxformer.train import workdir as workdir_lib
from jaxformer.train.config import RunConfig, save_config
from jaxformer.train.data import pipeline
from jaxformer.train.jax_trainer import model_config_for_training
from jaxformer.train.logging_utils import MetricsWriter, Progress
from jaxformer.train.optim import make_torch_optimizer
from jaxformer.train.torch import init as torch_init
from jaxformer.train.torch import tasks as torch_tasks
from torch_ref import lowering as torch_lowering


def check_fits_torch(cfg: RunConfig) -> None:
    """Before the real build: the module built on torch's meta device (no memory), its weights,
    their gradients and Adam's two moments against the host's available memory (init.check_bytes)."""
    from torch_ref.models import build_model
    try:
        with torch.device("meta"):
            meta = build_model(cfg.model_name, model_config_for_training(cfg), seed=cfg.train.seed)
    except Exception:  # a module whose construction needs real tensors: no estimate
        return
    need = 4 * sum(p.numel() * p.element_size() for p in meta.parameters())
    init_lib.check_bytes(need, "the train state (parameters, gradients and optimiser state)", host=True)


def build_torch_model(cfg: RunConfig):
    """The torch module the run trains. A model.module's comes from its factory (model.torch)
    and starts from the JAX trainer's init (the same arrays, loaded under the torch module's own
    keys)."""
    from torch_ref.models import build_model
    module = build_model(cfg.model_name, model_config_for_training(cfg), seed=cfg.train.seed)
    if cfg.model_name == MODULE:
        from jaxformer import module_weights
        from jaxformer.train.jax_trainer import build_jax_model
        return module_weights.load_into_torch(build_jax_model(cfg), module)
    if cfg.train.init_from:  # fine-tune: the checkpoint's params and saved buffers (MoE score_bias)
        from jaxformer.checkpoint_io import load_model
        from jaxformer.convert import to_torch_state_dict
        module.load_state_dict(to_torch_state_dict(load_model(cfg.train.init_from)[2]), strict=True)
        return module
    torch_init.init_torch(module, cfg.train.init, cfg.train.seed)
    if cfg.train.init_from:  # fine-tune: the model checkpoint's (flax layout) weights
        from jaxformer import checkpoint_io, convert
        _, _, source = checkpoint_io.load_model(cfg.train.init_from)
        module.load_state_dict({k: convert.to_torch(v) for k, v in convert.flax_to_torch_arrays(source).items()},
                               strict=True)
    return adapt_torch(module, cfg.train.lora, cfg.train.seed)


def adapt_torch(module, lcfg, seed: int):
    """train.lora (twin of jaxformer/train/lora.py adapt): the targets wrapped in LoRALinear with
    fresh adapters (every other parameter frozen, requires_grad False) and their base stored in
    lcfg.base_dtype; a module that already has adapters, or lcfg None, is left as it is."""
    from torch_ref.layers import lora as tl
    if lcfg is not None and not tl.has_adapters(module):
        tl.apply_lora(module, lcfg.adapter(), seed=seed)
        if lcfg.base_dtype != "fp32":
            tl.quantize_base(module, lcfg.base_dtype)
    return module


def export_state_dict(module) -> dict:
    """The module's state_dict with each reduced-precision LoRA base (not a Parameter, so not in
    the state_dict) added back as the fp32 weight [out, in] it stands for."""
    from torch_ref.layers import lora as tl
    from torch_ref.layers.kernels.quant import QuantizedWeight
    out = {k: v.detach() for k, v in module.state_dict().items()}
    for path, m in tl.lora_modules(module).items():
        if isinstance(m.weight, QuantizedWeight):
            out[f"{path}.weight"] = m.weight.dequantized()
    return out


def _unshared(state_dict) -> dict:
    """A state_dict safetensors can write: a tensor held under several keys (a tied weight, as a
    model.module's torch module may tie its head to its embedding) copied for each further key."""
    seen, out = set(), {}
    for k, v in state_dict.items():
        v = v.detach().contiguous()
        ptr = (v.data_ptr(), tuple(v.shape))
        out[k] = v.clone() if ptr in seen else v
        seen.add(ptr)
    return out


def _to_torch(batch: dict) -> dict:
    return {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in batch.items()}


def torch_checkpoint_steps(directory: str) -> list[int]:
    if not os.path.isdir(directory):
        return []
    return sorted(int(n.split("_")[1]) for n in os.listdir(directory)
                  if n.startswith("step_") and n.split("_")[1].isdigit())


class TorchTrainer:
    def __init__(self, cfg: RunConfig, workdir: str, *, resume: bool = False, overwrite: bool = False,
                 progress: bool = True, module=None):
        self.cfg, self.workdir = cfg, workdir
        # the torch trainer is the float reference: no int8/fp8 training twin (docs/numerics.md §48)
        check(cfg.train.quantization is None, "train.quantization",
              f"{cfg.train.quantization} training is the JAX trainer's; the torch trainer trains in float "
              "(drop the setting, or use --framework jax)")
        if module is None:  # a model.module's NNX twin against the task, before the workdir is touched
            from jaxformer.train.jax_trainer import check_module
            check_module(cfg)
            if cfg.model_name == MODULE:
                from torch_ref.models import build_model
                build_model(MODULE, cfg.model)  # model.torch's factory: a missing one fails here
        self.ckpt_dir = os.path.join(workdir, "torch_checkpoints")
        self.lock, self.config_changes = workdir_lib.open_workdir(workdir, cfg, resume=resume, overwrite=overwrite,
                                             has_checkpoint=bool(torch_checkpoint_steps(self.ckpt_dir)))
        try:
            self._setup(module, resume)
        except BaseException:
            self.lock.release(remove=True)
            raise
        self._setup_claim()
        self._setup_metrics(resume)
        self.progress_enabled = progress
        self.autocast = cfg.train.precision == "bf16"
        self.pad_id = getattr(cfg.model, "pad_id", 0)
        self.moe = tasks.moe_of(cfg.model) if cfg.model_name == "lm" else None
        self.history: list[dict] = []
        self.last_eval: dict = {}
        self.stopped_by: str | None = None
        self.preemption_grace: float | None = None  # seconds a SIGTERM stop may take (train/faults.py)

    def _setup(self, module, resume: bool) -> None:
        """The run's parts before it writes, phase by phase (JaxTrainer._setup's order)."""
        torch.manual_seed(self.cfg.train.seed)
        self._setup_data()
        self._setup_model(module)
        self._setup_optimizer()
        self._setup_resume(resume)

    def _setup_data(self) -> None:
        """The JAX trainer's sources and grain pipeline (one process): the same batches."""
        cfg = self.cfg
        self.train_data, self.eval_data = data_lib.load_sources(cfg.data_name, cfg.data, cfg.train.seed)
        self.tokenizer, self.tokenizer_file = data_lib.tokenizer_info(cfg.data_name, cfg.data)
        self.batches = None
        self.data_state: dict | None = None
        self.trained_tokenizer: dict | None = None  # the resumed checkpoint's

    def _setup_model(self, module) -> None:
        """self.module: the config's (checked to fit first) or a caller's, with adapters under
        train.lora (a caller's module gets them too)."""
        cfg, tc = self.cfg, self.cfg.train
        if module is None:
            check_fits_torch(cfg)
        self.module = module if module is not None else build_torch_model(cfg)
        adapt_torch(self.module, tc.lora, tc.seed)  # a caller's module gets adapters too

    def _setup_optimizer(self) -> None:
        """The optimiser and its schedule over the module's trainable parameters."""
        self.opt, self.sched = make_torch_optimizer(self.cfg.train, self.module)

    def _setup_resume(self, resume: bool) -> None:
        """The step to start from, the skipped steps and the best eval loss so far; on resume
        the newest checkpoint restored (_restore), its tokenizer and step checked."""
        tc, workdir = self.cfg.train, self.workdir
        self.start_step = 0
        self.skipped_steps = 0
        self.best_eval = workdir_lib.best_eval_loss(workdir) if resume else float("inf")
        if resume:
            self.start_step = self._restore()
            workdir_lib.check_tokenizer(self.trained_tokenizer, self.tokenizer, workdir)
            workdir_lib.check_resumed_step(self.start_step, tc.steps, workdir)

    def _setup_claim(self) -> None:
        """The run accepted: from here on it writes (the workdir's lock claimed, the config's
        changes on resume printed, config.yaml saved)."""
        self.lock.claim()
        for line in self.config_changes:
            print(f"resume: changed {line}", flush=True)
        save_config(self.cfg, os.path.join(self.workdir, "config.yaml"))

    def _setup_metrics(self, resume: bool) -> None:
        """metrics.jsonl and TensorBoard, continued from the resumed step on resume."""
        self.metrics = MetricsWriter(self.workdir, resume_step=self.start_step if resume else None)

    # ------------------------------------------------------------------ checkpoints
    def _save(self, step: int) -> None:
        from safetensors.torch import save_file
        d = os.path.join(self.ckpt_dir, f"step_{step}")
        with fileio.atomic_dir(d, overwrite=True) as tmp:  # a re-run over an old workdir replaces that step
            save_file(_unshared(self.module.state_dict()), os.path.join(tmp, "model.safetensors"))
            torch.save({"step": step, "optimizer": self.opt.state_dict(), "scheduler": self.sched.state_dict(),
                        "rng": torch.get_rng_state(), "skipped_steps": self.skipped_steps,
                        "data": json.dumps(self.batches.get_state()), "tokenizer": json.dumps(self.tokenizer)},
                       os.path.join(tmp, "train_state.pt"))
        for s in torch_checkpoint_steps(self.ckpt_dir)[: -self.cfg.train.keep_checkpoints]:
            shutil.rmtree(os.path.join(self.ckpt_dir, f"step_{s}"))

    def _export(self, kind: str, info: dict) -> None:
        """WORKDIR/model/{last,best}: the torch_ref weights converted to the flax layout (as
        `jaxformer convert --to flax` does) in checkpoint_io's standalone format."""
        from jaxformer.checkpoint_io import save_model
        from jaxformer.convert import load_torch_state_dict
        from jaxformer.models import build_model
        model = build_model(self.cfg.model_name, self.cfg.model, seed=0)
        if self.cfg.model_name == MODULE:  # its own state_dict keys, tied weights and buffers
            from jaxformer import module_weights
            module_weights.load_from_torch(model, self.module)
            d = os.path.join(self.workdir, "model", kind)
            save_model(model, MODULE, self.cfg.model, d, tokenizer=self.tokenizer, tokenizer_file=self.tokenizer_file)
            workdir_lib.write_info(os.path.join(d, "metrics.json"), info)
            return
        lora = self.cfg.train.lora
        if lora is not None:  # the JAX twin's adapters, filled from the module's below
            from flax import nnx

            from jaxformer.layers.lora import apply_lora
            apply_lora(model, lora.adapter(), nnx.Rngs(0))
        load_torch_state_dict(model, export_state_dict(self.module))
        d = os.path.join(self.workdir, "model", kind)
        save_model(model, self.cfg.model_name, self.cfg.model, d, tokenizer=self.tokenizer,
                   tokenizer_file=self.tokenizer_file, lora=None if lora is None else lora.adapter())
        workdir_lib.write_info(os.path.join(d, "metrics.json"), info)

    def _restore(self) -> int:
        from safetensors.torch import load_file
        steps = torch_checkpoint_steps(self.ckpt_dir)[::-1]
        errors = []
        for s in steps:
            d = os.path.join(self.ckpt_dir, f"step_{s}")
            try:
                self.module.load_state_dict(load_file(os.path.join(d, "model.safetensors")), strict=True)
                st = torch.load(os.path.join(d, "train_state.pt"), weights_only=True)
                self.opt.load_state_dict(st["optimizer"])
                self.sched.load_state_dict(st["scheduler"])
                torch.set_rng_state(st["rng"])
                self.skipped_steps = int(st.get("skipped_steps", 0))
                self.data_state = pipeline.check_state(json.loads(st["data"])) if "data" in st else None
                self.trained_tokenizer = json.loads(st.get("tokenizer", "null"))
                if int(st["step"]) != s:  # a copied or renamed step folder: its state is another step's
                    raise ValueError(f"its train_state.pt names step {int(st['step'])}, not {s}")
            except Exception as e:
                errors.append(f"step {s}: {type(e).__name__}: {e}")
                continue
            for why in errors:  # one line per step skipped, only when an older one restored
                print(f"warning: torch checkpoint {why.splitlines()[0][:200]}; resumed from step {s}",
                      file=sys.stderr, flush=True)
            return s
        if errors:
            raise ValueError("no restorable torch checkpoint:\n  " + "\n  ".join(errors))
        return 0

    # ------------------------------------------------------------------ steps
    def computing(self):
        """train.attention (torch_ref/lowering.py's switch, the JAX steps' twin); torch has no
        context mesh, so parallel.mesh.context does not apply here."""
        tc = self.cfg.train
        return torch_lowering.computing(attention=tc.attention, attention_blocks=tuple(tc.attention_blocks))

    def train_step(self, batch: dict) -> dict:
        tc = self.cfg.train
        self.module.train()
        self.opt.zero_grad(set_to_none=True)
        micro = tc.micro_batch
        loss_sum, count_sum, metric_sums = 0.0, 0.0, {}
        counts = []
        for a in range(tc.grad_accum_steps):
            mb = _to_torch({k: v[a * micro:(a + 1) * micro] for k, v in batch.items()})
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.autocast), self.computing():
                loss, count, metrics = torch_tasks.forward_loss(self.cfg.family, self.module, mb,
                                                                tc.label_smoothing, self.pad_id)
            loss = torch_tasks.objective(loss, metrics, self.moe)  # + MoE aux losses (tasks.py)
            loss.float().backward()
            loss_sum += float(loss.detach())
            counts.append(float(count))
            for k, v in metrics.items():
                v = v.detach()
                metric_sums[k] = metric_sums.get(k, 0.0) + (v if k == tasks.EXPERT_LOAD else float(v))
        load = metric_sums.pop(tasks.EXPERT_LOAD, None)  # [n_sparse, E] summed over the micro-batches
        count_sum = max(sum(counts), 1.0)  # a loss-masked step may hold no target: loss 0, not NaN
        params = [p for p in self.module.parameters() if p.grad is not None]
        for p in params:
            p.grad.div_(count_sum)
        if tc.grad_clip > 0:
            grad_norm = float(torch.nn.utils.clip_grad_norm_(params, tc.grad_clip))
        else:
            grad_norm = float(torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in params])))
        lr = self.opt.param_groups[0]["lr"]
        loss = loss_sum / count_sum
        # NaN/inf: no update (params, optimiser and schedule as they were), as in the JAX step
        bad = int(not math.isfinite(loss)) + 2 * int(not math.isfinite(grad_norm))
        if not bad:
            self.opt.step()
            self.sched.step()
            if self.moe is not None and self.moe.bias_update_rate:  # DeepSeek's aux-loss-free balancing
                torch_tasks.update_score_bias(self.module, load, self.moe.bias_update_rate)
        return {"loss": loss, "grad_norm": grad_norm, "lr": lr, "nonfinite": bad,
                **{k: v / count_sum for k, v in metric_sums.items()}}

    @torch.no_grad()
    def evaluate(self) -> dict:
        self.module.eval()
        totals: dict[str, float] = {}
        for batch in pipeline.eval_batches(self.eval_data, self.cfg.train.batch_size, self.cfg.train.eval_batches):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.autocast), self.computing():
                loss, count, metrics = torch_tasks.forward_loss(self.cfg.family, self.module, _to_torch(batch),
                                                                self.cfg.train.label_smoothing, self.pad_id)
            metrics = {k: v for k, v in metrics.items() if not k.startswith("moe_")}  # eval: the LM loss alone
            for k, v in {"loss": loss, "count": count, **metrics}.items():
                totals[k] = totals.get(k, 0.0) + float(v)
        return tasks.eval_metrics(self.cfg.family, totals) if totals else {}

    def _record(self, step: int, out: dict) -> dict:
        """One step's metrics record; stops the run on a non-finite step unless on_nonfinite=skip."""
        bad = out.pop("nonfinite")
        record = {"step": step, **out}
        if bad:
            what = workdir_lib.nonfinite_names(bad)
            record["nonfinite"] = what
            if self.cfg.train.on_nonfinite == "stop":
                self.history.append(record)
                self.metrics.write_many(self._pending + [record])
                raise workdir_lib.NonFiniteError(what, step, torch_checkpoint_steps(self.ckpt_dir))
            self.skipped_steps += 1
            record["skipped"] = True
        if self.skipped_steps:
            record["skipped_steps"] = self.skipped_steps
        return record

    def run(self) -> list[dict]:
        """The loop; metrics lines are written every train.log_every steps (and at eval and
        checkpoint steps). Torch computes eagerly, so log_every only batches the file writes."""
        tc = self.cfg.train
        unit = "tok" if self.cfg.family in tasks.TOKEN_MODELS + ("classifier",) else "samples"
        bar = Progress(tc.steps, self.start_step, unit, enabled=self.progress_enabled)
        step = self.start_step
        self._pending: list[dict] = []
        from jaxformer.train import faults
        stop = workdir_lib.StopSignal(on_signal=faults.GraceWatchdog(self.preemption_grace).start)
        try:
            self.batches = iter(pipeline.train_dataset(
                self.train_data, batch_size=tc.batch_size, seed=tc.seed, steps=tc.steps,
                rows=pipeline.process_rows(tc.batch_size, tc.grad_accum_steps)))
            pipeline.start_at(self.batches, step, self.data_state)
            with stop:
                while step < tc.steps:
                    batch = next(self.batches)
                    out = self.train_step(batch)
                    step += 1
                    record = self._record(step, out)
                    stopping = stop.requested
                    is_eval = step % tc.eval_every == 0 or step == tc.steps
                    is_ckpt = step % tc.checkpoint_every == 0 or step == tc.steps or stopping
                    if is_eval or is_ckpt:
                        self.last_eval = self.evaluate()
                        record.update(self.last_eval)
                        bar.write(f"step {step}: " + ", ".join(f"{k} {v:.4f}" for k, v in self.last_eval.items()))
                    self.history.append(record)
                    self._pending.append(record)
                    bar.update(record["loss"], record["lr"], tasks.tokens_in(self.cfg.family, batch))
                    if is_eval or is_ckpt or step % tc.log_every == 0:
                        self.metrics.write_many(self._pending)
                        self._pending = []
                    if is_ckpt:
                        self._save(step)
                        self._export("last", {"step": step, **self.last_eval})
                    eval_loss = self.last_eval.get("eval_loss") if (is_eval or is_ckpt) else None
                    if eval_loss is not None and eval_loss < self.best_eval:
                        self.best_eval = eval_loss
                        self._export("best", {"step": step, **self.last_eval})
                    if stopping:
                        self.stopped_by = stop.name
                        break
        finally:
            bar.close()
            if self.batches is not None:
                self.batches.close()
                self.batches = None
            self.metrics.close()
            self.lock.release()
        return self.history
