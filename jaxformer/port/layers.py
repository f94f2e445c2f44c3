"""torch.nn modules that the port writes as flax layers, and how each is built and called.

The flax layer's leaves are the ones jaxformer.convert's rule table expects for the torch
module's keys (`kernel` <-> `weight` transposed, `scale` <-> `weight`, `embedding` <->
`weight`), so the torch state_dict loads with no renaming. Each entry checks that the torch
module is one the flax layer computes exactly (explicit eps, padding and use_fast_variance
False: flax's E[x^2] - E[x]^2 variance is not torch's, docs/numerics.md §42)."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any


def _linear(m) -> str:
    return f"nnx.Linear({m.in_features}, {m.out_features}, use_bias={m.bias is not None}, rngs=rngs)"


def _embedding(m) -> str:
    return f"nnx.Embed({m.num_embeddings}, {m.embedding_dim}, rngs=rngs)"


def _layer_norm(m) -> str | None:
    if len(m.normalized_shape) != 1:
        return None
    affine = m.weight is not None
    bias = getattr(m, "bias", None) is not None
    return (f"nnx.LayerNorm({m.normalized_shape[0]}, epsilon={m.eps!r}, use_scale={affine}, "
            f"use_bias={bias}, use_fast_variance=False, rngs=rngs)")


def _rms_norm(m) -> str | None:
    if len(m.normalized_shape) != 1 or m.eps is None:
        return None  # torch's eps=None (finfo eps of the input dtype) is written op by op
    return (f"nnx.RMSNorm({m.normalized_shape[0]}, epsilon={m.eps!r}, use_scale={m.weight is not None}, "
            "use_fast_variance=False, rngs=rngs)")


def _dropout(m) -> str:
    return f"nnx.Dropout({m.p!r}, rngs=rngs)"


def _conv(m) -> str | None:
    if m.padding_mode != "zeros" or isinstance(m.padding, str) and m.padding != "valid":
        return None
    pads = [(0, 0)] * len(m.kernel_size) if isinstance(m.padding, str) else [(p, p) for p in m.padding]
    return (f"nnx.Conv({m.in_channels}, {m.out_channels}, kernel_size={tuple(m.kernel_size)}, "
            f"strides={tuple(m.stride)}, padding={pads}, kernel_dilation={tuple(m.dilation)}, "
            f"feature_group_count={m.groups}, use_bias={m.bias is not None}, rngs=rngs)")


def _batch_norm(m) -> str | None:
    if m.momentum is not None and not isinstance(m.momentum, float):
        return None
    return (f"BatchNorm({m.num_features}, eps={m.eps!r}, momentum={m.momentum!r}, affine={m.affine}, "
            f"track_running_stats={m.track_running_stats}, rngs=rngs)")


def _channels_last_call(attr: str, x: str, ndim: int) -> str:
    """A torch conv on [B, C, *spatial] through flax's channels-last conv."""
    last = ndim - 1
    to_last = (0,) + tuple(range(2, ndim)) + (1,)
    to_first = (0, last) + tuple(range(1, last))
    return f"{attr}({x}.transpose{to_last}).transpose{to_first}"


# torch class name -> (constructor expression or None when unsupported, call writer,
# {torch leaf: (flax leaf, expression that turns the flax value into torch's layout)})
KNOWN: dict[str, tuple[Callable[[Any], str | None], Callable[[str, str, Any], str], dict[str, tuple[str, str]]]] = {
    "Linear": (_linear, lambda a, x, m: f"{a}({x})", {"weight": ("kernel", "{}.T"), "bias": ("bias", "{}")}),
    "NonDynamicallyQuantizableLinear": (_linear, lambda a, x, m: f"{a}({x})",
                                        {"weight": ("kernel", "{}.T"), "bias": ("bias", "{}")}),
    "Embedding": (_embedding, lambda a, x, m: f"{a}({x})", {"weight": ("embedding", "{}")}),
    "LayerNorm": (_layer_norm, lambda a, x, m: f"{a}({x})", {"weight": ("scale", "{}"), "bias": ("bias", "{}")}),
    "RMSNorm": (_rms_norm, lambda a, x, m: f"{a}({x})", {"weight": ("scale", "{}")}),
    "Dropout": (_dropout, lambda a, x, m: f"{a}({x})", {}),
    "Conv1d": (_conv, lambda a, x, m: _channels_last_call(a, x, 3),
               {"weight": ("kernel", "{}.transpose(2, 1, 0)"), "bias": ("bias", "{}")}),
    "Conv2d": (_conv, lambda a, x, m: _channels_last_call(a, x, 4),
               {"weight": ("kernel", "{}.transpose(3, 2, 0, 1)"), "bias": ("bias", "{}")}),
}
for _name in ("BatchNorm1d", "BatchNorm2d", "BatchNorm3d"):
    KNOWN[_name] = (_batch_norm, lambda a, x, m: f"{a}({x})",
                    {k: (k, "{}") for k in ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")})
# each layer's op in the graph: the first as torch.export writes it, the others as a functional
# graph (trace.functional) has it (an eval dropout is a clone, an eval batch norm its no-training form)
CORE_OPS = {"BatchNorm1d": ("aten.batch_norm", "aten._native_batch_norm_legit_no_training"),
            "BatchNorm2d": ("aten.batch_norm", "aten._native_batch_norm_legit_no_training"),
            "BatchNorm3d": ("aten.batch_norm", "aten._native_batch_norm_legit_no_training"),
            "Linear": ("aten.linear",), "NonDynamicallyQuantizableLinear": ("aten.linear",),
            "Embedding": ("aten.embedding",), "LayerNorm": ("aten.layer_norm",), "RMSNorm": ("aten.rms_norm",),
            "Dropout": ("aten.dropout", "aten.clone"), "Conv1d": ("aten.conv1d",), "Conv2d": ("aten.conv2d",)}


# the flax layer's constructor argument that carries each torch leaf's partitioning metadata
METADATA = {"Linear": {"weight": "kernel_metadata", "bias": "bias_metadata"},
            "NonDynamicallyQuantizableLinear": {"weight": "kernel_metadata", "bias": "bias_metadata"},
            "Embedding": {"weight": "embedding_metadata"},
            "LayerNorm": {"weight": "scale_metadata", "bias": "bias_metadata"},
            "RMSNorm": {"weight": "scale_metadata"},
            "Conv1d": {"weight": "kernel_metadata", "bias": "bias_metadata"},
            "Conv2d": {"weight": "kernel_metadata", "bias": "bias_metadata"}}


def known(module) -> bool:
    """A torch.nn module the port writes as a flax layer."""
    name = type(module).__name__
    return (type(module).__module__.startswith("torch.nn.") and name in KNOWN
            and KNOWN[name][0](module) is not None)


def constructor(module) -> str:
    return KNOWN[type(module).__name__][0](module)


def call(module, attr: str, x: str) -> str:
    return KNOWN[type(module).__name__][1](attr, x, module)


def leaf(module, torch_leaf: str) -> tuple[str, str] | None:
    """(flax leaf, layout expression) of a known module's torch leaf."""
    return KNOWN[type(module).__name__][2].get(torch_leaf)


def parameterless_builtin(module) -> bool:
    """A torch.nn module with no weights of its own and no state (activations, Identity,
    Flatten, ...): its ops are written inline where it is called."""
    import torch
    if not type(module).__module__.startswith("torch.nn."):
        return False
    if isinstance(module, (torch.nn.Dropout, torch.nn.ModuleList, torch.nn.ModuleDict, torch.nn.Sequential)):
        return False
    return not any(True for _ in module.parameters()) and not any(True for _ in module.buffers())


def container(module) -> bool:
    """A ModuleList / ModuleDict / Sequential that holds modules only (an nnx.List or nnx.Dict); one
    with tensors of its own (torch's ParametrizationList holds `original0`, `original1`) is a
    module like any other."""
    import torch
    return (isinstance(module, (torch.nn.ModuleList, torch.nn.ModuleDict, torch.nn.Sequential))
            and not module._parameters and not module._buffers)


# Classes a written file defines when it holds such a layer (flax has none with torch's numerics)
CLASSES = {
    "BatchNorm": '''class BatchNorm(nnx.Module):
    """torch.nn.BatchNorm1d / 2d / 3d on [B, C, *spatial] (the channel axis 1, as torch's).

    Eval mode (model.eval()) normalises with the running statistics. Train mode (model.train())
    normalises with the batch's (biased variance) and updates the running ones as torch does:
    (1 - momentum) * running + momentum * batch, with the batch variance unbiased (n / (n - 1));
    momentum None is the cumulative average (1 / num_batches_tracked). Without running
    statistics (track_running_stats=False) both modes use the batch's. flax's nnx.BatchNorm
    differs: it keeps the biased variance and its momentum weighs the old value."""

    def __init__(self, num_features, *, eps, momentum, affine, track_running_stats, rngs):
        self.eps, self.momentum = eps, momentum
        self.use_running_average = False  # torch modules start in train mode
        if affine:
            self.weight = nnx.Param(jnp.ones((num_features,)))
            self.bias = nnx.Param(jnp.zeros((num_features,)))
        else:
            self.weight = self.bias = None
        if track_running_stats:
            self.running_mean = nnx.BatchStat(jnp.zeros((num_features,)))
            self.running_var = nnx.BatchStat(jnp.ones((num_features,)))
            self.num_batches_tracked = nnx.BatchStat(jnp.zeros((), jnp.int32))
        else:
            self.running_mean = self.running_var = self.num_batches_tracked = None

    def __call__(self, x):
        axes = (0,) + tuple(range(2, x.ndim))
        channel = (1, -1) + (1,) * (x.ndim - 2)  # [C] -> broadcast over [B, C, *spatial]
        if self.use_running_average and self.running_mean is not None:
            mean, var = self.running_mean[...], self.running_var[...]
        else:
            mean = x.mean(axis=axes)
            var = jnp.square(x - mean.reshape(channel)).mean(axis=axes)
            if self.running_mean is not None:
                n = x.size // x.shape[1]
                count = self.num_batches_tracked[...] + 1
                self.num_batches_tracked[...] = count
                m = 1.0 / count if self.momentum is None else self.momentum
                batch_mean, batch_var = jax.lax.stop_gradient(mean), jax.lax.stop_gradient(var) * n / (n - 1)
                self.running_mean[...] = (1 - m) * self.running_mean[...] + m * batch_mean
                self.running_var[...] = (1 - m) * self.running_var[...] + m * batch_var
        y = (x - mean.reshape(channel)) * jax.lax.rsqrt(var.reshape(channel) + self.eps)
        if self.weight is not None:
            y = y * self.weight[...].reshape(channel) + self.bias[...].reshape(channel)
        return y''',
}


def file_class(module) -> str | None:
    """The name of the class in CLASSES that a known module's constructor uses, if any."""
    text = constructor(module)
    name = text.split("(", 1)[0]
    return name if name in CLASSES else None


def modes_itself(module) -> bool:
    """A known module whose written class computes train and eval mode itself (BatchNorm's
    batch statistics): its train-mode ops are not lined up with the eval graph's."""
    return known(module) and file_class(module) is not None
