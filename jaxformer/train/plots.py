"""Pictures of runs and of attention: training curves of several runs overlaid (from their
metrics.jsonl), and the attention maps of one layer's heads.

    from jaxformer.train.plots import plot_runs, plot_attention
    plot_runs(["runs/lm", "runs/lm_torch"], "curves.png")
    plot_attention(inter["layers.0.attn_weights"][0], tokens=list("hello"), out="heads.png")

A JAX run beside its torch twin (`jaxformer train --framework torch` on the same config) is
the trajectory parity you can see. matplotlib is imported inside the plotting functions, with
the Agg backend (no display needed).
"""
from __future__ import annotations

import math
import os
import sys
from collections.abc import Sequence

import numpy as np

from jaxformer.fileio import atomic_file
from jaxformer.train import logging_utils

# (panel title, metrics.jsonl key, log y axis)
PANELS = (("train loss", "loss", False), ("learning rate", "lr", False),
          ("grad norm", "grad_norm", True), ("eval loss", "eval_loss", False))


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _save(fig, out: str) -> str:
    with atomic_file(out) as tmp:
        fig.savefig(tmp, format="png", bbox_inches="tight")
    _pyplot().close(fig)
    return out


# ----------------------------------------------------------------------------- runs
def read_metrics(run_dir: str) -> list[dict]:
    """RUN_DIR/metrics.jsonl -> one record per step (logging_utils.read_metrics: a resumed
    run's redone steps, the last line wins); values may be null or missing. Lines without an
    integer step (torn, not JSON, a null or list step) are skipped, counted in one warning on stderr."""
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.isfile(path):
        raise ValueError(f"{run_dir}: no metrics.jsonl (is it a `jaxformer train` workdir?)")
    skipped: list = []
    records = logging_utils.read_metrics(path, skipped)
    if skipped:  # never used, never silent: one line with the count and the first
        n, why = skipped[0]
        print(f"warning: {path}: skipped {len(skipped)} line(s) that are not a JSON object with an integer "
              f"step; the first, line {n}: {why}"[:400], file=sys.stderr, flush=True)
    return records


def series(records: list[dict], key: str) -> tuple[np.ndarray, np.ndarray]:
    """(steps, values) of `key`, leaving out records where it is missing, null or not finite."""
    pts = [(r["step"], float(r[key])) for r in records
           if isinstance(r.get(key), (int, float)) and math.isfinite(r[key])]
    if not pts:
        return np.zeros(0), np.zeros(0)
    s, v = zip(*pts, strict=True)
    return np.asarray(s, np.float64), np.asarray(v, np.float64)


def run_framework(run_dir: str) -> str:
    """'jax' or 'torch' from the checkpoint folder the trainer keeps ('' if neither)."""
    if os.path.isdir(os.path.join(run_dir, "torch_checkpoints")):
        return "torch"
    if os.path.isdir(os.path.join(run_dir, "checkpoints")):
        return "jax"
    return ""


def run_label(run_dir: str) -> str:
    name = os.path.basename(os.path.normpath(run_dir))
    fw = run_framework(run_dir)
    return f"{name} ({fw})" if fw else name


def plot_runs(run_dirs: Sequence[str], out: str, *, title: str = "") -> str:
    """Overlay loss, learning rate, grad norm and eval loss of the runs (one colour per run,
    dashed for a torch run) -> out (PNG)."""
    if not run_dirs:
        raise ValueError("plot_runs needs at least one run directory")
    runs = [(run_label(d), run_framework(d), read_metrics(d)) for d in run_dirs]
    plt = _pyplot()
    fig, axes = plt.subplots(2, 2, figsize=(8, 5.5), dpi=80)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, (panel, key, log) in zip(axes.flat, PANELS, strict=True):
        drawn = False
        for i, (label, fw, records) in enumerate(runs):
            x, y = series(records, key)
            if not len(x):
                continue
            ax.plot(x, y, color=colours[i % len(colours)], ls="--" if fw == "torch" else "-",
                    marker="o" if len(x) <= 12 else None, ms=3, lw=1.2, label=label)
            drawn = True
        ax.set_title(panel, fontsize=9)
        ax.set_xlabel("step", fontsize=8)
        ax.tick_params(labelsize=7)
        if log and drawn:
            ax.set_yscale("log")
        if not drawn:
            ax.text(0.5, 0.5, f"no {key} values", ha="center", va="center", transform=ax.transAxes,
                    fontsize=8, color="0.5")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="lower center", ncol=min(4, len(labels)), fontsize=8)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    return _save(fig, out)


# ----------------------------------------------------------------------------- attention
def plot_attention(weights, tokens=None, out: str = "attention.png", *, title: str = "",
                   max_cols: int = 4) -> str:
    """The heads of one layer for one input, as a grid of [T, S] maps (0..1 colour scale).

    Args:
        weights: [H, T, S] (or [1, H, T, S]): e.g. intermediates["layers.0.attn_weights"][0].
        tokens: labels of the keys and queries (self-attention: one sequence), or a pair
            (query tokens, key tokens); None = positions.
        out: the PNG to write.
    """
    w = np.asarray(weights.detach().cpu().numpy() if hasattr(weights, "detach") else weights, np.float32)
    if w.ndim == 4 and w.shape[0] == 1:
        w = w[0]
    if w.ndim != 3:
        raise ValueError(f"attention weights must be [H, T, S] (one input of one layer), got shape {w.shape}")
    h, t, s = w.shape
    q_tok, k_tok = (tokens if isinstance(tokens, tuple) else (tokens, tokens)) if tokens is not None else (None, None)
    for what, tok, n in (("query", q_tok, t), ("key", k_tok, s)):
        if tok is not None and len(tok) != n:
            raise ValueError(f"{len(tok)} {what} tokens for {n} {what} positions")
    cols = min(h, max_cols)
    rows = math.ceil(h / cols)
    side = 2.2 if max(t, s) <= 16 else 3.0
    plt = _pyplot()
    fig, axes = plt.subplots(rows, cols, figsize=(side * cols + 0.8, side * rows + 0.4), dpi=80,
                             squeeze=False)
    for i, ax in enumerate(axes.flat):
        if i >= h:
            ax.axis("off")
            continue
        im = ax.imshow(w[i], vmin=0.0, vmax=1.0, cmap="viridis", interpolation="nearest")
        ax.set_title(f"head {i}", fontsize=8)
        for setter, tok, n in ((ax.set_yticks, q_tok, t), (ax.set_xticks, k_tok, s)):
            if tok is not None and n <= 32:
                setter(range(n), [str(x) for x in tok], fontsize=6)
            else:
                setter([])
        if k_tok is not None and s <= 32:
            ax.tick_params(axis="x", labelrotation=90)
    fig.colorbar(im, ax=axes.ravel().tolist(), shrink=0.8)
    if title:
        fig.suptitle(title, fontsize=9)
    return _save(fig, out)
