"""Training for jaxformer (JAX: jit, pmap, mesh) and the torch_ref twin trainer, from one YAML config."""
