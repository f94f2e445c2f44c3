"""Shared Flax NNX layers. Each file has a twin with the same names in torch_ref/layers/."""
