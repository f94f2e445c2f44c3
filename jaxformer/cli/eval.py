"""`jaxformer eval RUN_DIR [--step last|best|N] [--json]`: evaluate a training run's weights on
its config's eval split (train.eval_batches batches of train.batch_size) and print the metrics.

last / best: the run's standalone model checkpoints WORKDIR/model/last|best (written by both
trainers); N: the JAX run's orbax training checkpoint of step N (WORKDIR/checkpoints/N)."""
from __future__ import annotations

import json
import os


def add_arguments(p) -> None:
    p.add_argument("run_dir", metavar="RUN_DIR", help="a training workdir (holds config.yaml)")
    p.add_argument("--step", default="last", help="last (default), best, or a checkpoint step number")
    p.add_argument("--json", action="store_true", help="print the metrics as one JSON object")


def _metrics_step(path: str) -> int | None:
    """The step a model/last|best dir's metrics.json names (None if it names none); its file
    read with limits and its field typed, ValueError naming both."""
    from jaxformer.fileio import read_json
    step = read_json(path, expect=dict).get("step")
    if step is not None and (not isinstance(step, int) or isinstance(step, bool) or step < 0):
        raise ValueError(f"{path}: step must be a step number, got {step!r}"[:300])
    return step


def run(args) -> int:
    from jaxformer.train.config import load_config
    run_dir = args.run_dir
    cfg_path = os.path.join(run_dir, "config.yaml")
    if not os.path.isfile(cfg_path):
        raise FileNotFoundError(f"{run_dir} is not a training run (no config.yaml)")
    if args.step not in ("last", "best") and not args.step.isdigit():
        raise ValueError(f"--step {args.step}: expected last, best or a step number")
    from jaxformer.config import ConfigError
    try:
        cfg = load_config(cfg_path)
    except ConfigError as e:
        raise ConfigError(str(e) if cfg_path in str(e) else f"{cfg_path}: {e}") from None
    if args.step in ("last", "best"):  # its files checked before the model is built
        d = os.path.join(run_dir, "model", args.step)
        if not os.path.isdir(d):
            raise FileNotFoundError(f"{run_dir} has no model/{args.step} (no checkpoint written yet)")
        step = _metrics_step(os.path.join(d, "metrics.json"))
    import jax
    from flax import nnx

    from jaxformer.convert import scan_prefixes
    from jaxformer.train import data as data_lib
    from jaxformer.train import init as init_lib
    from jaxformer.train import tasks
    from jaxformer.train.jax_trainer import StepFns, checkpoint_steps, model_config_for_training
    from jaxformer.train.optim import make_optax
    # the model stays abstract: the weights are read straight into their arrays, never initialised
    mcfg = model_config_for_training(cfg)
    from jaxformer.train import lora as lora_lib
    lora = cfg.train.lora
    if lora is not None and args.step in ("last", "best"):  # model/ dirs hold an fp32 base
        import dataclasses
        lora = dataclasses.replace(lora, base_dtype="fp32")
    model = init_lib.abstract_model(cfg.model_name, mcfg, cfg.train.seed, lora)
    init_lib.check_fits(nnx.state(model), "the model")
    graphdef, params, frozen, _ = lora_lib.split(model)
    tx, schedule = make_optax(cfg.train, params, scan_prefixes(model))
    rest = init_lib.create_rest(cfg.model_name, mcfg, cfg.train.seed, lora_cfg=lora)
    if args.step in ("last", "best"):
        from jaxformer.checkpoint_io import load_params_sharded
        every = nnx.state(model, nnx.Param)  # a LoRA run's adapters and base alike
        loaded = lora_lib.split(nnx.merge(graphdef, load_params_sharded(d, every, init_lib.single_device(every)),
                                          rest))
        state = {"params": loaded[1], "rest": rest, **({} if loaded[2] is None else {"frozen": loaded[2]})}
    else:
        from jaxformer.train.checkpoint import Checkpointer
        step = int(args.step)
        ckpt = os.path.join(run_dir, "checkpoints")
        if step not in checkpoint_steps(ckpt):
            raise ValueError(f"--step {step}: no checkpoint of that step in {ckpt} "
                             f"(steps: {checkpoint_steps(ckpt)})")
        abstract = init_lib.abstract_state_of(model, tx)
        target = {**init_lib.with_shardings(abstract, init_lib.single_device(abstract)),
                  "rest": rest, "step": init_lib.zero_step()}
        reader = Checkpointer(ckpt, keep=cfg.train.keep_checkpoints, read_only=True)
        try:
            state, _ = reader.restore(target, step=step)
        finally:
            reader.close()
    fns = StepFns(cfg, model, tx, schedule)
    eval_step = jax.jit(fns.eval_step)
    _, eval_data = data_lib.load_sources(cfg.data_name, cfg.data, cfg.train.seed)
    totals: dict[str, float] = {}
    from jaxformer.train.data.pipeline import eval_batches
    for batch in eval_batches(eval_data, cfg.train.batch_size, cfg.train.eval_batches):
        for k, v in jax.device_get(eval_step(state["params"], state["rest"], batch, state.get("frozen"))).items():
            totals[k] = totals.get(k, 0.0) + float(v)
    if not totals:
        raise ValueError(f"the eval split has fewer than train.batch_size={cfg.train.batch_size} examples")
    metrics = {"step": step, "weights": args.step, **tasks.eval_metrics(cfg.model_name, totals)}
    if args.json:
        print(json.dumps(metrics))
    else:
        print(f"{run_dir} ({args.step}, step {step}): "
              + ", ".join(f"{k} {v:.4f}" for k, v in metrics.items() if isinstance(v, float)))
    return 0
