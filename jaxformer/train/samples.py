"""The short sample printed at the end of an `lm` or `seq2seq` run (either framework). It is a
courtesy after the run's real outputs (checkpoints, metrics) are written, so it never fails a
run: any error while generating it becomes the one line "sample skipped: <why>".

lm: a prompt taken from the eval split (text the model never trained on: the first paragraph
that starts with a sentence, cut at a word boundary), continued twice and printed as text: with
the config's sampling settings (train.sample_temperature, train.sample_top_p, seeded by
train.seed) and greedily. A small model's greedy continuation tends to loop on frequent words;
the sampled one shows what it learned. seq2seq: a few dates, greedy."""
from __future__ import annotations

import re

import numpy as np

from jaxformer.train.data import tokenizer

SEQ2SEQ_INPUTS = ("Friday, March 5, 2021", "5th of december 1999", "JUL 04 1976")
PROMPT_BYTES = 48  # the longest prompt; it is cut back to a word boundary
# a paragraph that opens with a plain sentence: "\n\nLists are mutable sequences, ..."
_PARAGRAPH = re.compile(r"\n\n([A-Z][a-z]+ [a-z][A-Za-z ,]{40,})")


def sample_text(cfg, model, generate, eval_data: dict | None = None) -> str | None:
    """The sample's text (None for other models or sample_tokens 0), or "sample skipped: <why>"
    if generating it fails. generate: jaxformer.generation.generate or its torch twin,
    matching `model`. eval_data: the run's eval split (loaded from cfg when None)."""
    if cfg.model_name not in ("lm", "seq2seq") or cfg.train.sample_tokens == 0:
        return None
    try:
        return _sample(cfg, model, generate, eval_data)
    except Exception as e:  # a run that trained and saved is a success, whatever the sample does
        why = (str(e).strip().splitlines() or [""])[0]
        return f"sample skipped: {type(e).__name__}: {why}" if why else f"sample skipped: {type(e).__name__}"


def prompt_from_eval(tokens: np.ndarray, max_bytes: int = PROMPT_BYTES) -> np.ndarray:
    """Byte ids of a prompt from eval windows [N, L] (consecutive windows of the eval text):
    the start of the first paragraph that opens with a sentence (else the first window),
    at most max_bytes long and cut back to the end of a word."""
    window = tokens[: max(1, 8192 // tokens.shape[1])].reshape(-1)  # the first ~8 KB
    text = tokenizer.decode(window)
    m = _PARAGRAPH.search(text)
    start = m.start(1) if m else 0
    ids = tokenizer.encode(text[start:])[:max_bytes]
    space = tokenizer.encode(" ")[0]
    cut = np.flatnonzero(ids == space)
    return ids[: cut[-1]] if len(cut) and cut[-1] > 0 else ids


def readable(ids) -> str:
    """Decoded bytes on one line: a newline shows as \\n."""
    return tokenizer.decode(ids).replace("\n", "\\n")


def _sample(cfg, model, generate, eval_data) -> str:
    from jaxformer.config.models import GenerationConfig
    tc, max_len = cfg.train, cfg.model.max_len
    if cfg.model_name == "lm":
        if eval_data is None:
            from jaxformer.train.data import load_dataset
            _, eval_data = load_dataset(cfg.data_name, cfg.data, tc.seed)
        prompt = prompt_from_eval(np.asarray(eval_data["tokens"]), min(PROMPT_BYTES, max_len // 2))[None]
        n = min(tc.sample_tokens, max_len - prompt.shape[1])
        sampled = generate(model, prompt, gen=GenerationConfig(
            max_new_tokens=n, strategy="sample", temperature=tc.sample_temperature, top_p=tc.sample_top_p,
            seed=tc.seed))
        greedy = generate(model, prompt, gen=GenerationConfig(max_new_tokens=n, strategy="greedy"))
        settings = f"temperature {tc.sample_temperature:g}, top-p {tc.sample_top_p:g}"
        return "\n".join([
            "sample (a prompt from the eval split, then the model's continuation):",
            f"  prompt:  {readable(prompt[0])}",
            f"  sampled: {readable(np.asarray(sampled)[0])}    [{settings}]",
            f"  greedy:  {readable(np.asarray(greedy)[0])}"])
    src_len = getattr(cfg.data, "src_len", 32)
    src = np.stack([tokenizer.pad_to(tokenizer.encode(s), src_len) for s in SEQ2SEQ_INPUTS])
    n = min(tc.sample_tokens, 12, max_len - 1)  # ISO dates need 11 tokens with EOS
    out = np.asarray(generate(model, src, gen=GenerationConfig(max_new_tokens=n, strategy="greedy")))
    lines = [f"  {s!r} -> {tokenizer.decode(o)!r}" for s, o in zip(SEQ2SEQ_INPUTS, out)]
    return "samples (greedy):\n" + "\n".join(lines)
