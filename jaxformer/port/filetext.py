"""The text of a port's file around its classes: the header (what was traced, which dims stay
free, what train mode does, the parameters left without axes, the notes), the imports, the
variable classes and helpers it declares, and the formatting. `emit.Port` writes the classes and
inherits this (`FileText`)."""
from __future__ import annotations

import re

from jaxformer.port import axes, layers
from jaxformer.port.body import Body
from jaxformer.port.helpers import HELPERS
from jaxformer.port.trace import PortError

BUFFER_CLASS = '''class Buffer(nnx.Variable):
    """A torch buffer in the state_dict: state that is saved and loaded but never trained."""'''
LOGICAL_HELPER = '''def logical(*names):
    """A parameter's logical axes, one name (or None) per dim, as flax partitioning metadata:
    jaxformer's trainer shards by them (embed, heads, mlp, vocab, norm; jaxformer/port/axes.py)."""
    return {"out_sharding": names, "eager_sharding": False}'''
MODEL_OUTPUT = '''@jax.tree_util.register_pytree_with_keys_class
class ModelOutput(dict):
    """transformers' ModelOutput as the port returns it: the outputs torch's forward gave, in its
    order, read by name (out["logits"]), as attributes (out.logits) or by position (out[0]), and a
    JAX pytree (each subclass registered too), so jit and grad pass it through."""

    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def __getitem__(self, key):
        return tuple(self.values())[key] if isinstance(key, (int, slice)) else super().__getitem__(key)

    def to_tuple(self):
        return tuple(self.values())

    def tree_flatten_with_keys(self):
        return [(jax.tree_util.DictKey(k), v) for k, v in self.items()], tuple(self)

    @classmethod
    def tree_unflatten(cls, keys, values):
        return cls(zip(keys, values))'''
FROZEN_CLASS = '''class Frozen(nnx.Variable):
    """A torch parameter with requires_grad=False: loaded and saved as a parameter, never trained
    (not an nnx.Param, so no optimiser or gradient sees it)."""'''
CONSTANT_CLASS = '''class Constant(nnx.Variable):
    """A torch tensor outside the state_dict (a non-persistent buffer): never saved or trained."""'''


class FileText:
    """`emit.Port`'s file-level writing (it reads the Port's traced program, twins, imports,
    classes and the sets its writing fills)."""

    def _file(self) -> str:
        imports = "import jax\nimport jax.numpy as jnp\nfrom flax import nnx"
        body = [text for _, text in self.classes]
        if any(re.search(r"\bnp\.", text) for text in body + [HELPERS[h] for h in self.helpers]):
            imports = "import jax\nimport jax.numpy as jnp\nimport numpy as np\nfrom flax import nnx"
        by_module: dict[str, list[str]] = {}
        for local, where in self.imports.items():
            if where is not None:
                by_module.setdefault(where[0], []).append(where[1] if where[1] == local else f"{where[1]} as {local}")
        imports += "".join(f"\nfrom {m} import {', '.join(sorted(names))}" for m, names in sorted(by_module.items()))
        parts = [self._header(), imports]
        parts += [text for kind, text in (("Buffer", BUFFER_CLASS), ("Frozen", FROZEN_CLASS), ("Constant", CONSTANT_CLASS))
                  if kind in self.variables]
        parts += [LOGICAL_HELPER] if self.uses_logical else []
        parts += [HELPERS[h] for h in sorted(self.helpers)]
        parts += [layers.CLASSES[c] for c in sorted(self.layer_classes)]
        if self.output_classes:
            parts.append(MODEL_OUTPUT)
            parts += [f"@jax.tree_util.register_pytree_with_keys_class\nclass {name}(ModelOutput):\n"
                      f'    """{cls.__module__}.{cls.__qualname__}: the outputs torch gave, by name."""'
                      for cls, name in self.output_classes.items()]
        parts += [text.replace("__CLASS__", name) for name, text in self.classes]
        return "\n\n\n".join(parts) + "\n"

    def _header(self) -> str:
        import flax
        import jax
        import torch
        shapes = ", ".join(f"{k} {_describe(v)}" for k, v in self.traced.values.items())
        free = "; ".join(self.traced.symbols.values()) or "none (static shapes)"
        module = f"{type(self.model).__module__}.{type(self.model).__qualname__}"
        lines = [f'"""Flax NNX port of {module}, written by `jaxformer port` (torch {torch.__version__}, '
                 f"jax {jax.__version__}, flax {flax.__version__}).", "",
                 f"Traced at: {shapes}.", f"Free dimensions: {free}; every other size is fixed{self._relations()}.",
                 "Attribute paths are the torch state_dict keys: jaxformer.convert loads the parameters strictly",
                 "(jaxformer.port.load_torch_weights also fills the buffers)."]
        if self.twins:
            by_class: dict[str, list[str]] = {}
            for p, twin in self.twins.items():
                by_class.setdefault(f"{twin.cls.__module__}.{twin.cls.__name__}", []).append(f"`{p}`")
            names = "; ".join(f"{_listed(paths)} as {cls}" for cls, paths in by_class.items())
            renamed = " (torch.nn's under jaxformer.interop's names)" if any(t.interop for t in self.twins.values()) else ""
            lines += [f"Layers: jaxformer's (--layers jaxformer), so the file imports jaxformer: {names}.",
                      f"Their weights load through jaxformer.port.load_torch_weights{renamed}."]
        lines += [line for line in [self._train_line()] if line]
        params = [w.fqn for w in self.weights.values() if w.kind == "param"]
        if params and not self.twins:
            lines.append(axes.describe(self.annotated, params, self.width))
        lines += [f"Note: {n}." for n in self.traced.notes]
        return "\n".join(lines) + '\n"""'

    def _relations(self) -> str:
        """The shape guards torch.export recorded between free dims beyond equalities and
        ranges (a product or a remainder: `v.shape[3] * v.shape[1] == 8`), as the header says them."""
        guards = getattr(self.program, "_guards_code", None) or []
        said = [re.sub(r"L\['(\w+)'\]\.size\(\)\[(\d+)\]", r"\1.shape[\2]", g) for g in guards
                if re.search(r"[*%]|//", g) and "L[" in g]
        if not said:
            return ""
        return "; and they must keep " + _listed(sorted(said, key=len), shown=2)  # the plainest first

    def _train_line(self) -> str:
        """What train mode does, said only where it differs from eval mode: the dropouts the
        file writes (rate above 0), or that torch's train-mode graph was not ported; and the
        BatchNorm layers, whose class computes train mode itself."""
        line = self._dropout_line()
        if self.batch_stats:
            stats = _listed([f"`{p}`" for p in sorted(self.batch_stats)])
            line += ("\n" if line else "") + (f"Train mode of BatchNorm (model.train()): batch statistics, the running "
                                              f"ones updated as torch does, in {stats}.")
        return line

    def _dropout_line(self) -> str:
        if self.traced.train_program is None:
            return "Train mode: not ported (its graph does not export); the file computes eval mode."
        if self.train_nodes is None:
            return ("Train mode: not ported (torch's train-mode graph runs other ops than eval mode); "
                    "the file computes eval mode.")
        if not self.drops:
            return ""
        return f"Train mode: dropout as nnx.Dropout (model.train() / model.eval()) in {_listed(sorted(self.drops))}."


def _listed(items: list[str], shown: int = 3) -> str:
    """'a, b, c' or 'a, b, c and 4 more'."""
    head = ", ".join(items[:shown])
    return head if len(items) <= shown else f"{head} and {len(items) - shown} more"


def _render_tree(spec, leaves, output_class=lambda t: None) -> str:
    """Python source for forward's output structure (torch.utils._pytree TreeSpec); a mapping
    type that `output_class` names (transformers' ModelOutput) as that class of the file."""
    if spec.is_leaf():
        return next(leaves)
    kids = [_render_tree(c, leaves, output_class) for c in spec.children()]
    if spec.type is type(None):
        return "None"
    if spec.type in (tuple, list) or (isinstance(spec.type, type) and issubclass(spec.type, tuple)):
        return f"({kids[0]},)" if len(kids) == 1 and spec.type is not list else \
            ("[" + ", ".join(kids) + "]" if spec.type is list else ", ".join(kids))
    keys = spec.context if isinstance(spec.context, (list, tuple)) else None
    if keys is None or len(keys) != len(kids):
        raise PortError(f"cannot port an output of type {spec.type.__name__}")
    mapping = "{" + ", ".join(f"{k!r}: {v}" for k, v in zip(keys, kids, strict=True)) + "}"
    name = output_class(spec.type)
    return f"{name}({mapping})" if name else mapping


def _model_output(cls) -> bool:
    """A transformers ModelOutput class (an ordered dict of named outputs, read as attributes)."""
    return isinstance(cls, type) and any(c.__name__ == "ModelOutput" and c.__module__.startswith("transformers.")
                                         for c in cls.__mro__)


def _describe(v) -> str:
    if v is None or isinstance(v, (bool, int, float)):
        return repr(v)
    return f"{str(v.dtype).replace('torch.', '')}{list(v.shape)}"


def _class_text(init: list[str], body: Body | None, root: bool, base: str = "nnx.Module") -> str:
    takes_rngs = root or any("rngs" in line for line in init)
    lines = [f"class __CLASS__({base}):"]
    if init or root:
        sig = "self, *, rngs: nnx.Rngs" if takes_rngs else "self"
        lines.append(f"    def __init__({sig}):")
        lines += [f"        {ln}" for ln in init] or ["        del rngs  # no weights"]
    if body is not None:
        if init or root:
            lines.append("")
        lines.append(f"    def __call__(self{''.join(', ' + p for p in body.params)}):")
        lines += [f"        {ln}" for ln in body.lines]
    if len(lines) == 1:
        lines.append("    pass")
    return "\n".join(lines)


def _format(text: str) -> str:
    try:
        import black
    except ImportError:  # pragma: no cover - black is a dependency
        raise PortError("the port formats its file with black: pip install black") from None
    try:
        return black.format_str(text, mode=black.Mode(line_length=100))
    except Exception as e:  # black.InvalidInput: the writer produced invalid Python, a bug
        raise RuntimeError(f"jaxformer port wrote invalid Python ({e}):\n{text}") from None
