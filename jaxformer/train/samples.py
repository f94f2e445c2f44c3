"""The short sample printed at the end of an `lm` or `seq2seq` run (either framework). It is a
courtesy after the run's real outputs (checkpoints, metrics) are written, so it never fails a
run: any error while generating it becomes the one line "sample skipped: <why>".

lm: a prompt taken from the eval split (text the model never trained on: the first paragraph
that starts with a sentence, cut at a word boundary), encoded and decoded with the run's own
tokenizer (bytes for the embedded corpus, the prepared directory's for `data.name: tokens`),
continued twice and printed as text: with
the config's sampling settings (train.sample_temperature, train.sample_top_p, seeded by
train.seed) and greedily. A small model's greedy continuation tends to loop on frequent words
(the main job's, at 1.95 nats/byte, repeats "the"); the sampled one shows what it learned:
word-shaped bytes, not yet text, after the main job's 300 steps. seq2seq: a few dates, greedy."""
from __future__ import annotations

import re

import numpy as np

from jaxformer.train.data import tokenizer

SEQ2SEQ_INPUTS = ("Friday, March 5, 2021", "5th of december 1999", "JUL 04 1976")
PROMPT_BYTES = 48  # the longest prompt, in characters; it is cut back to a word boundary
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


def run_tokenizer(cfg):
    """The tokenizer of the run's text data: the tokens directory's own, else bytes."""
    if cfg.data_name == "tokens":
        return tokenizer.load_tokenizer(cfg.data.path)
    return tokenizer.ByteTokenizer()


def eval_windows(eval_data, max_tokens: int = 8192) -> np.ndarray:
    """The first consecutive eval windows [N, L] (about max_tokens ids) of an eval split: a
    random-access source (what the trainers hold; each item {"tokens": [L]}) or a dict of arrays."""
    if isinstance(eval_data, dict):
        tokens = np.asarray(eval_data["tokens"])
        return tokens[: max(1, max_tokens // tokens.shape[1])]
    first = np.asarray(eval_data[0]["tokens"])
    n = min(len(eval_data), max(1, max_tokens // first.shape[0]))
    return np.stack([first] + [np.asarray(eval_data[i]["tokens"]) for i in range(1, n)])


def prompt_from_eval(tokens: np.ndarray, max_chars: int = PROMPT_BYTES, tok=None) -> np.ndarray:
    """Ids of a prompt from eval windows [N, L] (consecutive windows of the eval text): the
    start of the first paragraph that opens with a sentence (else the first window), at most
    max_chars long and cut back to the end of a word. With bytes the space after it is kept:
    without it the continuation begins by extending the prompt's last word ("used to" +
    "n the"); a BPE keeps the space with the next word (" the"), so there it is left out.
    tok: the ids' tokenizer (bytes if None)."""
    tok = tok or tokenizer.ByteTokenizer()
    text = tok.decode(tokens.reshape(-1))
    m = _PARAGRAPH.search(text)
    text = text[m.start(1) if m else 0:][:max_chars]
    cut = text.rfind(" ")
    if cut > 0:
        text = text[:cut + 1] if tok.kind == "bytes" else text[:cut]
    return np.asarray(tok.encode(text), np.int32)


def readable(ids, tok=None) -> str:
    """Decoded ids on one line: a newline shows as \\n."""
    return (tok or tokenizer.ByteTokenizer()).decode(ids).replace("\n", "\\n")


def _sample(cfg, model, generate, eval_data) -> str:
    from jaxformer.config.models import GenerationConfig
    tc, max_len = cfg.train, cfg.model.max_len
    if cfg.model_name == "lm":
        if eval_data is None:
            from jaxformer.train.data import load_sources
            _, eval_data = load_sources(cfg.data_name, cfg.data, tc.seed)
        tok = run_tokenizer(cfg)
        prompt = prompt_from_eval(eval_windows(eval_data), min(PROMPT_BYTES, max_len // 2), tok)[None]
        n = min(tc.sample_tokens, max_len - prompt.shape[1])
        sampled = generate(model, prompt, gen=GenerationConfig(
            max_new_tokens=n, strategy="sample", temperature=tc.sample_temperature, top_p=tc.sample_top_p,
            seed=tc.seed))
        greedy = generate(model, prompt, gen=GenerationConfig(max_new_tokens=n, strategy="greedy"))
        settings = f"temperature {tc.sample_temperature:g}, top-p {tc.sample_top_p:g}"
        return "\n".join([
            "sample (a prompt from the eval split, then the model's continuation):",
            f"  prompt:  {readable(prompt[0], tok)}",
            f"  sampled: {readable(np.asarray(sampled)[0], tok)}    [{settings}]",
            f"  greedy:  {readable(np.asarray(greedy)[0], tok)}"])
    src_len = getattr(cfg.data, "src_len", 32)
    src = np.stack([tokenizer.pad_to(tokenizer.encode(s), src_len) for s in SEQ2SEQ_INPUTS])
    n = min(tc.sample_tokens, 12, max_len - 1)  # ISO dates need 11 tokens with EOS
    out = np.asarray(generate(model, src, gen=GenerationConfig(max_new_tokens=n, strategy="greedy")))
    lines = [f"  {s!r} -> {tokenizer.decode(o)!r}" for s, o in zip(SEQ2SEQ_INPUTS, out, strict=True)]
    return "samples (greedy):\n" + "\n".join(lines)
