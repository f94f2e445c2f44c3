"""Instruction and chat data (jaxformer/train/data/chat.py, `data prepare --format
prompt_completion|chat`): rendering, a loss mask that covers exactly the answers (checked against
transformers' return_assistant_tokens_mask), --train-on-prompt, bad records with their line, and
the JAX and torch trainers on masked data (same losses; train and eval count only the answers)."""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from chat_helpers import conversations, hf_tokenizer_dir, write_jsonl

from jaxformer import cli
from jaxformer.train.data import chat
from jaxformer.train.data import prepare as P
from jaxformer.train.data import tokenizer as tk
from jaxformer.train.data.tokens import TokensDir


def documents(d: TokensDir, split: str = "train"):
    """[(ids, mask)] of each document of a split, without its eos separator (and the
    separator's mask value)."""
    s = d.split(split)
    ids = s.read(0, s.num_tokens)
    mask = s.read_mask(0, s.num_tokens) if d.loss_mask else np.ones_like(ids)
    cuts = np.flatnonzero(ids == d.eos_id)
    starts = np.r_[0, cuts[:-1] + 1]
    return [(ids[a:b], mask[a:b], int(mask[b])) for a, b in zip(starts, cuts, strict=False)]


# ----------------------------------------------------------------------------- rendering
def test_named_templates_render_as_written():
    tok = tk.load_tokenizer("bytes")
    r = chat.renderer_for(tok, "bytes")
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": " U "},
            {"role": "assistant", "content": "A"}]
    render = lambda t, g=False: r.apply_chat_template(msgs, chat_template=chat.TEMPLATES[t],
                                                      tokenize=False, add_generation_prompt=g)
    assert render("chatml") == ("<|im_start|>system\nS<|im_end|>\n<|im_start|>user\n U <|im_end|>\n"
                                "<|im_start|>assistant\nA<|im_end|>\n")
    assert render("llama3") == ("<|start_header_id|>system<|end_header_id|>\n\nS<|eot_id|>"
                                "<|start_header_id|>user<|end_header_id|>\n\nU<|eot_id|>"
                                "<|start_header_id|>assistant<|end_header_id|>\n\nA<|eot_id|>")
    assert render("chatml", True).endswith("<|im_start|>assistant\n")


@pytest.mark.parametrize("template", ["chatml", "llama3"])
def test_chat_mask_equals_transformers_assistant_mask(template, tmp_path):
    """The tokenizer dir's own template (chatml) and a named one (llama3, with the dir's
    <|begin_of_text|>): our ids are apply_chat_template(tokenize=True)'s, and our mask is its
    return_assistant_tokens_mask (the {% generation %} blocks), token for token."""
    from transformers import AutoTokenizer
    hf_dir = hf_tokenizer_dir(tmp_path / "hf")
    rows = conversations(12)
    src = write_jsonl(tmp_path / "c.jsonl", rows)
    out = str(tmp_path / "o")
    P.prepare([src], hf_dir, out, P.PrepareOptions(fmt="chat", chat_template=None if template == "chatml" else template,
                                                   eval_fraction=0, progress=False))
    d = TokensDir(out)
    assert d.meta["version"] == 2 and d.loss_mask and d.meta["source"]["format"] == "chat"
    hf = AutoTokenizer.from_pretrained(hf_dir)
    docs = documents(d)
    assert len(docs) == len(rows)
    for row, (ids, mask, sep) in zip(rows, docs, strict=True):
        ref = hf.apply_chat_template(row["messages"], chat_template=chat.TEMPLATES[template], tokenize=True,
                                     return_dict=True, return_assistant_tokens_mask=True)
        assert ids.tolist() == ref["input_ids"]
        assert mask.tolist() == ref["assistant_masks"]
        assert sep == 0  # the separator eos is not an answer: the end-of-turn token is
        answers = [m["content"] + ("<|im_end|>" if template == "chatml" else "<|eot_id|>")
                   for m in row["messages"] if m["role"] == "assistant"]
        assert hf.decode(ids[mask == 1]) == "".join(answers)
    if template == "llama3":
        assert docs[0][0][0] == hf.convert_tokens_to_ids("<|begin_of_text|>")


def test_chat_mask_is_exactly_the_answers_bytes(tmp_path):
    """Byte ids: each run of mask 1 is one answer and its <|im_end|>, in order; nothing else."""
    rows = conversations(6)
    out = str(tmp_path / "o")
    P.prepare([write_jsonl(tmp_path / "c.jsonl", rows)], "bytes", out,
              P.PrepareOptions(fmt="chat", chat_template="chatml", eval_fraction=0, progress=False))
    for row, (ids, mask, _) in zip(rows, documents(TokensDir(out)), strict=False):
        edges = np.flatnonzero(np.diff(np.r_[0, mask, 0]))
        runs = [tk.decode(ids[a:b]) for a, b in zip(edges[::2], edges[1::2], strict=True)]
        assert runs == [m["content"] + "<|im_end|>" for m in row["messages"] if m["role"] == "assistant"]


def test_prompt_completion_and_train_on_prompt(tmp_path):
    rows = [{"q": "2+2=", "a": " 4"}, {"q": "Capital of France?", "a": " Paris."}, {"q": "", "a": "yes"}]
    src = write_jsonl(tmp_path / "pc.jsonl", rows)
    tj = str(tmp_path / "tok.json")
    with open(tj, "wb") as f:
        f.write(Path(os.path.join(hf_tokenizer_dir(tmp_path / "hf"), "tokenizer.json")).read_bytes())
    for spec in ("bytes", tj):
        tok = tk.load_tokenizer(spec)
        masked, whole = str(tmp_path / f"m{spec == 'bytes'}"), str(tmp_path / f"w{spec == 'bytes'}")
        kw = dict(fmt="prompt_completion", prompt_field="q", completion_field="a", eval_fraction=0, progress=False)
        P.prepare([src], spec, masked, P.PrepareOptions(**kw))
        P.prepare([src], spec, whole, P.PrepareOptions(train_on_prompt=True, **kw))
        dm, dw = TokensDir(masked), TokensDir(whole)
        assert dm.loss_mask and not dw.loss_mask and not any(n.endswith(".mask.npy") for n in os.listdir(whole))
        for row, (ids, mask, sep), (ids_w, _, _) in zip(rows, documents(dm), documents(dw), strict=False):
            assert ids.tolist() == ids_w.tolist() == tok.encode(row["q"] + row["a"]).tolist()
            assert tok.decode(ids[mask == 1]) == row["a"] and tok.decode(ids[mask == 0]) == row["q"]
            assert sep == 1  # the completion's stop counts with it
        split = dm.meta["splits"]["train"]
        assert split["loss_tokens"] == int(dm.split("train").read_mask(0, split["tokens"]).sum())


def test_version_1_directories_still_load(tmp_path):
    out = str(tmp_path / "o")
    P.prepare([write_jsonl(tmp_path / "t.jsonl", [{"text": "one doc"}, {"text": "two"}])], "bytes", out,
              P.PrepareOptions(eval_fraction=0, progress=False))
    meta_path = os.path.join(out, "meta.json")
    meta = json.loads(Path(meta_path).read_text())
    assert meta["version"] == 2 and meta["loss_mask"] is False
    meta["version"] = 1
    del meta["loss_mask"]
    Path(meta_path).write_text(json.dumps(meta))
    d = TokensDir(out)
    assert not d.loss_mask and d.split("train").masks is None
    assert tk.decode(d.split("train").read(0, 7)) == "one doc"


# ----------------------------------------------------------------------------- bad records
BAD_LINES = [  # (line text, phrase of its error); line 1 is good, blank lines are skipped
    ("not json", "not a JSON object"),
    ('{"msgs": []}', "no field 'messages' (its fields: msgs)"),
    ('{"messages": [{"role": "robot", "content": "x"}, {"role": "assistant", "content": "y"}]}',
     "unknown role 'robot'"),
    ('{"messages": [{"role": "user", "content": "x"}, {"role": "tool", "content": "y"}]}',
     "unknown role 'tool'; known: system, user, assistant (tool roles need a template that handles them)"),
    ('{"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "  "}]}',
     "message 2 is an empty answer"),
    ('{"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": ["y"]}]}',
     "content is a JSON list"),
    ('{"messages": [{"role": "user", "content": "x"}]}', "no assistant message"),
    ('{"messages": [{"role": "system", "content": "x"}, {"role": "assistant", "content": "y"}]}',
     "the chat template (FILE) failed: TemplateError: no system turns here"),
]
RAISING = ("{%- for m in messages -%}{%- if m['role'] == 'system' -%}{{ raise_exception('no system turns here') }}"
           "{%- endif -%}{{ m['role'] + ': ' + m['content'] + '\n' }}{%- endfor -%}")


def test_bad_records_name_their_line_or_are_skipped_and_counted(tmp_path, capsys):
    good = json.dumps(conversations(2)[1])  # no system turn: RAISING renders it
    template = tmp_path / "t.jinja"
    template.write_text(RAISING)
    base = ["data", "prepare", "--format", "chat", "--chat-template", str(template), "--tokenizer", "bytes",
            "--eval-fraction", "0", "--no-progress"]
    for i, (line, phrase) in enumerate(BAD_LINES):
        src = write_jsonl(tmp_path / f"b{i}.jsonl", [good, "", line])
        out = str(tmp_path / f"o{i}")
        assert cli.main([*base, "--input", src, "--out", out]) == 2
        err = capsys.readouterr().err
        assert f"b{i}.jsonl:3: " in err and phrase.replace("FILE", str(template)) in err, err
        assert len(err.strip().splitlines()) <= 2 and "Traceback" not in err
        assert not os.path.exists(out) and not [n for n in os.listdir(tmp_path) if n.startswith(".tmp-")]
    src = write_jsonl(tmp_path / "all.jsonl", [good] + [ln for ln, _ in BAD_LINES] + [good])
    out = str(tmp_path / "skipped")
    assert cli.main([*base, "--input", src, "--out", out, "--skip-bad"]) == 0
    printed = capsys.readouterr().out
    assert f"skipped {len(BAD_LINES)} bad record(s); the first: {src}:2: not a JSON object" in printed
    meta = TokensDir(out).meta
    assert meta["splits"]["train"]["documents"] == 2 and meta["source"]["skipped_bad"] == len(BAD_LINES)


def test_prompt_completion_bad_records(tmp_path):
    src = write_jsonl(tmp_path / "pc.jsonl", ['{"prompt": "a", "completion": "b"}', '{"prompt": "a"}',
                                              '{"prompt": "a", "completion": " "}', '{"prompt": 3, "completion": "b"}'])
    kw = dict(fmt="prompt_completion", eval_fraction=0, progress=False)
    with pytest.raises(ValueError, match=r"pc.jsonl:2: no field 'completion' \(its fields: prompt\); name it "
                                         "with --completion-field"):
        P.prepare([src], "bytes", str(tmp_path / "o"), P.PrepareOptions(**kw))
    meta = P.prepare([src], "bytes", str(tmp_path / "o"), P.PrepareOptions(skip_bad=True, **kw))
    assert meta["source"]["skipped_bad"] == 3 and meta["splits"]["train"]["documents"] == 1
    assert "pc.jsonl:2:" in meta["source"]["first_bad"]


# ----------------------------------------------------------------------------- training on the mask
def _masked_run(tmp_path, **train):
    from jaxformer.train.config import config_from_dict
    rows = conversations(48)
    out = str(tmp_path / "data")
    P.prepare([write_jsonl(tmp_path / "c.jsonl", rows[:40])], "bytes", out,
              P.PrepareOptions(fmt="chat", chat_template="chatml",
                               eval_files=[write_jsonl(tmp_path / "e.jsonl", rows[40:])], progress=False))
    model = {"name": "lm", "vocab_size": 259, "max_len": 32, "d_model": 32, "num_heads": 4, "d_ff": 64,
             "num_layers": 2, "dropout": 0.0}
    train = {"steps": 2, "batch_size": 8, "grad_accum_steps": 2, "lr": 3e-3, "warmup_steps": 0,
             "label_smoothing": 0.1, "eval_every": 2, "eval_batches": 2, "checkpoint_every": 2,
             "async_checkpoint": False, **train}
    return config_from_dict({"model": model, "data": {"name": "tokens", "path": out, "seq_len": 16},
                             "train": train})


def _masked_ce(logits, tokens, mask, eps):
    """Smoothed cross-entropy over the masked-in targets, in float64 numpy: an independent
    reference for the trainers' (sum, count) loss."""
    x = logits.astype(np.float64)
    logp = x - x.max(-1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
    nll = -np.take_along_axis(logp, tokens[:, 1:, None], -1)[..., 0]
    loss = (1 - eps) * nll - eps * logp.mean(-1)
    w = mask[:, 1:].astype(np.float64)
    return float((loss * w).sum() / w.sum())


def test_jax_and_torch_train_and_eval_on_the_answers_only(tmp_path):
    """Both trainers on chat data: the same per-step losses; step 0's loss is the masked
    cross-entropy of the global batch (divided by its answer-token count, with 2 micro-batches),
    and eval_loss that of the eval windows, both against a float64 reference."""
    import torch

    from jaxformer.convert import load_torch_state_dict
    from jaxformer.models import build_model as jbuild
    from jaxformer.train.data import batch_at, load_sources
    from jaxformer.train.jax_trainer import JaxTrainer
    from jaxformer.train.torch.trainer import TorchTrainer
    from torch_ref.models import build_model as tbuild
    cfg = _masked_run(tmp_path)
    tmod, jmod = tbuild("lm", cfg.model, seed=3), jbuild("lm", cfg.model, seed=0)
    load_torch_state_dict(jmod, tmod.state_dict())
    train, evaluation = load_sources("tokens", cfg.data, cfg.train.seed)
    batch = batch_at(train, 0, 8, cfg.train.seed)
    m = batch["loss_mask"][:, 1:]
    assert 0 < m[:4].sum() != m[4:].sum() > 0 and m.sum() < m.size  # micro-batches differ in count
    with torch.no_grad():
        logits = tmod(torch.from_numpy(batch["tokens"][:, :-1]).long()).numpy()
    want0 = _masked_ce(logits, batch["tokens"], batch["loss_mask"], 0.1)
    everything = _masked_ce(logits, batch["tokens"], np.ones_like(batch["loss_mask"]), 0.1)
    jh = JaxTrainer(cfg, str(tmp_path / "jax"), model=jmod, progress=False).run()
    tt = TorchTrainer(cfg, str(tmp_path / "torch"), module=tmod, progress=False)
    th = tt.run()
    rel = lambda a, b: abs(a - b) / max(1.0, abs(b))  # the trajectory test's measure
    dloss = max(rel(a["loss"], b["loss"]) for a, b in zip(jh, th, strict=False))
    print(f"masked chat data: JAX vs torch max |dloss|/max(1,|loss|) {dloss:.2e}; step 0 JAX {jh[0]['loss']:.6f} "
          f"torch {th[0]['loss']:.6f} float64 reference {want0:.6f} (all tokens {everything:.6f})")
    assert len(jh) == len(th) == 2 and dloss <= 1e-6
    assert rel(jh[0]["loss"], want0) <= 1e-6 and rel(th[0]["loss"], want0) <= 1e-6
    assert abs(everything - want0) > 1e-2  # the mask matters for this batch
    # eval: the first eval_batches * batch_size windows, answers only, with the final weights
    jeval, teval = jh[-1]["eval_loss"], th[-1]["eval_loss"]
    rows = [evaluation[i] for i in range(16)]
    tokens = np.stack([r["tokens"] for r in rows])
    mask = np.stack([r["loss_mask"] for r in rows])
    tt.module.eval()
    with torch.no_grad():
        logits = tt.module(torch.from_numpy(tokens[:, :-1]).long()).numpy()
    want = _masked_ce(logits, tokens, mask, 0.1)
    print(f"eval_loss JAX {jeval:.6f} torch {teval:.6f} float64 reference {want:.6f}")
    assert rel(teval, want) <= 1e-6  # the same weights: fp32 against float64
    assert rel(jeval, teval) <= 1e-5  # two trained steps apart, as the trajectory parity test allows drift
