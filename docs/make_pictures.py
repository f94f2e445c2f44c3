"""Make the three pictures in docs/images/ from tiny configs (about a minute on 2 CPU cores):

  divergence.png       `jaxformer parity --report`'s plot for a tiny GPT-2 LM whose JAX twin
                       has layer 1's FFN scaled by 1.01: every sub-layer before it agrees to
                       ~1e-7, and the plot names layer 1's FFN (layers.1.ffn) as the first to part.
  run_overlay.png      `jaxformer plot` of a 60-step tiny LM run in JAX and its torch twin
                       (same config, dropout off): the trajectory parity you can see.
  attention_heads.png  plot_attention of the trained JAX run's layer 0 heads on a short prompt.

    PYTHONPATH=. python docs/make_pictures.py [OUT_DIR]   # default docs/images
"""
from __future__ import annotations

import os
import sys
import tempfile

import numpy as np

TINY_RUN = ["model.d_model=32", "model.num_heads=4", "model.d_ff=64", "model.num_layers=2",
            "model.max_len=64", "model.dropout=0.0", "model.attn_dropout=0.0", "model.embed_dropout=0.0",
            "data.seq_len=32", "train.steps=60", "train.batch_size=8", "train.warmup_steps=6",
            "train.eval_every=20", "train.eval_batches=2", "train.checkpoint_every=60",
            "train.sample_tokens=0"]
PROMPT = "def f(x): return x"


def divergence(out: str) -> None:
    from jaxformer import convert
    from jaxformer.config.models import LMConfig
    from jaxformer.parity.cases_models import model_pair
    from jaxformer.parity.report import report_pair
    t, j = model_pair("lm", LMConfig.tiny("gpt2"))(0)
    convert.load_torch_state_dict(j, t.state_dict())
    kernel = j.decoder.layers[1].ffn.down_proj.kernel
    kernel[...] = kernel[...] * 1.01
    ids = np.random.RandomState(0).randint(1, 64, (2, 7)).astype(np.int32)
    with tempfile.TemporaryDirectory() as d:
        s = report_pair(t, j, {"ids": ids}, d, convert=False,
                        title="tiny GPT-2, JAX twin's layer 1 FFN scaled by 1.01")
        os.replace(os.path.join(d, "divergence.png"), out)
    print(f"{out}: first divergence {s['first_divergence']} ({s['first_divergence_diff']:.2e})")


def runs(overlay: str, heads: str) -> None:
    from jaxformer.train.config import load_config
    from jaxformer.train.data import tokenizer
    from jaxformer.train.jax_trainer import JaxTrainer
    from jaxformer.train.plots import plot_attention, plot_runs
    from jaxformer.train.torch.trainer import TorchTrainer
    cfg = load_config("lm", TINY_RUN)
    with tempfile.TemporaryDirectory() as d:
        jdir, tdir = os.path.join(d, "jax", "lm_tiny"), os.path.join(d, "torch", "lm_tiny")
        jt = JaxTrainer(cfg, jdir, progress=False, quiet=True)
        jt.run()
        TorchTrainer(cfg, tdir, progress=False).run()
        plot_runs([jdir, tdir], overlay, title="tiny LM, 60 steps: JAX and its torch twin")
        print(overlay)
        ids = tokenizer.encode(PROMPT)[None]  # [1, T]
        out = jt.trained_model()(ids, return_intermediates=True, return_attention=True)
        plot_attention(out.attention["layers.0.attn_weights"][0], tokens=[tokenizer.decode([i]) for i in ids[0]],
                       out=heads, title="tiny LM after 60 steps, layer 0")
        print(heads)


def main(out_dir: str = os.path.join(os.path.dirname(os.path.abspath(__file__)), "images")) -> None:
    from jaxformer.parity import setup_precision
    setup_precision()
    os.makedirs(out_dir, exist_ok=True)
    divergence(os.path.join(out_dir, "divergence.png"))
    runs(os.path.join(out_dir, "run_overlay.png"), os.path.join(out_dir, "attention_heads.png"))


if __name__ == "__main__":
    main(*sys.argv[1:])
