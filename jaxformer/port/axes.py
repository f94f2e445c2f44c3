"""Logical axes for a port's parameters (issue 48): the partitioning metadata the trainer's
logical-axis rules shard by (jaxformer/layers/kernels/partitioning.py, train/config.py's
LOGICAL_AXIS_RULES), inferred from the torch module and its exported graph.

The model width D is the size the norms and embeddings share (the most common; else the most
common Linear size). Then, in torch's layout, as jaxformer's own models are annotated:

    nn.Embedding [V, D]               (vocab, embed)
    a norm's weight and bias [D]      (norm,)
    a Linear reading D [F, D]         (mlp, embed), or (heads, embed) where its output is split
                                      into heads (viewed into more dims) or meets another
                                      projection in a matmul; its bias (None,)
    a Linear writing D [D, F]         (embed, mlp), or (embed, heads) where its input is merged
                                      from heads (viewed from more dims)
    a Linear D -> D                   as above where the graph says which; else replicated
    a conv [O, I, k...]               (embed, None, ...) where O is D; its bias (None,)
    any other parameter               embed on a last dim of size D, None elsewhere

Anything else (a Linear between two other widths, a parameter with no dim of size D) gets no
axes: the trainer replicates it, and the file's header lists it."""
from __future__ import annotations

import collections

from jaxformer.port.graph import op_name

NORMS = ("LayerNorm", "RMSNorm", "GroupNorm", "BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "InstanceNorm1d",
         "InstanceNorm2d", "LocalResponseNorm")
SHAPE_OPS = {"aten.view", "aten.reshape", "aten._unsafe_view", "aten.unflatten", "aten.flatten", "aten.permute",
             "aten.transpose", "aten.contiguous", "aten.clone", "aten.split", "aten.split_with_sizes",
             "aten.chunk", "aten.unbind", "operator.getitem", "aten.expand", "aten.unsqueeze", "aten.squeeze",
             "aten.alias", "aten.slice", "aten.select"}
PRODUCTS = {"aten.matmul", "aten.bmm", "aten.einsum", "aten.scaled_dot_product_attention", "aten.mm", "aten.baddbmm"}


def width(model) -> int | None:
    """The model width D: the size its norms and embeddings share most, else its Linears'."""
    import torch
    sizes = collections.Counter()
    for m in model.modules():
        if type(m).__name__ in NORMS and getattr(m, "weight", None) is not None and m.weight.dim() == 1:
            sizes[m.weight.shape[0]] += 1
        elif isinstance(m, torch.nn.Embedding):
            sizes[m.embedding_dim] += 1
    if not sizes:
        for m in model.modules():
            if isinstance(m, torch.nn.Linear):
                sizes[m.in_features] += 1
                sizes[m.out_features] += 1
    return sizes.most_common(1)[0][0] if sizes else None


def infer(model, program, weights: dict) -> tuple[dict[str, tuple], int | None]:
    """({torch parameter name: logical axes in torch's layout}, D) for every parameter the graph
    reads that gets axes; the others are absent (replicated)."""
    d = width(model)
    if d is None:
        return {}, None
    nodes = {n.name: n for n in program.graph.nodes}
    out: dict[str, tuple] = {}
    for name, w in weights.items():
        if w.kind != "param":
            continue
        owner_path, _, leaf = w.fqn.rpartition(".")
        owner = model.get_submodule(owner_path)
        axes = _axes(owner, leaf, tuple(w.value.shape), d, nodes.get(name))
        if axes is not None:
            out[w.fqn] = axes
    return out, d


def _axes(owner, leaf: str, shape: tuple, d: int, node) -> tuple | None:
    import torch
    kind = type(owner).__name__
    if isinstance(owner, torch.nn.Embedding) and leaf == "weight":
        return ("vocab", "embed") if shape[1] == d else ("vocab", None)
    if kind in NORMS and len(shape) == 1:
        return ("norm",)
    if isinstance(owner, torch.nn.modules.conv._ConvNd) and leaf in ("weight", "bias"):
        if leaf == "bias":
            return (None,)
        return ("embed",) + (None,) * (len(shape) - 1) if shape[0] == d and not owner.transposed else None
    linear = _linear_of(node)
    if len(shape) == 2 and linear is not None and node is linear.args[1]:
        return _linear_axes(shape, d, linear)
    if len(shape) == 1 and linear is not None and len(linear.args) > 2 and node is linear.args[2]:
        return (None,)
    if shape and shape[-1] == d:
        return (None,) * (len(shape) - 1) + ("embed",)
    return None


def _linear_of(node):
    """The aten.linear that reads `node` (a weight placeholder) as its weight or bias, or None."""
    if node is None:
        return None
    for user in node.users:
        if op_name(user) == "aten.linear":
            return user
    return None


def _linear_axes(shape: tuple, d: int, linear) -> tuple | None:
    """A Linear's weight [out, in]."""
    out_f, in_f = shape
    split, merged = _splits_heads(linear), _merges_heads(linear.args[0])
    if in_f == d and out_f != d:
        return ("heads" if split else "mlp", "embed")
    if out_f == d and in_f != d:
        return ("embed", "heads" if merged else "mlp")
    if in_f == d == out_f:
        if split and not merged:
            return ("heads", "embed")
        if merged and not split:
            return ("embed", "heads")
    return None


SCALINGS = {"aten.mul", "aten.div"}  # by a number (OPT scales q before splitting the heads)


def _splits_heads(node, depth: int = 6) -> bool:
    """`node`'s value is viewed into more dims (heads split off), or meets another value in a
    product (scores), through shape ops and scalings by a number only."""
    todo, seen = [(node, 0)], set()
    ndim = _ndim(node)
    while todo:
        n, k = todo.pop()
        for user in n.users:
            name = op_name(user)
            if name in PRODUCTS:
                return True
            if name in ("aten.view", "aten.reshape", "aten._unsafe_view", "aten.unflatten") \
                    and ndim is not None and (_ndim(user) or 0) > ndim:
                return True
            scaled = name in SCALINGS and len(user.args) > 1 and isinstance(user.args[1], (int, float))
            if (name in SHAPE_OPS or scaled) and k < depth and user not in seen:
                seen.add(user)
                todo.append((user, k + 1))
    return False


def _merges_heads(node, depth: int = 6) -> bool:
    """`node` (a Linear's input) was viewed from more dims (heads merged), through shape ops."""
    ndim = _ndim(node)
    n = node
    for _ in range(depth):
        if not hasattr(n, "target") or op_name(n) not in SHAPE_OPS:
            return False
        src = n.args[0] if n.args else None
        if op_name(n) in ("aten.view", "aten.reshape", "aten._unsafe_view", "aten.flatten") and ndim is not None \
                and (_ndim(src) or 0) > ndim:
            return True
        n = src
    return False


def _ndim(node) -> int | None:
    val = getattr(node, "meta", {}).get("val") if node is not None else None
    return len(val.shape) if hasattr(val, "shape") else None


def flax_axes(module, leaf: str, axes: tuple) -> tuple:
    """A torch-layout axes tuple in the flax layer's layout (a Linear's kernel is [in, out], a
    conv's [k..., I, O])."""
    import torch
    if leaf != "weight" or len(axes) < 2:
        return axes
    if isinstance(module, torch.nn.Linear):
        return axes[::-1]
    if isinstance(module, torch.nn.modules.conv._ConvNd):
        return axes[2:] + (axes[1], axes[0])
    return axes


def describe(annotated: set[str], params: list[str], d: int | None, shown: int = 4) -> str:
    """The header's sharding line: how many of `params` the file annotates, and which not."""
    bare = [p for p in params if p not in annotated]
    head = (f"Sharding: logical axes (partitioning metadata) on {len(params) - len(bare)} of {len(params)} "
            f"parameters, inferred from the graph (model width {d})")
    if not bare:
        return head + "; override any by path pattern in the YAML's model.axes."
    listed = ", ".join(f"`{p}`" for p in bare[:shown]) + (f" and {len(bare) - shown} more" if len(bare) > shown else "")
    return head + f"; replicated (no axis inferred): {listed}; override any by path pattern in the YAML's model.axes."

