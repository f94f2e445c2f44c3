"""Shared PyTorch layers. Each file has a twin with the same names in jaxformer/layers/."""
