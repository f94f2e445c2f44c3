"""Instruction and chat records for `jaxformer data prepare --format prompt_completion|chat`:
JSON lines -> documents of (ids, loss mask), the mask 1 on the answer tokens.

    prompt_completion  {"prompt": "...", "completion": "..."}: the text is prompt + completion,
                       joined as TRL joins them, and encoded as plain text is (the tokenizer's
                       post-processor, e.g. Llama's <s>). The answer is the completion; the eos
                       that ends the document (the writer's separator) counts with it, so the
                       model learns to stop, as TRL appends eos to completions.
    chat               {"messages": [{"role": "system" | "user" | "assistant", "content": "..."}]}
                       rendered by a chat template: the tokenizer's own (tokenizer_config.json's
                       `chat_template`, through transformers' `apply_chat_template`) or one of
                       TEMPLATES or a Jinja file (--chat-template), and encoded without the
                       tokenizer's own specials (the template writes them, as
                       apply_chat_template(tokenize=True) does). The answers are the assistant
                       turns with their end-of-turn token, as TRL's assistant_only_loss; the
                       separator eos does not count (the end-of-turn token is the stop).
Tool roles (tool, ipython, function) are accepted only where the template names them.

Answer spans. A conversation is rendered prefix by prefix: assistant turn i spans from the end of
render(messages[:i], add_generation_prompt=True) to the end of render(messages[:i+1]), less
trailing whitespace (ChatML's newline after <|im_end|> is the template's, not the answer's). Each
prefix must render as a prefix of the whole conversation: a template that rewrites earlier turns
(e.g. drops past reasoning) is refused for that record. The whole text is tokenized once, so its
ids are exactly those of the text, and a token counts when its characters (the tokenizer's
offsets) overlap an answer span. transformers' return_assistant_tokens_mask on a template with
{% generation %} blocks gives the same mask (tests/test_chat_data.py checks it).

Every bad record (not JSON, a missing or mistyped field, an unknown role, a template error, an
empty answer, no assistant turn, a template that writes none of an answer) is a BadRecord
"FILE:LINE: ...", or, with skip_bad, is skipped and counted (`Records.skipped`, the first reason
in `Records.first_bad`).

Templates are untrusted code: transformers renders them in jinja2's ImmutableSandboxedEnvironment
(no attribute escapes, range() capped at 100,000 items), and each render here also has a time
limit (RENDER_SECONDS; nested loops run for ever within the range cap) and a limit on the
rendered text (RENDER_CHARS). Either stops the whole command, --skip-bad or not: the template is
at fault, not the record.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import threading
from typing import Callable, Iterator

import numpy as np

from jaxformer.train.data import tokenizer as tk

FORMATS = ("text", "prompt_completion", "chat")
ROLES = ("system", "user", "assistant")
TOOL_ROLES = ("tool", "ipython", "function")
DEFAULT_FIELDS = {"chat": "messages", "prompt": "prompt", "completion": "completion"}
RENDER_SECONDS = 10.0  # one render of one conversation; real templates take well under 1 ms
RENDER_CHARS = 64 << 20  # characters one render may write

# Our named templates, written as Hugging Face's are (transformers' Jinja environment trims
# blocks, so every newline is a string). The {% generation %} blocks mark the answers for
# transformers' return_assistant_tokens_mask; our mask does not need them (module docstring).
TEMPLATES = {
    "chatml": (
        "{%- for message in messages -%}"
        "{{- '<|im_start|>' + message['role'] + '\n' -}}"
        "{%- if message['role'] == 'assistant' -%}"
        "{%- generation -%}{{- message['content'] + '<|im_end|>' -}}{%- endgeneration -%}"
        "{%- else -%}{{- message['content'] + '<|im_end|>' -}}{%- endif -%}"
        "{{- '\n' -}}"
        "{%- endfor -%}"
        "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- endif -%}"),
    "llama3": (
        "{%- if bos_token -%}{{- bos_token -}}{%- endif -%}"
        "{%- for message in messages -%}"
        "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' -}}"
        "{%- if message['role'] == 'assistant' -%}"
        "{%- generation -%}{{- message['content'] | trim + '<|eot_id|>' -}}{%- endgeneration -%}"
        "{%- else -%}{{- message['content'] | trim + '<|eot_id|>' -}}{%- endif -%}"
        "{%- endfor -%}"
        "{%- if add_generation_prompt -%}{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}{%- endif -%}"),
}


class BadRecord(ValueError):
    """One record that cannot become a document; the message starts with FILE:LINE."""


# ----------------------------------------------------------------------------- templates
def renderer_for(tok: tk.Tokenizer, spec):
    """A transformers tokenizer whose apply_chat_template renders for `tok`: an HF dir's own
    (AutoTokenizer, with its chat template), else a PreTrainedTokenizerFast around `tok`'s
    tokenizer.json (no chat template of its own), with `tok`'s eos/bos as bos_token/eos_token."""
    try:
        from transformers import AutoTokenizer, PreTrainedTokenizerFast
    except ImportError:
        raise ValueError("--format chat renders with transformers' apply_chat_template "
                         "(pip install 'jaxformer[hf]')") from None
    if isinstance(spec, str) and os.path.isdir(spec) and tk.has_hf_tokenizer(spec) and \
            not os.path.isfile(os.path.join(spec, "meta.json")):
        try:
            return AutoTokenizer.from_pretrained(spec, local_files_only=True)
        except Exception as e:  # transformers raises many kinds for a bad dir
            raise ValueError(f"{spec}: transformers' AutoTokenizer cannot read it ({type(e).__name__}: "
                             f"{_first_line(e)})") from None
    from tokenizers import Tokenizer as RustTokenizer
    if tok.kind == "bytes":  # its specials are ids, not texts the byte tokenizer encodes back
        return PreTrainedTokenizerFast(tokenizer_object=RustTokenizer.from_str(tk.bytes_tokenizer_json().decode()))
    if tok.content is None:
        raise ValueError(f"tokenizer {tok.spec} ({tok.kind}) has no tokenizer.json: --format chat "
                         "needs a fast tokenizer (its character offsets place the answers)")
    rust = RustTokenizer.from_str(tok.content.decode("utf-8"))
    names = {k: rust.id_to_token(i) for k, i in (("eos_token", tok.eos_id), ("bos_token", tok.bos_id))
             if i is not None}
    return PreTrainedTokenizerFast(tokenizer_object=rust, **names)


def resolve_template(choice: str | None, renderer, spec) -> tuple[str, str]:
    """(the Jinja template, what it is: "tokenizer", a TEMPLATES name or a file path)."""
    names = "|".join(TEMPLATES)
    if choice is None:
        own = getattr(renderer, "chat_template", None)
        if isinstance(own, dict):  # several named templates: transformers' default is "default"
            own = own.get("default")
        if not own:
            raise ValueError(f"tokenizer {spec} has no chat template (tokenizer_config.json's "
                             f"chat_template); give --chat-template {names}|PATH")
        template, what = own, "tokenizer"
    elif choice in TEMPLATES:
        template, what = TEMPLATES[choice], choice
    elif os.path.isfile(choice):
        with open(choice, encoding="utf-8") as f:
            template, what = f.read(), os.path.abspath(choice)
    else:
        raise ValueError(f"--chat-template {choice!r}: not a named template ({names}) nor a Jinja file")
    try:
        import jinja2
        from transformers.utils.chat_template_utils import _compile_jinja_template
        _compile_jinja_template(template)
    except jinja2.TemplateSyntaxError as e:
        raise ValueError(f"chat template {what}: Jinja syntax error at line {e.lineno}: {e.message}") from None
    return template, what


# ----------------------------------------------------------------------------- ids and masks
def encode_offsets(tok: tk.Tokenizer, text: str, specials: bool):
    """(ids int32 [N], start and end character of each id [N]) of the whole text; ids that
    cover no character (a post-processor's <s>) have start == end."""
    if tok.kind == "bytes":
        cp = np.frombuffer(text.encode("utf-32-le"), np.uint32)
        width = 1 + (cp >= 0x80) + (cp >= 0x800) + (cp >= 0x10000)  # UTF-8 bytes per character
        char = np.repeat(np.arange(len(cp)), width)
        return tk.encode(text), char, char + 1
    if isinstance(tok, tk.JSONTokenizer):
        e = tok.tok.encode(text, add_special_tokens=specials)
        off = np.asarray(e.offsets, np.int64).reshape(-1, 2)
        return np.asarray(e.ids, np.int32), off[:, 0], off[:, 1]
    raise ValueError(f"tokenizer {tok.spec} ({tok.kind}) gives no character offsets: instruction and "
                     "chat data need a fast tokenizer (a tokenizer.json)")


def span_mask(starts: np.ndarray, ends: np.ndarray, spans) -> np.ndarray:
    """1 for each id whose characters overlap one of the [a, b) spans."""
    m = np.zeros(len(starts), bool)
    for a, b in spans:
        m |= (starts < b) & (ends > a) & (ends > starts)
    return m.astype(np.uint8)


# ----------------------------------------------------------------------------- records
class Records:
    """Documents (text, ids, mask, end_mask) of the JSON-lines records of one format."""

    def __init__(self, fmt: str, tok: tk.Tokenizer, spec, *, chat_template: str | None = None,
                 field: str | None = None, prompt_field: str | None = None,
                 completion_field: str | None = None, train_on_prompt: bool = False,
                 skip_bad: bool = False):
        self.fmt, self.tok, self.train_on_prompt, self.skip_bad = fmt, tok, train_on_prompt, skip_bad
        self.skipped, self.first_bad = 0, None
        self.template = self.template_what = None
        if fmt == "chat":
            self.field = field or DEFAULT_FIELDS["chat"]
            self.renderer = renderer_for(tok, spec)
            self.template, self.template_what = resolve_template(chat_template, self.renderer, spec)
            self.roles = ROLES + tuple(r for r in TOOL_ROLES if re.search(f"['\"]{r}['\"]", self.template))
        else:
            self.prompt_field = prompt_field or DEFAULT_FIELDS["prompt"]
            self.completion_field = completion_field or DEFAULT_FIELDS["completion"]
            encode_offsets(tok, "", True)  # a slow-only tokenizer is refused before any input is read

    def describe(self) -> dict:
        out = {"format": self.fmt, "train_on_prompt": self.train_on_prompt, "skipped_bad": self.skipped}
        if self.fmt == "chat":
            out.update(chat_template=self.template_what, field=self.field)
        else:
            out.update(prompt_field=self.prompt_field, completion_field=self.completion_field)
        return out

    def read(self, path: str, advance: Callable[[int], None]) -> Iterator[tuple[str, np.ndarray, np.ndarray, int]]:
        with open(path, "rb") as f:
            for lineno, raw in enumerate(f, 1):
                advance(len(raw))
                where = f"{path}:{lineno}"
                try:
                    obj = _parse(raw, where)
                    if obj is None:
                        continue
                    doc = self.chat(obj, where) if self.fmt == "chat" else self.prompt_completion(obj, where)
                except BadRecord as e:
                    if not self.skip_bad:
                        raise
                    self.skipped += 1
                    self.first_bad = self.first_bad or str(e)
                    continue
                yield doc

    def _mask(self, starts, ends, spans) -> np.ndarray | None:
        return None if self.train_on_prompt else span_mask(starts, ends, spans)

    def prompt_completion(self, obj: dict, where: str):
        prompt = _string(obj, self.prompt_field, where, "--prompt-field")
        completion = _string(obj, self.completion_field, where, "--completion-field")
        if not completion.strip():
            raise BadRecord(f"{where}: empty answer (field {self.completion_field!r} is blank)")
        text = prompt + completion
        ids, starts, ends = _encode(self.tok, text, True, where)
        if ids.size and ids[-1] == self.tok.eos_id:  # a post-processor's own eos: the writer adds one
            ids, starts, ends = ids[:-1], starts[:-1], ends[:-1]
        return text, ids, self._mask(starts, ends, [(len(prompt), len(text))]), 1

    def chat(self, obj: dict, where: str):
        messages = obj.get(self.field)
        if self.field not in obj:
            keys = ", ".join(map(str, list(obj)[:8])) or "none"
            raise BadRecord(f"{where}: no field {self.field!r} (its fields: {keys}); name the messages "
                            "field with --field")
        if not isinstance(messages, list) or not messages:
            raise BadRecord(f"{where}: field {self.field!r} must be a non-empty list of "
                            "{role, content} messages")
        for n, m in enumerate(messages, 1):
            if not isinstance(m, dict) or "role" not in m or "content" not in m:
                raise BadRecord(f"{where}: message {n} is not a {{role, content}} object")
            if m["role"] not in self.roles:
                hint = " (tool roles need a template that handles them)" if m["role"] in TOOL_ROLES else ""
                raise BadRecord(f"{where}: message {n} has the unknown role {m['role']!r}; known: "
                                f"{', '.join(self.roles)}{hint}")
            if not isinstance(m["content"], str):
                raise BadRecord(f"{where}: message {n}'s content is a JSON {type(m['content']).__name__}, "
                                "not a string (only text content is supported)")
            if m["role"] == "assistant" and not m["content"].strip():
                raise BadRecord(f"{where}: message {n} is an empty answer")
        turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
        if not turns:
            raise BadRecord(f"{where}: no assistant message: nothing to train on")
        if turns[0] == 0:
            raise BadRecord(f"{where}: message 1 is an assistant turn with no prompt before it")
        text = self._render(messages, False, where)
        spans = []
        for i in turns:
            before = self._render(messages[:i], True, where)
            upto = self._render(messages[:i + 1], False, where)
            if not (text.startswith(upto) and upto.startswith(before)):
                raise BadRecord(f"{where}: the chat template renders message {i + 1} differently inside "
                                "the whole conversation, so its answer cannot be placed")
            spans.append((len(before), len(upto.rstrip())))
        ids, starts, ends = _encode(self.tok, text, False, where)
        mask = self._mask(starts, ends, spans)
        if mask is not None and not mask.any():
            raise BadRecord(f"{where}: the chat template ({self.template_what}) writes none of the assistant's "
                            "text, so no token would count in the loss")
        return text, ids, mask, 0

    def _render(self, messages, add_generation_prompt: bool, where: str) -> str:
        try:
            with _time_limit(RENDER_SECONDS):
                text = self.renderer.apply_chat_template(messages, chat_template=self.template, tokenize=False,
                                                         add_generation_prompt=add_generation_prompt)
        except _RenderTimeout:
            raise ValueError(f"{where}: the chat template ({self.template_what}) ran for more than "
                             f"{RENDER_SECONDS:g} s on one conversation (a loop without end?); refused") from None
        except Exception as e:  # a user's Jinja template can raise anything (raise_exception, TypeError...)
            raise BadRecord(f"{where}: the chat template ({self.template_what}) failed: "
                            f"{type(e).__name__}: {_first_line(e)}") from None
        if len(text) > RENDER_CHARS:
            raise ValueError(f"{where}: the chat template ({self.template_what}) wrote {len(text)} characters "
                             f"for one conversation, more than {RENDER_CHARS}; refused")
        return text


class _RenderTimeout(BaseException):
    """Raised by the timer inside a render; a BaseException, so no template's own error
    handling (or transformers') catches it."""


@contextlib.contextmanager
def _time_limit(seconds: float):
    """SIGALRM after `seconds` raises _RenderTimeout in the main thread (other threads: no limit,
    since only the main thread receives signals)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(signum, frame):
        raise _RenderTimeout()

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _parse(raw: bytes, where: str) -> dict | None:
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BadRecord(f"{where}: not UTF-8 text (byte 0x{raw[e.start]:02x} at column {e.start + 1})") from None
    if not line.strip():
        return None
    try:
        obj = json.loads(line)
    except RecursionError:
        raise BadRecord(f"{where}: JSON nested too deeply to read") from None
    except ValueError as e:
        raise BadRecord(f"{where}: not a JSON object ({getattr(e, 'msg', e)}); JSONL files hold one "
                        "object per line") from None
    if not isinstance(obj, dict):
        raise BadRecord(f"{where}: a JSON {type(obj).__name__}, not an object")
    return obj


def _string(obj: dict, field: str, where: str, flag: str) -> str:
    if field not in obj:
        keys = ", ".join(map(str, list(obj)[:8])) or "none"
        raise BadRecord(f"{where}: no field {field!r} (its fields: {keys}); name it with {flag}")
    value = obj[field]
    if not isinstance(value, str):
        raise BadRecord(f"{where}: field {field!r} is a JSON {'null' if value is None else type(value).__name__}, "
                        "not a string")
    return value


def _encode(tok, text: str, specials: bool, where: str):
    try:
        return encode_offsets(tok, text, specials)
    except UnicodeEncodeError:  # JSON allows lone surrogates ("\ud800"), UTF-8 does not
        raise BadRecord(f"{where}: the text holds a lone surrogate (not encodable as UTF-8)") from None


def _first_line(e: BaseException) -> str:
    return ((str(e).strip().splitlines() or [type(e).__name__])[0])[:300]
