"""The safe file layer (framework-free, bottom layer): atomic writes, writes that never follow a
link, paths read from files kept inside their root, and JSON/YAML parsed with limits.

Everything jaxformer writes goes through these: the content is built under a temporary name
in the destination's own folder and renamed into place only when complete, so a failed or
killed write leaves no partial file and never touches an existing good one.

    with atomic_file("out.safetensors") as tmp:   # tmp: a path in the same folder
        save_file(tensors, tmp)
    with atomic_dir("ckpt", overwrite=True) as tmp:  # tmp: an empty folder beside ckpt
        ...

A killed write leaves its temporary `.tmp-NAME-pPID-XXXX` beside NAME; the next write of the same
NAME removes the ones whose process is gone (clean_stale).

Files we did not write in this process are read with limits (every error is a ValueError that
names the file, and the field where one is wrong):

    inside(root, rel, source=meta_path, field="shard file")  # a path from a file, kept in root
    refuse_link(path, source)                               # a file that must not be a link
    read_json(path) / json_loads(text, where)               # size and depth limits
    yaml_load(text_or_stream)                               # no aliases, depth limit, no dup keys
    open_append(path) / open_nofollow(path, flags)          # appends never follow a link
"""
from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from typing import Any

MAX_JSON_BYTES = 64 << 20  # a JSON file we read whole (configs, meta, headers, indexes)
MAX_DEPTH = 64  # nesting of JSON/YAML values: no config or meta of ours comes near it


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _parent(path: str) -> str:
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    return parent


_OS_ERROR = re.compile(r"\(os error (\d+)\)|\bcode: (\d+), kind: ")


def _as_os_error(e: BaseException, path: str) -> BaseException:
    """A library's write error that carries an OS error code (safetensors' Rust I/O errors:
    "... (os error 28)") as the OSError it is, naming `path`; any other error as it is."""
    if isinstance(e, OSError) or not isinstance(e, Exception):
        return e
    m = _OS_ERROR.search(str(e))
    if m is None:
        return e
    code = int(m.group(1) or m.group(2))
    return OSError(code, f"cannot write {path}: {os.strerror(code)} (nothing partial is kept)")


def _tmp_prefix(path: str) -> str:
    return f".tmp-{os.path.basename(os.path.abspath(path))}-p{os.getpid()}-"


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: it exists, as another user's
        return True
    return True


def clean_stale(path: str) -> list[str]:
    """Remove the temporary files and folders that a killed write of `path` left beside it
    (`.tmp-NAME-pPID-XXXX` whose process PID is gone; a running writer's are kept). -> the
    names removed."""
    parent = os.path.dirname(os.path.abspath(path))
    pattern = re.compile(re.escape(f".tmp-{os.path.basename(os.path.abspath(path))}-p") + r"(\d+)-[a-z0-9_]+")
    removed = []
    try:
        names = os.listdir(parent)
    except OSError:
        return removed
    for name in names:
        m = pattern.fullmatch(name)
        if m is None or _alive(int(m.group(1))):
            continue
        stale = os.path.join(parent, name)
        if os.path.isdir(stale) and not os.path.islink(stale):
            shutil.rmtree(stale, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                os.remove(stale)
        removed.append(name)
    return removed


@contextlib.contextmanager
def _os_errors(path: str) -> Iterator[None]:
    """A library's error that carries an OS error code (safetensors' "(os error 28)") raised as
    a one-line OSError about `path` (_as_os_error); any other error unchanged."""
    try:
        yield
    except Exception as e:
        err = _as_os_error(e, path)
        if err is e:
            raise
        raise err from None


@contextlib.contextmanager
def atomic_file(path: str) -> Iterator[str]:
    """Yield a temporary path beside `path`; on a clean exit it replaces `path` (os.replace is
    atomic on POSIX and replaces a link at `path`, never its target), on any error it is
    removed and `path` is left as it was."""
    parent = _parent(path)
    clean_stale(path)
    fd, tmp = tempfile.mkstemp(prefix=_tmp_prefix(path), dir=parent)
    os.close(fd)
    os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes it 0600; a written file gets the usual mode
    try:
        with _os_errors(path):
            yield tmp
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


@contextlib.contextmanager
def atomic_dir(path: str, *, overwrite: bool = False) -> Iterator[str]:
    """Yield an empty temporary folder beside `path`; on a clean exit it takes `path`'s place.

    An existing `path` is an error (FileExistsError, raised before anything is written) unless
    overwrite is True; it is then removed only after the new folder is complete."""
    if os.path.lexists(path) and not overwrite:
        raise FileExistsError(f"{path} exists; choose another output or pass --overwrite")
    parent = _parent(path)
    clean_stale(path)
    tmp = tempfile.mkdtemp(prefix=_tmp_prefix(path), dir=parent)
    os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp makes it 0700
    try:
        with _os_errors(path):
            yield tmp
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        elif os.path.lexists(path):
            os.remove(path)
        os.replace(tmp, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def write_text(path: str, text: str) -> None:
    """Write a text file atomically."""
    with atomic_file(path) as tmp, open(tmp, "w") as f:
        f.write(text)


# ------------------------------------------------------------------ paths read from files, links
def inside(root: str, rel: Any, *, source: str, field: str, absolute: bool = False) -> str:
    """`rel`, a path read from `source` (a file we did not write), as a path under `root`:
    resolved (links too), it must stay inside root's resolved path, else a ValueError naming
    source, field and the path. absolute: an absolute path is allowed if it lies inside root.
    -> the resolved path."""
    if not isinstance(rel, str) or not rel or "\0" in rel:
        raise ValueError(f"{source}: {field} must be a relative path inside {root}, got {rel!r}")
    if os.path.isabs(rel) and not absolute:
        raise ValueError(f"{source}: {field} {rel!r} is an absolute path; it must lie inside {root}")
    real_root = os.path.realpath(root)
    real = os.path.realpath(os.path.join(real_root, rel))
    if real != real_root and not real.startswith(real_root.rstrip(os.sep) + os.sep):
        raise ValueError(f"{source}: {field} {rel!r} leads outside {root}")
    return real


def refuse_link(path: str, source: str | None = None) -> None:
    """A file that must be a plain file of its directory, not a symbolic link (whose target,
    inside or outside, we would read): ValueError naming it, never its target's bytes."""
    if os.path.islink(path):
        where = f"{source}: " if source else ""
        raise ValueError(f"{where}{path} is a symbolic link; refused (copy the file in instead)")


def contains(outer: str, inner: str) -> bool:
    """Whether `inner` is `outer` or lies inside it: as written, with its folder's links resolved
    (a link inside `outer` is inside it), or with every link resolved; hard-linked files are
    compared by inode."""
    def within(a: str, b: str) -> bool:
        return a == b or b.startswith(a.rstrip(os.sep) + os.sep)

    inner_forms = {os.path.abspath(inner), os.path.realpath(inner),
                   os.path.join(os.path.realpath(os.path.dirname(os.path.abspath(inner))), os.path.basename(inner))}
    for a in {os.path.abspath(outer), os.path.realpath(outer)}:
        if any(within(a, b) for b in inner_forms):
            return True
    with contextlib.suppress(OSError):
        return os.path.samefile(outer, inner)
    return False


def refuse_overlap(out: str, inputs: dict[str, str]) -> None:
    """An output that --overwrite would replace must neither be an input, hold one, nor lie
    inside one: `inputs` maps a name ("--adapter", "the input directory") to a path. ValueError
    naming both."""
    for what, path in inputs.items():
        if path is None or not os.path.lexists(path):
            continue
        if contains(path, out) and contains(out, path):
            raise ValueError(f"{out} is {what} {path}; write the output elsewhere")
        if contains(out, path):
            raise ValueError(f"{out} holds {what} {path}; write the output elsewhere")
        if contains(path, out):
            raise ValueError(f"{out} lies inside {what} {path}; write the output elsewhere")


def open_nofollow(path: str, flags: int, mode: int = 0o666) -> int:
    """os.open with O_NOFOLLOW: a link at `path` is a ValueError, never followed."""
    try:
        return os.open(path, flags | os.O_NOFOLLOW, mode)
    except OSError as e:
        if e.errno == errno.ELOOP or os.path.islink(path):
            raise ValueError(f"{path} is a symbolic link; refusing to write through it") from None
        raise


def open_append(path: str):
    """A text file opened for appending (created if absent) that is never a followed link."""
    return os.fdopen(open_nofollow(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT), "a")


# ------------------------------------------------------------------ JSON and YAML with limits
def _depth(value: Any, limit: int) -> bool:
    """Whether `value` nests no deeper than `limit` (iterative: no recursion)."""
    stack = [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, (dict, list)):
            if d > limit:
                return False
            stack.extend((c, d + 1) for c in (v.values() if isinstance(v, dict) else v))
    return True


def json_loads(text: str | bytes, where: str, *, max_depth: int = MAX_DEPTH) -> Any:
    """json.loads with a depth limit; any failure is one ValueError naming `where`."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise ValueError(f"{where}: JSON nested deeper than {max_depth} levels") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{where}: not valid JSON (line {e.lineno}, column {e.colno}): {e.msg}") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"{where}: not valid JSON ({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None
    if not _depth(value, max_depth):
        raise ValueError(f"{where}: JSON nested deeper than {max_depth} levels")
    return value


def read_json(path: str, *, max_bytes: int = MAX_JSON_BYTES, max_depth: int = MAX_DEPTH,
              expect: type | None = None) -> Any:
    """A JSON file's value, read with limits (size, depth); expect=dict/list: its type.
    ValueError naming the file (OSError for a missing/unreadable one)."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size > max_bytes:
            raise ValueError(f"{path}: {size} bytes; a JSON file here holds at most {max_bytes}")
        raw = f.read(max_bytes + 1)
    value = json_loads(raw, path, max_depth=max_depth)
    if expect is not None and not isinstance(value, expect):
        kind = {dict: "a JSON object", list: "a JSON list"}.get(expect, expect.__name__)
        raise ValueError(f"{path}: must be {kind}, not {type(value).__name__}")
    return value


def _yaml_loader():
    import yaml

    class Loader(yaml.SafeLoader):
        """yaml.SafeLoader (plain data, no tags) that refuses aliases (a "billion laughs"
        expands them exponentially), nesting deeper than MAX_DEPTH and duplicate keys."""

        _depth = 0

        def compose_node(self, parent, index):
            if self.check_event(yaml.AliasEvent):
                event = self.peek_event()
                raise yaml.composer.ComposerError(
                    None, None, f"the alias *{event.anchor} is refused (aliases and anchors are not read)",
                    event.start_mark)
            self._depth += 1
            try:
                if self._depth > MAX_DEPTH:
                    raise yaml.composer.ComposerError(None, None, f"nested deeper than {MAX_DEPTH} levels",
                                                      self.peek_event().start_mark)
                return super().compose_node(parent, index)
            finally:
                self._depth -= 1

        def construct_mapping(self, node, deep=False):
            seen = set()
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=True)
                try:
                    dup = key in seen
                except TypeError:
                    continue  # unhashable: construct_mapping's own error follows
                if dup:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"the key {key!r} appears twice in one mapping", key_node.start_mark)
                seen.add(key)
            return super().construct_mapping(node, deep)

    return Loader


_LOADER = None


def yaml_load(stream: Any) -> Any:
    """yaml.safe_load with limits: aliases/anchors, nesting deeper than MAX_DEPTH and duplicate
    keys are refused (yaml.YAMLError subclasses with a mark, as safe_load's own errors)."""
    global _LOADER
    import yaml
    if _LOADER is None:
        _LOADER = _yaml_loader()
    if hasattr(stream, "read"):
        stream = stream.read(MAX_JSON_BYTES + 1)
    if len(stream) > MAX_JSON_BYTES:
        raise yaml.YAMLError(f"more than {MAX_JSON_BYTES} bytes of YAML")
    loader = _LOADER(stream)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()
