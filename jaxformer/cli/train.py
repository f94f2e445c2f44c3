"""`jaxformer train --config NAME|PATH [--set key=value ...] [--workdir DIR]
[--framework jax|torch] [--resume | --overwrite]`: NAME is a packaged config (lm, llama, ...).

The workdir rules are in jaxformer/train/workdir.py: a fresh run needs an empty workdir
(--overwrite replaces the old run's files, --resume continues it). Exit codes: 0 done; 2 a user
error (bad config, workdir refused, non-finite loss, full disk, ...); 75 (EX_TEMPFAIL) stopped
by SIGTERM after saving a checkpoint at the current step: run again with --resume."""
from __future__ import annotations

import os
import sys


def add_arguments(p) -> None:
    p.add_argument("--config", required=True,
                   help="a packaged config's name (lm, llama, ...) or a YAML path with model/data/train/parallel sections")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override any nested key, e.g. --set train.lr=3e-4 (repeatable)")
    p.add_argument("--workdir", default=None, help="output directory (default: runs/<config name>)")
    p.add_argument("--framework", choices=["jax", "torch"], default="jax")
    p.add_argument("--resume", action="store_true", help="continue the workdir's run from its newest good checkpoint")
    p.add_argument("--overwrite", action="store_true",
                   help="replace the workdir's previous run (its config, metrics, checkpoints, model)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--coordinator", default=None, help="multi-host: coordinator address host:port")
    p.add_argument("--num-processes", type=int, default=None)
    p.add_argument("--process-id", type=int, default=None)


def init_distributed(args) -> None:
    """Multi-host: jax.distributed.initialize from flags or the environment
    (JAXFORMER_COORDINATOR, JAXFORMER_NUM_PROCESSES, JAXFORMER_PROCESS_ID). On CPU the
    collectives go through gloo."""
    coordinator = args.coordinator or os.environ.get("JAXFORMER_COORDINATOR")
    if not coordinator:
        return
    import jax
    num = args.num_processes or int(os.environ["JAXFORMER_NUM_PROCESSES"])
    pid = args.process_id if args.process_id is not None else int(os.environ["JAXFORMER_PROCESS_ID"])
    # CPU collectives through gloo (only used by the CPU backend; set before it starts)
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=coordinator, num_processes=num, process_id=pid)


PREEMPTED = 75  # EX_TEMPFAIL: stopped by SIGTERM with a checkpoint at the current step


def no_eval_reason(trainer, cfg) -> str | None:
    """Why the run will report no eval metrics (eval reads whole batches only), or None."""
    data, b = getattr(trainer, "eval_data", None), cfg.train.batch_size
    if data is not None and len(data) < b:
        n = len(data)
        return (f"the eval split holds {n} example(s), fewer than one batch (train.batch_size {b}): "
                "no eval metrics; add eval data or lower train.batch_size")
    return None


def _warn_no_eval(trainer, cfg) -> None:
    import jax
    reason = no_eval_reason(trainer, cfg)
    if reason and jax.process_index() == 0:
        print(f"jaxformer train: warning: {reason}", file=sys.stderr)


def run(args) -> int:
    from jaxformer.train.config import load_config
    init_distributed(args)
    cfg = load_config(args.config, args.overrides)  # validated before the workdir is touched
    workdir = args.workdir or os.path.join("runs", os.path.splitext(os.path.basename(args.config))[0])
    kw = dict(resume=args.resume, overwrite=args.overwrite, progress=not args.no_progress)
    if args.framework == "torch":
        from jaxformer.train.torch.trainer import TorchTrainer
        trainer = TorchTrainer(cfg, workdir, **kw)
        _warn_no_eval(trainer, cfg)
        trainer.run()
        model = trainer.module
    else:
        from jaxformer.train.jax_trainer import JaxTrainer
        trainer = JaxTrainer(cfg, workdir, **kw)
        _warn_no_eval(trainer, cfg)
        trainer.run()
        model = trainer.trained_model()
    import jax
    if trainer.stopped_by:
        if jax.process_index() == 0:
            print(f"jaxformer train: stopped by {trainer.stopped_by} at step {trainer.history[-1]['step']}; "
                  f"checkpoint saved; continue with --resume --workdir {workdir}", file=sys.stderr)
        return PREEMPTED
    if jax.process_index() != 0:  # metrics and logs come from process 0
        return 0
    final = trainer.last_eval
    if getattr(trainer, "mesh", None) is not None:
        print("memory per device: " + ", ".join(f"{k} {v:,}" for k, v in trainer.memory_report().items()))
    print(f"final eval ({args.framework}): " + (", ".join(f"{k} {v:.4f}" for k, v in final.items())
                                                 or f"none ({no_eval_reason(trainer, cfg) or 'no eval batch'})"))
    print(f"workdir: {os.path.abspath(workdir)} (metrics.jsonl, tb/, checkpoints)")
    sample = _sample(cfg, model, args.framework, getattr(trainer, "eval_data", None))
    if sample:
        print(sample)
        from jaxformer.train.logging_utils import write_tb_text
        write_tb_text(workdir, "sample", sample, trainer.history[-1]["step"] if trainer.history else 0)
    return 0


def _sample(cfg, model, framework: str, eval_data=None) -> str | None:
    """A short generated sample for lm / seq2seq runs (an lm's prompt comes from eval_data)."""
    from jaxformer.train.samples import sample_text
    if framework == "jax":
        from jaxformer.generation import generate
    else:
        from torch_ref.generation import generate
    return sample_text(cfg, model, generate, eval_data)
