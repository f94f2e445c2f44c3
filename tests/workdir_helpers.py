"""A tiny training run for the workdir tests (tests/test_workdir.py, tests/test_bad_input.py),
imported by name: d_model 32, 2 layers, batch 4, byte-level LM on 16-byte windows."""
from __future__ import annotations

import yaml

TINY_RUN = {
    "model": {"name": "lm", "vocab_size": 259, "max_len": 32, "d_model": 32, "num_heads": 4, "d_ff": 64,
              "num_layers": 2, "dropout": 0.0},
    "data": {"name": "stdlib_docs", "seq_len": 16},
    "train": {"steps": 4, "batch_size": 4, "eval_every": 2, "eval_batches": 1, "checkpoint_every": 2,
              "async_checkpoint": False, "warmup_steps": 2,
              # inverse_sqrt: the lr does not depend on train.steps, so runs of any length share
              # one compiled train step (the suite's compilation cache)
              "schedule": "inverse_sqrt"},
}


def tiny_run_dict(**train) -> dict:
    return {**TINY_RUN, "train": {**TINY_RUN["train"], **train}}


def tiny_run_config(**train):
    from jaxformer.train.config import config_from_dict
    return config_from_dict(tiny_run_dict(**train))


def write_tiny_config(path: str, **train) -> str:
    with open(path, "w") as f:
        yaml.safe_dump(tiny_run_dict(**train), f)
    return path
