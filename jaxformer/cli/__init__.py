"""The `jaxformer` command line. One module per subcommand in this package, each with
`add_arguments(parser)` and `run(args) -> exit code`; a subcommand's module is imported only
when that subcommand runs (its --help included), so `jaxformer --help` starts fast."""
from __future__ import annotations

import argparse
import importlib
import sys

import jaxformer

# name -> (module under jaxformer.cli, one-line help)
COMMANDS = {
    "train": ("train", "train a config in JAX (jit/pmap/mesh) or torch, with checkpoints and metrics"),
    "generate": ("generate", "generate token ids with an lm/seq2seq model (KV cache)"),
    "convert": ("convert", "convert weights between torch, flax and Hugging Face"),
    "parity": ("parity", "run the parity registry: outputs and gradients, torch vs JAX"),
}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="jaxformer",
        description="Transformers in Flax NNX with a PyTorch mirror: train, generate, convert "
                    "weights both ways and prove parity.",
        epilog="Run 'jaxformer COMMAND --help' for a command's options.")
    parser.add_argument("--version", action="version", version=f"jaxformer {jaxformer.__version__}")
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
    return int(_module(args._module).run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
