"""`jaxformer train --config configs/NAME.yaml [--set key=value ...] [--workdir DIR]
[--framework jax|torch] [--resume]`"""
from __future__ import annotations

import os
import sys


def add_arguments(p) -> None:
    p.add_argument("--config", required=True, help="YAML with model/data/train/parallel sections")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override any nested key, e.g. --set train.lr=3e-4 (repeatable)")
    p.add_argument("--workdir", default=None, help="output directory (default: runs/<config name>)")
    p.add_argument("--framework", choices=["jax", "torch"], default="jax")
    p.add_argument("--resume", action="store_true", help="continue from the newest good checkpoint")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--coordinator", default=None, help="multi-host: coordinator address host:port")
    p.add_argument("--num-processes", type=int, default=None)
    p.add_argument("--process-id", type=int, default=None)


def run(args) -> int:
    from jaxformer.config import ConfigError
    from train.config import load_config
    try:
        cfg = load_config(args.config, args.overrides)
    except (ConfigError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    workdir = args.workdir or os.path.join("runs", os.path.splitext(os.path.basename(args.config))[0])
    if args.framework == "torch":
        from train.torch_trainer import TorchTrainer
        trainer = TorchTrainer(cfg, workdir, resume=args.resume, progress=not args.no_progress)
        trainer.run()
        model = trainer.module
    else:
        from train.jax_trainer import JaxTrainer
        trainer = JaxTrainer(cfg, workdir, resume=args.resume, progress=not args.no_progress)
        trainer.run()
        model = trainer.trained_model()
    final = trainer.last_eval
    print(f"final eval ({args.framework}): " + ", ".join(f"{k} {v:.4f}" for k, v in final.items()))
    print(f"workdir: {os.path.abspath(workdir)} (metrics.jsonl, tb/, checkpoints)")
    sample = _sample(cfg, model, args.framework)
    if sample:
        print(sample)
    return 0


def _sample(cfg, model, framework: str) -> str | None:
    """A short generated sample for lm / seq2seq runs."""
    try:
        from train.samples import sample_text
    except ImportError:
        return None
    return sample_text(cfg, model, framework)
