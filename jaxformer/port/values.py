"""How the port writes a tensor's value into the file: a parameter's initial value, a buffer
(written out when it is ones, a triangle, an arange or small; else zeros that
jaxformer.port.load_torch_weights fills), and a tensor torch's forward builds from Python values."""
from __future__ import annotations

from jaxformer.port.body import dtype_name
from jaxformer.port.trace import PortError

LITERAL_LIMIT = 64  # tensors up to this many elements are written as a list, larger ones as bytes
BYTES_LIMIT = 1 << 20  # the largest tensor built in forward that the file spells out


def shape_text(t) -> str:
    return repr(tuple(int(d) for d in t.shape))


def init_expr(p) -> str:
    """A parameter's initial value: ones or zeros when torch's is, else a normal draw at the
    torch tensor's own scale."""
    import torch
    dtype = "" if p.dtype == torch.float32 else f", {dtype_name(p.dtype)}"
    t = p.detach()
    if t.numel() and bool((t == 1).all()):
        return f"jnp.ones({shape_text(t)}{dtype})"
    if not t.numel() or bool((t == 0).all()):
        return f"jnp.zeros({shape_text(t)}{dtype})"
    if t.numel() > 1 and bool((t == t.flatten()[0]).all()):  # a constant (a gain of 1.5)
        return f"jnp.full({shape_text(t)}, {float(t.flatten()[0])!r}{dtype})"
    std = float(t.float().std()) if t.numel() > 1 else abs(float(t.float().flatten()[0]))
    return f"jax.random.normal(rngs.params(), {shape_text(t)}{dtype}) * {std:.2g}"


def buffer_expr(b, *, literal: bool) -> str:
    """A buffer's value: written out when it is ones, a triangle of ones, an arange or (with
    `literal`, for tensors outside the state_dict) small; else zeros of its shape, filled by
    jaxformer.port.load_torch_weights."""
    import torch
    t = b.detach()
    dtype = dtype_name(t.dtype)
    shape = shape_text(t)
    if t.numel() and bool((t == 1).all()):
        return f"jnp.ones({shape}, {dtype})"
    if t.dim() >= 2 and bool((t == torch.tril(torch.ones_like(t))).all()):
        return f"jnp.tril(jnp.ones({shape}, {dtype}))"
    if t.dim() == 1 and bool((t == torch.arange(t.numel(), dtype=t.dtype)).all()):
        return f"jnp.arange({t.numel()}, dtype={dtype})"
    if t.dim() > 1 and max(t.shape) == t.numel() and bool((t.flatten() == torch.arange(t.numel(), dtype=t.dtype)).all()):
        return f"jnp.arange({t.numel()}, dtype={dtype}).reshape({shape})"  # position ids [1, N]
    if literal and t.numel() <= LITERAL_LIMIT:
        return f"jnp.array({t.flatten().tolist()!r}, {dtype}).reshape({shape})"
    return f"jnp.zeros({shape}, {dtype})"


def literal(t) -> str:
    """A tensor that torch's forward built from Python values (a window mask, a table), written
    into the file: a list when small, else its bytes (np.frombuffer, one line)."""
    dtype = dtype_name(t.dtype)
    if t.numel() <= LITERAL_LIMIT:
        return f"jnp.array({t.tolist()!r}, {dtype})"
    data = t.contiguous().numpy()
    if data.nbytes > BYTES_LIMIT:
        raise PortError(f"cannot port a {list(t.shape)} tensor that forward builds from Python values "
                        f"({data.nbytes} bytes): keep it as a registered buffer instead")
    return (f"jnp.asarray(np.frombuffer(bytes.fromhex({data.tobytes().hex()!r}), {data.dtype.name!r})"
            f".reshape({shape_text(t)}), {dtype})")
