"""`jaxformer port`'s op table beyond the basics (issue 47 §4): the add* family with alpha / beta,
F.interpolate in every mode, pooling, functional norms, 3-D / transposed / 'same' convolutions,
the functional forms of mutation ops (scatter, index_put, ...), and the rest of what
Transformers, ViTs, conv stems and audio front ends call. Each group is one tiny torch module
ported and checked by the parity harness (outputs, and every parameter's and float input's
gradient, at the default tolerances); refused ops are refused by name."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from jaxformer.port import PortError, from_torch, ops, port_source

RS = np.random.RandomState(0)


def _f32(*shape, scale=1.0, shift=0.0):
    return (RS.randn(*shape) * scale + shift).astype(np.float32)


def _check(module, inputs):
    torch.manual_seed(0)
    return from_torch(module.eval(), inputs, check=True)  # raises ParityError on a mismatch


# ----------------------------------------------------------------------------- add* family
class AddFamily(nn.Module):
    def __init__(self):
        super().__init__()
        self.bias = nn.Parameter(torch.randn(2, 3, 4))

    def forward(self, a, b, v, w):
        return (torch.baddbmm(self.bias, a, b, beta=0.5, alpha=0.25),  # Bloom's ALiBi form
                torch.baddbmm(torch.full((2, 3, 4), float("nan")), a, b, beta=0.0, alpha=2.0),  # beta 0: self unread
                torch.addbmm(self.bias[0], a, b, beta=2.0, alpha=0.5),
                torch.addmm(self.bias[0], a[0], b[0], beta=0.5, alpha=3.0),
                torch.addmv(self.bias[0, :, 0], a[0], v, beta=2.0, alpha=0.5),
                torch.addr(self.bias[0], w, self.bias[1, 0], beta=0.5, alpha=2.0),
                torch.addcmul(self.bias, a[..., :4], b[:, :3], value=0.3),
                torch.addcdiv(self.bias, a[..., :4], b[:, :3].exp(), value=-0.7),
                torch.lerp(self.bias, a[..., :4], 0.3), torch.lerp(self.bias, a[..., :4], 0.8),
                torch.lerp(self.bias, a[..., :4], b[:, :3].sigmoid() * 1.2 - 0.1))


def test_add_family():
    _check(AddFamily(), {"a": _f32(2, 3, 5), "b": _f32(2, 5, 4), "v": _f32(5), "w": _f32(3)})


# ----------------------------------------------------------------------------- interpolation
class Resize(nn.Module):
    def forward(self, x, v, t):
        outs = []
        for mode in ("nearest", "nearest-exact", "bilinear", "bicubic"):
            for spec in (dict(size=(7, 4)), dict(scale_factor=1.7), dict(scale_factor=(0.6, 2.05))):
                for ac in ((None,) if "nearest" in mode else (False, True)):
                    kw = dict(mode=mode, **spec) if ac is None else dict(mode=mode, align_corners=ac, **spec)
                    outs.append(F.interpolate(x, **kw))
        outs.append(F.interpolate(x, size=(3, 4), mode="bilinear", antialias=True))
        outs.append(F.interpolate(x, scale_factor=0.45, mode="bicubic", antialias=True, align_corners=True))
        outs.append(F.interpolate(x, size=(3, 4), mode="area"))
        outs.append(F.interpolate(v, scale_factor=0.6, mode="linear"))
        outs.append(F.interpolate(v, size=13, mode="linear", align_corners=True))
        outs.append(F.interpolate(v, scale_factor=2.5, mode="nearest"))
        outs.append(F.interpolate(t, scale_factor=1.3, mode="trilinear", align_corners=True))
        outs.append(F.interpolate(t, size=(2, 5, 3), mode="nearest-exact"))
        outs.append(F.interpolate(t, scale_factor=(1.5, 0.5, 2.0), mode="nearest"))
        return tuple(outs)


def test_interpolate_every_mode():
    """Up and down, by size and by scale factor (torch maps back with 1/scale), align_corners both
    ways, antialias, 1-D to 3-D: one module, every output and the inputs' gradients checked."""
    _check(Resize(), {"x": _f32(2, 3, 5, 7), "v": _f32(2, 3, 9), "t": _f32(1, 2, 3, 4, 5)})


def test_position_table_resize():
    """ViT / BEiT position-table resizing: bicubic, align_corners=False, on a parameter."""
    class PosResize(nn.Module):
        def __init__(self):
            super().__init__()
            self.table = nn.Parameter(torch.randn(1, 6, 4, 4))

        def forward(self, x):
            return x + F.interpolate(self.table, size=(7, 7), mode="bicubic", align_corners=False)
    _check(PosResize(), {"x": _f32(2, 6, 7, 7)})


# ----------------------------------------------------------------------------- pooling
class Pools(nn.Module):
    def forward(self, x, v, t):
        values, where = F.max_pool2d(x, 3, 2, 1, return_indices=True, ceil_mode=True)
        adaptive, at = F.adaptive_max_pool2d(x, (3, 4), return_indices=True)
        return (F.max_pool2d(x, 3, 2, 1), F.max_pool2d(x, (3, 2), (2, 1), (1, 0), (1, 2), ceil_mode=True),
                values, where, adaptive, at, F.max_pool1d(v, 3, 2, 1, dilation=2), F.max_pool3d(t, 2, ceil_mode=True),
                F.avg_pool2d(x, 3, 2, 1), F.avg_pool2d(x, 3, 2, 1, ceil_mode=True, count_include_pad=False),
                F.avg_pool2d(x, 2, 2, ceil_mode=True, divisor_override=3), F.avg_pool1d(v, 4, 3, 2, ceil_mode=True),
                F.avg_pool1d(v, 3, 2, 1, count_include_pad=False), F.avg_pool3d(t, 2, 1, 1),
                F.adaptive_avg_pool2d(x, (4, 3)), F.adaptive_avg_pool2d(x, 1), F.adaptive_avg_pool1d(v, 4),
                F.adaptive_max_pool1d(v, 5))


def test_pooling():
    _check(Pools(), {"x": _f32(2, 3, 9, 8), "v": _f32(2, 3, 11), "t": _f32(1, 2, 5, 4, 6)})


# ----------------------------------------------------------------------------- norms, convolutions
class NormsConvs(nn.Module):
    def __init__(self):
        super().__init__()
        self.gw, self.gb = nn.Parameter(torch.randn(6)), nn.Parameter(torch.randn(6))
        self.register_buffer("mean", torch.randn(6))
        self.register_buffer("var", torch.rand(6) + 0.5)
        self.w3 = nn.Parameter(torch.randn(4, 3, 2, 2, 2) * 0.3)
        self.wt1 = nn.Parameter(torch.randn(6, 2, 3) * 0.3)
        self.wt2 = nn.Parameter(torch.randn(6, 2, 3, 2) * 0.3)
        self.wt3 = nn.Parameter(torch.randn(3, 2, 2, 2, 2) * 0.3)
        self.bt = nn.Parameter(torch.randn(4))
        self.ws = nn.Parameter(torch.randn(4, 6, 4, 3) * 0.3)

    def forward(self, x, v, t):
        return (F.group_norm(x, 3, self.gw, self.gb, eps=1e-5), F.group_norm(x, 2),
                F.instance_norm(x, weight=self.gw, bias=self.gb), F.instance_norm(v),
                F.batch_norm(x, self.mean, self.var, self.gw, self.gb, training=False, eps=1e-3),
                F.batch_norm(v, None, None, training=True),
                F.conv3d(t, self.w3, stride=(1, 2, 1), padding=1, dilation=(1, 1, 2)),
                F.conv_transpose1d(v, self.wt1, self.bt, stride=2, padding=1, output_padding=1, groups=2),
                F.conv_transpose2d(x, self.wt2, None, stride=(2, 1), padding=(0, 1), dilation=(1, 2)),
                F.conv_transpose3d(t, self.wt3, stride=2),
                F.conv2d(x, self.ws, padding="same", dilation=(1, 2)), F.conv1d(v, self.wt1[:4].repeat(1, 3, 1), padding="valid"))


def test_norms_and_convolutions():
    _check(NormsConvs(), {"x": _f32(2, 6, 5, 4, scale=2.0, shift=1.0), "v": _f32(2, 6, 7), "t": _f32(1, 3, 3, 4, 4)})


def test_batch_norm_with_running_stats_in_train_mode_is_refused():
    class Updating(nn.Module):
        def forward(self, x):
            return F.batch_norm(x, torch.zeros(3), torch.ones(3), training=True)
    with pytest.raises(PortError, match="batch_norm.*running statistics"):
        port_source(Updating().eval(), {"x": _f32(2, 3, 4)})


# ----------------------------------------------------------------------------- scatter forms
class Scatters(nn.Module):
    def __init__(self):
        super().__init__()
        self.base = nn.Parameter(torch.randn(4, 5, 3))

    def forward(self, x, idx, mask):
        b = self.base
        i2 = torch.tensor([[0, 2, 0], [1, 1, 3]])
        i3 = idx[:3, :2]  # [3, 2, 3] ids in 0..3, along dim 0
        out = [torch.select_scatter(b, x[:, 0], 1, 2), torch.slice_scatter(b, x[:, :2], 1, 1, 5, 2),
               torch.diagonal_scatter(b, x[0, :3, :3], -1, 0, 1),
               b.index_put((torch.tensor([0, -1, 0]),), x[:3], accumulate=True),
               torch.ops.aten.index_put(b, [torch.tensor([[1], [2]]), None, torch.tensor([0, 2])], x[0, :, 0]),
               b.index_put((mask,), torch.tensor(7.0)), b.index_put((mask,), x[0, 0], accumulate=True),
               b.index_copy(1, torch.tensor([4, 0]), x[:, :2]), b.index_add(0, torch.tensor([1, 1]), x[:2], alpha=-2),
               b.index_fill(2, torch.tensor([1]), -3.0),
               b.scatter(0, i2.unsqueeze(-1).expand(2, 3, 3), x[:2, :3] * 2),
               b.scatter(1, i2[:, :2].unsqueeze(-1).expand(2, 2, 3), 0.5),
               b.detach().scatter(0, i3, x[:3, :2].detach(), reduce="add"),  # no torch derivative
               b.detach().scatter(0, i3, x[:3, :2].detach(), reduce="multiply"),
               b.scatter_add(0, i3, x[:3, :2]), b.masked_scatter(x > 0, x * 3),
               # the functional forms of copy_ / fill_ / zero_ (torch gives them no derivative)
               torch.ops.aten.copy(b.detach(), x[0, 0].detach()), torch.ops.aten.fill(b.detach(), 2.5),
               torch.ops.aten.fill(b.detach(), x[0, 0, 0].detach()), torch.ops.aten.zero(b.detach())]
        for reduce in ("sum", "prod", "mean", "amax", "amin"):
            for include_self in (True, False):
                out.append(b.scatter_reduce(0, i3, x[:3, :2], reduce, include_self=include_self))
        return tuple(out)


def test_scatter_forms():
    mask = np.zeros((4, 5), bool)
    mask[[0, 2, 3], [1, 1, 4]] = True
    idx = np.array([[[0, 3, 1], [2, 0, 0]], [[3, 3, 1], [0, 1, 2]], [[1, 3, 2], [2, 0, 1]]]).repeat(2, 0)
    _check(Scatters(), {"x": _f32(4, 5, 3), "idx": idx.reshape(6, 2, 3)[:4].copy(), "mask": mask})


# ----------------------------------------------------------------------------- elementwise, activations
class Elementwise(nn.Module):
    def __init__(self):
        super().__init__()
        self.slope = nn.Parameter(torch.rand(4) * 0.3)

    def forward(self, x, n):
        u = x.tanh() * 0.9  # in (-1, 1)
        p = x.abs() + 0.5
        out = [F.hardswish(x), F.hardsigmoid(x), F.relu6(x * 3), F.prelu(x, self.slope), F.prelu(x, self.slope[:1]),
               F.glu(x, 1), F.logsigmoid(x), F.selu(x), F.celu(x, 0.7), F.threshold(x, 0.1, -2.0),
               F.hardshrink(x, 0.4), F.softshrink(x, 0.3), F.softsign(x), F.tanhshrink(x),
               F.rrelu(x, training=False), torch.erfinv(u), torch.exp2(x), torch.log10(p), torch.sinh(x),
               torch.cosh(x), torch.tan(u), torch.asin(u), torch.acos(u), torch.atan2(x, p), torch.asinh(x),
               torch.acosh(p + 1), torch.atanh(u), torch.trunc(x * 3), torch.frac(x * 3), torch.fix(x * 2),
               torch.logit(u * 0.5 + 0.5), torch.logit(u * 0.5 + 0.5, eps=0.2), torch.hypot(x, p), torch.sgn(x),
               torch.logaddexp(x, u), torch.logaddexp2(x, u), torch.copysign(p, x), torch.erfc(x),
               torch.xlogy(p, p), torch.lgamma(p), torch.digamma(p), torch.deg2rad(x), torch.heaviside(x.detach(), p.detach()),
               torch.special.expit(x), torch.special.ndtr(x), torch.special.log_ndtr(x), torch.special.i0(x),
               torch.special.i0e(x), torch.special.i1(x), torch.special.i1e(x), torch.special.sinc(x),
               torch.special.entr(p), torch.special.ndtri(u * 0.5 + 0.5), torch.special.erfcx(p),
               torch.special.log1p(p),
               torch.nan_to_num(x.detach() / (x > 0).float(), nan=0.5, posinf=3.0, neginf=-3.0),
               torch.isnan(x.log()), torch.isinf(1 / (x > 0).float()), torch.isfinite(x.log()),
               torch.isneginf(-1 / (x > 0).float()), torch.isposinf(1 / (x > 0).float()),
               torch.logical_xor(x > 0, u > 0.2), torch.signbit(x), n << 2, n >> 1,
               torch.clamp(x, u * 0.5, p), torch.where(x > 0, 1.0, 0.0) * x]
        return tuple(out)


def test_elementwise_and_activations():
    _check(Elementwise(), {"x": _f32(2, 4, 6), "n": RS.randint(0, 100, (2, 4)).astype(np.int64)})


# ----------------------------------------------------------------------------- reductions, losses
class Reductions(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.rand(5) + 0.5)

    def forward(self, x, labels, probs):
        y = x.clone()
        s, m = torch.std_mean(x, 1)
        v, m0 = torch.var_mean(x, (0, 2), correction=0, keepdim=True)
        cmax, imax = torch.cummax(x, 1)
        cmin, imin = torch.cummin(x, 2)
        mn, mx = torch.aminmax(x, dim=1)
        logits = x[:, :, :5]
        return (s, m, v, m0, x[..., :5] * self.w, x.std(1, unbiased=False), x.var(correction=2), torch.logsumexp(x, (1, 2)),
                torch.cumprod(x, 2), cmax, imax, cmin, imin, torch.logcumsumexp(x, 1), mn, mx,
                torch.linalg.vector_norm(x, dim=(1, 2)), torch.linalg.vector_norm(x, float("inf"), 1),
                torch.linalg.vector_norm(x, float("-inf"), 2, keepdim=True), torch.linalg.vector_norm(x, 0, 2),
                torch.linalg.vector_norm(x, 3.0, 1), torch.norm(x, dim=1), torch.norm(x, p=1), x.norm(),
                torch.norm(x, "fro", dim=(1, 2)), torch.linalg.norm(x, dim=-1),
                torch.linalg.vector_norm(y * 0, dim=-1),  # a zero norm: gradient 0, as torch's
                F.cosine_similarity(x, x.flip(1) + 1, dim=1), F.pairwise_distance(x[0], x[1]),
                torch.cdist(x, x.flip(1) * 2), torch.cdist(x[:, :2], x, p=1.0), F.normalize(x, dim=-1),
                x.sum(1, dtype=torch.float32), x.mean(2, dtype=torch.float32), torch.nansum(x, 1),
                F.mse_loss(x, x.flip(0)), F.l1_loss(x, x.flip(0), reduction="sum"),
                F.smooth_l1_loss(x, x.flip(0), beta=0.5, reduction="none"), F.huber_loss(x, x.flip(0), delta=0.7),
                F.binary_cross_entropy(x.sigmoid(), probs[:, :, :6]),
                F.binary_cross_entropy_with_logits(x, probs[:, :, :6], weight=self.w[0].detach(),
                                                   pos_weight=self.w[:1].detach() * 2),
                F.kl_div(x.log_softmax(-1), probs[:, :, :6], reduction="batchmean"),
                F.cross_entropy(logits.transpose(1, 2), labels), F.cross_entropy(logits[0], labels[0], weight=self.w.detach()),
                F.cross_entropy(logits.reshape(-1, 5), labels.reshape(-1), ignore_index=2, label_smoothing=0.1,
                                weight=self.w.detach()),
                F.cross_entropy(logits.reshape(-1, 5), probs[:, :, :5].reshape(-1, 5).softmax(-1), label_smoothing=0.2),
                F.nll_loss(logits.log_softmax(-1).reshape(-1, 5), labels.reshape(-1), reduction="sum"))


def test_reductions_norms_and_losses():
    _check(Reductions(), {"x": _f32(2, 4, 6), "labels": RS.randint(0, 5, (2, 4)).astype(np.int64),
                          "probs": RS.rand(2, 4, 6).astype(np.float32)})


# ----------------------------------------------------------------------------- shapes, patches, creation
class Shapes(nn.Module):
    def __init__(self):
        super().__init__()
        self.table = nn.Parameter(torch.randn(6, 3))

    def forward(self, x, img, ids, offsets):
        a, b = torch.meshgrid(x[0, 0, :3], x[0, 1, :2], indexing="ij")
        cols = F.unfold(img, (2, 3), dilation=(1, 2), padding=1, stride=(2, 1))
        return (F.pixel_shuffle(img, 2), F.pixel_unshuffle(img, 2), F.channel_shuffle(img, 2),
                x.unfold(2, 3, 2), cols, F.fold(cols, (4, 6), (2, 3), dilation=(1, 2), padding=1, stride=(2, 1)),
                x.narrow(1, 1, 2), torch.take(x, ids), x.tile(2, 1), a, b, torch.cartesian_prod(x[0, 0, :2], x[1, 1, :3]),
                torch.linspace(-1, 2, 7) + x[0, 0, 0], torch.logspace(0, 1, 5, base=2.0), torch.eye(3, 4),
                torch.tril_indices(4, 5, -1), torch.triu_indices(3, 4, 1), torch.diag(x[0]), torch.diag(x[0, 0], 1),
                torch.diag_embed(x, 1), torch.diag_embed(x[0], 0, 0, 2), x.diagonal(1, 1, 2), torch.trace(x[0]),
                torch.bucketize(x, torch.tensor([-1.0, 0.0, 0.5])), torch.searchsorted(torch.tensor([-1.0, 0.0, 2.0]), x),
                torch.searchsorted(x.sort(-1).values, x[..., :2], right=True), F.one_hot(ids, 9),
                F.embedding_bag(ids.reshape(-1) % 6, self.table, offsets, mode="mean"),
                F.embedding_bag(ids.reshape(-1) % 6, self.table, offsets, mode="max"),
                F.embedding_bag(ids % 6, self.table, mode="sum", padding_idx=0),
                x.swapaxes(0, 2), x.fliplr(), torch.rot90(x, 1, (1, 2)), torch.kron(x[0], x[1, :2, :2]),
                torch.block_diag(x[0], x[1, :2]), torch.linalg.cross(x[..., :3], x[..., 3:]),
                torch.hann_window(5) * x[0, 0, 0], F.dropout2d(img, 0.3, training=False),
                F.alpha_dropout(x, 0.2, training=False))


def test_shapes_patches_and_creation():
    _check(Shapes(), {"x": _f32(2, 4, 6), "img": _f32(1, 4, 4, 6), "ids": np.array([[0, 3, 5], [7, 2, 8]]),
                      "offsets": np.array([0, 2, 2, 5])})


# ----------------------------------------------------------------------------- refusals and the table
class Odd(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


@pytest.mark.parametrize("name, fn", [
    ("aten.rand_like", lambda x: x + torch.rand_like(x)),
    ("aten.bernoulli", lambda x: torch.bernoulli(x.sigmoid())),
    ("aten.randn", lambda x: x + torch.randn(3)),
    ("aten.masked_select", lambda x: torch.masked_select(x, x > 0)),
    ("aten.nonzero", lambda x: torch.nonzero(x > 0).float()),
    ("aten.as_strided_scatter", lambda x: torch.as_strided_scatter(x, x[:2], (2,), (2,))),
    ("aten.rrelu", lambda x: F.rrelu(x, training=True)),
])
def test_refused_ops_name_the_op(name, fn):
    with pytest.raises(PortError) as e:
        port_source(Odd(fn).eval(), {"x": _f32(3, 4) if name != "aten.as_strided_scatter" else _f32(4)})
    assert name in str(e.value), str(e.value)


def test_new_entries_are_named_aten_ops():
    assert all(name.startswith("aten.") for name in ops.TABLE)
    for name in ("aten.baddbmm", "aten.upsample_bicubic2d", "aten.max_pool2d_with_indices", "aten.scatter_reduce",
                 "aten.index_put", "aten._native_batch_norm_legit_no_training", "aten.conv_transpose2d"):
        assert name in ops.TABLE
