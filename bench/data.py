"""The input pipeline against what training consumes, on the `lm` config (batch 32, seq 128,
d_model 128, 4 layers, fp32), side by side in one run:

1. loader throughput: the grain pipeline (train/data/pipeline.py) reading `data.name: tokens`
   windows from memory-mapped shards, host batches only, in tokens/s, against the tokens/s
   that the `lm` train step consumes (target: at least 10x);
2. the `lm` step time fed by the tokens loader, by the in-memory embedded data (stdlib_docs
   arrays through the same pipeline) and by one batch already on the device (no loader), in
   rounds, so a slow spell of this shared machine falls on all of them alike (target: tokens
   within 5% of in-memory);
3. prepare throughput: `jaxformer data prepare` in tokens/s, byte tokenizer and a trained BPE.

    python bench/data.py [--rounds 5] [--steps 10] [--tokens 4000000]

Not a test: it times things. The last line of the output is one JSON value.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def write_tokens_dir(out: str, num_tokens: int) -> str:
    """A tokens directory of `num_tokens` byte-level ids (the embedded corpus repeated, split
    into documents at blank lines), in shards of 1 Mi ids, so the loader reads across shards."""
    from jaxformer.train.data import stdlib_docs, tokenizer
    from jaxformer.train.data.tokens import TokensWriter
    docs = [tokenizer.encode(d) for d in stdlib_docs.corpus().split("\n\n") if d.strip()]
    record = {"spec": "bytes", "kind": "bytes", "file": None, "sha256": None}
    with TokensWriter(out, vocab_size=tokenizer.VOCAB_SIZE, eos_id=tokenizer.EOS, tokenizer=record,
                      shard_tokens=1 << 20) as w:
        i = 0
        while w.count("train")[0] < num_tokens:
            w.add("eval" if i % 50 == 49 else "train", docs[i % len(docs)])
            i += 1
    return out


def lm_config(data: dict, steps: int):
    from jaxformer.train.config import load_config
    cfg = load_config("lm")
    raw = cfg.to_dict()
    raw["data"] = data
    raw["train"].update(steps=steps, eval_every=10**6, checkpoint_every=10**6, async_checkpoint=True)
    from jaxformer.train.config import config_from_dict
    return config_from_dict(raw)


def loader_throughput(cfg, seconds: float = 3.0) -> float:
    """Tokens/s of the host pipeline alone (no device stage), as the trainer reads it."""
    from jaxformer.train import data as data_lib
    from jaxformer.train.data import pipeline
    tc = cfg.train
    train, _ = data_lib.load_sources(cfg.data_name, cfg.data, tc.seed)
    it = iter(pipeline.train_dataset(train, batch_size=tc.batch_size, seed=tc.seed, steps=10**6,
                                     rows=pipeline.process_rows(tc.batch_size, tc.grad_accum_steps)))
    try:
        next(it)  # threads started
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            n += next(it)["tokens"][:, 1:].size
        return n / (time.perf_counter() - t0)
    finally:
        it.close()


class StepRunner:
    """One JaxTrainer's train step, fed by its own grain pipeline (`feed` True) or by one batch
    placed on the device once (`feed` False: the step alone)."""

    def __init__(self, cfg, feed: bool):
        import jax

        from jaxformer.train.jax_trainer import JaxTrainer
        self.trainer = JaxTrainer(cfg, tempfile.mkdtemp(prefix="bench_data_"), progress=False, quiet=True)
        self.state = self.trainer._replicate(self.trainer.state)
        self.it = self.trainer._train_iterator()
        self.fixed = None if feed else next(self.it)[0]
        self.jax = jax

    def steps(self, n: int) -> float:
        """Seconds per step over n steps (the last step's outputs fetched)."""
        t = time.perf_counter()
        for _ in range(n):
            batch = self.fixed if self.fixed is not None else next(self.it)[0]
            self.state, out = self.trainer.train_step(self.state, batch)
        self.jax.block_until_ready(out["loss"])
        return (time.perf_counter() - t) / n

    def close(self) -> None:
        self.it.close()
        self.trainer.ckpt.close()
        self.trainer.metrics.close()
        self.trainer.close()


def prepare_throughput(tmp: str, megabytes: int, bpe_vocab: int) -> dict:
    """Tokens/s of `jaxformer data prepare` (train/data/prepare.py) on a generated text of
    `megabytes` MB (the embedded corpus repeated): with the byte tokenizer, and with a byte-level
    BPE of `bpe_vocab` ids trained beforehand (its training is timed apart). The tokenizer is
    loaded before the clock starts; shards, metadata and the atomic rename are in the time."""
    from jaxformer.train.data import prepare, stdlib_docs, tokenizer
    text = stdlib_docs.corpus()
    path = os.path.join(tmp, "input.txt")
    with open(path, "w") as f:
        for _ in range(max(1, megabytes * 2**20 // len(text.encode()))):
            f.write(text + "\n\n")
    nbytes = os.path.getsize(path)
    out: dict = {"input_bytes": nbytes}
    t = time.perf_counter()
    bpe = tokenizer.train_bpe([d for d in text.split("\n\n") if d.strip()], bpe_vocab)
    out["bpe_train_s"] = round(time.perf_counter() - t, 2)
    for name, tok in (("bytes", tokenizer.load_tokenizer("bytes")), (f"bpe{bpe_vocab}", bpe)):
        t = time.perf_counter()
        meta = prepare.prepare([path], tok, os.path.join(tmp, f"prep_{name}"),
                               prepare.PrepareOptions(progress=False))
        dt = time.perf_counter() - t
        n = sum(meta["splits"][s]["tokens"] for s in meta["splits"])
        out[name] = {"tokens": n, "seconds": round(dt, 2), "tokens_per_s": round(n / dt),
                     "mb_per_s": round(nbytes / dt / 1e6, 2)}
    return out


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=10, help="steps per variant per round")
    p.add_argument("--tokens", type=int, default=4_000_000, help="train tokens in the generated directory")
    p.add_argument("--prepare-mb", type=int, default=20, help="text size for the prepare throughput")
    p.add_argument("--bpe-vocab", type=int, default=8000)
    args = p.parse_args(argv)
    import jax
    with tempfile.TemporaryDirectory() as tmp:
        prep = prepare_throughput(tmp, args.prepare_mb, args.bpe_vocab)
        path = write_tokens_dir(os.path.join(tmp, "tok"), args.tokens)
        steps = args.rounds * args.steps + 4 * args.steps
        tokens_cfg = lm_config({"name": "tokens", "path": path, "seq_len": 128}, steps)
        memory_cfg = lm_config({"name": "stdlib_docs", "seq_len": 128}, steps)
        loader = {"tokens": loader_throughput(tokens_cfg), "in_memory": loader_throughput(memory_cfg)}
        runners = {"tokens": StepRunner(tokens_cfg, True), "in_memory": StepRunner(memory_cfg, True),
                   "no_loader": StepRunner(memory_cfg, False)}
        try:
            for r in runners.values():  # compile, fill the prefetch buffers
                r.steps(2)
            times = {name: [] for name in runners}
            for _ in range(args.rounds):
                for name, r in runners.items():
                    times[name].append(r.steps(args.steps))
        finally:
            for r in runners.values():
                r.close()
    step = {k: statistics.median(v) for k, v in times.items()}
    tc = tokens_cfg.train
    consumed = tc.batch_size * tokens_cfg.data.seq_len / step["no_loader"]
    out = {
        "device": str(jax.devices()[0].device_kind),
        "batch": tc.batch_size, "seq_len": tokens_cfg.data.seq_len,
        "loader_tokens_per_s": {k: round(v) for k, v in loader.items()},
        "step_consumes_tokens_per_s": round(consumed),
        "loader_over_step": round(loader["tokens"] / consumed, 1),
        "step_s": {k: round(v, 5) for k, v in step.items()},
        "step_s_rounds": {k: [round(x, 5) for x in v] for k, v in times.items()},
        "tokens_over_in_memory": round(step["tokens"] / step["in_memory"], 4),
        "in_memory_over_no_loader": round(step["in_memory"] / step["no_loader"], 4),
        "prepare": prep,
        "prepare_tokens_per_s": {k: v["tokens_per_s"] for k, v in prep.items() if isinstance(v, dict)},
    }
    for k in ("prepare_tokens_per_s", "loader_tokens_per_s", "step_s", "loader_over_step", "tokens_over_in_memory",
              "in_memory_over_no_loader"):
        print(f"{k}: {out[k]}")
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
