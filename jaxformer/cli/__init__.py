"""The `jaxformer` command line. One module per subcommand in this package, each with
`add_arguments(parser)` and `run(args) -> exit code`; a subcommand's module is imported only
when that subcommand runs (its --help included), so `jaxformer --help` starts fast.

Errors: a subcommand raises; `main` turns every user error (see `user_error`) into one or two
lines on stderr and exit code 2, and lets a bug surface as a traceback. `--debug` shows the
traceback of a user error too."""
from __future__ import annotations

import argparse
import importlib
import sys
import threading

import jaxformer

# name -> (module under jaxformer.cli, one-line help)
COMMANDS = {
    "train": ("train", "train a config in JAX (jit/pmap/mesh) or torch, with checkpoints and metrics"),
    "generate": ("generate", "generate text (or token ids) with an lm/seq2seq model (KV cache)"),
    "convert": ("convert", "convert weights between torch, flax and Hugging Face"),
    "export": ("export", "export a training run's weights as a model checkpoint, torch safetensors or HF dir"),
    "parity": ("parity", "run the parity registry: outputs and gradients, torch vs JAX"),
    "eval": ("eval", "evaluate a training run's weights (last, best or a step) on its eval split"),
    "data": ("data", "prepare your own text as a tokenized dataset (data prepare)"),
    "plot": ("plot", "overlay the loss, lr, grad-norm and eval curves of training runs (PNG)"),
    "compile": ("compile", "compile the train or decode step for a TPU slice on this host: fits? estimated speed"),
    "config": ("config", "print a config resolved, or --explain: every rule it breaks"),
    "port": ("port", "write a torch module as Flax NNX source (torch.export), with parity checked"),
}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="jaxformer",
        description="Transformers in Flax NNX with a PyTorch mirror: train, generate, convert "
                    "weights both ways and prove parity.",
        epilog="Run 'jaxformer COMMAND --help' for a command's options.")
    parser.add_argument("--version", action="version", version=f"jaxformer {jaxformer.__version__}")
    parser.add_argument("--debug", action="store_true", help="show the traceback of an error")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(_module=module)
    return parser


def _module(name: str):
    return importlib.import_module(f"jaxformer.cli.{name}")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = _parser()
    # The subcommand's own options are added only for the subcommand that runs.
    first = next((a for a in argv if not a.startswith("-")), None)
    if first in COMMANDS:
        sub = parser._subparsers._group_actions[0].choices[first]
        _module(COMMANDS[first][0]).add_arguments(sub)
    args = parser.parse_args(argv)
    if args.command != "compile":  # compile runs on the CPU, libtpu and CUDA as its compilers
        from jaxformer.cli.platforms import set_platforms
        set_platforms()
    if not args.debug:
        _quiet_background_failures()
    try:
        return int(_module(args._module).run(args) or 0)
    except KeyboardInterrupt:
        print(f"jaxformer {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader of stdout left (`| head`): stop quietly, as Unix tools do
        import os
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so exit's flush cannot raise again
        return 141
    except BaseException as e:
        if args.debug or not user_error(e):
            raise
        print(error_lines(f"jaxformer {args.command}", e), file=sys.stderr)
        return 2


class _BackgroundTracebackFilter:
    """sys.stderr for a command: what the main thread writes passes straight through; what
    another thread writes is assembled into lines per thread, and a traceback block from
    another thread whose last line is `RuntimeError: Event loop is closed` is dropped whole.

    Why: when a checkpoint write fails (a full disk), tensorstore's writer threads keep
    calling back into the asyncio loop orbax has already closed, and each prints that
    traceback (dozens, interleaved between threads) while the real error reaches `main` as
    an exception and is printed once. Any other background output, tracebacks included,
    still reaches stderr."""

    def __init__(self, stream):
        self._stream = stream
        self._main = threading.get_ident()
        self._lock = threading.Lock()
        self._pending: dict[int, str] = {}  # thread -> text not yet ending in a newline
        self._blocks: dict[int, list[str]] = {}  # thread -> lines of an open traceback

    def write(self, text: str) -> int:
        tid = threading.get_ident()
        if tid == self._main:
            return self._stream.write(text)
        with self._lock:
            buf = self._pending.pop(tid, "") + text
            *lines, rest = buf.split("\n")
            if rest:
                self._pending[tid] = rest
            for line in lines:
                self._line(tid, line + "\n")
        return len(text)

    def _line(self, tid: int, line: str) -> None:
        block = self._blocks.get(tid)
        if block is None:
            if line.startswith("Traceback (most recent call last):"):
                self._blocks[tid] = [line]
            else:
                self._stream.write(line)
            return
        block.append(line)
        if not line.startswith((" ", "\t")):  # the exception line closes the block
            del self._blocks[tid]
            if line.strip() != "RuntimeError: Event loop is closed":
                self._stream.write("".join(block))

    def flush(self) -> None:
        self._stream.flush()

    def __getattr__(self, name):
        return getattr(self._stream, name)


def _quiet_background_failures() -> None:
    """When a checkpoint write fails (a full disk), orbax's background writers log the same
    error through absl, asyncio logs the failed write tasks again when they are collected, and
    tensorstore's threads print "Event loop is closed" tracebacks (see
    _BackgroundTracebackFilter); the error itself reaches `main` as an exception and is printed
    once. These echoes are dropped unless --debug."""
    import logging
    logging.getLogger("absl").setLevel(logging.CRITICAL)
    # orbax's failed write coroutines are reported again when their tasks are collected
    # ("Task exception was never retrieved"); jaxformer runs no asyncio code of its own
    logging.getLogger("asyncio").setLevel(logging.CRITICAL)
    # and a write coroutine the failed save cancelled before it ran is warned about when it is
    # collected ("coroutine ... was never awaited", with a tracemalloc hint): seen under load
    import warnings
    warnings.filterwarnings("ignore", message=r"coroutine .* was never awaited", category=RuntimeWarning)
    if not isinstance(sys.stderr, _BackgroundTracebackFilter):
        sys.stderr = _BackgroundTracebackFilter(sys.stderr)


def user_error(e: BaseException) -> bool:
    """Bad input rather than a bug: invalid values and configs (ValueError, which ConfigError
    and ConversionError are), files that are missing, unreadable, unwritable or on a full disk
    (OSError), YAML syntax and refused pickles."""
    import pickle
    if isinstance(e, (ValueError, OSError, pickle.UnpicklingError)):
        return True
    yaml = sys.modules.get("yaml")
    return yaml is not None and isinstance(e, yaml.YAMLError)


def error_lines(prefix: str, e: BaseException, width: int = 400) -> str:
    """At most two lines: the message's first line, then how many more lines it had."""
    text = str(e).strip() or type(e).__name__
    if isinstance(e, OSError) and e.filename and str(e.filename) not in text:
        text = f"{text}: {e.filename}"
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    first = lines[0] if len(lines[0]) <= width else lines[0][: width - 3] + "..."
    out = f"{prefix}: error: {first}"
    if len(lines) > 1:
        out += f"\n  (and {len(lines) - 1} more line(s); --debug shows them all)"
    return out


if __name__ == "__main__":
    sys.exit(main())
