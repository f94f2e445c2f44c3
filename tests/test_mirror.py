"""The two trees line up class by class: every module under jaxformer/layers/ and
jaxformer/models/ that has a torch twin (torch_ref/, same relative path) defines the same public
classes, and each class the same public methods (torch's `forward` is NNX's `__call__`). Read
from the source (ast), so it costs no import. A difference a framework forces is listed below
with its reason; anything else is a twin that drifted."""
from __future__ import annotations

import ast
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# jax files with no torch twin, and why
NO_TWIN = {
    "layers/linear.py": "nnx.Linear with logical axes and reduced-precision kernels; torch uses nn.Linear",
    "layers/kernels/moe_parallel.py": "expert parallelism over a mesh; torch_ref runs on one device",
    "layers/kernels/partitioning.py": "Flax partitioning metadata; torch has none",
    "layers/kernels/chunked_loss.py": "the JAX trainer's loss in sequence chunks; the torch trainer's unchunked "
                                      "loss is the reference",
    "layers/special.py": "tanh to torch's float32 accuracy; torch_ref uses torch's own kernel (numerics §44)",
    "layers/kernels/pipeline.py": "pipeline stages over a mesh; torch_ref runs on one device (the one-device "
                                  "run is the pipeline's reference, tests/test_pipeline.py)",
    "layers/kernels/quant_train.py": "int8 / fp8 training products (qwix); the torch trainer is the float "
                                     "reference and refuses train.quantization",
}
# (file, class) present in one tree only, and why
ONE_SIDED = {
    ("layers/lora.py", "LoRAParam"): "jax: the adapters' nnx.Param subclass (torch marks them with requires_grad)",
    ("layers/moe.py", "Buffer"): "jax: an nnx.Variable no optimiser trains (torch: register_buffer)",
    ("layers/kernels/quant.py", "QuantizedLinear"): "torch: nn.Linear.forward cannot take a QuantizedWeight "
                                                    "(the jax twin swaps its Linear's kernel value)",
    ("models/swin.py", "DropPath"): "torch: timm's DropPath (jax: nnx.Dropout with broadcast_dims)",
}
# (file, class, method) in one tree only, and why
ONE_SIDED_METHODS = {
    ("layers/kernels/quant.py", "QuantizedWeight", "device"): "torch: a tensor-like's device, for nn.Module.to",
    ("layers/lora.py", "LoRALinear", "reset_lora_parameters"): "torch: PEFT's name for the adapter init",
    ("layers/moe.py", "Experts", "compute"): "jax: the expert FFN on routed rows, shared by the dispatch paths",
    ("layers/moe.py", "Experts", "grouped_ffn"): "jax: the ragged_dot path (torch loops over experts)",
    ("layers/moe.py", "Experts", "stacked_axes"): "jax: the stacked weights' logical axes",
    ("models/lm.py", "LM", "output_head"): "jax: the head as a pure function for the chunked loss "
                                           "(layers/kernels/chunked_loss.py)",
    ("models/seq2seq.py", "Seq2Seq", "output_head"): "jax: the head as a pure function for the chunked loss",
}


def _jax_files() -> list[str]:
    out = []
    for sub in ("layers", "models"):
        for dirpath, _, names in os.walk(os.path.join(ROOT, "jaxformer", sub)):
            out += [os.path.relpath(os.path.join(dirpath, n), os.path.join(ROOT, "jaxformer"))
                    for n in names if n.endswith(".py") and n != "__init__.py"]
    return sorted(out)


def _classes(path: str) -> dict[str, set[str]]:
    """{public top-level class: its public methods}; forward counts as __call__."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    return {node.name: {"__call__" if m.name == "forward" else m.name for m in node.body
                        if isinstance(m, ast.FunctionDef) and (m.name == "__call__" or not m.name.startswith("_"))}
            for node in tree.body if isinstance(node, ast.ClassDef) and not node.name.startswith("_")}


@pytest.mark.parametrize("rel", _jax_files())
def test_twin_files_line_up_class_by_class(rel):
    twin = os.path.join(ROOT, "torch_ref", rel)
    if rel in NO_TWIN:
        assert not os.path.exists(twin), f"{rel} has a twin now: remove it from NO_TWIN"
        return
    assert os.path.exists(twin), f"jaxformer/{rel} has no torch_ref twin"
    j, t = _classes(os.path.join(ROOT, "jaxformer", rel)), _classes(twin)
    problems = [f"class {c} only in {side}" for side, a, b in (("jaxformer", j, t), ("torch_ref", t, j))
                for c in sorted(set(a) - set(b)) if (rel, c) not in ONE_SIDED]
    for c in sorted(set(j) & set(t)):
        problems += [f"{c}.{m} only in {side}" for side, a, b in (("jaxformer", j[c], t[c]), ("torch_ref", t[c], j[c]))
                     for m in sorted(a - b) if (rel, c, m) not in ONE_SIDED_METHODS]
    assert not problems, f"{rel}: " + "; ".join(problems)


def test_torch_ref_has_no_file_without_a_jax_twin():
    extra = []
    for sub in ("layers", "models"):
        for dirpath, _, names in os.walk(os.path.join(ROOT, "torch_ref", sub)):
            for n in names:
                rel = os.path.relpath(os.path.join(dirpath, n), os.path.join(ROOT, "torch_ref"))
                if n.endswith(".py") and not os.path.exists(os.path.join(ROOT, "jaxformer", rel)):
                    extra.append(rel)
    assert not extra, f"torch_ref files without a jaxformer twin: {extra}"


def test_the_listed_exceptions_still_exist():
    """An exception whose class or method is gone is stale: the list must not hide a future drift."""
    stale = []
    for rel, cls in ONE_SIDED:
        found = [p for p in (os.path.join(ROOT, "jaxformer", rel), os.path.join(ROOT, "torch_ref", rel))
                 if os.path.exists(p) and cls in _classes(p)]
        stale += [] if found else [f"{rel}:{cls}"]
    for rel, cls, meth in ONE_SIDED_METHODS:
        found = [p for p in (os.path.join(ROOT, "jaxformer", rel), os.path.join(ROOT, "torch_ref", rel))
                 if os.path.exists(p) and meth in _classes(p).get(cls, set())]
        stale += [] if found else [f"{rel}:{cls}.{meth}"]
    assert not stale, f"stale exceptions: {stale}"
