"""The training config that fine-tunes a converted model checkpoint: the model section as
converted, the embedded dataset that fits it (or a placeholder that fails loudly), a short
fine-tuning schedule and `init_from` pointing at the checkpoint. `jaxformer convert --from hf`
writes it as OUT/train.yaml.
"""
from __future__ import annotations

import yaml

from jaxformer.config import to_dict

TRAIN_SECTION = dict(steps=200, batch_size=8, lr=5e-5, schedule="warmup_cosine", warmup_steps=20,
                     weight_decay=0.01, grad_clip=1.0, eval_every=50, eval_batches=4,
                     checkpoint_every=100)
PLACEHOLDER = {"name": "REPLACE_WITH_A_DATASET"}


def data_section(name: str, cfg) -> tuple[dict | None, str]:
    """The embedded dataset that fits this model, or (None, why not)."""
    if name == "lm":
        if cfg.vocab_size < 259:
            return None, f"the byte-level datasets need vocab_size >= 259, the model has {cfg.vocab_size}"
        return {"name": "stdlib_docs", "seq_len": min(128, cfg.max_len)}, ""
    if name == "classifier":
        if cfg.num_classes != 3 or cfg.vocab_size < 259:
            return None, (f"the embedded text_source dataset has 3 classes and byte ids < 259; the "
                          f"model has {cfg.num_classes} classes and vocab_size {cfg.vocab_size}")
        return {"name": "text_source", "seq_len": min(64, cfg.max_len)}, ""
    if name in ("vit", "swin"):
        if cfg.num_classes != 10 or cfg.image_size % 8 or cfg.num_channels not in (1, 3):
            return None, ("the embedded digits dataset has 10 classes and 1 or 3 channels at a multiple "
                          f"of 8 pixels; the model has {cfg.num_classes} classes, {cfg.num_channels} "
                          f"channels, {cfg.image_size} pixels")
        return {"name": "digits", "image_size": cfg.image_size, "num_channels": cfg.num_channels}, ""
    return None, f"there is no training task for a bare {name!r} model (train/tasks.py)"


def finetune_config(name: str, cfg, init_from: str) -> dict:
    """The raw training config (model, data, train, parallel) that fine-tunes the model
    checkpoint at `init_from`; data is PLACEHOLDER where no embedded dataset fits."""
    data, _ = data_section(name, cfg)
    return {"model": {"name": name, **to_dict(cfg)}, "data": data or dict(PLACEHOLDER),
            "train": {**TRAIN_SECTION, "init_from": init_from}, "parallel": {"mode": "none"}}


def finetune_yaml(name: str, cfg, init_from: str, path: str) -> tuple[str, str]:
    """(the text of `path`: finetune_config as YAML under a comment header saying how to run
    it, why no embedded dataset fits or "")."""
    _, why = data_section(name, cfg)
    header = ("# Fine-tune an imported Hugging Face checkpoint: jaxformer train --config "
              f"{path}\n"
              "# The embedded datasets use jaxformer's byte-level tokenizer, not the model's own;\n"
              "# point `data` at your data for a real fine-tune.\n")
    if why:
        header += f"# NOTE: {why}.\n# Replace the data section before training.\n"
    return header + yaml.safe_dump(finetune_config(name, cfg, init_from), sort_keys=False), why
