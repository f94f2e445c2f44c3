"""The user documentation's commands (README.md and docs/*.md but numerics.md) as a user outside
a checkout runs them (from a wheel: no configs/ folder next to them): every `--config` that names
a packaged config resolves from any directory, in train and in generate / convert's --config (a
YAML with a model section)."""
from __future__ import annotations

import os
import re

import pytest
from helpers import user_docs_text

from jaxformer.cli.convert import load_model_section
from jaxformer.train.config import packaged_configs, resolve_config

# files a documented walkthrough writes first (convert's train.yaml, the user's own YAML)
WRITTEN = ("ckpt/", "my_model.yaml", "my_gpt.yaml")


def _config_args() -> list[str]:
    text = user_docs_text()
    return [m for m in re.findall(r"--config ([^\s`\]|]+)", text) if m not in ("NAME",)]


def test_readme_configs_resolve_outside_a_checkout(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no configs/ here
    args = _config_args()
    assert args, "the user docs have --config examples"
    for arg in args:
        if arg.startswith(WRITTEN):
            continue
        assert not arg.startswith("configs/"), f"docs: --config {arg} needs a checkout; use the packaged name"
        assert os.path.isfile(resolve_config(arg)), arg


@pytest.mark.parametrize("name", ["lm", "llama"])
def test_model_section_reads_a_packaged_name(tmp_path, monkeypatch, name):
    monkeypatch.chdir(tmp_path)
    assert name in packaged_configs()
    model, cfg = load_model_section(name)
    assert model == "lm" and cfg.num_layers > 0


def test_readme_says_where_convert_train_yaml_reads_its_data():
    """The docs' fine-tune flow (the README's, first in the text) prepares the tokens dir that
    convert's train.yaml reads (finetune.tokens_path), and the prose (docs/huggingface.md) says
    train.yaml reads a tokens directory."""
    from jaxformer.train import finetune
    text = user_docs_text()
    ckpt = re.search(r"jaxformer convert --from hf \S+ --to flax (\S+)", text)[1]
    prepared = re.search(r"jaxformer data prepare .*--out (\S+)", text)[1]
    assert prepared == finetune.tokens_path(ckpt)
    prose = " ".join(text.split())
    assert "generated `train.yaml` of an `lm` whose HF directory has tokenizer files trains from a tokens directory" in prose
    assert "`train.yaml` trains on the embedded byte-level datasets as a smoke run;" not in prose


def test_readme_describes_the_end_of_run_sample_as_it_is():
    """The user docs (docs/train.md) say how to skip the sample and do not promise text the main
    job's model does not write; sample_tokens=0 does skip it."""
    from jaxformer.train.config import load_config
    from jaxformer.train.samples import sample_text
    prose = " ".join(user_docs_text().split())
    assert "`--set train.sample_tokens=0` skips it" in prose
    assert "sample that reads as text" not in prose
    assert sample_text(load_config("lm", ["train.sample_tokens=0"]), None, None) is None
