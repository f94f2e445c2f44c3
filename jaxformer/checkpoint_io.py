"""Standalone model checkpoints (what `jaxformer convert --to flax` and HF import write, and
what `train.init_from` and `jaxformer generate` read):

    DIR/model.yaml      the model section: {name: ..., fields...}
    DIR/params/         an orbax checkpoint of the params as a pure dict (flax layout)

Loading builds the abstract model from model.yaml (nnx.eval_shape, no allocation), restores
the arrays into it and checks every leaf's shape and dtype. Writes are atomic (a temp dir
renamed into place), so a failed export leaves nothing behind.
"""
from __future__ import annotations

import os

import numpy as np
import yaml

from jaxformer import fileio


def save_model(model, name: str, cfg, directory: str) -> None:
    import orbax.checkpoint as ocp
    from flax import nnx

    from jaxformer.config import to_dict
    with fileio.atomic_dir(os.path.abspath(directory), overwrite=True) as tmp:
        with open(os.path.join(tmp, "model.yaml"), "w") as f:
            yaml.safe_dump({"model": {"name": name, **to_dict(cfg)}}, f, sort_keys=False)
        params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
        ckptr = ocp.StandardCheckpointer()
        ckptr.save(os.path.join(tmp, "params"), params)
        ckptr.wait_until_finished()


def load_model_config(directory: str):
    from jaxformer.config import model_config_from_dict
    path = os.path.join(directory, "model.yaml")
    if not os.path.exists(path):
        raise FileNotFoundError(f"{directory} is not a jaxformer model checkpoint (no model.yaml)")
    with open(path) as f:
        data = yaml.safe_load(f)
    return model_config_from_dict(data.get("model", data))


def load_params_into(model, directory: str) -> None:
    """Restore DIR/params into `model` in place, strictly (same keys, shapes, dtypes)."""
    import jax
    import orbax.checkpoint as ocp
    from flax import nnx

    from jaxformer.convert import ConversionError
    state = nnx.state(model, nnx.Param)
    target = nnx.to_pure_dict(state)
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), target)
    try:
        restored = ocp.StandardCheckpointer().restore(os.path.join(os.path.abspath(directory), "params"), abstract)
    except Exception as e:
        raise ConversionError([f"cannot restore params from {directory}: {type(e).__name__}: {e}"]) from None
    problems = []
    for (path, a), b in zip(jax.tree_util.tree_flatten_with_path(abstract)[0], jax.tree.leaves(restored)):
        if tuple(a.shape) != tuple(b.shape) or np.dtype(a.dtype) != np.dtype(b.dtype):
            problems.append(f"shape/dtype: {jax.tree_util.keystr(path)} {b.shape}/{b.dtype}, expected {a.shape}/{a.dtype}")
    if problems:
        raise ConversionError(problems)
    nnx.replace_by_pure_dict(state, restored)
    nnx.update(model, state)


def load_model(directory: str, seed: int = 0):
    """-> (name, cfg, model) from a model checkpoint directory."""
    from jaxformer.models import build_model
    name, cfg = load_model_config(directory)
    model = build_model(name, cfg, seed=seed)
    load_params_into(model, directory)
    return name, cfg, model
