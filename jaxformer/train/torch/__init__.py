"""The torch twin of the JAX trainer: the same YAML trained by torch_ref's models
(`jaxformer train --framework torch`): trainer.py (the loop, checkpoints, resume), tasks.py (the
losses, twins of jaxformer/train/tasks.py), init.py (the initialisers, twins of
jaxformer/train/init.py). Only the CLI, the trajectory check and tests load it, lazily: the rest
of jaxformer never imports torch_ref."""
