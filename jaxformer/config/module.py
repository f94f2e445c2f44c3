"""A model given as any Flax NNX module: a file `jaxformer port` wrote, or your own class.

    model: {module: my_gpt.py:GPT, torch: my_torch.py:make_gpt, kwargs: {}, axes: {...}}
    task: causal_lm

`module` names the class as FILE.py:CLASS (FILE relative to the YAML's folder; the loader makes
it absolute) or package.module:CLASS (imported with the working directory on the path, as
`python -m` has it). The class is built as CLASS(**kwargs, rngs=nnx.Rngs(seed)). `torch` names
a function that returns the torch module it stands for (the torch trainer trains it; `export
--to torch` writes that module's own state_dict keys). `axes` gives any parameter's logical
axes by a regex on its path (jaxformer/layers/kernels/partitioning.py; null: replicated).
`dropout`, when set, is the rate of every dropout layer of the module (train.dropout sets it).

The top-level `task:` says what the module learns and how a batch becomes its call (TASKS;
jaxformer/train/tasks.py): the registered family whose batches, loss and metrics it shares.

Imports neither jax nor torch: `load_object` imports the user's file, which does.
"""
from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import re
import sys
from dataclasses import dataclass, field
from typing import Any

from jaxformer.config.base import ConfigError, check

MODULE = "module"  # the model name of a module given by model.module
# task -> the registered family whose batches, loss and metrics it shares, and the call:
#   causal_lm       model(ids [B, T]) -> logits [B, T, V]; next-token loss
#   classification  model(ids [B, T] or images [B, H, W, C]) -> logits [B, C]
#   seq2seq         model(src [B, S], tgt_in [B, T]) -> logits [B, T, V]; teacher forcing
TASK_FAMILY = {"causal_lm": "lm", "classification": "classifier", "seq2seq": "seq2seq"}
TASKS = tuple(TASK_FAMILY)


def is_file_spec(spec: str) -> bool:
    """FILE.py:NAME (a file path) rather than package.module:NAME."""
    return spec.rpartition(":")[0].endswith(".py")


def _check_spec(cfg, name: str) -> None:
    spec = getattr(cfg, name)
    target, colon, obj = spec.rpartition(":")
    check(bool(colon and target and obj.isidentifier()), name,
          f"{spec!r} must be FILE.py:NAME or package.module:NAME")
    check(is_file_spec(spec) or all(p.isidentifier() for p in target.split(".")), name,
          f"{spec!r}: {target!r} is neither a .py file nor a dotted module name")


@dataclass(frozen=True)
class ModuleConfig:
    module: str  # FILE.py:CLASS or package.module:CLASS, an nnx.Module built as CLASS(**kwargs, rngs=...)
    kwargs: dict = field(default_factory=dict)  # the constructor's keyword arguments (besides rngs)
    torch: str | None = None  # FILE.py:FUNC or package.module:FUNC: FUNC() -> the torch nn.Module
    axes: dict = field(default_factory=dict)  # regex on a parameter's path -> its logical axes (or null)
    dropout: float | None = None  # every dropout layer's rate; None: as the module sets them

    def __post_init__(self) -> None:
        _check_spec(self, "module")
        if self.torch is not None:
            _check_spec(self, "torch")
        check(all(isinstance(k, str) and k.isidentifier() for k in self.kwargs), "kwargs",
              f"must map argument names to values, got {sorted(map(str, self.kwargs))}")
        check("rngs" not in self.kwargs, "kwargs", "rngs is passed by the trainer (nnx.Rngs(train.seed))")
        for pattern, axes in self.axes.items():
            try:
                re.compile(pattern)
            except re.error as e:
                raise ConfigError(f"axes: {pattern!r} is not a regular expression: {e}") from None
            check(axes is None or (isinstance(axes, (list, tuple))
                                   and all(a is None or isinstance(a, str) for a in axes)), "axes",
                  f"{pattern!r}: {axes!r} must be a list of logical axis names (or null per dim), or null")
        if self.dropout is not None:
            check(isinstance(self.dropout, (int, float)) and 0.0 <= self.dropout < 1.0, "dropout",
                  f"must be a probability in [0, 1), got {self.dropout!r}")


def logits_of(out):
    """The logits of a model's output, in either framework: the output itself, or its `logits`
    (an LMOutput, a Hugging Face ModelOutput, a dict), or the first item of a tuple."""
    if isinstance(out, dict):
        return out["logits"] if "logits" in out else next(iter(out.values()))
    if hasattr(out, "logits"):
        return out.logits
    if isinstance(out, (tuple, list)):
        return out[0]
    return out


def absolute_spec(spec: str, folder: str) -> str:
    """FILE.py:NAME with FILE made absolute against `folder` (package specs as they are)."""
    if not isinstance(spec, str) or not is_file_spec(spec):
        return spec
    target, _, name = spec.rpartition(":")
    return f"{os.path.normpath(os.path.join(folder, os.path.expanduser(target)))}:{name}"


_FILES: dict[tuple, Any] = {}  # (path, mtime, size) -> the imported module


def _import_file(path: str, key: str, spec: str):
    """The module of a .py file, imported once per version of the file (its folder on sys.path
    while it runs, so it may import its neighbours)."""
    stat = os.stat(path)
    version = (path, stat.st_mtime_ns, stat.st_size)
    if version not in _FILES:
        name = "jaxformer_module_" + hashlib.sha1(repr(version).encode()).hexdigest()[:12]
        loader_spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(loader_spec)
        folder = os.path.dirname(path)
        sys.path.insert(0, folder)
        sys.modules[name] = module
        try:
            loader_spec.loader.exec_module(module)
        except Exception as e:  # any failure of the user's file, in one line
            del sys.modules[name]
            raise ConfigError(f"{key}: {spec}: importing {path} failed: {type(e).__name__}: "
                              f"{_first_line(e)}") from None
        finally:
            sys.path.remove(folder)
        _FILES[version] = module
    return _FILES[version]


def _first_line(e: BaseException) -> str:
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return lines[0] if lines else type(e).__name__


def load_object(spec: str, key: str):
    """The object a FILE.py:NAME or package.module:NAME spec names; ConfigError (naming `key`,
    the YAML key) when the file, module or name is not there or the import fails."""
    target, _, name = spec.rpartition(":")
    if is_file_spec(spec):
        path = os.path.abspath(os.path.expanduser(target))
        if not os.path.isfile(path):
            raise ConfigError(f"{key}: {spec}: no such file {path}")
        module = _import_file(path, key, spec)
    else:
        added = os.getcwd() not in sys.path
        if added:  # as `python -m` has it
            sys.path.insert(0, os.getcwd())
        try:
            module = importlib.import_module(target)
        except ModuleNotFoundError as e:
            if e.name is not None and target.startswith(e.name):
                raise ConfigError(f"{key}: {spec}: no module {e.name!r} (run from the folder that holds it, "
                                  "or name a file as FILE.py:NAME)") from None
            raise ConfigError(f"{key}: {spec}: importing {target} failed: {type(e).__name__}: {_first_line(e)}") from None
        except Exception as e:
            raise ConfigError(f"{key}: {spec}: importing {target} failed: {type(e).__name__}: {_first_line(e)}") from None
        finally:
            if added:
                sys.path.remove(os.getcwd())
    if not hasattr(module, name):
        raise ConfigError(f"{key}: {spec}: {target} defines no {name!r}")
    return getattr(module, name)
