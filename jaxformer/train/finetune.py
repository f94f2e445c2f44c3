"""The training config that fine-tunes a converted model checkpoint: the model section as
converted, its data, a short fine-tuning schedule and `init_from` pointing at the checkpoint.
`jaxformer convert --from hf` writes it as OUT/train.yaml.

The data: for an `lm` whose checkpoint comes with a tokenizer, a tokens directory
(`data.name: tokens`) to prepare with that tokenizer; the YAML's header gives the exact
`jaxformer data prepare` command. Otherwise the embedded dataset that fits the model (byte
ids), or a placeholder that fails loudly.
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


def tokens_path(init_from: str) -> str:
    """Where the fine-tune config expects its tokens directory: beside the checkpoint."""
    return init_from.rstrip("/\\") + "-data"


def prepare_command(tokenizer: str, out: str) -> str:
    """The `jaxformer data prepare` command that writes the tokens dir a fine-tune expects."""
    import shlex
    return (f"jaxformer data prepare --input YOUR_TEXT.txt --tokenizer {shlex.quote(tokenizer)} "
            f"--out {shlex.quote(out)}")


def finetune_config(name: str, cfg, init_from: str, tokenizer: str | None = None) -> dict:
    """The raw training config (model, data, train, parallel) that fine-tunes the model
    checkpoint at `init_from`. tokenizer: the SPEC of the checkpoint's own tokenizer (its HF
    dir); with it an `lm` trains from a tokens directory (tokens_path) prepared with it.
    Without, data is the embedded dataset that fits, or PLACEHOLDER."""
    if tokenizer is not None and name == "lm":
        data = {"name": "tokens", "path": tokens_path(init_from), "seq_len": min(512, cfg.max_len)}
    else:
        data, _ = data_section(name, cfg)
    return {"model": {"name": name, **to_dict(cfg)}, "data": data or dict(PLACEHOLDER),
            "train": {**TRAIN_SECTION, "init_from": init_from}, "parallel": {"mode": "none"}}


def finetune_yaml(name: str, cfg, init_from: str, path: str, tokenizer: str | None = None) -> tuple[str, str]:
    """(the text of `path`: finetune_config as YAML under a comment header saying how to run
    it, why no dataset fits or ""). tokenizer: as finetune_config."""
    config = finetune_config(name, cfg, init_from, tokenizer)
    header = ("# Fine-tune an imported Hugging Face checkpoint: jaxformer train --config "
              f"{path}\n")
    why = ""
    body = yaml.safe_dump(config, sort_keys=False)
    if config["data"].get("name") == "tokens":
        note = ("# A tokens directory made with this checkpoint's own tokenizer from your text\n"
                "# (.txt, .jsonl --field NAME, .parquet); prepare it first:\n"
                f"#   {prepare_command(tokenizer, config['data']['path'])}\n")
        header += "# Prepare its data first (see `data:` below).\n"
        body = body.replace("\ndata:\n", "\n" + note + "data:\n", 1)
    else:
        _, why = data_section(name, cfg)
        header += ("# The embedded datasets use jaxformer's byte-level tokenizer, not the model's own;\n"
                   "# point `data` at your data for a real fine-tune.\n")
        if name == "lm":  # the checkpoint came without a tokenizer: name one
            header += ("# E.g. prepare your text with the model's tokenizer and train on it:\n"
                       f"#   {prepare_command('TOKENIZER_JSON_OR_HF_DIR', tokens_path(init_from))}\n"
                       f"#   data: {{name: tokens, path: {tokens_path(init_from)}, seq_len: "
                       f"{min(512, cfg.max_len)}}}\n")
        if why:
            header += f"# NOTE: {why}.\n# Replace the data section before training.\n"
    return header + body, why
