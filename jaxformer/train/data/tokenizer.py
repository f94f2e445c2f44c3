"""Tokenizers: the byte-level one of the embedded text datasets (id = byte + 3; 0 pad, 1
bos/[CLS], 2 eos), and real ones from the `tokenizers` library or a local Hugging Face dir.

    tok = load_tokenizer(SPEC)
    tok.encode("Hel") -> int32 ids      tok.decode(ids) -> str (special tokens dropped)
    tok.vocab_size, tok.eos_id, tok.bos_id
    tok.describe() -> {"spec", "kind", "file", "sha256"}   (what meta.json and model.yaml record)

SPEC is one of
    bytes                   the byte tokenizer (kind "bytes", no file, sha256 BYTES_SHA256)
    PATH/tokenizer.json     a `tokenizers` JSON file (kind "tokenizers")
    HF_DIR                  a Hugging Face checkpoint dir: its tokenizer.json, or, when it has only
                            other tokenizer files (vocab.json + merges.txt, tokenizer.model, ...),
                            transformers' AutoTokenizer read from the dir alone (kind
                            "transformers"; its fast form is saved as tokenizer.json)
    TOKENS_DIR              a directory `jaxformer data prepare` wrote: the tokenizer it used
    MODEL_DIR | RUN_DIR     a jaxformer model checkpoint or training run: tokenizer_for_checkpoint
    bpe:VOCAB               only for `jaxformer data prepare`, which trains it (train_bpe)
Nothing is ever downloaded: a name that is not a local path is an error.

A tokenizer's file is what a tokens directory and a model checkpoint keep beside their data as
`tokenizer.json`; its sha256 (of those bytes) identifies the tokenizer, so a checkpoint and a
dataset can be checked against each other.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np

PAD, BOS, EOS, OFFSET = 0, 1, 2, 3
VOCAB_SIZE = 256 + OFFSET
BYTES_SHA256 = "bytes-v1"  # the byte tokenizer has no file: a fixed identity (id = byte + 3)
FILE = "tokenizer.json"
# special tokens taken as end-of-text / begin-of-text when nothing names them (bare tokenizer.json)
EOS_NAMES = ("<|endoftext|>", "</s>", "<eos>", "<|end_of_text|>", "<|eos|>", "<|im_end|>")
BOS_NAMES = ("<s>", "<bos>", "<|begin_of_text|>", "<|bos|>", "<|startoftext|>")
# files transformers' AutoTokenizer builds a tokenizer from (besides tokenizer.json)
HF_TOKENIZER_FILES = ("tokenizer_config.json", "vocab.json", "merges.txt", "tokenizer.model",
                      "spiece.model", "vocab.txt", "sentencepiece.bpe.model", "tiktoken.model")
SPEC_HELP = "a tokenizer.json file, a Hugging Face checkpoint dir, `bytes` or `bpe:VOCAB`"


# ----------------------------------------------------------------------------- the byte functions
def encode(text: str) -> np.ndarray:
    return np.frombuffer(text.encode("utf-8"), np.uint8).astype(np.int32) + OFFSET


def decode(ids) -> str:
    """Bytes of the ids in [3, 259); the special ids (and any beyond the byte vocab) are dropped."""
    out = bytes(int(i) - OFFSET for i in ids if OFFSET <= int(i) < VOCAB_SIZE)
    return out.decode("utf-8", errors="replace")


def pad_to(ids: np.ndarray, length: int, pad: int = PAD) -> np.ndarray:
    if len(ids) > length:
        raise ValueError(f"sequence of {len(ids)} tokens exceeds {length}")
    return np.concatenate([ids, np.full(length - len(ids), pad, np.int32)]).astype(np.int32)


# ----------------------------------------------------------------------------- Tokenizer objects
class Tokenizer:
    """What every tokenizer offers. `content` is the bytes of its file (None: it has none)."""

    kind: str
    spec: str
    vocab_size: int
    eos_id: int | None
    bos_id: int | None
    content: bytes | None = None

    def encode(self, text: str) -> np.ndarray:
        raise NotImplementedError

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        """encode of each text; tokenizers' own batch call where there is one (threads in Rust)."""
        return [self.encode(t) for t in texts]

    def decode(self, ids) -> str:
        raise NotImplementedError

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.content).hexdigest()

    def describe(self) -> dict:
        return {"spec": self.spec, "kind": self.kind, "file": FILE if self.content is not None else None,
                "sha256": self.sha256}

    def save(self, directory: str) -> str | None:
        """Write the tokenizer file into `directory` (as FILE); -> its path, or None (no file)."""
        if self.content is None:
            return None
        path = os.path.join(directory, FILE)
        with open(path, "wb") as f:
            f.write(self.content)
        return path

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({self.spec!r}, vocab_size={self.vocab_size}, "
                f"eos_id={self.eos_id}, bos_id={self.bos_id})")


class ByteTokenizer(Tokenizer):
    kind, spec, vocab_size, eos_id, bos_id = "bytes", "bytes", VOCAB_SIZE, EOS, BOS

    def encode(self, text: str) -> np.ndarray:
        return encode(text)

    def decode(self, ids) -> str:
        return decode(ids)

    @property
    def sha256(self) -> str:
        return BYTES_SHA256


class JSONTokenizer(Tokenizer):
    """A `tokenizers.Tokenizer` and the JSON it was read from. encode applies the tokenizer's
    own post-processor (e.g. Llama's leading <s>), as transformers does by default."""

    def __init__(self, tok, content: bytes, spec: str, *, kind: str = "tokenizers",
                 eos: str | int | None = None, bos: str | int | None = None):
        self.tok, self.content, self.spec, self.kind = tok, content, spec, kind
        vocab = tok.get_vocab(with_added_tokens=True)
        self.vocab_size = max(vocab.values()) + 1 if vocab else 0
        specials = [t.content for t in tok.get_added_tokens_decoder().values() if t.special]
        self.eos_id = self._special(eos, specials, EOS_NAMES, "eos")
        self.bos_id = self._special(bos, specials, BOS_NAMES, "bos")

    def _special(self, given, specials, names, what) -> int | None:
        if isinstance(given, int):
            if not 0 <= given < self.vocab_size:
                raise ValueError(f"tokenizer {self.spec}: {what} id {given} is outside its vocab "
                                 f"[0, {self.vocab_size})")
            return given
        if given is not None:
            i = self.tok.token_to_id(given)
            if i is None:
                raise ValueError(f"tokenizer {self.spec}: no token {given!r} for {what}")
            return i
        for name in names:
            if name in specials or (what == "eos" and self.tok.token_to_id(name) is not None):
                return self.tok.token_to_id(name)
        return None

    def encode(self, text: str) -> np.ndarray:
        return np.asarray(self.tok.encode(text).ids, np.int32)

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        return [np.asarray(e.ids, np.int32) for e in self.tok.encode_batch(texts)]

    def decode(self, ids) -> str:
        return self.tok.decode([int(i) for i in ids], skip_special_tokens=True)


class SlowHFTokenizer(Tokenizer):
    """transformers' AutoTokenizer of a directory that has no fast form (no tokenizer.json can
    be made): no single file, so the sha256 covers the dir's tokenizer files."""

    kind = "transformers"

    def __init__(self, tok, directory: str, eos: str | int | None = None):
        self.tok, self.spec = tok, directory
        self.vocab_size = len(tok)
        if isinstance(eos, str):
            eos = tok.convert_tokens_to_ids(eos)
        self.eos_id = tok.eos_token_id if eos is None else eos
        self.bos_id = tok.bos_token_id
        h = hashlib.sha256()
        for name in sorted(os.listdir(directory)):
            if name in HF_TOKENIZER_FILES or name in ("special_tokens_map.json", "added_tokens.json"):
                h.update(name.encode() + b"\0" + Path(os.path.join(directory, name)).read_bytes())
        self._sha = h.hexdigest()

    @property
    def sha256(self) -> str:
        return self._sha

    def describe(self) -> dict:
        return {"spec": self.spec, "kind": self.kind, "file": None, "sha256": self._sha}

    def encode(self, text: str) -> np.ndarray:
        return np.asarray(self.tok(text)["input_ids"], np.int32)

    def decode(self, ids) -> str:
        return self.tok.decode([int(i) for i in ids], skip_special_tokens=True)


# ----------------------------------------------------------------------------- loading a spec
def from_json_file(path: str, spec: str | None = None, *, kind: str = "tokenizers",
                   eos: str | int | None = None, bos: str | int | None = None) -> JSONTokenizer:
    """A `tokenizers` JSON file -> JSONTokenizer; an unreadable file is a ValueError naming it."""
    with open(path, "rb") as f:
        content = f.read()
    return from_json_bytes(content, spec or os.path.abspath(path), what=path, kind=kind, eos=eos, bos=bos)


def from_json_bytes(content: bytes, spec: str, *, what: str, kind: str = "tokenizers",
                    eos: str | int | None = None, bos: str | int | None = None) -> JSONTokenizer:
    from tokenizers import Tokenizer as RustTokenizer
    try:
        tok = RustTokenizer.from_str(content.decode("utf-8"))
    except Exception as e:  # tokenizers raises a bare Exception on a malformed file
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise ValueError(f"{what} is not a `tokenizers` tokenizer.json ({first})") from None
    return JSONTokenizer(tok, content, spec, kind=kind, eos=eos, bos=bos)


def load_tokenizer(spec: str, *, eos_token: str | None = None) -> Tokenizer:
    """SPEC (module docstring) -> a Tokenizer. eos_token: the token that ends a document, for a
    tokenizer that names none (a bare tokenizer.json without a known end-of-text token)."""
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"tokenizer spec {spec!r}: give {SPEC_HELP}")
    if spec == "bytes":
        if eos_token is not None:
            raise ValueError("the byte tokenizer's eos is id 2; --eos-token applies to other tokenizers")
        return ByteTokenizer()
    if spec.startswith("bpe:"):
        raise ValueError(f"tokenizer spec {spec!r} trains a new tokenizer: only `jaxformer data prepare` "
                         "takes it; elsewhere give the tokenizer.json it wrote beside the data")
    if os.path.isfile(spec):
        return from_json_file(spec, eos=eos_token)
    if os.path.isdir(spec):
        return _load_dir(spec, eos_token)
    hint = ""
    if not os.path.isabs(spec) and spec.count("/") <= 1 and ":" not in spec:
        hint = " (nothing is downloaded: give a local directory, e.g. one `save_pretrained` wrote)"
    raise ValueError(f"tokenizer spec {spec!r}: no such file or directory{hint}; give {SPEC_HELP}")


def _load_dir(directory: str, eos_token: str | None = None) -> Tokenizer:
    """A directory SPEC: a tokens dir (meta.json), an HF dir's tokenizer files, or a jaxformer
    model checkpoint / training run (tokenizer_for_checkpoint)."""
    if os.path.isfile(os.path.join(directory, "meta.json")):
        return tokenizer_for_tokens_dir(directory)
    if has_hf_tokenizer(directory):
        return hf_dir_tokenizer(directory, eos_token)
    if any(os.path.isfile(os.path.join(directory, m)) for m in ("model.yaml", "config.yaml")):
        return tokenizer_for_checkpoint(directory)
    raise ValueError(f"tokenizer spec {directory}: the directory has no tokenizer ({FILE}, "
                     f"{', '.join(HF_TOKENIZER_FILES[:4])}, ...), and is not a tokens dir or a "
                     "jaxformer model/run dir")


def has_hf_tokenizer(directory: str) -> bool:
    return any(os.path.isfile(os.path.join(directory, n)) for n in (FILE, *HF_TOKENIZER_FILES))


def _token_name(value) -> str | None:
    """tokenizer_config.json writes a special token as a string or {"content": ...}."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _hf_specials(directory: str) -> tuple[str | int | None, str | int | None]:
    """(eos, bos) an HF dir names: tokenizer_config.json's tokens, else config.json's ids."""
    eos = bos = None
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        path = os.path.join(directory, name)
        if os.path.isfile(path) and eos is None:
            try:
                with open(path) as f:
                    data = json.load(f)
            except (OSError, ValueError) as e:
                raise ValueError(f"{path} is not valid JSON ({e})") from None
            if isinstance(data, dict):
                eos, bos = _token_name(data.get("eos_token")), _token_name(data.get("bos_token"))
    if eos is None:
        for name in ("generation_config.json", "config.json"):
            path = os.path.join(directory, name)
            if os.path.isfile(path):
                try:
                    with open(path) as f:
                        data = json.load(f)
                except (OSError, ValueError):
                    continue
                e = data.get("eos_token_id") if isinstance(data, dict) else None
                e = e[0] if isinstance(e, list) and e else e
                if isinstance(e, int):
                    eos = e
                    b = data.get("bos_token_id")
                    bos = b if isinstance(b, int) else None
                    break
    return eos, bos


def hf_dir_tokenizer(directory: str, eos_token: str | None = None) -> Tokenizer:
    """An HF checkpoint dir's own tokenizer: tokenizer.json through `tokenizers`, else
    AutoTokenizer from the directory alone (local_files_only; its fast form when it has one)."""
    directory = os.path.abspath(directory)
    eos, bos = _hf_specials(directory)
    eos = eos_token if eos_token is not None else eos
    path = os.path.join(directory, FILE)
    if os.path.isfile(path):
        return from_json_file(path, directory, eos=eos, bos=bos)
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise ValueError(f"{directory} has no {FILE}; reading its other tokenizer files needs "
                         "transformers (pip install 'jaxformer[hf]')") from None
    try:
        tok = AutoTokenizer.from_pretrained(directory, local_files_only=True)
    except Exception as e:  # transformers raises many kinds (OSError, ValueError, ImportError...)
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise ValueError(f"{directory}: transformers' AutoTokenizer cannot read its tokenizer "
                         f"files ({type(e).__name__}: {first[:300]})") from None
    if getattr(tok, "is_fast", False):
        content = tok.backend_tokenizer.to_str().encode("utf-8")
        return from_json_bytes(content, directory, what=directory, kind="transformers",
                               eos=eos if eos is not None else tok.eos_token,
                               bos=bos if bos is not None else tok.bos_token)
    return SlowHFTokenizer(tok, directory, eos)


def tokenizer_for_tokens_dir(directory: str) -> Tokenizer:
    """The tokenizer a tokens directory (`jaxformer data prepare`) was written with."""
    from jaxformer.train.data.tokens import TokensDir
    d = TokensDir(directory)
    return from_entry(d.tokenizer, directory, what=f"tokens dataset {directory}", eos=d.eos_id,
                      bos=d.bos_id)


def from_entry(entry: dict, directory: str, *, what: str, eos: int | None = None,
               bos: int | None = None) -> Tokenizer:
    """The tokenizer a describe() dict records, its file read from `directory` and checked
    against the recorded sha256."""
    if not isinstance(entry, dict) or "kind" not in entry:
        raise ValueError(f"{what}: its tokenizer entry {entry!r} is not a describe() dict")
    if entry["kind"] == "bytes":
        return ByteTokenizer()
    # the specials the model was trained with (recorded by the trainer) win over the file's guess
    eos = entry.get("eos_id") if eos is None else eos
    bos = entry.get("bos_id") if bos is None else bos
    if entry.get("file"):
        from jaxformer.fileio import inside  # a name from a file we did not write: kept in directory
        path = inside(directory, entry["file"], source=what, field="tokenizer file")
        if not os.path.isfile(path):
            raise ValueError(f"{what}: the tokenizer file {path} is missing")
        tok = from_json_file(path, entry.get("spec"), kind=entry["kind"], eos=eos, bos=bos)
    elif entry["kind"] == "transformers" and os.path.isdir(str(entry.get("spec"))):
        tok = hf_dir_tokenizer(entry["spec"])
    else:
        raise ValueError(f"{what}: its tokenizer ({entry.get('spec')}) has no file here and is not "
                         "a readable directory; pass --tokenizer SPEC")
    if entry.get("sha256") and tok.sha256 != entry["sha256"]:
        raise ValueError(f"{what}: the tokenizer's sha256 {tok.sha256[:12]}... differs from the "
                         f"recorded {str(entry['sha256'])[:12]}... (changed since it was written)")
    return tok


# ----------------------------------------------------------------------------- checkpoints
# embedded datasets whose ids are the byte tokenizer's (jaxformer/train/data)
BYTE_DATASETS = ("stdlib_docs", "text_source", "dates")


def tokenizer_for_checkpoint(model_dir: str, step: str | int | None = None) -> Tokenizer:
    """The tokenizer of the weights at `model_dir`, found as
      1. an HF dir: its tokenizer.json or other tokenizer files (hf_dir_tokenizer);
      2. a jaxformer model checkpoint: the `tokenizer:` entry of its model.yaml (the describe()
         dict; its file beside it, sha256 checked), else a tokenizer.json beside model.yaml;
      3. a training run: that of model/last (or model/best with step "best"), else its config's
         data (a tokens dir's tokenizer; the byte tokenizer for the embedded text datasets);
      4. a model whose vocab is the byte vocab (259): the byte tokenizer.
    Otherwise a ValueError that asks for --tokenizer."""
    from jaxformer import checkpoint_io
    kind = checkpoint_io.path_kind(model_dir)
    if kind == "hf":
        if has_hf_tokenizer(model_dir):
            return hf_dir_tokenizer(model_dir)
        vocab = _hf_vocab(model_dir)
    elif kind == "model":
        entry = checkpoint_io.tokenizer_entry(model_dir)
        if entry is not None:
            return from_entry(entry, model_dir, what=f"model checkpoint {model_dir}")
        if os.path.isfile(os.path.join(model_dir, FILE)):
            return from_json_file(os.path.join(model_dir, FILE))
        vocab = getattr(checkpoint_io.load_model_config(model_dir)[1], "vocab_size", None)
    else:
        step = checkpoint_io.parse_step(step)
        sub = os.path.join(model_dir, "model", "best" if step == "best" else "last")
        if os.path.isfile(os.path.join(sub, "model.yaml")):
            entry = checkpoint_io.tokenizer_entry(sub)
            if entry is not None:
                return from_entry(entry, sub, what=f"model checkpoint {sub}")
        tok, vocab = _run_data_tokenizer(model_dir)
        if tok is not None:
            return tok
    if vocab == VOCAB_SIZE:
        return ByteTokenizer()
    raise NoTokenizer(f"{model_dir} records no tokenizer (vocab {vocab}); pass --tokenizer SPEC "
                      f"({SPEC_HELP}), or prompts as ids with --ids")


class NoTokenizer(ValueError):
    """Weights that record no tokenizer at all (as opposed to one that cannot be read)."""


def _hf_vocab(directory: str):
    try:
        with open(os.path.join(directory, "config.json")) as f:
            return json.load(f).get("vocab_size")
    except (OSError, ValueError, AttributeError):
        return None


def _run_data_tokenizer(run_dir: str):
    """(the tokenizer of a run's data section or None, the run's model vocab_size)."""
    import yaml

    from jaxformer.fileio import yaml_load
    path = os.path.join(run_dir, "config.yaml")
    try:
        with open(path) as f:
            raw = yaml_load(f)
    except yaml.YAMLError as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise ValueError(f"{path} is corrupted (not YAML: {first})") from None
    raw = raw if isinstance(raw, dict) else {}
    model = raw.get("model") if isinstance(raw.get("model"), dict) else {}
    data = raw.get("data") if isinstance(raw.get("data"), dict) else {}
    vocab = model.get("vocab_size")
    if data.get("name") == "tokens" and isinstance(data.get("path"), str):
        return tokenizer_for_tokens_dir(data["path"]), vocab
    if data.get("name") in BYTE_DATASETS:
        return ByteTokenizer(), vocab
    return None, vocab


# ----------------------------------------------------------------------------- for transformers
def _byte_chars() -> list[str]:
    """The character the `tokenizers` ByteLevel pre-tokenizer writes for each byte (GPT-2's
    table): printable Latin-1 bytes stand for themselves, the other 68 take the code points
    from 256 up, in byte order."""
    keep = {*range(ord("!"), ord("~") + 1), *range(ord("\u00a1"), ord("\u00ac") + 1),
            *range(ord("\u00ae"), ord("\u00ff") + 1)}
    out, n = [], 0
    for b in range(256):
        out.append(chr(b) if b in keep else chr(256 + n))
        n += b not in keep
    return out


def bytes_tokenizer_json() -> bytes:
    """The byte tokenizer as a `tokenizers` JSON (id = byte + 3; <pad> <bos> <eos> = 0, 1, 2),
    so an exported byte-level model loads its tokenizer in transformers. It encodes any text as
    encode() does, except that the literal texts "<pad>", "<bos>" and "<eos>" become the special
    ids, as special tokens do in every `tokenizers` tokenizer."""
    from tokenizers import Tokenizer as RustTokenizer
    from tokenizers import decoders, models, pre_tokenizers
    vocab = {name: i for i, name in enumerate(BPE_SPECIALS)}
    vocab.update({c: b + OFFSET for b, c in enumerate(_byte_chars())})
    tok = RustTokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(list(BPE_SPECIALS))
    return tok.to_str().encode("utf-8")


def hf_tokenizer_files(tok: Tokenizer, pad_id: int | None = None) -> dict[str, bytes]:
    """{file name: content} that give an exported Hugging Face dir the tokenizer `tok` for
    AutoTokenizer: its tokenizer.json (the byte tokenizer's from bytes_tokenizer_json) and a
    tokenizer_config.json naming PreTrainedTokenizerFast and the eos/bos/pad tokens. pad_id:
    the model's pad id (config.json's pad_token_id); written as pad_token when the tokenizer
    holds a special token at that id (<pad> of the byte and bpe tokenizers), never an ordinary
    token (GPT-2's id 0 is "!"). {} for a tokenizer without a file (a slow-only transformers one)."""
    content = bytes_tokenizer_json() if tok.kind == "bytes" else tok.content
    if content is None:
        return {}
    from tokenizers import Tokenizer as RustTokenizer
    rust = RustTokenizer.from_str(content.decode("utf-8"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast"}
    for key, i in (("eos_token", tok.eos_id), ("bos_token", tok.bos_id)):
        if i is not None and rust.id_to_token(i) is not None:
            config[key] = rust.id_to_token(i)
    special = rust.get_added_tokens_decoder().get(pad_id) if pad_id is not None else None
    if special is not None and special.special:
        config["pad_token"] = special.content
    return {FILE: content, "tokenizer_config.json": (json.dumps(config, indent=1) + "\n").encode()}


# ----------------------------------------------------------------------------- bpe:VOCAB
BPE_SPECIALS = ("<pad>", "<bos>", "<eos>")  # ids 0, 1, 2, as the byte tokenizer's


def parse_bpe_spec(spec: str) -> int | None:
    """The VOCAB of "bpe:VOCAB" (checked), or None for any other spec."""
    if not isinstance(spec, str) or not spec.startswith("bpe:"):
        return None
    text = spec[4:]
    if not text.isdigit():
        raise ValueError(f"tokenizer spec {spec!r}: bpe:VOCAB takes a vocab size, e.g. bpe:32000")
    vocab = int(text)
    if vocab < VOCAB_SIZE:
        raise ValueError(f"tokenizer spec {spec!r}: a byte-level BPE needs a vocab of at least "
                         f"{VOCAB_SIZE} (3 special tokens and the 256 bytes)")
    return vocab


def train_bpe(texts, vocab_size: int, *, spec: str | None = None, length: int | None = None,
              show_progress: bool = False) -> JSONTokenizer:
    """Train a byte-level BPE (the `tokenizers` library's iterator trainer: `texts` is streamed)
    with <pad> <bos> <eos> as ids 0, 1, 2 and every byte in its alphabet, so any text encodes.
    A corpus too small for vocab_size - 259 merges gives a smaller vocab."""
    from tokenizers import Tokenizer as RustTokenizer
    from tokenizers import decoders, models, pre_tokenizers, trainers
    tok = RustTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(BPE_SPECIALS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=show_progress)
    tok.train_from_iterator(texts, trainer, length=length)
    content = tok.to_str().encode("utf-8")
    return from_json_bytes(content, spec or f"bpe:{vocab_size}", what="the trained BPE",
                           eos=BPE_SPECIALS[2], bos=BPE_SPECIALS[1])
