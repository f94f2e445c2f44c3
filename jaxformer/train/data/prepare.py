"""`jaxformer data prepare`: text files -> a tokens directory (jaxformer/train/data/tokens.py)
that `data.name: tokens` trains from.

    meta = prepare(["a.txt", "b.jsonl"], "bpe:8000", "data/mine", PrepareOptions(field="text"))

Inputs, by file name:
    *.jsonl, *.ndjson, *.json  JSON lines: one object per line, its `field` (default "text") a document
    *.parquet, *.arrow         read by the `datasets` library (streaming, local files only), the
    a `save_to_disk` dir       `field` column: one row, one document
    anything else              UTF-8 text, split into documents by `text_docs`:
                               "paragraph" (default): blocks separated by blank lines;
                               "line": every non-blank line; "file": the whole file
Instruction and chat data (fmt "prompt_completion" or "chat", JSON lines only) are read record
by record by data/chat.py, which renders each, encodes it and marks its answer tokens: the
directory then holds a loss mask beside the ids (tokens.py), unless train_on_prompt.

Documents are encoded one by one with the tokenizer's own post-processor (e.g. Llama's leading
<s>, as transformers' `tokenizer(text)` does; an eos it appends is not doubled) and written back
to back, each followed by the eos id. Empty and blank documents are skipped.

Memory stays bounded whatever the input size: files are read line by line (JSON lines) or batch
by batch (Parquet/Arrow), a document longer than PIECE_BYTES is encoded in pieces cut at line
ends (a tokenizer that treats the start of a text specially, e.g. SentencePiece's leading "_",
may tokenize those cut points differently from one call), texts go to the tokenizer in batches
of about BATCH_BYTES, and the writer holds at most one shard. `bpe:VOCAB` trains with the
`tokenizers` iterator trainer on a first pass over the train documents.

The eval split is either `eval_files` (whole files) or a held-out fraction of the documents
chosen by a hash of each document's text (its first piece): deterministic, independent of input
order, and identical documents always land in the same split. If the fraction picks no document
the last (single-piece) document is held out, so small inputs still get an eval split.

Errors (ValueError / FileNotFoundError / FileExistsError, each naming the file and the line or
row) leave nothing at `out` and an existing `out` untouched: the directory is written in a
temporary folder that replaces `out` only when complete. Arguments, inputs' existence and the
tokenizer are checked before any input is read.
"""
from __future__ import annotations

import codecs
import dataclasses
import hashlib
import json
import os
import sys
from collections.abc import Callable, Iterator, Sequence

import numpy as np

from jaxformer.train.data import tokenizer as tk
from jaxformer.train.data.tokens import SHARD_TOKENS, TokensWriter, storage_dtype

TEXT_DOCS = ("paragraph", "line", "file")
JSON_SUFFIXES = (".jsonl", ".ndjson", ".json")
DATASET_SUFFIXES = (".parquet", ".arrow")
DEFAULT_FIELD = "text"
DEFAULT_EVAL_FRACTION = 0.01
PIECE_BYTES = 8 << 20  # a longer document is encoded in pieces cut at line ends
BATCH_BYTES = 4 << 20  # text per tokenizer call
BATCH_DOCS = 4096
ROWS_PER_BATCH = 1024  # Parquet/Arrow rows read at a time

# One item of the document stream: (text, first piece of its document, last piece).
Piece = tuple[str, bool, bool]


# ----------------------------------------------------------------------------- reading inputs
def input_kind(path: str) -> str:
    """"text", "jsonl" or "dataset" (Parquet, Arrow, or a `save_to_disk` directory)."""
    if os.path.isdir(path):
        return "dataset"
    low = path.lower()
    if low.endswith(JSON_SUFFIXES):
        return "jsonl"
    if low.endswith(DATASET_SUFFIXES):
        return "dataset"
    return "text"


def check_input(path: str) -> None:
    if not os.path.exists(path):
        raise FileNotFoundError(f"input {path} does not exist")
    if os.path.isdir(path) and not any(os.path.isfile(os.path.join(path, m))
                                       for m in ("dataset_info.json", "state.json", "dataset_dict.json")):
        raise ValueError(f"input {path} is a directory, not a text/JSONL/Parquet/Arrow file or a "
                         "datasets `save_to_disk` directory")


def input_bytes(path: str) -> int:
    if os.path.isdir(path):
        return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)
    return os.path.getsize(path)


def _lines(path: str, advance: Callable[[int], None]) -> Iterator[tuple[int, str, bool]]:
    """(line number, text, complete) of a UTF-8 file, strictly decoded, read in pieces of at
    most PIECE_BYTES: a longer line comes as several pieces, all but the last incomplete."""
    decoder = codecs.getincrementaldecoder("utf-8")("strict")
    lineno = 1
    with open(path, "rb") as f:
        while True:
            raw = f.readline(PIECE_BYTES)
            if not raw:
                break
            advance(len(raw))
            complete = raw.endswith(b"\n")
            try:
                text = decoder.decode(raw, final=complete)
            except UnicodeDecodeError as e:
                raise ValueError(f"{path}:{lineno}: not UTF-8 text (byte 0x{raw[e.start]:02x} at "
                                 f"column {e.start + 1}); convert the file to UTF-8") from None
            yield lineno, text, complete
            if complete:
                lineno += 1
        try:
            decoder.decode(b"", final=True)
        except UnicodeDecodeError:
            raise ValueError(f"{path}:{lineno}: not UTF-8 text (the file ends inside a character)") from None


def _split_long(text: str) -> Iterator[str]:
    """A document's text in pieces of about PIECE_BYTES or less, cut after a newline where one
    is near (a plain cut otherwise)."""
    limit = PIECE_BYTES // 4  # characters: at most 4 bytes each in UTF-8
    if len(text) <= limit:
        yield text
        return
    start = 0
    while start < len(text):
        end = min(start + limit, len(text))
        if end < len(text):
            nl = text.rfind("\n", start + limit // 2, end)
            end = nl + 1 if nl >= 0 else end
        yield text[start:end]
        start = end


def _document(text: str) -> Iterator[Piece]:
    pieces = list(_split_long(text)) if text.strip() else []
    for i, p in enumerate(pieces):
        yield p, i == 0, i == len(pieces) - 1


def read_text(path: str, text_docs: str, advance: Callable[[int], None]) -> Iterator[Piece]:
    """Documents of a text file (module docstring: "paragraph", "line" or "file"). A paragraph
    or line loses its trailing newline; a file is kept as it is."""
    buf: list[str] = []
    size, started, line_start = 0, False, True

    def end() -> Iterator[Piece]:  # the document ends here
        text = "".join(buf)
        if text_docs != "file":
            text = text.rstrip("\r\n")
        if started:
            yield text, False, True
        elif text.strip():
            yield text, True, True

    for _, text, complete in _lines(path, advance):
        blank = line_start and complete and not text.strip()
        line_start = complete
        if text_docs == "paragraph" and blank:
            yield from end()
            buf, size, started = [], 0, False
            continue
        buf.append(text)
        size += len(text)
        if text_docs == "line" and complete:
            yield from end()
            buf, size, started = [], 0, False
        elif (size >= PIECE_BYTES and complete or size >= 2 * PIECE_BYTES) and len(buf) > 1:
            # cut before the last line read, so the document's end (stripped) is in its last piece
            piece = "".join(buf[:-1])
            if started or piece.strip():
                yield piece, not started, False
                started = True
            buf = buf[-1:]
            size = len(buf[0])
    yield from end()


def read_jsonl(path: str, field: str, advance: Callable[[int], None]) -> Iterator[Piece]:
    """Documents of a JSON-lines file: the `field` of each object; blank lines are skipped."""
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            advance(len(raw))
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise ValueError(f"{path}:{lineno}: not UTF-8 text (byte 0x{raw[e.start]:02x} at "
                                 f"column {e.start + 1})") from None
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except RecursionError:
                raise ValueError(f"{path}:{lineno}: JSON nested too deeply to read") from None
            except ValueError as e:
                raise ValueError(f"{path}:{lineno}: not a JSON object ({getattr(e, 'msg', e)}); "
                                 "JSONL files hold one object per line") from None
            if not isinstance(obj, dict):
                raise ValueError(f"{path}:{lineno}: a JSON {type(obj).__name__}, not an object; JSONL "
                                 "files hold one object per line")
            if field not in obj:
                keys = ", ".join(map(str, list(obj)[:8])) or "none"
                raise ValueError(f"{path}:{lineno}: no field {field!r} (its fields: {keys}); name the "
                                 "text field with --field")
            text = obj[field]
            if not isinstance(text, str):
                raise ValueError(f"{path}:{lineno}: field {field!r} is a JSON "
                                 f"{'null' if text is None else type(text).__name__}, not a string")
            yield from _document(text)


def read_dataset(path: str, field: str, advance: Callable[[int], None]) -> Iterator[Piece]:
    """Documents of a Parquet or Arrow file, or a `datasets` save_to_disk dir: the `field`
    column, row by row, through the `datasets` library (streaming from the local file)."""
    try:
        import datasets
    except ImportError:
        raise ValueError(f"{path}: reading Parquet/Arrow needs the `datasets` library "
                         "(pip install 'jaxformer[data]')") from None
    try:
        if os.path.isdir(path):
            ds = datasets.load_from_disk(path)
        else:
            builder = "parquet" if path.lower().endswith(".parquet") else "arrow"
            ds = datasets.load_dataset(builder, data_files=[os.path.abspath(path)], split="train",
                                       streaming=True)
        features = getattr(ds, "features", None)
    except Exception as e:  # pyarrow and datasets raise their own kinds for a bad file
        raise ValueError(f"{path}: not readable by `datasets` ({type(e).__name__}: "
                         f"{_first_line(e)})") from None
    if isinstance(ds, datasets.DatasetDict):
        raise ValueError(f"input {path} holds the splits {', '.join(ds)}; give one of them, "
                         f"e.g. {os.path.join(path, next(iter(ds)))}")
    if features is not None:
        if field not in features:
            raise ValueError(f"{path}: no column {field!r} (its columns: {', '.join(features)}); "
                             "name the text column with --field")
        dtype = getattr(features[field], "dtype", None)
        if dtype not in ("string", "large_string"):
            raise ValueError(f"{path}: column {field!r} holds {features[field]}, not text")
    row = 0
    batches = ds.iter(batch_size=ROWS_PER_BATCH)
    while True:
        try:
            batch = next(batches)
        except StopIteration:
            break
        except Exception as e:
            raise ValueError(f"{path}: unreadable after row {row} ({type(e).__name__}: "
                             f"{_first_line(e)})") from None
        for text in batch[field]:
            row += 1
            if not isinstance(text, str):
                raise ValueError(f"{path}: row {row}: column {field!r} is "
                                 f"{'null' if text is None else type(text).__name__}, not text")
            yield from _document(text)
    advance(input_bytes(path))


def _first_line(e: BaseException) -> str:
    return ((str(e).strip().splitlines() or [type(e).__name__])[0])[:300]


def read_documents(path: str, *, field: str | None = None, text_docs: str = "paragraph",
                   advance: Callable[[int], None] = lambda n: None) -> Iterator[Piece]:
    """The documents of one input as (text, first, last) pieces (module docstring)."""
    kind = input_kind(path)
    if kind == "text":
        return read_text(path, text_docs, advance)
    if kind == "jsonl":
        return read_jsonl(path, field or DEFAULT_FIELD, advance)
    return read_dataset(path, field or DEFAULT_FIELD, advance)


# ----------------------------------------------------------------------------- the split
class Split:
    """Which split a document goes to: "eval" for every document of an eval file, else "eval"
    for a hashed fraction of documents (by their first piece's text), "train" for the rest."""

    def __init__(self, fraction: float):
        self.threshold = int(fraction * 2 ** 64)

    def of(self, text: str) -> str:
        if not self.threshold:
            return "train"
        h = hashlib.blake2b(text.encode("utf-8"), digest_size=8, person=b"jaxformer-eval").digest()
        return "eval" if int.from_bytes(h, "little") < self.threshold else "train"


def stream(inputs: list[str], eval_files: list[str], split: Split, *, field, text_docs,
           advance) -> Iterator[tuple[str, str, bool, bool]]:
    """(split, text, first, last) over the inputs, then the eval files."""
    for path, fixed in [(p, None) for p in inputs] + [(p, "eval") for p in eval_files]:
        where = fixed
        for text, first, last in read_documents(path, field=field, text_docs=text_docs, advance=advance):
            if first:
                where = fixed or split.of(text)
            yield where, text, first, last


# ----------------------------------------------------------------------------- prepare
def _progress(total: int, desc: str, enabled: bool):
    if not enabled:
        return None
    from tqdm import tqdm
    return tqdm(total=total, desc=desc, unit="B", unit_scale=True, unit_divisor=1024,
                dynamic_ncols=True, file=sys.stderr, leave=False)


def _advance(bar) -> Callable[[int], None]:
    return bar.update if bar is not None else (lambda n: None)


def resolve_tokenizer(tokenizer, dtype: str | None, eos_token: str | None):
    """-> (a Tokenizer, or the VOCAB of a bpe:VOCAB spec to train), checked for the storage
    dtype and an eos before any input is read."""
    if isinstance(tokenizer, tk.Tokenizer):
        tok, vocab = tokenizer, tokenizer.vocab_size
    else:
        vocab = tk.parse_bpe_spec(tokenizer)
        tok = None if vocab is not None else tk.load_tokenizer(tokenizer, eos_token=eos_token)
        if tok is not None:
            vocab = tok.vocab_size
        elif eos_token is not None:
            raise ValueError(f"{tokenizer} trains a BPE whose eos is <eos>; --eos-token applies to "
                             "other tokenizers")
    what = tokenizer if isinstance(tokenizer, str) else tok.spec
    if dtype is not None:
        if dtype not in ("uint16", "uint32"):
            raise ValueError(f"dtype must be uint16 or uint32, got {dtype!r}")
        need = storage_dtype(vocab)
        if np.iinfo(np.dtype(dtype)).max < vocab - 1:
            raise ValueError(f"tokenizer {what} has a vocab of {vocab} ids; {dtype} stores at most "
                             f"{np.iinfo(np.dtype(dtype)).max + 1}; use {need.name} (or leave --dtype out)")
    if tok is not None and tok.eos_id is None:
        raise ValueError(f"tokenizer {what} names no end-of-text token (none of "
                         f"{', '.join(tk.EOS_NAMES[:4])}, ...); give the one that separates documents "
                         "with --eos-token")
    return tok if tok is not None else vocab


def _check_request(inputs: list[str], eval_files: list[str], tokenizer, out: str, *, eval_fraction, text_docs: str,
                   field, overwrite: bool, fmt: str, chat_template, chat: tuple) -> float:
    """prepare's arguments checked before anything is read or written -> the eval fraction.
    chat: (prompt_field, completion_field, train_on_prompt, skip_bad), data/chat.py's options."""
    if not inputs:
        raise ValueError("no input: give one or more files with --input")
    if text_docs not in TEXT_DOCS:
        raise ValueError(f"text_docs must be one of {', '.join(TEXT_DOCS)}, got {text_docs!r}")
    if eval_files and eval_fraction:
        raise ValueError("give either --eval FILE (the eval split) or --eval-fraction, not both")
    fraction = 0.0 if eval_files else DEFAULT_EVAL_FRACTION if eval_fraction is None else float(eval_fraction)
    if not 0 <= fraction < 1:
        raise ValueError(f"eval fraction must be in [0, 1), got {fraction}")
    for path in inputs + eval_files:
        check_input(path)
    _check_format(fmt, inputs + eval_files, tokenizer, chat_template, *chat)
    if field is not None and all(input_kind(p) == "text" for p in inputs + eval_files):
        raise ValueError(f"--field {field!r} applies to JSONL/Parquet/Arrow inputs; {inputs[0]} is read "
                         "as plain text (name JSON lines *.jsonl)")
    out = os.path.abspath(out)
    from jaxformer.fileio import refuse_overlap  # links resolved: --overwrite never deletes an input
    named = {p: "the input" for p in inputs + eval_files}
    for extra in (tokenizer, chat_template):
        if isinstance(extra, str) and os.path.exists(extra):
            named[extra] = "the tokenizer" if extra is tokenizer else "the chat template"
    for path, what in named.items():
        refuse_overlap(out, {what: path})
    if os.path.lexists(out) and not overwrite:
        raise FileExistsError(f"{out} exists; choose another output or pass --overwrite")
    return fraction


@dataclasses.dataclass(frozen=True)
class PrepareOptions:
    """prepare's options: the `jaxformer data prepare` flags (cli/data.py; fmt is --format,
    eval_files --eval, progress the opposite of --no-progress).

    field: the JSON key / Parquet-Arrow column of a document (None: "text"; fmt "chat": the
    messages key, None: "messages"). text_docs: how
    plain text splits into documents: "paragraph", "line" or "file". eval_fraction: the
    held-out fraction of documents (None: 0.01; 0 = no eval split); eval_files: whole files
    for the eval split instead. dtype: "uint16"/"uint32" (None: the smallest that holds the
    vocab). eos_token: the document separator for a tokenizer that names none. overwrite:
    replace an existing `out`. progress: a progress bar on stderr. shard_tokens, batch_bytes:
    the writer's shard size and the text per tokenizer call (throughput; bench/data.py).
    fmt "text" | "prompt_completion" | "chat" and the options after it: data/chat.py
    (chat_template: a TEMPLATES name or a Jinja file, None: the tokenizer's own; prompt_field,
    completion_field: the record's keys; train_on_prompt: no loss mask; skip_bad: skip and
    count bad records, meta's source.skipped_bad)."""
    field: str | None = None
    text_docs: str = "paragraph"
    eval_fraction: float | None = None
    eval_files: Sequence[str] = ()
    dtype: str | None = None
    eos_token: str | None = None
    overwrite: bool = False
    progress: bool = True
    shard_tokens: int = SHARD_TOKENS
    batch_bytes: int = BATCH_BYTES
    fmt: str = "text"
    chat_template: str | None = None
    prompt_field: str | None = None
    completion_field: str | None = None
    train_on_prompt: bool = False
    skip_bad: bool = False


def prepare(inputs: list[str], tokenizer, out: str, options: PrepareOptions | None = None) -> dict:
    """Tokenize `inputs` into the tokens directory `out` (module docstring) and return its meta.

    tokenizer: a SPEC (tokenizer.load_tokenizer, or "bpe:VOCAB" to train one on the train
    documents) or a Tokenizer. options: a PrepareOptions (None: every default)."""
    o = PrepareOptions() if options is None else options
    inputs = [inputs] if isinstance(inputs, str) else list(inputs)
    eval_files = list(o.eval_files or [])
    fraction = _check_request(inputs, eval_files, tokenizer, out, eval_fraction=o.eval_fraction, text_docs=o.text_docs,
                              field=o.field, overwrite=o.overwrite, fmt=o.fmt, chat_template=o.chat_template,
                              chat=(o.prompt_field, o.completion_field, o.train_on_prompt, o.skip_bad))
    out = os.path.abspath(out)
    tok = resolve_tokenizer(tokenizer, o.dtype, o.eos_token)
    records = None
    if o.fmt != "text":
        from jaxformer.train.data.chat import Records
        records = Records(o.fmt, tok, tokenizer, chat_template=o.chat_template, field=o.field,
                          prompt_field=o.prompt_field, completion_field=o.completion_field,
                          train_on_prompt=o.train_on_prompt, skip_bad=o.skip_bad)
    split = Split(fraction)
    total = sum(input_bytes(p) for p in inputs + eval_files)
    kw = dict(field=o.field, text_docs=o.text_docs)

    if isinstance(tok, int):  # bpe:VOCAB: train on the train documents (first pass)
        tok = _train_bpe(inputs, split, tok, str(tokenizer), total, o.progress, kw)
        if o.dtype is not None:
            resolve_tokenizer(tok, o.dtype, None)

    source = {"inputs": [os.path.abspath(p) for p in inputs],
              "eval_files": [os.path.abspath(p) for p in eval_files],
              "eval_fraction": fraction, "text_docs": o.text_docs, "field": o.field,
              "tokenizer_spec": tokenizer if isinstance(tokenizer, str) else tok.spec, "format": o.fmt}
    bar = _progress(total, "prepare", o.progress)
    try:
        with TokensWriter(out, vocab_size=tok.vocab_size, eos_id=tok.eos_id, bos_id=tok.bos_id,
                          tokenizer=tok.describe(), dtype=o.dtype, source=source, overwrite=o.overwrite,
                          shard_tokens=o.shard_tokens, loss_mask=records is not None and not o.train_on_prompt) as w:
            feed = _Feeder(w, tok, bar)
            if records is not None:
                for path, fixed in [(p, None) for p in inputs] + [(p, "eval") for p in eval_files]:
                    for text, *doc in records.read(path, _advance(bar)):
                        feed.document(fixed or split.of(text), *doc)
                source.update(records.describe(), first_bad=records.first_bad)
                if records.skipped and not sum(w.count(s)[1] for s in ("train", "eval")) and feed.held is None:
                    raise ValueError(f"every record was bad and skipped ({records.skipped}); the first: "
                                     f"{records.first_bad}")
            else:
                batch: list[tuple[str, str, bool, bool]] = []
                size = 0
                for item in stream(inputs, eval_files, split, advance=_advance(bar), **kw):
                    batch.append(item)
                    size += len(item[1])
                    if size >= o.batch_bytes or len(batch) >= BATCH_DOCS:
                        feed(batch)
                        batch, size = [], 0
                feed(batch)
            feed.finish(fraction, inputs)
            source["eval_held_out_last"] = feed.held_out_last
            tok.save(w.tmp)
            meta = w.meta
    finally:
        if bar is not None:
            bar.close()
    return meta


class _Feeder:
    """Encodes batches of pieces and adds them to the writer, in order. The last train document
    (when it is one piece) is held back until the next one arrives, so that it can become the
    eval split's only document if the hashed fraction picked none (finish)."""

    def __init__(self, writer: TokensWriter, tok: tk.Tokenizer, bar):
        self.w, self.tok, self.bar = writer, tok, bar
        self.held: tuple | None = None  # (ids, mask, end_mask) of w.add
        self.held_out_last = False
        self.open_doc = False  # a multi-piece document is being written

    def __call__(self, batch) -> None:
        if not batch:
            return
        # a document's continuation pieces are encoded without the tokenizer's special tokens
        firsts = [i for i, it in enumerate(batch) if it[2]]
        rest = [i for i, it in enumerate(batch) if not it[2]]
        ids: list = [None] * len(batch)
        for idx, specials in ((firsts, True), (rest, False)):
            if idx:
                texts = [batch[i][1] for i in idx]
                enc = self.tok.encode_batch(texts) if specials else [self._plain(t) for t in texts]
                for i, e in zip(idx, enc, strict=True):
                    ids[i] = e
        for (where, _, first, last), e in zip(batch, ids, strict=True):
            if first and e.size and e[-1] == self.tok.eos_id:
                e = e[:-1]  # a post-processor's own trailing eos (T5's </s>): the writer adds one
            if first and last and where == "train":
                self._release()
                self.held = (e, None, 0)
                continue
            if first:
                self._release()
            self.w.add(where, e, end=last)
        if self.bar is not None:
            t, d = self.w.count("train")
            self.bar.set_postfix(docs=d + (self.held is not None), tokens=t, refresh=False)

    def document(self, where: str, ids: np.ndarray, mask: np.ndarray | None, end_mask: int) -> None:
        """One whole encoded document with its loss mask (data/chat.py's records)."""
        self._release()
        if where == "train":
            self.held = (ids, mask, end_mask)
        else:
            self.w.add(where, ids, mask=mask, end_mask=end_mask)

    def _plain(self, text: str) -> np.ndarray:
        if isinstance(self.tok, tk.JSONTokenizer):
            return np.asarray(self.tok.tok.encode(text, add_special_tokens=False).ids, np.int32)
        if isinstance(self.tok, tk.SlowHFTokenizer):
            return np.asarray(self.tok.tok(text, add_special_tokens=False)["input_ids"], np.int32)
        return self.tok.encode(text)

    def _release(self) -> None:
        if self.held is not None:
            ids, mask, end_mask = self.held
            self.w.add("train", ids, mask=mask, end_mask=end_mask)
            self.held = None

    def finish(self, fraction: float, inputs: list[str]) -> None:
        train_docs = self.w.count("train")[1] + (self.held is not None)
        eval_docs = self.w.count("eval")[1]
        if train_docs + eval_docs == 0:
            raise ValueError(f"empty input: no document in {', '.join(inputs)} (every file is empty "
                             "or blank)")
        if fraction and not eval_docs:
            if self.held is None or train_docs < 2:
                raise ValueError(f"the eval fraction {fraction} picked none of the {train_docs} "
                                 "document(s); give --eval FILE, split the text into more documents "
                                 "(--text-docs line), or --eval-fraction 0 for no eval split")
            ids, mask, end_mask = self.held
            self.w.add("eval", ids, mask=mask, end_mask=end_mask)
            self.held, self.held_out_last = None, True
        self._release()
        if not self.w.count("train")[1]:
            raise ValueError(f"no train document: every document of {', '.join(inputs)} went to "
                             "the eval split; lower --eval-fraction")


def _check_format(fmt, paths, tokenizer, chat_template, prompt_field, completion_field,
                  train_on_prompt, skip_bad) -> None:
    """The --format options, each refused by name where it does not apply."""
    from jaxformer.train.data.chat import FORMATS
    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    given = {"--chat-template": chat_template is not None and fmt != "chat",
             "--prompt-field": prompt_field is not None and fmt != "prompt_completion",
             "--completion-field": completion_field is not None and fmt != "prompt_completion",
             "--train-on-prompt": train_on_prompt and fmt == "text", "--skip-bad": skip_bad and fmt == "text"}
    for flag, wrong in given.items():
        if wrong:
            raise ValueError(f"{flag} does not apply to --format {fmt}")
    if fmt == "text":
        return
    for path in paths:
        if input_kind(path) != "jsonl":
            raise ValueError(f"--format {fmt} reads JSON lines (*.jsonl, *.ndjson, *.json); {path} is not one")
    if tk.parse_bpe_spec(tokenizer) is not None:
        raise ValueError(f"--format {fmt} needs an existing tokenizer, not {tokenizer} (train one on "
                         "plain text with --format text, then give its DIR/tokenizer.json)")


def _train_bpe(inputs, split: Split, vocab: int, spec: str, total: int, progress: bool, kw):
    bar = _progress(total, f"{spec}: train", progress)
    count = [0]

    def texts():  # the train documents only: the eval split stays unseen
        for where, text, _, _ in stream(inputs, [], split, advance=_advance(bar), **kw):
            if where == "train":
                count[0] += 1
                yield text

    try:
        tok = tk.train_bpe(texts(), vocab, spec=spec, show_progress=progress)
    finally:
        if bar is not None:
            bar.close()
    if not count[0]:
        raise ValueError(f"empty input: no document in {', '.join(inputs)} to train {spec} on "
                         "(every file is empty or blank)")
    return tok
