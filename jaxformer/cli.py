"""`jaxformer` command line: one module per subcommand under jaxformer/commands/ (or train/),
each with add_arguments(parser) and run(args) -> exit code."""
from __future__ import annotations

import argparse
import importlib
import sys

COMMANDS = {
    "parity": ("jaxformer.commands.parity", "run the parity registry: outputs and gradients, torch vs JAX"),
    "convert": ("jaxformer.commands.convert", "convert weights between torch and flax (safetensors)"),
    "generate": ("jaxformer.commands.generate", "generate token ids with an lm/seq2seq model (KV cache)"),
    "train": ("train.cli", "train a config in JAX (jit/pmap) or torch, with checkpoints and metrics"),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="jaxformer", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(_module=module)
        importlib.import_module(module).add_arguments(p)
    args = parser.parse_args(argv)
    return int(importlib.import_module(args._module).run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
