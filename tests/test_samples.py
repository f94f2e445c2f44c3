"""The end-of-run sample of an lm run (train/samples.py): a prompt from the eval split,
continued with the config's sampling settings and greedily, all printed as text."""
from __future__ import annotations

import numpy as np

from jaxformer.train.config import load_config
from jaxformer.train.data import stdlib_docs, tokenizer
from jaxformer.train.samples import prompt_from_eval, sample_text


def test_prompt_is_a_sentence_from_the_eval_split():
    train, evaluation = stdlib_docs.load(stdlib_docs.Config(seq_len=128), 0)
    prompt = tokenizer.decode(prompt_from_eval(evaluation["tokens"]))
    assert prompt == "Lists are mutable sequences, typically used to "  # the next word starts afresh
    assert prompt not in tokenizer.decode(train["tokens"][:, :-1].reshape(-1))  # held out
    short = tokenizer.decode(prompt_from_eval(stdlib_docs.load(stdlib_docs.Config(seq_len=16), 0)[1]["tokens"], 20))
    assert short == "Lists are mutable "  # cut back to a word boundary


def test_sample_uses_the_configs_settings_and_prints_text():
    cfg = load_config("lm", ["train.sample_tokens=7", "train.sample_temperature=0.7", "train.sample_top_p=0.85",
                             "train.seed=3"])
    calls = []

    def fake_generate(model, prompt, gen):
        calls.append(gen)
        text = " and so" if gen.strategy == "sample" else " is the"
        return tokenizer.encode(text)[None, : gen.max_new_tokens]
    _, evaluation = stdlib_docs.load(cfg.data, 0)
    out = sample_text(cfg, None, fake_generate, evaluation)
    sampled, greedy = calls
    assert (sampled.strategy, sampled.temperature, sampled.top_p, sampled.seed) == ("sample", 0.7, 0.85, 3)
    assert greedy.strategy == "greedy" and sampled.max_new_tokens == greedy.max_new_tokens == 7
    assert out.splitlines()[1:] == ["  prompt:  Lists are mutable sequences, typically used to ",
                                    "  sampled:  and so    [temperature 0.7, top-p 0.85]",
                                    "  greedy:   is the"]


def test_sample_settings_are_validated():
    import pytest

    from jaxformer.config import ConfigError
    for bad in ("train.sample_top_p=0", "train.sample_temperature=0"):
        with pytest.raises(ConfigError, match=bad.split("=")[0].split(".")[1]):
            load_config("lm", [bad])
    assert np.isfinite(load_config("lm").train.sample_temperature)


def test_sample_of_a_tokens_run_uses_its_tokenizer(tmp_path):
    """A run on a prepared tokens directory: the prompt comes from its eval source (the trainer's
    random-access windows, not arrays) and is encoded and printed with the directory's BPE."""
    from jaxformer.train.data import prepare, tokens_data
    text = stdlib_docs.corpus()[:60000]
    src = tmp_path / "in.txt"
    src.write_text(text)
    bpe = tokenizer.train_bpe([p for p in text.split("\n\n") if p.strip()], 400)
    prepare.prepare([str(src)], bpe, str(tmp_path / "tok"), prepare.PrepareOptions(eval_fraction=0.3, progress=False))
    cfg = load_config("lm", ["data.name=tokens", f"data.path={tmp_path / 'tok'}", "data.seq_len=32",
                             "model.vocab_size=400", "train.sample_tokens=3"])
    tok = tokenizer.load_tokenizer(str(tmp_path / "tok"))
    prompts = []

    def fake_generate(model, prompt, gen):
        prompts.append(prompt)
        return tok.encode(" the end")[None, : gen.max_new_tokens]
    _, evaluation = tokens_data.sources(cfg.data, 0)
    out = sample_text(cfg, None, fake_generate, evaluation)
    assert tok.vocab_size == 400 and int(prompts[0].max()) > tokenizer.VOCAB_SIZE  # BPE ids, not bytes
    prompt_line = out.splitlines()[1]
    assert prompt_line == "  prompt:  " + tok.decode(prompts[0][0]).replace("\n", "\\n"), out
    cont = tok.decode(tok.encode(" the end")[:3])
    assert f"sampled: {cont}    [" in out and out.endswith(f"greedy:  {cont}"), out
