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

Templates are untrusted code. They render here as transformers' apply_chat_template renders them
(its environment's filters, globals and {% generation %} tag, the same template variables: the
special tokens, messages without None fields), in a subclass of jinja2's
ImmutableSandboxedEnvironment (no attribute escapes, range() capped at 100,000 items) that also
bounds what one operation may build: `*`, `+`, `~`, `%` and `**`, the padding and joining string
methods and filters (center, ljust, rjust, zfill, expandtabs, replace, join, format, indent,
tojson's indent) refuse a result of more than RENDER_CHARS characters or items before allocating
it (`'x' * 10**10` is one line, not 10 GB), and no template is constant-folded at compile time.
Each render has a time limit (RENDER_SECONDS; nested loops run for ever within the range cap),
kept by a watchdog thread that raises in the rendering thread, so it holds in any thread (a
signal would reach the main thread only), and the rendered text is counted as it is written
(RENDER_CHARS). Any of these stops the whole command, --skip-bad or not: the template is at
fault, not the record.
"""
from __future__ import annotations

import contextlib
import ctypes
import functools
import json
import math
import os
import re
import threading
import time
from collections.abc import Callable, Iterator

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
        bounded_template(template)  # in the bounded sandbox: nothing is constant-folded at compile
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
                return render(self.template, messages, add_generation_prompt, _template_tokens(self.renderer))
        except _RenderTimeout:
            raise ValueError(f"{where}: the chat template ({self.template_what}) ran for more than "
                             f"{RENDER_SECONDS:g} s on one conversation (a loop without end?); refused") from None
        except _TooLarge as e:
            raise ValueError(f"{where}: the chat template ({self.template_what}) {e}; refused") from None
        except Exception as e:  # a user's Jinja template can raise anything (raise_exception, TypeError...)
            raise BadRecord(f"{where}: the chat template ({self.template_what}) failed: "
                            f"{type(e).__name__}: {_first_line(e)}") from None


class _RenderTimeout(BaseException):
    """Raised by the watchdog inside a render; a BaseException, so no template's own error
    handling (or transformers') catches it."""


class _Watchdog:
    """One daemon thread that raises _RenderTimeout in a thread whose render ran past its
    deadline (PyThreadState_SetAsyncExc: raised at the thread's next bytecode, so a Jinja loop
    stops; one long C call, such as a huge allocation, is what the size bounds prevent)."""

    def __init__(self):
        self.cond = threading.Condition()
        self.jobs: dict[int, tuple[int, float]] = {}  # job id -> (thread id, deadline)
        self.fired: set[int] = set()
        self.count = 0
        self.thread: threading.Thread | None = None
        self.wake_at = 0.0  # when the thread wakes next; an earlier deadline wakes it (no wake-up per render)

    def arm(self, seconds: float) -> int:
        with self.cond:
            self.count += 1
            deadline = time.monotonic() + seconds
            self.jobs[self.count] = (threading.get_ident(), deadline)
            if self.thread is None or not self.thread.is_alive():
                self.thread = threading.Thread(target=self._run, name="jaxformer-render-watchdog", daemon=True)
                self.thread.start()
            elif deadline < self.wake_at:
                self.cond.notify()
            return self.count

    def disarm(self, job: int) -> bool:
        """-> whether the job's deadline fired (its exception may still be pending: cleared)."""
        with self.cond:
            self.jobs.pop(job, None)
            fired = job in self.fired
            self.fired.discard(job)
            if fired:
                ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(threading.get_ident()), None)
            return fired

    def _run(self) -> None:
        with self.cond:
            while True:
                now = time.monotonic()
                for job, (tid, deadline) in list(self.jobs.items()):
                    if deadline <= now:
                        del self.jobs[job]
                        self.fired.add(job)
                        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(tid),
                                                                   ctypes.py_object(_RenderTimeout))
                self.wake_at = min((d for _, d in self.jobs.values()), default=now + 60.0)
                self.cond.wait(max(self.wake_at - now, 0.001))


_WATCHDOG = _Watchdog()


@contextlib.contextmanager
def _time_limit(seconds: float):
    """_RenderTimeout in this thread (any thread) once `seconds` have passed inside the block."""
    job = _WATCHDOG.arm(seconds)
    try:
        yield
    finally:
        if _WATCHDOG.disarm(job):
            raise _RenderTimeout()


# ----------------------------------------------------------------------------- the bounded sandbox
class _TooLarge(Exception):
    """An operation of a template that would build more than RENDER_CHARS characters or items."""


def _limit(size, what: str) -> None:
    if size > RENDER_CHARS:
        raise _TooLarge(f"builds {what} of {size:,} characters or items, more than {RENDER_CHARS:,}")


def _length(x) -> int:
    try:
        return len(x)
    except TypeError:
        return 0


_SIZED = (str, bytes, list, tuple)
_WIDTH = re.compile(r"%[-#0 +]*(\d+|\*)?(?:\.(\d+|\*))?|\{[^{}]*?[:<>^=]?(\d{4,})[^{}]*\}")


def _check_format(fmt: str, args) -> None:
    """%-formatting or str.format: a width or precision that pads past the limit (written in
    the format, or taken from the arguments: '%*d', '{:{}}')."""
    from_args = bool(re.search(r"\{[^{}]*\{", fmt))
    for m in _WIDTH.finditer(fmt):
        for g in m.groups():
            if g and g.isdigit():
                _limit(int(g), "a padded field")
        from_args = from_args or "*" in m.group(0)
    if from_args:
        for a in (args if isinstance(args, tuple) else (args,)):
            if isinstance(a, int):
                _limit(abs(a), "a padded field")


def _check_binop(op: str, a, b) -> None:
    if op == "*":
        for x, n in ((a, b), (b, a)):
            if isinstance(x, _SIZED) and isinstance(n, int):
                _limit(len(x) * max(n, 0), f"'{type(x).__name__} * {n}'")
        if isinstance(a, int) and isinstance(b, int):
            _limit((abs(a).bit_length() + abs(b).bit_length()) // 4, "a number")
    elif op == "+" and isinstance(a, _SIZED) and isinstance(b, _SIZED):
        _limit(len(a) + len(b), "a concatenation")
    elif op == "%" and isinstance(a, str):
        _check_format(a, b)
    elif op == "**" and isinstance(a, int) and isinstance(b, int) and abs(a) > 1 and b > 0:
        _limit(int(b * math.log2(abs(a)) / 4), "a number")


def _check_call(obj, args, kwargs) -> None:
    """The string methods that pad or multiply what they are given."""
    owner, name = getattr(obj, "__self__", None), getattr(obj, "__name__", "")
    if not isinstance(owner, str):
        return
    if name in ("center", "ljust", "rjust", "zfill") and args and isinstance(args[0], int):
        _limit(args[0], f"'str.{name}({args[0]})'")
    elif name == "expandtabs":
        size = args[0] if args else kwargs.get("tabsize", 8)
        if isinstance(size, int):
            _limit(len(owner) * max(size, 1), "'str.expandtabs'")
    elif name == "replace" and len(args) >= 2 and isinstance(args[0], str) and isinstance(args[1], str):
        _replace_size(owner, args[0], args[1], args[2] if len(args) > 2 else -1)
    elif name == "join" and args:
        _join_size(owner, args[0])
    elif name in ("format", "format_map"):
        _check_format(owner, tuple(args))


def _replace_size(s: str, old: str, new: str, count=-1) -> None:
    n = s.count(old) if old else len(s) + 1
    if isinstance(count, int) and count >= 0:
        n = min(n, count)
    _limit(len(s) + n * (len(new) - len(old)), "'str.replace'")


def _join_size(sep: str, items) -> None:
    if hasattr(items, "__len__") and not isinstance(items, dict):
        _limit(len(sep) * max(len(items) - 1, 0) + sum(len(x) for x in items if isinstance(x, _SIZED)), "a join")


def _bounded_filters(filters: dict) -> dict:
    def wrap(name, check):
        f = filters[name]

        @functools.wraps(f)
        def bounded(*args, **kwargs):
            check(*args, **kwargs)
            return f(*args, **kwargs)
        return bounded

    def center(value, width=80, *a, **k):
        if isinstance(width, int):
            _limit(width, "'center'")

    def indent(value, width=4, *a, **k):
        w = width if isinstance(width, int) else _length(width)
        _limit(_length(value) + (str(value).count("\n") + 1) * w, "'indent'")

    def join(*args, **k):  # (eval_ctx, value, d="", attribute=None)
        value, sep = (args[1:3] + ("",))[:2]
        if isinstance(sep, str):
            _join_size(sep, value)

    def replace(*args, **k):  # (eval_ctx, s, old, new, count=None)
        s_, old, new = (args[1:4] + (None,) * 3)[:3]
        if all(isinstance(x, str) for x in (s_, old, new)):
            _replace_size(s_, old, new, args[4] if len(args) > 4 and isinstance(args[4], int) else -1)

    def fmt(value, *args, **k):
        if isinstance(value, str):
            _check_format(value, args)

    def tojson(value, *a, **k):
        indent_ = k.get("indent", a[1] if len(a) > 1 else None)
        if isinstance(indent_, int):
            _limit(indent_, "a JSON indent")
        elif isinstance(indent_, str):
            _limit(len(indent_), "a JSON indent")

    out = dict(filters)
    for name, check in (("center", center), ("indent", indent), ("join", join), ("replace", replace),
                        ("format", fmt), ("tojson", tojson)):
        if name in out:
            out[name] = wrap(name, check)
    return out


def _bounded_env_class():
    from jinja2 import compiler
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class BoundedCodeGenerator(compiler.CodeGenerator):
        def visit_Concat(self, node, frame):  # `a ~ b`: through the environment, to be bounded
            self.write("environment.bounded_concat((")
            for arg in node.nodes:
                self.visit(arg, frame)
                self.write(", ")
            self.write("))")

    class BoundedSandbox(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset({"*", "+", "%", "**"})  # never constant-folded, checked at run time
        code_generator_class = BoundedCodeGenerator

        def call_binop(self, context, operator, left, right):
            _check_binop(operator, left, right)
            return super().call_binop(context, operator, left, right)

        def call(__self, __context, __obj, *args, **kwargs):  # jinja2's signature
            _check_call(__obj, args, kwargs)
            return super().call(__context, __obj, *args, **kwargs)

        def wrap_str_format(self, value):  # str.format / format_map, which the sandbox wraps at access
            wrapped = super().wrap_str_format(value)
            if wrapped is None:
                return None
            fmt = value.__self__

            def bounded(*args, **kwargs):
                _check_format(fmt, tuple(args) + tuple(kwargs.values()))
                return wrapped(*args, **kwargs)
            return bounded

        def bounded_concat(self, parts):
            parts = [p if isinstance(p, str) else str(p) for p in parts]
            _limit(sum(len(p) for p in parts), "a concatenation ('~')")
            return "".join(parts)

    return BoundedSandbox


@functools.lru_cache(maxsize=16)
def bounded_template(template: str):
    """`template` compiled in the bounded sandbox, with the filters, globals and extensions of
    transformers' chat-template environment (taken from its compile of an empty template)."""
    from transformers.utils.chat_template_utils import _compile_jinja_template
    base = _compile_jinja_template("").environment
    env = _bounded_env_class()(trim_blocks=True, lstrip_blocks=True,
                               extensions=[type(e) for e in base.extensions.values()])
    env.filters = _bounded_filters({**env.filters, **base.filters})
    env.globals.update(base.globals)
    return env.from_string(template)


def _template_tokens(renderer) -> dict:
    """The template variables transformers adds: the tokenizer's special tokens (bos_token...)."""
    return dict(getattr(renderer, "special_tokens_map", None) or {})


def render(template: str, messages: list, add_generation_prompt: bool, tokens: dict) -> str:
    """One conversation through the bounded sandbox, with apply_chat_template's variables and
    message preparation (None fields dropped, plain JSON data, reasoning aliases); the text is
    counted as it is written (RENDER_CHARS)."""
    from transformers.utils import chat_template_utils as ctu
    chat = [{k: v for k, v in m.items() if v is not None} for m in messages]
    plain = getattr(ctu, "_plain_template_data", lambda x: x)
    chat = plain(chat)
    chat = getattr(ctu, "_alias_reasoning_fields", lambda x: x)(chat)
    parts, size = [], 0
    for piece in bounded_template(template).generate(messages=chat, tools=None, documents=None,
                                                     add_generation_prompt=add_generation_prompt, **plain(tokens)):
        size += len(piece)
        if size > RENDER_CHARS:
            raise _TooLarge(f"wrote more than {RENDER_CHARS:,} characters for one conversation")
        parts.append(piece)
    return "".join(parts)


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
