"""`jaxformer train --config NAME|PATH [--set key=value ...] [--workdir DIR]
[--framework jax|torch] [--resume | --overwrite]`: NAME is a packaged config (lm, llama, ...).

The workdir rules are in jaxformer/train/workdir.py: a fresh run needs an empty workdir
(--overwrite replaces the old run's files, --resume continues it). Exit codes: 0 done; 2 a user
error (bad config, workdir refused, non-finite loss, full disk, ...); 75 (EX_TEMPFAIL) stopped
by SIGTERM after saving a checkpoint at the current step: run again with --resume.

Several processes (--coordinator; docs/scale.md, "Faults on a multi-process run"): a preemption
(SIGTERM to any process, or the runtime's notice) saves one step agreed by all and exits 0 on
every process; a process whose peer stops responding for --heartbeat-timeout seconds exits 69
(EX_UNAVAILABLE) with one line naming it; a preemption stop not finished within
--preemption-grace seconds exits 124 (jaxformer/train/faults.py)."""
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
    p.add_argument("--heartbeat-timeout", type=float, default=None, metavar="SECONDS",
                   help="multi-host: a process silent this long is lost; the others exit 69 naming it "
                        f"(default {HEARTBEAT_TIMEOUT}; or JAXFORMER_HEARTBEAT_TIMEOUT)")
    p.add_argument("--preemption-grace", type=float, default=None, metavar="SECONDS",
                   help="after SIGTERM (a preemption notice), exit 124 if the agreed step is not saved "
                        "within this many seconds (default: no limit of its own; or JAXFORMER_PREEMPTION_GRACE)")


HEARTBEAT_TIMEOUT = 30  # seconds (jaxformer/train/faults.py)


def _seconds(args, name: str, env: str, default):
    """A positive number of seconds from the flag, else the environment, else the default."""
    value = getattr(args, name)
    if value is None and os.environ.get(env):
        try:
            value = float(os.environ[env])
        except ValueError:
            raise ValueError(f"{env}={os.environ[env]!r} is not a number of seconds") from None
    if value is not None and not value > 0:
        raise ValueError(f"--{name.replace('_', '-')} must be a positive number of seconds, got {value:g}")
    return default if value is None else value


def init_distributed(args):
    """Multi-host: jax.distributed.initialize from flags or the environment
    (JAXFORMER_COORDINATOR, JAXFORMER_NUM_PROCESSES, JAXFORMER_PROCESS_ID). On CPU the
    collectives go through gloo."""
    coordinator = args.coordinator or os.environ.get("JAXFORMER_COORDINATOR")
    if not coordinator:
        return None
    import jax

    from jaxformer.train import faults
    num = args.num_processes or int(os.environ["JAXFORMER_NUM_PROCESSES"])
    pid = args.process_id if args.process_id is not None else int(os.environ["JAXFORMER_PROCESS_ID"])
    # CPU collectives through gloo (only used by the CPU backend; set before it starts)
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    # -> the watch that ends this process with one line (exit 69) when a peer stops responding
    return faults.initialize(coordinator, num, pid, _seconds(args, "heartbeat_timeout", "JAXFORMER_HEARTBEAT_TIMEOUT",
                                                             HEARTBEAT_TIMEOUT))


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
    grace = _seconds(args, "preemption_grace", "JAXFORMER_PREEMPTION_GRACE", None)
    watch = init_distributed(args)
    done = False
    try:
        code = _train(args, grace)
        done = True
        return code
    except BaseException as e:
        from jaxformer.cli import user_error
        if watch is not None and isinstance(e, Exception) and not user_error(e):  # a failed collective:
            watch.settle()  # a peer may be gone, and the watch then ends this process naming it
        raise
    finally:
        if watch is not None:  # peers stop waiting for a process that finished its run
            watch.stop(done)


def _train(args, grace) -> int:
    from jaxformer.train.config import load_config
    cfg = load_config(args.config, args.overrides)  # validated before the workdir is touched
    workdir = args.workdir or os.path.join("runs", os.path.splitext(os.path.basename(args.config))[0])
    kw = dict(resume=args.resume, overwrite=args.overwrite, progress=not args.no_progress)
    if args.framework == "torch":
        from jaxformer.train.torch.trainer import TorchTrainer
        trainer = TorchTrainer(cfg, workdir, **kw)
        trainer.preemption_grace = grace
        _warn_no_eval(trainer, cfg)
        trainer.run()
        model = trainer.module
    else:
        from jaxformer.train.jax_trainer import JaxTrainer
        trainer = JaxTrainer(cfg, workdir, **kw)
        trainer.preemption_grace = grace
        _warn_no_eval(trainer, cfg)
        trainer.run()
        model = trainer.trained_model()
    import jax
    if trainer.stopped_by:
        step = trainer.history[-1]["step"]
        if jax.process_count() > 1:  # every process saved the agreed step: a clean end (exit 0)
            if jax.process_index() == 0:
                print(f"jaxformer train: preempted ({trainer.stopped_by}): all {jax.process_count()} processes "
                      f"stopped at step {step}, checkpoint saved; continue with --resume --workdir {workdir}",
                      file=sys.stderr)
            return 0
        print(f"jaxformer train: stopped by {trainer.stopped_by} at step {step}; "
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
