"""torch_ref: the PyTorch mirror of jaxformer. Same file, class and attribute names, so the
attribute path is the checkpoint key. Shape legend: see jaxformer/__init__.py."""
