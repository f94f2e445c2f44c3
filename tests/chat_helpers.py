"""Chat data for the tests (tests/test_chat_data.py, tests/test_finetune_flow.py), imported by
name: short random conversations, JSON lines, and a tiny Hugging Face tokenizer dir with a chat
template."""
from __future__ import annotations

import json
import os

import numpy as np

from jaxformer.train.data import chat

CHAT_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|begin_of_text|>",
                 "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
WORDS = "what is the colour of sky sea grass blue green two plus four hello name a brief answer".split()  # noqa: SIM905 (words read as one sentence)


def conversations(n: int, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    say = lambda k: " ".join(rng.choice(WORDS, k))
    out = []
    for i in range(n):
        msgs = [{"role": "system", "content": "Be brief."}] if i % 3 == 0 else []
        for _ in range(1 + i % 2):
            msgs += [{"role": "user", "content": say(4) + "?"}, {"role": "assistant", "content": say(3) + "."}]
        out.append({"messages": msgs})
    return out


def write_jsonl(path, rows) -> str:
    with open(path, "w") as f:
        for r in rows:
            f.write((r if isinstance(r, str) else json.dumps(r)) + "\n")
    return str(path)


def hf_tokenizer_dir(path, template: str | None = chat.TEMPLATES["chatml"]) -> str:
    """A tiny byte-level BPE in a Hugging Face dir (tokenizer.json + tokenizer_config.json with
    a chat_template), its chat markers special tokens, as in Qwen's and Llama 3's."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    texts = [m["content"] for c in conversations(40, 9) for m in c["messages"]]
    tok.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=320, special_tokens=CHAT_SPECIALS, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    os.makedirs(path, exist_ok=True)
    tok.save(os.path.join(path, "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>",
              "bos_token": "<|begin_of_text|>", **({"chat_template": template} if template else {})}
    with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
        json.dump(config, f)
    return str(path)
