"""Train a config, as `jaxformer train` does: the entry script nanoGPT and MaxText users expect.

    python train/train.py --config configs/lm.yaml [--set train.lr=3e-4] [--workdir DIR] [--resume]

Every option of `jaxformer train --help` works here.
"""
import sys

from jaxformer.cli import main

if __name__ == "__main__":
    sys.exit(main(["train", *sys.argv[1:]]))
