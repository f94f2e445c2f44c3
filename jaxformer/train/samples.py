"""The short sample printed at the end of an `lm` or `seq2seq` run (either framework). It is a
courtesy after the run's real outputs (checkpoints, metrics) are written, so it never fails a
run: any error while generating it becomes the one line "sample skipped: <why>"."""
from __future__ import annotations

import numpy as np

from jaxformer.train.data import tokenizer

LM_PROMPT = "The \"if\" statement is used for"
SEQ2SEQ_INPUTS = ("Friday, March 5, 2021", "5th of december 1999", "JUL 04 1976")


def sample_text(cfg, model, generate) -> str | None:
    """The sample's text (None for other models or sample_tokens 0), or "sample skipped: <why>"
    if generating it fails. generate: jaxformer.generation.generate or its torch twin,
    matching `model`."""
    if cfg.model_name not in ("lm", "seq2seq") or cfg.train.sample_tokens == 0:
        return None
    try:
        return _sample(cfg, model, generate)
    except Exception as e:  # a run that trained and saved is a success, whatever the sample does
        why = (str(e).strip().splitlines() or [""])[0]
        return f"sample skipped: {type(e).__name__}: {why}" if why else f"sample skipped: {type(e).__name__}"


def _sample(cfg, model, generate) -> str:
    from jaxformer.config.models import GenerationConfig
    max_len = cfg.model.max_len
    if cfg.model_name == "lm":
        prompt = tokenizer.encode(LM_PROMPT)[None, : max_len // 2]
        n = min(cfg.train.sample_tokens, max_len - prompt.shape[1])
        out = generate(model, prompt, gen=GenerationConfig(max_new_tokens=n, strategy="greedy"))
        return f"sample (greedy): {tokenizer.decode(prompt[0])!r} -> {tokenizer.decode(np.asarray(out)[0])!r}"
    src_len = getattr(cfg.data, "src_len", 32)
    src = np.stack([tokenizer.pad_to(tokenizer.encode(s), src_len) for s in SEQ2SEQ_INPUTS])
    n = min(cfg.train.sample_tokens, 12, max_len - 1)  # ISO dates need 11 tokens with EOS
    out = np.asarray(generate(model, src, gen=GenerationConfig(max_new_tokens=n, strategy="greedy")))
    lines = [f"  {s!r} -> {tokenizer.decode(o)!r}" for s, o in zip(SEQ2SEQ_INPUTS, out)]
    return "samples (greedy):\n" + "\n".join(lines)
