"""Helpers the tests share, imported by name (`from helpers import converted_pair`): tests/ and
parity_tests/ each have a conftest.py, so `from conftest import ...` would find whichever was
imported last."""
from __future__ import annotations

import functools


def converted_pair(name: str, cfg, seed: int = 0):
    """torch_ref model `name` and its jaxformer twin holding the same (converted) weights, both
    in eval mode. Token embeddings are rescaled to N(0, 1/D) first (realistic_embeddings in
    jaxformer/parity/cases_models.py; docs/numerics.md §17: with the constructor's N(0, 1) tied
    tables, logits reach |x| ~ 100, where float32's spacing alone exceeds the 1e-5 tolerances).
    The JAX model is built abstractly (jaxformer.parity.cases.twin) and torch's weights fill
    every parameter and buffer: drawing them eagerly first cost a compile per new parameter
    shape. Only the dropout RNG keys differ from an eager build, and eval mode never draws them."""
    from jaxformer import convert
    from jaxformer.models import build_model as jbuild
    from jaxformer.parity.cases import twin
    from jaxformer.parity.cases_models import realistic_embeddings
    from torch_ref.models import build_model as tbuild
    t = realistic_embeddings(tbuild(name, cfg, seed=seed).eval())
    j = twin(lambda: jbuild(name, cfg, seed=seed), seed)
    convert.load_torch_state_dict(j, t.state_dict())
    j.eval()
    return t, j


def randomize(module, seed: int = 0):
    """Every parameter of a torch module redrawn (biases and norms too: HF initialises them to
    0 / 1, and random values make every weight matter), in eval mode."""
    import torch
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * (0.5 if p.ndim == 1 else 0.2))
    return module.eval()


def hf_lm_logits(model, ids, mask):
    """An HF causal LM's fp32 logits for a (left-padded) batch, with positions counting real
    tokens, as HF generate (and jaxformer) do."""
    import torch
    mask_t = torch.from_numpy(mask)
    with torch.no_grad():
        return model(torch.from_numpy(ids), attention_mask=mask_t,
                     position_ids=(mask_t.cumsum(-1) - 1).clamp(min=0)).logits.numpy()


def realigned(model):
    """The HF model with every param copied into a fresh (aligned) buffer, values unchanged.
    Weights loaded from safetensors sit at the file's 8-byte-aligned offsets, and torch's CPU
    kernels choose their code path by pointer alignment: a loaded Qwen2-MoE gave logits 6e-8
    away from the same model built in memory, with bit-identical weights (single-threaded);
    after the copy they are equal. Exact comparisons of a reloaded export go through this."""
    import torch
    with torch.no_grad():
        for p in model.parameters():
            p.data = p.data.clone()
    return model


def check_hf_logits(tag: str, ref, ours, mask) -> float:
    """Max |logit diff| on real tokens (pad rows see no real token in HF's causal mask), within
    1e-5 x max(1, max |logit|) (docs/numerics.md §19); printed, so -s shows the figures."""
    import numpy as np
    real = mask.astype(bool)
    d = float(np.abs(ref[real] - ours[real]).max())
    scale = max(1.0, float(np.abs(ref).max()))
    print(f"[hf logits] {tag}: max |diff| {d:.2e}, max |logit| {scale:.2f}")
    assert d <= 1e-5 * scale, f"{tag}: max |logits diff| vs HF {d:.2e}"
    return d


def host_devices_env(n: int) -> dict:
    """cli_env() for a child process that sees n CPU devices, with the suite's other XLA flags
    (tests/conftest.py) and its JAX matmul precision kept."""
    import os
    import re
    flags = re.sub(r"--xla_force_host_platform_device_count=\d+", "", os.environ.get("XLA_FLAGS", ""))
    return cli_env(XLA_FLAGS=f"{flags} --xla_force_host_platform_device_count={n}".strip(), JAX_PLATFORMS="cpu")


def cli_env(**extra) -> dict:
    """os.environ for a `jaxformer` CLI subprocess, with this process's JAX matmul precision
    (tests/conftest.py sets 'highest' through jax.config, which a child does not inherit): the
    child traces the same programs as this process's runs, so it reads them from the suite's
    compilation cache instead of compiling others, and computes what they compute."""
    import os

    import jax
    precision = jax.config.jax_default_matmul_precision
    return {**os.environ, **({"JAX_DEFAULT_MATMUL_PRECISION": str(precision)} if precision else {}), **extra}


def step_losses(tr, steps: int | None = None, at_end=None) -> list[float]:
    """A one-device or mesh JaxTrainer's first `steps` (default train.steps) compiled train steps
    over its own batches (_train_iterator: run()'s order and placement), on its mesh as run()
    enters it, without run()'s eval, checkpoints and exports -> per-step losses (the ones run()
    logs). at_end(state, batch), if given, is called on the mesh after the last step (e.g. to
    lower the step). tr.state is the final state, and the trainer is closed."""
    import contextlib

    import jax
    batches, state, losses = tr._train_iterator(), tr.state, []
    try:
        with jax.set_mesh(tr.mesh) if tr.mesh is not None else contextlib.nullcontext():
            for _ in range(tr.cfg.train.steps if steps is None else steps):
                batch, _ = next(batches)
                state, out = tr.train_step(state, batch)
                losses.append(float(out["loss"]))
            if at_end is not None:
                at_end(state, batch)
    finally:
        batches.close()
        tr.close()
    tr.state = state
    return losses


def hf_encoder_outputs(model, ids, mask) -> list:
    """An HF encoder's fp32 outputs: [last_hidden_state (and pooler_output)] or [logits]."""
    import torch
    with torch.no_grad():
        out = model(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask))
    if hasattr(out, "logits"):
        return [out.logits.numpy()]
    pooled = getattr(out, "pooler_output", None)
    return [out.last_hidden_state.numpy()] + ([] if pooled is None else [pooled.numpy()])


def jit_call(model, *args):
    """model(*args) as one XLA compilation (op by op, a tiny encoder's forward takes seconds of
    CPU time on a loaded machine). One jit for every call: a model structure and input shapes
    seen before in the process reuse their compilation."""
    return _call()(model, *args)


@functools.cache
def _call():
    from flax import nnx
    return nnx.jit(lambda m, *a: m(*a))


def check_hf_encoder(tag: str, hf_model, path: str, ids, mask, auto, out_dir: str):
    """Import `path` (the HF encoder's save_pretrained directory) and compare with transformers
    on a padded batch: the hidden states on real tokens (a pad token's row is never used),
    the pooled vector and the logits of every row, within 1e-5 x max(1, max|out|) (fp32);
    then export, load the export with `auto` (no missing, unexpected or mismatched keys) and
    check the weights and outputs are identical to the original's. -> (max diff, model, cfg)."""
    import jax.numpy as jnp
    import numpy as np

    from jaxformer import hf
    model, name, cfg = hf.from_pretrained(path)
    ref = hf_encoder_outputs(hf_model, ids, mask)
    ours = jit_call(model, jnp.asarray(ids), jnp.asarray(mask))
    ours = [np.asarray(x) for x in (ours if isinstance(ours, tuple) else (ours,))]
    assert len(ours) == len(ref), (tag, len(ours), len(ref))
    real = mask.astype(bool)
    worst = 0.0
    for r, o in zip(ref, ours, strict=True):  # equal lengths asserted above
        r, o = (r[real], o[real]) if r.ndim == 3 else (r, o)
        d, scale = float(np.abs(r - o).max()), max(1.0, float(np.abs(r).max()))
        print(f"[hf encoder] {tag}: max |diff| {d:.2e}, max |out| {scale:.2f}")
        assert d <= 1e-5 * scale, f"{tag}: max |diff| vs HF {d:.2e}"
        worst = max(worst, d)
    hf.save_pretrained(model, name, cfg, out_dir)
    back, info = auto.from_pretrained(out_dir, output_loading_info=True)
    assert not any(info.get(k) for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    back = realigned(back.eval())
    sd, sd2 = hf_model.state_dict(), back.state_dict()
    assert set(sd) == set(sd2) and all(np.array_equal(sd[k].numpy(), sd2[k].numpy()) for k in sd)
    for a, b in zip(hf_encoder_outputs(realigned(hf_model), ids, mask), hf_encoder_outputs(back, ids, mask),
                    strict=True):
        np.testing.assert_array_equal(a, b)
    return worst, model, cfg


def shared_port(tmp_path_factory, key: str, example, layers: str = "flax") -> tuple[str, str]:
    """(source, class name) of `example()`'s port, made once per test run: under pytest-xdist a
    module-scoped fixture can be built on each worker (work stealing splits its tests), and the
    port (torch.export twice: tens of seconds for nn.Transformer) is the same on every worker, so
    the first writes it to the run's shared temporary folder and the others, waiting on a lock,
    read it."""
    import fcntl
    import json
    import os

    from jaxformer.port import port
    root = tmp_path_factory.getbasetemp()
    folder = (root.parent if os.environ.get("PYTEST_XDIST_WORKER") else root) / "shared_ports"
    folder.mkdir(exist_ok=True)
    done = folder / f"{key}-{layers}.json"
    with open(folder / f"{key}-{layers}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if not done.exists():
                module, inputs = example()
                result = port(module, inputs, layers=layers)
                done.write_text(json.dumps([result.source, result.class_name]))
            source, class_name = json.loads(done.read_text())
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return source, class_name


def user_docs() -> list[str]:
    """The user documentation's files: README.md, then docs/*.md in name order, without
    docs/numerics.md (the numerics reference, not a user page)."""
    import glob
    import os
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir)
    pages = sorted(p for p in glob.glob(os.path.join(root, "docs", "*.md")) if os.path.basename(p) != "numerics.md")
    return [os.path.join(root, "README.md"), *pages]


def user_docs_text() -> str:
    """The user documentation as one text (README.md first, then the docs pages)."""
    texts = []
    for path in user_docs():
        with open(path) as f:
            texts.append(f.read())
    return "\n".join(texts)
