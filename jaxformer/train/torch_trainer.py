"""The torch_ref trainer: the same config, data order, batches, loss, optimiser, schedule,
clipping, accumulation and init as jaxformer/train/jax_trainer.py, step for step.

Checkpoints are WORKDIR/torch_checkpoints/step_N/: `model.safetensors` (a torch_ref state_dict,
which `jaxformer convert --to flax` accepts) and `train_state.pt` (optimiser, scheduler and
RNG state, loadable with torch.load(weights_only=True)).
"""
from __future__ import annotations

import os
import shutil

import numpy as np
import torch

from jaxformer import fileio

from jaxformer.train import data as data_lib
from jaxformer.train import tasks, torch_init, torch_tasks
from jaxformer.train.config import RunConfig, save_config
from jaxformer.train.jax_trainer import model_config_for_training
from jaxformer.train.logging_utils import MetricsWriter, Progress
from jaxformer.train.optim import make_torch_optimizer


def build_torch_model(cfg: RunConfig):
    from torch_ref.models import build_model
    module = build_model(cfg.model_name, model_config_for_training(cfg), seed=cfg.train.seed)
    torch_init.init_torch(module, cfg.train.init, cfg.train.seed)
    return module


def _to_torch(batch: dict) -> dict:
    return {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in batch.items()}


class TorchTrainer:
    def __init__(self, cfg: RunConfig, workdir: str, *, resume: bool = False, progress: bool = True,
                 module=None):
        self.cfg, self.workdir = cfg, workdir
        os.makedirs(workdir, exist_ok=True)
        save_config(cfg, os.path.join(workdir, "config.yaml"))
        tc = cfg.train
        torch.manual_seed(tc.seed)
        self.train_data, self.eval_data = data_lib.load_dataset(cfg.data_name, cfg.data, tc.seed)
        self.module = module if module is not None else build_torch_model(cfg)
        self.opt, self.sched = make_torch_optimizer(tc, self.module)
        self.ckpt_dir = os.path.join(workdir, "torch_checkpoints")
        self.start_step = 0
        if resume:
            self.start_step = self._restore()
        self.metrics = MetricsWriter(workdir, resume_step=self.start_step if resume else None)
        self.progress_enabled = progress
        self.autocast = tc.precision == "bf16"
        self.pad_id = getattr(cfg.model, "pad_id", 0)
        self.history: list[dict] = []
        self.last_eval: dict = {}

    # ------------------------------------------------------------------ checkpoints
    def _save(self, step: int) -> None:
        from safetensors.torch import save_file
        d = os.path.join(self.ckpt_dir, f"step_{step}")
        with fileio.atomic_dir(d, overwrite=True) as tmp:  # a re-run over an old workdir replaces that step
            save_file({k: v.detach().contiguous() for k, v in self.module.state_dict().items()},
                      os.path.join(tmp, "model.safetensors"))
            torch.save({"step": step, "optimizer": self.opt.state_dict(), "scheduler": self.sched.state_dict(),
                        "rng": torch.get_rng_state()}, os.path.join(tmp, "train_state.pt"))
        steps = sorted(int(n.split("_")[1]) for n in os.listdir(self.ckpt_dir)
                       if n.startswith("step_") and not n.endswith(".tmp"))
        for s in steps[: -self.cfg.train.keep_checkpoints]:
            shutil.rmtree(os.path.join(self.ckpt_dir, f"step_{s}"))

    def _restore(self) -> int:
        from safetensors.torch import load_file
        if not os.path.isdir(self.ckpt_dir):
            return 0
        steps = sorted((int(n.split("_")[1]) for n in os.listdir(self.ckpt_dir)
                        if n.startswith("step_") and not n.endswith(".tmp")), reverse=True)
        errors = []
        for s in steps:
            d = os.path.join(self.ckpt_dir, f"step_{s}")
            try:
                self.module.load_state_dict(load_file(os.path.join(d, "model.safetensors")), strict=True)
                st = torch.load(os.path.join(d, "train_state.pt"), weights_only=True)
                self.opt.load_state_dict(st["optimizer"])
                self.sched.load_state_dict(st["scheduler"])
                torch.set_rng_state(st["rng"])
                return int(st["step"])
            except Exception as e:
                errors.append(f"step {s}: {type(e).__name__}: {e}")
        if errors:
            raise RuntimeError("no restorable torch checkpoint:\n  " + "\n  ".join(errors))
        return 0

    # ------------------------------------------------------------------ steps
    def train_step(self, batch: dict) -> dict:
        tc = self.cfg.train
        self.module.train()
        self.opt.zero_grad(set_to_none=True)
        micro = tc.micro_batch
        loss_sum, count_sum, metric_sums = 0.0, 0.0, {}
        counts = []
        for a in range(tc.grad_accum_steps):
            mb = _to_torch({k: v[a * micro:(a + 1) * micro] for k, v in batch.items()})
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.autocast):
                loss, count, metrics = torch_tasks.forward_loss(self.cfg.model_name, self.module, mb,
                                                                tc.label_smoothing, self.pad_id)
            loss.float().backward()
            loss_sum += float(loss.detach())
            counts.append(float(count))
            for k, v in metrics.items():
                metric_sums[k] = metric_sums.get(k, 0.0) + float(v.detach())
        count_sum = sum(counts)
        params = [p for p in self.module.parameters() if p.grad is not None]
        for p in params:
            p.grad.div_(count_sum)
        if tc.grad_clip > 0:
            grad_norm = float(torch.nn.utils.clip_grad_norm_(params, tc.grad_clip))
        else:
            grad_norm = float(torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in params])))
        lr = self.opt.param_groups[0]["lr"]
        self.opt.step()
        self.sched.step()
        return {"loss": loss_sum / count_sum, "grad_norm": grad_norm, "lr": lr,
                **{k: v / count_sum for k, v in metric_sums.items()}}

    @torch.no_grad()
    def evaluate(self) -> dict:
        self.module.eval()
        totals: dict[str, float] = {}
        for batch in data_lib.eval_batches(self.eval_data, self.cfg.train.batch_size, self.cfg.train.eval_batches):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.autocast):
                loss, count, metrics = torch_tasks.forward_loss(self.cfg.model_name, self.module, _to_torch(batch),
                                                                self.cfg.train.label_smoothing, self.pad_id)
            for k, v in {"loss": loss, "count": count, **metrics}.items():
                totals[k] = totals.get(k, 0.0) + float(v)
        return tasks.eval_metrics(self.cfg.model_name, totals) if totals else {}

    def run(self) -> list[dict]:
        tc = self.cfg.train
        unit = "tok" if self.cfg.model_name in tasks.TOKEN_MODELS + ("classifier",) else "samples"
        bar = Progress(tc.steps, self.start_step, unit, enabled=self.progress_enabled)
        step = self.start_step
        try:
            while step < tc.steps:
                batch = data_lib.batch_at(self.train_data, step, tc.batch_size, tc.seed)
                out = self.train_step(batch)
                step += 1
                record = {"step": step, **out}
                if step % tc.eval_every == 0 or step == tc.steps:
                    self.last_eval = self.evaluate()
                    record.update(self.last_eval)
                    bar.write(f"step {step}: " + ", ".join(f"{k} {v:.4f}" for k, v in self.last_eval.items()))
                self.history.append(record)
                self.metrics.write(record)
                bar.update(record["loss"], record["lr"], tasks.tokens_in(self.cfg.model_name, batch))
                if step % tc.checkpoint_every == 0 or step == tc.steps:
                    self._save(step)
        finally:
            bar.close()
            self.metrics.close()
        return self.history
