"""jaxformer: Transformer components and models in Flax NNX, mirrored in PyTorch (torch_ref).

Shape legend, used in einsum strings, names (`x_btd`) and `# [B, T, D]` comments in both trees:
    B batch, T target/query length, S source/key length, D model width, H query heads,
    G key/value heads, K head dim, F ffn width, V vocab, C channels, P patches, W window.

Importing this package does not import jax; submodules do.
"""
__version__ = "0.1.0"
