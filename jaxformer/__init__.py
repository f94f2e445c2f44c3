"""jaxformer: Transformer components and models in Flax NNX, mirrored in PyTorch (torch_ref).

Shape legend, used in einsum strings, names (`x_btd`) and `# [B, T, D]` comments in both trees:
    B batch, T target/query length, S source/key length, D model width, H query heads,
    G key/value heads, K head dim, F ffn width, V vocab, C channels, P patches, W window.

Importing this package does not import jax; submodules do, and so does calling `load`.
"""
__version__ = "0.1.0"


def load(path: str, *, step: str | int | None = None):
    """Trained weights as a model: -> (model, cfg), the Flax NNX model built in eval mode and
    its config (model.cfg too); `jaxformer.checkpoint_io.model_name(model)` gives its registry
    name ("lm", "seq2seq", ...).

    path: a training run dir (RUN/config.yaml; step "last" (default) or "best" reads
    RUN/model/last|best, a step number N the params of RUN/checkpoints/N, JAX or torch), a
    model checkpoint dir (model.yaml + params/), or a Hugging Face dir (config.json; read with
    jaxformer.hf.from_pretrained). `step` applies to run dirs only. Errors name the path and
    what is missing. The Hugging Face dispatch lives here, above checkpoint_io, because
    jaxformer.hf is the higher layer."""
    from jaxformer import checkpoint_io
    if checkpoint_io.path_kind(path) != "hf":
        return checkpoint_io.load(path, step=step)
    if step is not None:
        raise ValueError(f"{path} is a Hugging Face dir (one set of weights); step applies to "
                         "training run dirs only")
    from jaxformer.hf import from_pretrained
    model, _, cfg = from_pretrained(path)
    return model, cfg
