"""Divergence against depth: where along a model two frameworks part, as files people look at.

    from jaxformer.parity.report import report_pair
    summary = report_pair(torch_model, flax_model, {"ids": ids_np}, "out/my_model")

Both models run once with return_intermediates=True on the same inputs (torch's weights
converted into the flax model first, strict, fp32 eval mode, JAX matmul precision highest).
Every named intermediate is compared in depth order: sub-layers ("layers.1.attn",
".attn_residual", ".ffn"; jaxformer/layers/transformer.py), layer outputs ("layers.1") and
the rest ("embeddings", "final_norm", "pooled"). The folder gets
  divergence.csv   one row per intermediate: depth, name, layer, sub-layer, max |diff|, max |torch|, ok
  divergence.json  the same rows, the per-layer maxima, the tolerance and the first divergence
  divergence.png   max |diff| against depth, log y axis, with the tolerance line
`jaxformer parity --report DIR` writes one such folder per selected registry case that has
intermediates (DIR/<case>/) and DIR/index.json.
"""
from __future__ import annotations

import csv
import dataclasses
import io
import json
import os
import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from jaxformer.fileio import atomic_file, write_text
from jaxformer.parity.harness import accepts, intermediate_diffs, setup_precision, to_numpy
from jaxformer.parity.results import OUT_TOL, Tolerance

_LAYER = re.compile(r"^(?P<layer>(?:.*\.)?(?:layers|blocks)\.\d+)(?:\.(?P<sub>[a-z_]+))?$")
FILES = ("divergence.csv", "divergence.json", "divergence.png")


# ----------------------------------------------------------------------------- run
def run_intermediates(torch_module, flax_module, inputs, *, convert: bool = True) -> tuple[dict, dict]:
    """Run both models with return_intermediates=True on the same numpy inputs (a dict of
    keyword arguments or a tuple of positional ones) -> (torch intermediates, flax
    intermediates) as numpy, in the models' own (depth) order."""
    import jax.numpy as jnp
    import torch

    from jaxformer import convert as conv

    if not accepts(flax_module, "return_intermediates"):
        raise ValueError(f"{type(flax_module).__name__} takes no return_intermediates: no named "
                         "intermediates to compare")
    setup_precision()
    torch_module.eval()
    flax_module.eval()
    if convert:
        conv.load_torch_state_dict(flax_module, torch_module.state_dict())
    args, kwargs = (tuple(inputs), {}) if isinstance(inputs, (tuple, list)) else ((), dict(inputs))
    kwargs["return_intermediates"] = True

    def call(model, to_array):
        a = [to_array(x) for x in args]
        kw = {k: to_array(v) if isinstance(v, np.ndarray) and v.ndim else v for k, v in kwargs.items()}
        out = model(*a, **kw)
        inter = out.intermediates if dataclasses.is_dataclass(out) else out[1]  # LM: an LMOutput
        return {k: to_numpy(v) for k, v in inter.items()}

    with torch.no_grad():
        t_inter = call(torch_module, torch.as_tensor)
    return t_inter, call(flax_module, jnp.asarray)


# ----------------------------------------------------------------------------- rows
def split_name(name: str) -> tuple[str, str]:
    """'decoder.layers.1.ffn' -> ('decoder.layers.1', 'ffn'); 'decoder.layers.1' ->
    ('decoder.layers.1', ''); names outside a layer ('embeddings') -> (name, '')."""
    m = _LAYER.match(name)
    if not m:
        return name, ""
    return m.group("layer"), m.group("sub") or ""


def divergence_rows(torch_inter: Mapping[str, Any], flax_inter: Mapping[str, Any],
                    tol: float | Tolerance = OUT_TOL) -> list[dict]:
    """One row per intermediate, in torch_inter's (depth) order. `tol`: a Tolerance (the bound
    scales with each intermediate's own max |torch|, as check_parity's outputs do) or an
    absolute float."""
    diffs = intermediate_diffs(torch_inter, flax_inter)
    rows = []
    for depth, (name, d) in enumerate(diffs.items()):
        layer, sub = split_name(name)
        ref = float(np.abs(to_numpy(torch_inter[name])).max(initial=0))
        bound = tol.bound(ref) if isinstance(tol, Tolerance) else float(tol)
        rows.append({"depth": depth, "name": name, "layer": layer, "sublayer": sub,
                     "max_abs_diff": d, "max_abs": ref, "tol": bound, "ok": d <= bound})
    return rows


def per_layer(rows: list[dict]) -> list[dict]:
    """Rows grouped by layer (first-seen order): the largest difference over its sub-layers
    and output, and which sub-layer holds it."""
    out: dict[str, dict] = {}
    for r in rows:
        g = out.setdefault(r["layer"], {"layer": r["layer"], "max_abs_diff": -1.0, "worst": ""})
        if r["max_abs_diff"] > g["max_abs_diff"]:
            g["max_abs_diff"], g["worst"] = r["max_abs_diff"], r["sublayer"] or "out"
    return list(out.values())


# ----------------------------------------------------------------------------- files
def write_report(out_dir: str, rows: list[dict], *, tol: float | Tolerance = OUT_TOL, title: str = "") -> dict:
    """divergence.csv / .json / .png under out_dir (each written atomically) -> the summary
    (the JSON's content without the rows)."""
    first = next((r for r in rows if not r["ok"]), None)
    summary = {"title": title, "tol": _describe(tol), "ok": first is None,
               "first_divergence": None if first is None else first["name"],
               "first_divergence_diff": None if first is None else first["max_abs_diff"],
               "max_abs_diff": max((r["max_abs_diff"] for r in rows), default=0.0),
               "layers": per_layer(rows)}
    os.makedirs(out_dir, exist_ok=True)
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=["depth", "name", "layer", "sublayer", "max_abs_diff", "max_abs", "tol", "ok"],
                       lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({**r, "max_abs_diff": f"{r['max_abs_diff']:.6e}", "max_abs": f"{r['max_abs']:.6e}",
                    "tol": f"{r['tol']:.6e}"})
    write_text(os.path.join(out_dir, "divergence.csv"), buf.getvalue())
    write_text(os.path.join(out_dir, "divergence.json"), json.dumps({**summary, "rows": rows}, indent=1) + "\n")
    plot_divergence(rows, tol, os.path.join(out_dir, "divergence.png"), title=title)
    return summary


def _describe(tol) -> str | float:
    return f"{tol.atol:g} + {tol.rtol:g} x max|torch|" if isinstance(tol, Tolerance) else float(tol)


def plot_divergence(rows: list[dict], tol, out: str, *, title: str = "") -> str:
    """max |diff| against depth (log y), layer outputs as large dots, sub-layers as small
    ones, the tolerance as a dashed line and the first divergence marked. Exact zeros sit on
    the bottom edge (a log axis has no 0)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    d = np.array([r["max_abs_diff"] for r in rows], np.float64)
    positive = d[d > 0]
    bounds = np.array([r["tol"] for r in rows], np.float64)
    floor = min(positive.min() if positive.size else bounds.min(), bounds.min()) / 10
    y = np.maximum(d, floor)
    x = np.arange(len(rows))
    is_out = np.array([r["sublayer"] == "" for r in rows])
    fig, ax = plt.subplots(figsize=(max(6.0, min(14.0, 0.22 * len(rows) + 3)), 3.8), dpi=80)
    ax.plot(x, y, color="0.6", lw=1, zorder=1)
    ax.scatter(x[~is_out], y[~is_out], s=14, color="tab:blue", label="sub-layer", zorder=2)
    ax.scatter(x[is_out], y[is_out], s=40, color="tab:orange", label="layer / model output", zorder=3)
    ax.step(x, bounds, where="mid", color="tab:red", ls="--", lw=1, label=f"tolerance ({_describe(tol)})")
    first = next((i for i, r in enumerate(rows) if not r["ok"]), None)
    if first is not None:
        ax.axvline(first, color="tab:red", lw=0.8, alpha=0.5)
        ax.annotate(f"first: {rows[first]['name']}", (first, y[first]), xytext=(4, 6),
                    textcoords="offset points", fontsize=7, color="tab:red")
    ax.set_yscale("log")
    ax.set_xticks(x)
    ax.set_xticklabels([r["name"] for r in rows], rotation=90, fontsize=6)
    ax.set_ylabel("max |torch - jax|")
    ax.set_title(title or "divergence against depth", fontsize=9)
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    with atomic_file(out) as tmp:
        fig.savefig(tmp, format="png", bbox_inches="tight")
    plt.close(fig)
    return out


# ----------------------------------------------------------------------------- entry points
def report_pair(torch_module, flax_module, inputs, out_dir: str, *, tol: float | Tolerance = OUT_TOL,
                title: str = "", convert: bool = True) -> dict:
    """Run a user's pair with intermediates and write the report folder -> summary."""
    t_inter, j_inter = run_intermediates(torch_module, flax_module, inputs, convert=convert)
    return write_report(out_dir, divergence_rows(t_inter, j_inter, tol), tol=tol, title=title)


def has_intermediates(c) -> bool:
    """Whether a registry case is a model with keyword inputs (where intermediates exist)."""
    return getattr(c.build, "model", None) is not None


def report_case(c, out_dir: str, seed: int = 0) -> dict:
    """One registry case (jaxformer.parity.registry.Case) -> its report folder -> summary."""
    if not has_intermediates(c):
        raise ValueError(f"parity case {c.name!r} is not a model case: it has no named intermediates")
    torch_module, flax_module = c.build(seed)
    inputs = c.inputs(np.random.RandomState(seed))
    return report_pair(torch_module, flax_module, inputs, out_dir, tol=c.out_tol, title=c.name)


def report_cases(names, out_dir: str, seed: int = 0) -> dict:
    """Reports for the named registry cases that have intermediates, one folder each under
    out_dir, and out_dir/index.json: {case: summary} plus the skipped (non-model) cases."""
    from jaxformer.parity.registry import load_all
    cases = load_all()
    index: dict[str, Any] = {"cases": {}, "skipped": []}
    for n in names:
        if not has_intermediates(cases[n]):
            index["skipped"].append(n)
            continue
        s = report_case(cases[n], os.path.join(out_dir, n), seed)
        index["cases"][n] = {k: v for k, v in s.items() if k != "layers"}
    write_text(os.path.join(out_dir, "index.json"), json.dumps(index, indent=1) + "\n")
    return index
