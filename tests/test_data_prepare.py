"""Tokenizer specs (jaxformer/train/data/tokenizer.py), `jaxformer data prepare`
(jaxformer/train/data/prepare.py) and text in/out for `jaxformer generate`: each spec kind,
each input format, both eval splits, every bad input (a clear error naming the file and line,
nothing written), and generated text from a byte-level and a tokenizer.json checkpoint."""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pytest

from jaxformer import cli
from jaxformer.train.data import prepare as P
from jaxformer.train.data import tokenizer as tk
from jaxformer.train.data.tokens import TokensDir

WORDS = ("the quick brown fox jumps over a lazy dog while seven cats sing songs about "  # noqa: SIM905 (words read as one sentence)
         "rivers and mountains near the old town").split()


def paragraphs(n: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    return ["\n".join(" ".join(rng.choice(WORDS, 8)) for _ in range(2)) for _ in range(n)]


def write(path, text: str | bytes) -> str:
    os.makedirs(os.path.dirname(str(path)), exist_ok=True)
    with open(path, "wb") as f:
        f.write(text if isinstance(text, bytes) else text.encode("utf-8"))
    return str(path)


def foreign_tokenizer(vocab: int = 300):
    """A GPT-2-like byte-level BPE built with `tokenizers` directly (<|endoftext|> = id 0)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(paragraphs(50), trainers.BpeTrainer(
        vocab_size=vocab, special_tokens=["<|endoftext|>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return tok


def docs_of(d: TokensDir, split: str, tok) -> list[str]:
    """The documents of a split, decoded (the stream cut at each eos)."""
    s = d.split(split)
    ids = s.read(0, s.num_tokens)
    assert ids[-1] == d.eos_id
    cuts = np.flatnonzero(ids == d.eos_id)
    return [tok.decode(ids[a + 1 if i else 0:b]) for i, (a, b) in enumerate(zip(np.r_[-1, cuts[:-1]], cuts, strict=True))]


def run_cli(argv, capsys) -> tuple[int, str, str]:
    code = cli.main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def leftovers(parent) -> list[str]:
    return [n for n in os.listdir(parent) if n.startswith(".tmp-")]


# ----------------------------------------------------------------------------- tokenizer specs
def test_bytes_spec_keeps_the_byte_ids():
    tok = tk.load_tokenizer("bytes")
    assert tok.encode("Hel").tolist() == [72 + 3, 101 + 3, 108 + 3]
    assert tok.decode([1, 75, 104, 111, 2, 0]) == "Hel"  # specials dropped
    assert (tok.vocab_size, tok.eos_id, tok.bos_id) == (259, 2, 1)
    assert tok.describe() == {"spec": "bytes", "kind": "bytes", "file": None, "sha256": tk.BYTES_SHA256}
    assert tok.decode(tok.encode("naïve ✓")) == "naïve ✓"
    # its `tokenizers` twin (what an HF export carries) gives the same ids for any text
    from tokenizers import Tokenizer
    twin = Tokenizer.from_str(tk.bytes_tokenizer_json().decode())
    text = "".join(map(chr, range(0x800))) + "日本語 😀 \U0010ffff"
    assert twin.encode(text).ids == tok.encode(text).tolist() and twin.decode(twin.encode(text).ids) == text


def test_tokenizer_json_and_hf_dir_specs(tmp_path):
    from transformers import AutoTokenizer, PreTrainedTokenizerFast
    raw = foreign_tokenizer()
    path = str(tmp_path / "t" / "tokenizer.json")
    os.makedirs(os.path.dirname(path))
    raw.save(path)
    tok = tk.load_tokenizer(path)
    text = "the lazy fox sings near rivers"
    assert tok.encode(text).tolist() == raw.encode(text).ids and tok.decode(tok.encode(text)) == text
    assert tok.eos_id == 0 and tok.vocab_size == raw.get_vocab_size()  # <|endoftext|> found by name
    assert tok.describe() == {"spec": path, "kind": "tokenizers", "file": "tokenizer.json",
                              "sha256": hashlib.sha256(Path(path).read_bytes()).hexdigest()}
    # an HF dir with tokenizer.json + tokenizer_config.json: eos from the config
    hf = str(tmp_path / "hf")
    PreTrainedTokenizerFast(tokenizer_object=raw, eos_token="<|endoftext|>").save_pretrained(hf)
    t2 = tk.load_tokenizer(hf)
    assert t2.kind == "tokenizers" and t2.eos_id == 0 and t2.encode(text).tolist() == tok.encode(text).tolist()
    # an HF dir with only vocab.json + merges.txt: transformers' AutoTokenizer, its fast form saved
    slow = tmp_path / "slow"
    slow.mkdir()
    raw.model.save(str(slow))
    write(slow / "tokenizer_config.json", json.dumps({"tokenizer_class": "GPT2Tokenizer",
                                                       "eos_token": "<|endoftext|>"}))
    t3 = tk.load_tokenizer(str(slow))
    ref = AutoTokenizer.from_pretrained(str(slow), local_files_only=True)
    assert t3.kind == "transformers" and t3.describe()["file"] == "tokenizer.json"
    assert t3.encode(text).tolist() == ref(text)["input_ids"] and t3.decode(t3.encode(text)) == text
    assert t3.eos_id == ref.eos_token_id


@pytest.mark.parametrize("spec,phrase", [
    ("gpt2", "nothing is downloaded"),
    ("meta-llama/Llama-3.2-1B", "nothing is downloaded"),
    ("bpe:100", "at least 259"),
    ("bpe:lots", "takes a vocab size"),
    ("", "give a tokenizer.json file"),
])
def test_bad_specs(spec, phrase):
    with pytest.raises(ValueError, match=phrase):
        (tk.parse_bpe_spec if spec.startswith("bpe:") else tk.load_tokenizer)(spec)


def test_bad_spec_files(tmp_path):
    with pytest.raises(ValueError, match="is not a `tokenizers` tokenizer.json"):
        tk.load_tokenizer(write(tmp_path / "x.json", '{"hello": 1}'))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="the directory has no tokenizer"):
        tk.load_tokenizer(str(tmp_path / "empty"))
    with pytest.raises(ValueError, match="only `jaxformer data prepare` takes it"):
        tk.load_tokenizer("bpe:300")


# ----------------------------------------------------------------------------- prepare: formats
def test_prepare_text_modes_bytes(tmp_path):
    paras = paragraphs(30)
    src = write(tmp_path / "in" / "a.txt", "\n\n\n".join(paras) + "\n")
    lines = [ln for p in paras for ln in p.split("\n")]
    for mode, expected in (("paragraph", paras), ("line", lines), ("file", ["\n\n\n".join(paras) + "\n"])):
        out = str(tmp_path / mode)
        meta = P.prepare([src], "bytes", out, P.PrepareOptions(text_docs=mode, eval_fraction=0, progress=False))
        d = TokensDir(out)
        assert docs_of(d, "train", tk.ByteTokenizer()) == expected
        assert meta["splits"]["train"]["documents"] == len(expected) and meta["splits"]["eval"]["documents"] == 0
        assert (d.dtype, d.vocab_size, d.eos_id) == (np.uint16, 259, 2) and d.tokenizer["kind"] == "bytes"
        assert not os.path.exists(os.path.join(out, "tokenizer.json"))
    # bounded shards: the same stream in many files
    meta = P.prepare([src], "bytes", str(tmp_path / "sharded"), P.PrepareOptions(eval_fraction=0, progress=False, shard_tokens=500))
    shards = meta["splits"]["train"]["shards"]
    assert len(shards) == 5 and all(s["tokens"] < 500 + 100 for s in shards)  # a shard ends after a document
    assert docs_of(TokensDir(str(tmp_path / "sharded")), "train", tk.ByteTokenizer()) == paras


def test_prepare_long_documents_stream_in_pieces(tmp_path, monkeypatch):
    """Documents longer than PIECE_BYTES are read and encoded in pieces: one document each all
    the same (the byte tokenizer is exact at any cut), lines longer than a piece included."""
    monkeypatch.setattr(P, "PIECE_BYTES", 64)
    paras = paragraphs(6) + ["x" * 500 + "\n" + "é" * 300]
    src = write(tmp_path / "long.txt", "\n\n".join(paras))
    for mode, expected in (("paragraph", paras), ("file", ["\n\n".join(paras)])):
        out = str(tmp_path / mode)
        P.prepare([src], "bytes", out, P.PrepareOptions(text_docs=mode, eval_fraction=0, progress=False, batch_bytes=100))
        assert docs_of(TokensDir(out), "train", tk.ByteTokenizer()) == expected
    rows = write(tmp_path / "long.jsonl", "".join(json.dumps({"text": p}) + "\n" for p in paras))
    P.prepare([rows], "bytes", str(tmp_path / "j"), P.PrepareOptions(eval_fraction=0, progress=False))
    assert docs_of(TokensDir(str(tmp_path / "j")), "train", tk.ByteTokenizer()) == paras


def test_prepare_jsonl_parquet_arrow_with_bpe(tmp_path):
    """bpe:300 trained on JSONL; the same rows as Parquet (pyarrow) and a `datasets`
    save_to_disk dir give the same tokens with that tokenizer.json."""
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq
    paras = paragraphs(40)
    rows = write(tmp_path / "in" / "d.jsonl",
                 "".join(json.dumps({"id": i, "body": p}) + "\n" + ("\n" if i % 7 == 0 else "")
                         for i, p in enumerate(paras)))
    out = str(tmp_path / "bpe")
    meta = P.prepare([rows], "bpe:300", out, P.PrepareOptions(field="body", eval_fraction=0.2, progress=False))
    d = TokensDir(out)
    tok = tk.load_tokenizer(os.path.join(out, "tokenizer.json"))
    assert meta["vocab_size"] == tok.vocab_size == 300 and d.eos_id == tok.eos_id == 2
    assert d.tokenizer == {"spec": "bpe:300", "kind": "tokenizers", "file": "tokenizer.json", "sha256": tok.sha256}
    assert tk.tokenizer_for_tokens_dir(out).sha256 == tok.sha256
    train, ev = docs_of(d, "train", tok), docs_of(d, "eval", tok)
    assert sorted(train + ev) == sorted(paras) and 0 < len(ev) < len(paras) // 2
    assert d.split("train").num_tokens < sum(len(p) for p in train)  # merges happened
    pq.write_table(pa.table({"body": paras, "n": list(range(len(paras)))}), str(tmp_path / "in" / "d.parquet"))
    datasets.Dataset.from_dict({"body": paras}).save_to_disk(str(tmp_path / "in" / "saved"))
    tj = os.path.join(out, "tokenizer.json")
    for name in ("d.parquet", "saved"):
        o = str(tmp_path / name.replace(".", "_"))
        P.prepare([str(tmp_path / "in" / name)], tj, o, P.PrepareOptions(field="body", eval_fraction=0.2, progress=False))
        for split in ("train", "eval"):
            a, b = TokensDir(o).split(split), d.split(split)
            np.testing.assert_array_equal(a.read(0, a.num_tokens), b.read(0, b.num_tokens))


def test_post_processor_specials_per_document(tmp_path, monkeypatch):
    """A tokenizer whose post-processor wraps a text as <s> ... <|endoftext|> (eos): each
    document gets one <s> and one eos; a document read in pieces gets them once too."""
    from tokenizers.processors import TemplateProcessing
    raw = foreign_tokenizer()
    raw.add_special_tokens(["<s>"])
    bos = raw.token_to_id("<s>")
    raw.post_processor = TemplateProcessing(single="<s> $A <|endoftext|>",
                                            special_tokens=[("<s>", bos), ("<|endoftext|>", 0)])
    path = str(tmp_path / "tokenizer.json")
    raw.save(path)
    monkeypatch.setattr(P, "PIECE_BYTES", 64)
    paras = paragraphs(3) + ["\n".join(paragraphs(4))]  # the last one is read in pieces
    src = write(tmp_path / "a.txt", "\n\n".join(p.replace("\n", " ") for p in paras[:3]) + "\n\n" + paras[3])
    P.prepare([src], path, str(tmp_path / "o"), P.PrepareOptions(eval_fraction=0, progress=False))
    s = TokensDir(str(tmp_path / "o")).split("train")
    ids = s.read(0, s.num_tokens)
    assert (ids == bos).sum() == 4 and (ids == 0).sum() == 4 and ids[0] == bos and ids[-1] == 0
    text = raw.decode(ids.tolist(), skip_special_tokens=False)
    assert text.replace("<s>", " ").replace("<|endoftext|>", " ").split() == " ".join(paras).split()


def test_eval_split_is_deterministic_by_content_or_files(tmp_path):
    paras = paragraphs(200)
    a = write(tmp_path / "a.txt", "\n\n".join(paras))
    b = write(tmp_path / "b.txt", "\n\n".join(reversed(paras)))  # same documents, another order
    m1 = P.prepare([a], "bytes", str(tmp_path / "o1"), P.PrepareOptions(eval_fraction=0.1, progress=False))
    P.prepare([a], "bytes", str(tmp_path / "o2"), P.PrepareOptions(eval_fraction=0.1, progress=False))
    P.prepare([b], "bytes", str(tmp_path / "o3"), P.PrepareOptions(eval_fraction=0.1, progress=False))
    for name in ("train-00000.npy", "eval-00000.npy"):
        assert (tmp_path / "o1" / name).read_bytes() == (tmp_path / "o2" / name).read_bytes()
    bt = tk.ByteTokenizer()
    ev1, ev3 = docs_of(TokensDir(str(tmp_path / "o1")), "eval", bt), docs_of(TokensDir(str(tmp_path / "o3")), "eval", bt)
    assert sorted(ev1) == sorted(ev3) and 8 <= len(ev1) <= 35 and m1["source"]["eval_fraction"] == 0.1
    # --eval FILE: that file is the eval split, the input all train
    e = write(tmp_path / "e.txt", "held out one\n\nheld out two\n")
    meta = P.prepare([a], "bytes", str(tmp_path / "o4"), P.PrepareOptions(eval_files=[e], progress=False))
    d = TokensDir(str(tmp_path / "o4"))
    assert docs_of(d, "eval", bt) == ["held out one", "held out two"] and meta["splits"]["train"]["documents"] == 200
    # two documents and a fraction that picks neither: the last one is held out
    small = write(tmp_path / "s.txt", "first doc\n\nsecond doc\n")
    meta = P.prepare([small], "bytes", str(tmp_path / "o5"), P.PrepareOptions(eval_fraction=1e-9, progress=False))
    assert meta["source"]["eval_held_out_last"] and docs_of(TokensDir(str(tmp_path / "o5")), "eval", bt) == ["second doc"]


# ----------------------------------------------------------------------------- prepare: bad input
def _bad_cases(tmp):
    good = write(os.path.join(tmp, "good.txt"), "a fine document\n\nanother one\n")
    return [
        ("empty", [write(os.path.join(tmp, "empty.txt"), "\n\n  \n")], [], "empty input"),
        ("empty_jsonl", [write(os.path.join(tmp, "e.jsonl"), "")], [], "empty input"),
        ("missing_field", [write(os.path.join(tmp, "d.jsonl"), '{"text": "a"}\n{"body": "b"}\n')], [],
         "d.jsonl:2: no field 'text' (its fields: body)"),
        ("not_json", [write(os.path.join(tmp, "n.jsonl"), '{"text": "a"}\n{"text": \n')], [], "n.jsonl:2: not a JSON object"),
        ("not_utf8", [write(os.path.join(tmp, "l1.txt"), b"ok\nstill ok\nbad \xff byte\n")], [],
         "l1.txt:3: not UTF-8 text (byte 0xff at column 5)"),
        ("not_utf8_jsonl", [write(os.path.join(tmp, "l1.jsonl"), b'{"text": "a"}\n{"text": "\xe9"}\n')], [],
         "l1.jsonl:2: not UTF-8 text"),
        ("null_row", [os.path.join(tmp, "nulls.parquet")], [], "nulls.parquet: row 2: column 'text' is null"),
        ("no_column", [os.path.join(tmp, "nulls.parquet"), "--field", "body"], [], "no column 'body' (its columns: text)"),
        ("uint16_too_small", [good, "--tokenizer", "bpe:70000", "--dtype", "uint16"], [],
         "vocab of 70000 ids; uint16 stores at most 65536"),
        ("missing_input", [good, os.path.join(tmp, "nowhere.txt")], [], "nowhere.txt does not exist"),
        ("bad_spec", [good, "--tokenizer", "gpt2"], [], "nothing is downloaded"),
        ("field_on_text", [good, "--field", "body"], [], "applies to JSONL/Parquet/Arrow inputs"),
        ("one_doc_no_eval", [write(os.path.join(tmp, "one.txt"), "just one\n")], [], "picked none of the 1 document"),
        ("out_exists", [good], ["exists"], "exists; choose another output or pass --overwrite"),
    ]


def test_bad_inputs_fail_clearly_and_write_nothing(tmp_path, capsys):
    import pyarrow as pa
    import pyarrow.parquet as pq
    tmp = str(tmp_path)
    pq.write_table(pa.table({"text": ["a", None]}), os.path.join(tmp, "nulls.parquet"))
    for name, args, flags, phrase in _bad_cases(tmp):
        out = os.path.join(tmp, "out_" + name)
        if "exists" in flags:
            write(os.path.join(out, "keep.txt"), "mine")
        files = [a for a in args if not a.startswith("--") and (a == args[0] or os.sep in a)]
        rest = args[len(files):]
        argv = ["data", "prepare", "--input", *files, "--out", out, "--no-progress", *rest]
        if "--tokenizer" not in rest:
            argv += ["--tokenizer", "bytes"]
        code, _, err = run_cli(argv, capsys)
        assert code == 2 and phrase in err, (name, err)
        assert len(err.strip().splitlines()) <= 2 and "Traceback" not in err, (name, err)
        if "exists" in flags:
            assert os.listdir(out) == ["keep.txt"] and Path(os.path.join(out, "keep.txt")).read_text() == "mine"
        else:
            assert not os.path.exists(out), name
        assert leftovers(tmp) == [], name


# ----------------------------------------------------------------------------- generate text
def _tiny_lm(vocab: int):
    from jaxformer.config.models import LMConfig
    from jaxformer.models import build_model
    cfg = LMConfig.tiny("llama", vocab_size=vocab, max_len=48, eos_id=2, bos_id=1)
    return cfg, build_model("lm", cfg, seed=0)


def test_generate_text_with_the_checkpoints_tokenizer(tmp_path, capsys):
    """A byte-vocab checkpoint prints text ("Hel" -> byte ids + 3); a checkpoint whose
    model.yaml records a tokenizer.json prompts and prints with it; --ids gives the same ids."""
    from jaxformer import checkpoint_io
    cfg, model = _tiny_lm(259)
    checkpoint_io.save_model(model, "lm", cfg, str(tmp_path / "bytes"))
    common = ["--max-new-tokens", "5", "--no-eos-stop", "--json"]
    code, out, err = run_cli(["generate", "--weights", str(tmp_path / "bytes"), "--prompt", "Hel", *common], capsys)
    assert code == 0, err
    text = json.loads(out)
    code, out, _ = run_cli(["generate", "--weights", str(tmp_path / "bytes"), "--ids", "--prompt", "75 104 111", *common], capsys)
    assert json.loads(out)["tokens"] == text["tokens"] and "texts" not in json.loads(out)
    assert text["texts"] == [tk.decode([75, 104, 111] + text["tokens"][0])] and text["texts"][0].startswith("Hel")
    assert cli.main(["export", str(tmp_path / "bytes"), "--to", "hf", str(tmp_path / "bytes_hf")]) == 0
    from transformers import AutoTokenizer
    hf_tok = AutoTokenizer.from_pretrained(str(tmp_path / "bytes_hf"), local_files_only=True)
    assert hf_tok("Hel")["input_ids"] == [75, 104, 111] and hf_tok.eos_token_id == 2
    capsys.readouterr()
    # a tokenizer.json checkpoint (as the trainer records it: model.yaml entry + file)
    prep = str(tmp_path / "data")
    P.prepare([write(tmp_path / "c.txt", "\n\n".join(paragraphs(30)))], "bpe:300", prep, P.PrepareOptions(eval_fraction=0, progress=False))
    tok = tk.load_tokenizer(prep)
    cfg, model = _tiny_lm(320)
    checkpoint_io.save_model(model, "lm", cfg, str(tmp_path / "bpe"), tokenizer=tok.describe(),
                             tokenizer_file=os.path.join(prep, "tokenizer.json"))
    assert tk.tokenizer_for_checkpoint(str(tmp_path / "bpe")).sha256 == tok.sha256
    code, out, err = run_cli(["generate", "--weights", str(tmp_path / "bpe"), "--prompt", "the lazy fox",
                              "--max-new-tokens", "5", "--no-eos-stop"], capsys)
    assert code == 0 and out.startswith("the lazy fox"), (out, err)
    ids = " ".join(map(str, tok.encode("the lazy fox")))
    code, out2, _ = run_cli(["generate", "--weights", str(tmp_path / "bpe"), "--ids", "--prompt", ids,
                             "--max-new-tokens", "5", "--no-eos-stop"], capsys)
    assert out.rstrip("\n") == tok.decode(tok.encode("the lazy fox").tolist() + [int(t) for t in out2.split()])
    # exports carry it: model.yaml's entry + tokenizer.json (flax), tokenizer.json (hf)
    for to in ("flax", "hf"):
        assert cli.main(["export", str(tmp_path / "bpe"), "--to", to, str(tmp_path / to)]) == 0
        assert (tmp_path / to / "tokenizer.json").read_bytes() == tok.content
    assert checkpoint_io.tokenizer_entry(str(tmp_path / "flax")) == tok.describe()
    capsys.readouterr()
    # the recorded hash protects against a swapped file; a vocab without a record asks for one
    write(tmp_path / "bpe" / "tokenizer.json", foreign_tokenizer().to_str())
    code, _, err = run_cli(["generate", "--weights", str(tmp_path / "bpe"), "--prompt", "x"], capsys)
    assert code == 2 and "differs from the recorded" in err
    checkpoint_io.save_model(model, "lm", cfg, str(tmp_path / "none"))
    code, _, err = run_cli(["generate", "--weights", str(tmp_path / "none"), "--prompt", "x"], capsys)
    assert code == 2 and "records no tokenizer (vocab 320); pass --tokenizer" in err


def test_convert_hf_with_tokenizer_writes_tokens_train_yaml(tmp_path, capsys):
    """`convert --from hf` of a checkpoint with a tokenizer: OUT/tokenizer.json (generate prints
    text from OUT), and train.yaml's data is a tokens dir whose header's command prepares it."""
    import shlex

    import transformers
    import yaml
    from transformers import PreTrainedTokenizerFast
    raw = foreign_tokenizer()
    src, out = str(tmp_path / "hf"), str(tmp_path / "ckpt")
    hf_cfg = transformers.LlamaConfig(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                      bos_token_id=None, eos_token_id=0, pad_token_id=0)
    transformers.LlamaForCausalLM(hf_cfg).save_pretrained(src)
    PreTrainedTokenizerFast(tokenizer_object=raw, eos_token="<|endoftext|>").save_pretrained(src)
    code, printed, err = run_cli(["convert", "--from", "hf", src, "--to", "flax", out], capsys)
    assert code == 0, err
    assert Path(os.path.join(out, "tokenizer.json")).read_bytes() == Path(os.path.join(src, "tokenizer.json")).read_bytes()
    text = Path(os.path.join(out, "train.yaml")).read_text()
    data = yaml.safe_load(text)["data"]
    assert data == {"name": "tokens", "path": out + "-data", "seq_len": 64}
    command = next(ln for ln in text.splitlines() if ln.startswith("#   jaxformer data prepare"))[4:]
    assert f"--tokenizer {src} " in command and f"data: {command}\n" in printed
    argv = shlex.split(command)[1:]
    argv[argv.index("YOUR_TEXT.txt")] = write(tmp_path / "mine.txt", "\n\n".join(paragraphs(20)))
    code, _, err = run_cli(argv + ["--no-progress"], capsys)
    assert code == 0, err
    d = TokensDir(data["path"])
    assert d.eos_id == 0 and d.tokenizer["sha256"] == hashlib.sha256(Path(os.path.join(src, "tokenizer.json")).read_bytes()).hexdigest()
    code, out_text, err = run_cli(["generate", "--weights", out, "--prompt", "the fox", "--max-new-tokens", "3",
                                   "--no-eos-stop"], capsys)
    assert code == 0 and out_text.startswith("the fox"), err
