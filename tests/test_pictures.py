"""Pictures and what they are drawn from: sub-layer intermediates and attention weights in both
trees, first_divergence at sub-layer granularity, the parity report's files, `jaxformer plot`,
plot_attention and the TensorBoard entries (text, hparams, grouped tags). Tiny models only."""
from __future__ import annotations

import dataclasses
import glob
import json
import os
import struct
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx
from helpers import converted_pair

from jaxformer.config.models import LMConfig, Seq2SeqConfig
from jaxformer.config.vision import SwinConfig, TimeSeriesConfig, ViTConfig
from jaxformer.parity import first_divergence, setup_precision

setup_precision()
PNG = b"\x89PNG\r\n\x1a\n"
TOL = 1e-5


def run_both(t, j, *args, **kw):
    """Both trees' intermediates on the same inputs (an LM's LMOutput.intermediates, the other
    models' last tuple element); the jax model runs as one compiled program (eager dispatch
    compiles every op of a Swin separately, most of this file's time), its intermediates dict
    rebuilt in the order the model inserted its keys at trace time (a pytree round trip sorts
    dict keys), so key-order checks see the model's own order."""
    with torch.no_grad():
        ti = _intermediates(t(*[torch.as_tensor(a) for a in args], **kw))
    order = []

    def call(model, *xs):
        inter = _intermediates(model(*xs, **kw))
        order.append(list(inter))
        return inter
    ji = nnx.jit(call)(j, *[jnp.asarray(a) for a in args])
    return ti, {k: ji[k] for k in order[0]}


def _intermediates(out) -> dict:
    return out.intermediates if dataclasses.is_dataclass(out) else out[-1]


def ids(rng, b, n, vocab=64):
    return rng.randint(1, vocab, size=(b, n)).astype(np.int32)


def is_png(path: str) -> bool:
    with open(path, "rb") as f:
        return f.read(8) == PNG


# ----------------------------------------------------------------------------- intermediates
VISION = {"vit": ViTConfig(image_size=8, patch_size=4, num_channels=3, num_classes=5, d_model=16,
                           num_heads=2, d_ff=32, num_layers=2),
          "timeseries": TimeSeriesConfig(input_len=12, num_channels=3, target_channels=(0,), horizon=2,
                                         d_model=16, num_heads=2, d_ff=32, num_layers=2, conv_layers=1)}


@pytest.mark.parametrize("name", ["lm", "seq2seq", "vit", "timeseries"])
def test_sublayer_intermediates_have_the_same_keys_and_order_in_both_trees(name):
    rng = np.random.RandomState(0)
    if name == "lm":
        t, j = converted_pair("lm", LMConfig.tiny("llama"))
        args = (ids(rng, 2, 6),)
    elif name == "seq2seq":
        t, j = converted_pair("seq2seq", Seq2SeqConfig.tiny())
        args = (ids(rng, 2, 6), ids(rng, 2, 5))
    else:
        t, j = converted_pair(name, VISION[name])
        shape = (2, 8, 8, 3) if name == "vit" else (2, 12, 3)
        args = (rng.standard_normal(shape).astype(np.float32),)
    ti, ji = run_both(t, j, *args, return_intermediates=True, return_attention=True)
    assert list(ti) == list(ji)
    prefix = {"lm": "", "seq2seq": "decoder.", "vit": "encoder.", "timeseries": "encoder."}[name]
    subs = ["attn_weights", "attn", "attn_residual"] + \
        (["cross_attn_weights", "cross_attn", "cross_attn_residual"] if name == "seq2seq" else []) + ["ffn"]
    layer1 = [k for k in ti if k.startswith(f"{prefix}layers.1")]
    assert layer1 == [f"{prefix}layers.1.{s}" for s in subs] + [f"{prefix}layers.1"]
    for k in ti:
        assert np.abs(np.asarray(ji[k]) - ti[k].numpy()).max() <= TOL, k
    # the sub-layer keys do not depend on return_attention (only the weights do)
    ti2, _ = run_both(t, j, *args, return_intermediates=True)
    assert list(ti2) == [k for k in ti if not k.endswith("attn_weights")]


def test_swin_blocks_report_their_sublayers_in_both_trees():
    """Swin's blocks record attn (before the residual add), attn_residual and ffn, with the
    same keys and order in both trees, before the block's own output."""
    cfg = SwinConfig(image_size=16, patch_size=2, num_channels=3, num_classes=4, embed_dim=8, depths=(2, 2),
                     num_heads=(2, 2), window_size=2)
    t, j = converted_pair("swin", cfg)
    x = np.random.RandomState(0).standard_normal((2, 16, 16, 3)).astype(np.float32)
    ti, ji = run_both(t, j, x, return_intermediates=True)
    assert list(ti) == list(ji)
    block = [k for k in ti if k.startswith("stages.1.blocks.1")]
    assert block == [f"stages.1.blocks.1.{s}" for s in ("attn", "attn_residual", "ffn")] + ["stages.1.blocks.1"]
    for k in ti:
        assert np.abs(np.asarray(ji[k]) - ti[k].numpy()).max() <= TOL, k


@pytest.mark.parametrize("where, expect", [
    ("decoder.1.ffn", "decoder.layers.1.ffn"),
    ("encoder.0.self_attn", "encoder.layers.0.attn"),
    ("decoder.0.cross_attn", "decoder.layers.0.cross_attn"),
])
def test_first_divergence_names_the_perturbed_sublayer(where, expect):
    t, j = converted_pair("seq2seq", Seq2SeqConfig.tiny(norm_position="pre"))
    stack, layer, sub = where.split(".")
    module = getattr(getattr(j, stack).layers[int(layer)], sub)
    kernel = module.down_proj.kernel if sub == "ffn" else module.o_proj.kernel
    kernel[...] = kernel[...] * 1.01
    rng = np.random.RandomState(1)
    ti, ji = run_both(t, j, ids(rng, 2, 6), ids(rng, 2, 5), return_intermediates=True)
    report = first_divergence(ti, ji, TOL)
    assert report is not None and report.split(" ")[0] == expect, report


# ----------------------------------------------------------------------------- report
def test_report_writes_its_files_and_names_the_first_sublayer(tmp_path):
    from jaxformer.parity.registry import load_all
    from jaxformer.parity.report import FILES, report_case, report_pair
    case = load_all()["lm_gpt2_intermediates"]
    summary = report_case(case, str(tmp_path / "ok"))
    assert summary["ok"] and summary["first_divergence"] is None
    assert sorted(os.listdir(tmp_path / "ok")) == sorted(FILES)
    assert is_png(str(tmp_path / "ok" / "divergence.png"))
    data = json.loads((tmp_path / "ok" / "divergence.json").read_text())
    names = [r["name"] for r in data["rows"]]
    assert names[:3] == ["embeddings", "layers.0.attn", "layers.0.attn_residual"] and names[-1] == "final_norm"
    assert [g["layer"] for g in data["layers"]] == ["embeddings", "layers.0", "layers.1", "final_norm"]
    assert all(r["max_abs_diff"] <= TOL for r in data["rows"])
    csv_lines = (tmp_path / "ok" / "divergence.csv").read_text().splitlines()
    assert csv_lines[0].startswith("depth,name,layer,sublayer") and len(csv_lines) == len(names) + 1
    # a user's pair with one sub-layer perturbed on the JAX side
    from jaxformer import convert
    t, j = case.build(0)
    convert.load_torch_state_dict(j, t.state_dict())
    kernel = j.decoder.layers[1].self_attn.o_proj.kernel
    kernel[...] = kernel[...] * 1.01
    inputs = case.inputs(np.random.RandomState(0))
    bad = report_pair(t, j, inputs, str(tmp_path / "bad"), convert=False)
    assert not bad["ok"] and bad["first_divergence"] == "layers.1.attn"


def test_parity_cli_report_flag(tmp_path, capsys):
    from jaxformer import cli
    assert cli.main(["parity", "-k", "tcn_same_k3", "--report", str(tmp_path)]) == 0
    index = json.loads((tmp_path / "index.json").read_text())
    assert list(index["cases"]) == ["tcn_same_k3"] and index["cases"]["tcn_same_k3"]["ok"]
    assert is_png(str(tmp_path / "tcn_same_k3" / "divergence.png"))


# ----------------------------------------------------------------------------- attention
def test_attention_weights_match_across_trees_and_sum_to_one_over_unmasked_keys(tmp_path):
    t, j = converted_pair("lm", LMConfig.tiny("gpt2"))
    rng = np.random.RandomState(2)
    x = ids(rng, 2, 7)
    mask = np.ones((2, 7), np.int32)
    mask[1, :3] = 0  # left padding
    x[1, :3] = 0
    ti, ji = run_both(t, j, x, mask, return_intermediates=True, return_attention=True)
    visible = np.tril(np.ones((7, 7), bool))[None, None] & mask.astype(bool)[:, None, None, :]  # [B, 1, T, S]
    for i in range(2):
        tw, jw = ti[f"layers.{i}.attn_weights"].numpy(), np.asarray(ji[f"layers.{i}.attn_weights"])
        assert tw.shape == jw.shape == (2, 4, 7, 7)  # [B, H, T, S]
        assert np.abs(tw - jw).max() <= TOL
        for w in (tw, jw):
            assert np.all(w[~np.broadcast_to(visible, w.shape)] == 0)
            rows = visible[:, :, :, :].any(-1)  # query rows with a visible key
            sums = w.sum(-1)
            assert np.abs(sums[np.broadcast_to(rows, sums.shape)] - 1).max() <= 1e-6
    from jaxformer.train.plots import plot_attention
    out = plot_attention(np.asarray(ji["layers.0.attn_weights"])[1], tokens=list("abcdefg"),
                         out=str(tmp_path / "heads.png"))
    assert is_png(out)
    with pytest.raises(ValueError, match="one input of one layer"):
        plot_attention(np.zeros((2, 2, 4, 7, 7)), out=str(tmp_path / "x.png"))


def test_return_attention_needs_return_intermediates():
    t, j = converted_pair("lm", LMConfig.tiny("gpt2"))
    x = ids(np.random.RandomState(0), 1, 4)
    for model, conv in ((t, torch.as_tensor), (j, jnp.asarray)):
        with pytest.raises(ValueError, match="needs return_intermediates"):
            model(conv(x), return_attention=True)


# ----------------------------------------------------------------------------- runs
def fake_run(path, framework: str, rows: list[str]) -> str:
    os.makedirs(os.path.join(path, "torch_checkpoints" if framework == "torch" else "checkpoints"))
    with open(os.path.join(path, "metrics.jsonl"), "w") as f:
        f.write("\n".join(rows))
    return str(path)


def test_plot_overlays_two_runs_with_nulls_and_missing_values(tmp_path, capsys):
    from jaxformer import cli
    from jaxformer.train.plots import read_metrics, run_label, series
    a = fake_run(tmp_path / "lm", "jax", [
        '{"step": 1, "loss": 5.0, "lr": 0.001, "grad_norm": 2.0}',
        '{"step": 2, "loss": null, "lr": 0.002, "grad_norm": 1.5, "eval_loss": 4.0}',
        '{"step": 3, "loss": 3.5, "lr": 0.002}',
        '{"step": 4, "lo'])  # a torn last line
    b = fake_run(tmp_path / "torch_twin", "torch", [
        '{"step": 1, "loss": 5.0, "lr": 0.001, "grad_norm": NaN}',
        '{"step": 2, "loss": 4.2, "lr": 0.002, "grad_norm": 1.4, "eval_loss": 4.1}'])
    assert len(read_metrics(a)) == 3
    assert series(read_metrics(a), "loss")[0].tolist() == [1, 3]
    assert series(read_metrics(b), "grad_norm")[1].tolist() == [1.4]
    assert run_label(a) == "lm (jax)" and run_label(b) == "torch_twin (torch)"
    out = str(tmp_path / "curves.png")
    assert cli.main(["plot", a, b, "--out", out]) == 0
    assert is_png(out) and os.path.getsize(out) < 200_000


# ----------------------------------------------------------------------------- TensorBoard
def read_events(logdir: str) -> list:
    """Every Event in the tfevents files under logdir (TFRecord framing: length, crc, data, crc)."""
    from tensorboardX.proto import event_pb2
    events = []
    for path in sorted(glob.glob(os.path.join(logdir, "**", "*tfevents*"), recursive=True)):
        data = Path(path).read_bytes()
        pos = 0
        while pos < len(data):
            (n,) = struct.unpack("<Q", data[pos:pos + 8])
            events.append(event_pb2.Event.FromString(data[pos + 12:pos + 12 + n]))
            pos += 12 + n + 4
    return events


def test_tensorboard_has_grouped_tags_text_hparams_and_throughput(tmp_path):
    from jaxformer.train.logging_utils import MetricsWriter, write_tb_text
    w = MetricsWriter(str(tmp_path))
    w.write_throughput(0, 100, "tok")  # starts the clock
    w.write({"step": 1, "loss": 2.5, "lr": 1e-3, "grad_norm": 0.5, "eval_loss": 2.7})
    w.write_throughput(1, 100, "tok")
    w.write_text("sample", "def f(x): return x", 1)
    w.write_hparams({"model": {"d_model": 32, "dims": [1, 2]}, "train": {"lr": 1e-3, "seed": None}},
                    {"eval_loss": 2.7, "eval_perplexity": float("inf")}, 1)
    w.close()
    write_tb_text(str(tmp_path), "late", "after close", 2)
    values = [(v.tag, v) for e in read_events(str(tmp_path / "tb")) if e.HasField("summary")
              for v in e.summary.value]
    tags = {t for t, _ in values}
    assert {"train/loss", "train/lr", "train/grad_norm", "eval/loss"} <= tags
    assert {"perf/step_time_s", "perf/tokens_per_s"} <= tags
    text = [v for t, v in values if t == "sample/text_summary"]
    assert text and b"def f(x): return x" in text[0].tensor.string_val[0]
    assert any(t == "late/text_summary" for t, _ in values)
    hp = [v for t, v in values if t == "_hparams_/session_start_info"]
    assert hp and b"model.d_model" in hp[0].metadata.plugin_data.content
    assert b"train.seed" in hp[0].metadata.plugin_data.content
    assert "hparam/eval_loss" in tags and "hparam/eval_perplexity" not in tags
