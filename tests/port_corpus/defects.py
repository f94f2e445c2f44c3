"""Hand-written models planting each defect class issue 47 found on real models, several forms of
each, so a fix is proven on the pattern and not only on the model that showed it. Tiny sizes:
d 16-32, seq 8, batch 2; each forward also does ordinary work around the planted pattern, so the
pattern's result reaches the output and every parameter gets a gradient.

  (1) index assignment / in-place mutation inside forward:
      mutate_setitem     `buf = torch.zeros(...); buf[:, :, 1] = x.sum(-1)` (timm ConViT's
                         rel_indices), a setitem of a slice of a computed tensor, an int setitem;
      mutate_index_put   `out[idx] = v` with a long index tensor (a buffer), index_put_ with
                         accumulate=True, a boolean-mask setitem;
      mutate_copy_scatter  `y[:, :h].copy_(a)` into torch.empty, torch.slice_scatter,
                         torch.select_scatter, Tensor.index_copy;
      mutate_fill_masked `scores.masked_fill_(mask, -1e4)`, `h[..., :4].fill_(1.0)`, `.zero_()` of a
                         column;
      mutate_view_arith  `h[:, 1:] += x[:, :-1]` on a view, `h.narrow(-1, 0, 4).mul_(2)`,
                         `h[..., 8:] *= self.scale`, `x.add_(1)` on a clone, `clamp_`.
  (2) tied weights other than a bias-free head:
      tied_head_bias     a Linear head WITH bias whose weight is the Embedding's (BERT/ALBERT MLM);
      tied_embed_subclass an nn.Embedding subclass with its own forward (BART's
                         ScaledWordEmbedding) shared by encoder and decoder and tied to the head;
      shared_module      one nn.Linear registered under two names and called twice, and a Linear
                         weight assigned to a second Linear (`b.weight = a.weight`);
      tied_transpose     a tied autoencoder: the decoder is F.linear(h, self.enc.weight.t(), b).
  (3) a module called on a buffer or a weight:
      module_on_buffer   `self.pos(self.position_ids[:, :T])` (CLIP/SigLIP), a Linear on a
                         registered constant buffer;
      module_on_weight   `self.norm(self.rel_embeddings.weight)` (DeBERTa-v2's norm_rel_ebd), a
                         Linear on a latent nn.Parameter (Perceiver/Q-Former queries).
  (4) missing ops:
      batchnorm_modes    BatchNorm1d/2d in eval mode, and F.batch_norm(training=True) without
                         running stats inside an eval model (timm's StdConv2d);
      addmm_alpha_beta   torch.baddbmm(bias, q, k^T, beta=, alpha=) (Bloom's ALiBi) written over
                         several lines, torch.addmm(b, x, W^T, beta=, alpha=), addbmm;
      interpolate_modes  F.interpolate of a parameter table and of activations: bilinear and
                         bicubic with align_corners True and False, nearest, scale_factor;
      symbolic_slice     slice bounds that are expressions of the free sequence length:
                         `bias[:, :, max(0, L - T):]` (MPT), `table[-T:]`, `x[:, 1 - T:]` (as
                         `Max(0, 1 - s)`), `ids[:, : T // 2]`.
  (5) pads_from_shape    `pad = (k - T % k) % k; F.pad(x, (0, 0, 0, pad))`, chunked attention in
                         blocks, unpadded by `[:, :T]`.
  (6) frozen_params      a table with requires_grad_(False) (Whisper's embed_positions), a frozen
                         first layer, a frozen LayerNorm weight.
  (7) zero_true_grads    parameters whose true gradient is exactly 0 but float32 gives noise: a
                         bias constant along a softmax's axis (every attention's key bias), a
                         constant added before LayerNorm, a parameter that only reaches the
                         output through a comparison.
  (8) multiline_call     calls spread over several lines whose later lines carry the arguments
                         that matter (F.layer_norm's eps and weight, F.scaled_dot_product_attention's
                         is_causal and scale, torch.cat's dim).
  (9) found later:
      top_level_sequential the model itself an nn.Sequential (attributes `0`, `1`, ...);
      weight_norm        a Conv1d under torch.nn.utils.weight_norm (weight_g / weight_v, a forward
                         pre-hook) and one under nn.utils.parametrizations.weight_norm (original0 /
                         original1), as Wav2Vec2 / HuBERT's positional conv.
"""
import math

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

B, T, D, V = 2, 8, 32, 64


def _x(seed, *shape):
    return np.random.RandomState(seed).standard_normal(shape or (B, T, D)).astype(np.float32)


def _ids(seed):
    return np.random.RandomState(seed).randint(0, V, size=(B, T)).astype(np.int64)


def _eval(model, seed):
    torch.manual_seed(seed)
    return model.eval()


# ------------------------------------------------------------------------------------ (1) mutation
class MutateSetitem(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(D, D)
        self.pos_proj = nn.Linear(3, D)
        self.out = nn.Linear(D, D)

    def forward(self, x):
        Bn, Tn, C = x.shape
        h = self.fc(x)
        buf = torch.zeros(Bn, Tn, 3)
        buf[:, :, 2] = h.pow(2).mean(-1)
        buf[:, :, 1] = h.sum(-1)
        buf[:, :, 0] = x.mean(-1)
        h = h + self.pos_proj(buf)
        g = h.clone()
        g[:, 0] = h[:, -1] * 2.0  # a slice of a computed tensor
        g[:, :, 0] = 1.0  # an int setitem
        return self.out(g)


class MutateIndexPut(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(D, D)
        self.out = nn.Linear(D, D)
        self.register_buffer("rows", torch.tensor([0, 3, 5]))
        self.register_buffer("cols", torch.tensor([1, 1, 4]))

    def forward(self, x):
        h = self.fc(x)
        y = torch.zeros_like(h)
        y[:, self.rows] = h[:, self.rows] * 3.0  # a long index tensor
        y.index_put_((torch.arange(h.shape[0])[:, None], self.cols[None, :]), h[:, :3] * 0.5, accumulate=True)
        y[h > 1.0] = 1.0  # a boolean-mask setitem
        return self.out(y + h)


class MutateCopyScatter(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(D, D // 2)
        self.b = nn.Linear(D, D // 2)
        self.out = nn.Linear(D, D)

    def forward(self, x):
        Bn, Tn, _ = x.shape
        y = torch.empty(Bn, Tn, D)
        y[:, :, : D // 2].copy_(self.a(x))
        y[:, :, D // 2:].copy_(self.b(x))
        z = torch.slice_scatter(y, self.a(x) * 2.0, dim=2, start=0, end=D // 2)
        z = torch.select_scatter(z, x[:, :, 0] + x[:, :, 1], 2, 3)
        z = z.index_copy(1, torch.tensor([0, 2]), y[:, 4:6])
        return self.out(z)


class MutateFillMasked(nn.Module):
    def __init__(self):
        super().__init__()
        self.q = nn.Linear(D, D)
        self.k = nn.Linear(D, D)
        self.v = nn.Linear(D, D)
        self.out = nn.Linear(D, D)

    def forward(self, x, mask):
        scores = self.q(x) @ self.k(x).transpose(-1, -2) / math.sqrt(D)
        scores.masked_fill_(mask[:, None, :] == 0, -1e4)
        h = scores.softmax(-1) @ self.v(x)
        h[..., :4].fill_(1.0)
        h[:, :, 5].zero_()
        return self.out(h)


class MutateViewArith(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(D, D)
        self.scale = nn.Parameter(torch.linspace(0.5, 1.5, D - 8))
        self.out = nn.Linear(D, D)

    def forward(self, x):
        h = self.fc(x)
        h[:, 1:] += x[:, :-1]  # a view updated from another tensor (well defined, unlike h[:, :-1])
        h.narrow(-1, 0, 4).mul_(2)
        h[..., 8:] *= self.scale
        g = x.clone()
        g.add_(1)
        h = h + g
        h.clamp_(-3.0, 3.0)
        return self.out(h)


def mutate_setitem():
    return _eval(MutateSetitem(), 110), {"x": _x(110)}


def mutate_index_put():
    torch.manual_seed(111)
    return _eval(MutateIndexPut(), 111), {"x": _x(111)}


def mutate_copy_scatter():
    torch.manual_seed(112)
    return _eval(MutateCopyScatter(), 112), {"x": _x(112)}


def mutate_fill_masked():
    torch.manual_seed(113)
    mask = np.ones((B, T), np.int64)
    mask[1, 6:] = 0
    return _eval(MutateFillMasked(), 113), {"x": _x(113), "mask": mask}


def mutate_view_arith():
    torch.manual_seed(114)
    return _eval(MutateViewArith(), 114), {"x": _x(114)}


# -------------------------------------------------------------------------------- (2) tied weights
class TiedHeadBias(nn.Module):
    """An MLM-style head: transform, LayerNorm, a decoder Linear with bias tied to the embedding."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(V, D)
        self.body = nn.Linear(D, D)
        self.transform = nn.Linear(D, D)
        self.norm = nn.LayerNorm(D)
        self.decoder = nn.Linear(D, V, bias=True)
        self.decoder.weight = self.embed.weight
        nn.init.normal_(self.decoder.bias, 0.0, 0.1)

    def forward(self, input_ids):
        h = torch.tanh(self.body(self.embed(input_ids)))
        return self.decoder(self.norm(F.gelu(self.transform(h))))


class ScaledWordEmbedding(nn.Embedding):
    """BART's BartScaledWordEmbedding: an Embedding with its own forward."""

    def __init__(self, num_embeddings, embedding_dim, padding_idx=None, embed_scale=1.0):
        super().__init__(num_embeddings, embedding_dim, padding_idx)
        self.embed_scale = embed_scale

    def forward(self, input_ids):
        return super().forward(input_ids) * self.embed_scale


class TiedEmbedSubclass(nn.Module):
    def __init__(self):
        super().__init__()
        self.shared = ScaledWordEmbedding(V, D, padding_idx=1, embed_scale=math.sqrt(D))
        self.enc_tokens = self.shared
        self.dec_tokens = self.shared
        self.enc = nn.Linear(D, D)
        self.dec = nn.Linear(D, D)
        self.lm_head = nn.Linear(D, V, bias=False)
        self.lm_head.weight = self.shared.weight

    def forward(self, input_ids, decoder_input_ids):
        memory = torch.tanh(self.enc(self.enc_tokens(input_ids))).mean(1, keepdim=True)
        h = torch.tanh(self.dec(self.dec_tokens(decoder_input_ids)) + memory)
        return self.lm_head(h)


class SharedModule(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(D, D)
        self.proj_again = self.proj  # one module under two names
        self.a = nn.Linear(D, D)
        self.b = nn.Linear(D, D)
        self.b.weight = self.a.weight  # a weight shared by two modules (biases their own)
        self.norm = nn.LayerNorm(D)

    def forward(self, x):
        h = F.gelu(self.proj(x))
        h = self.norm(h + self.proj_again(h))
        return self.a(h) * torch.sigmoid(self.b(x))


class TiedTranspose(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = nn.Linear(D, 16)
        self.dec_bias = nn.Parameter(torch.zeros(D))

    def forward(self, x):
        h = torch.tanh(self.enc(x))
        return F.linear(h, self.enc.weight.t(), self.dec_bias)


def tied_head_bias():
    torch.manual_seed(120)
    return _eval(TiedHeadBias(), 120), {"input_ids": _ids(120)}


def tied_embed_subclass():
    torch.manual_seed(121)
    return _eval(TiedEmbedSubclass(), 121), {"input_ids": _ids(121), "decoder_input_ids": _ids(1121)}


def shared_module():
    torch.manual_seed(122)
    return _eval(SharedModule(), 122), {"x": _x(122)}


def tied_transpose():
    torch.manual_seed(123)
    model = TiedTranspose()
    with torch.no_grad():
        model.dec_bias.normal_(0.0, 0.1)
    return _eval(model, 123), {"x": _x(123)}


# ------------------------------------------------------------------ (3) a module on a buffer / weight
class ModuleOnBuffer(nn.Module):
    def __init__(self, max_pos=16):
        super().__init__()
        self.tok = nn.Embedding(V, D)
        self.pos = nn.Embedding(max_pos, D)
        self.register_buffer("position_ids", torch.arange(max_pos).expand((1, -1)), persistent=False)
        self.register_buffer("type_feats", torch.randn(4, D))
        self.type_proj = nn.Linear(D, D)
        self.out = nn.Linear(D, D)

    def forward(self, input_ids):
        Tn = input_ids.shape[1]
        h = self.tok(input_ids) + self.pos(self.position_ids[:, :Tn])
        h = h + self.type_proj(self.type_feats).mean(0)
        return self.out(torch.tanh(h))


class ModuleOnWeight(nn.Module):
    def __init__(self, buckets=15, n_latents=4):
        super().__init__()
        self.rel_embeddings = nn.Embedding(buckets, D)
        self.norm = nn.LayerNorm(D)
        self.latents = nn.Parameter(torch.randn(n_latents, D) * 0.5)
        self.latent_proj = nn.Linear(D, D)
        self.q = nn.Linear(D, D)
        self.out = nn.Linear(D, D)

    def forward(self, x):
        Tn = x.shape[1]
        rel = self.norm(self.rel_embeddings.weight)  # [buckets, D]
        pos = torch.arange(Tn)
        bucket = (pos[None, :] - pos[:, None]).clamp(-7, 7) + 7  # [T, T]
        bias = (self.q(x) @ rel.t())  # [B, T, buckets]
        bias = torch.gather(bias, 2, bucket[None].expand(x.shape[0], -1, -1))
        lat = self.latent_proj(self.latents)  # [L, D]
        attn = torch.softmax(x @ lat.t() / math.sqrt(D), -1) @ lat
        return self.out(attn + bias.softmax(-1) @ x)


def module_on_buffer():
    torch.manual_seed(130)
    return _eval(ModuleOnBuffer(), 130), {"input_ids": _ids(130)}


def module_on_weight():
    torch.manual_seed(131)
    model = ModuleOnWeight()
    with torch.no_grad():
        model.norm.weight.normal_(1.0, 0.1)
    return _eval(model, 131), {"x": _x(131)}


# ----------------------------------------------------------------------------------- (4) missing ops
class BatchNormModes(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn2d = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8, 16, bias=False)
        self.bn1d = nn.BatchNorm1d(16)
        self.std_w = nn.Parameter(torch.randn(8, 8, 1, 1))
        self.g = nn.Parameter(torch.ones(8))
        self.b = nn.Parameter(torch.zeros(8))
        self.head = nn.Linear(16, 5)

    def forward(self, x):
        h = F.relu(self.bn2d(self.conv(x)))  # eval: running statistics
        w = F.batch_norm(self.std_w.reshape(1, 8, -1), None, None, training=True, momentum=0.,
                         eps=1e-6).reshape_as(self.std_w)  # weight standardisation
        h = F.conv2d(h, w)
        h = F.batch_norm(h, None, None, self.g, self.b, training=True, eps=1e-5)  # batch statistics
        h = h.mean((2, 3))  # [B, 8]
        return self.head(F.relu(self.bn1d(self.fc(h))))


class AddmmAlphaBeta(nn.Module):
    def __init__(self, heads=4):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(D, 3 * D)
        self.w = nn.Parameter(torch.randn(D, D) * 0.1)
        self.b = nn.Parameter(torch.randn(D) * 0.1)
        self.register_buffer("slopes", torch.tensor([0.5, 0.25, 0.125, 0.0625]))

    def forward(self, x):
        Bn, Tn, _ = x.shape
        hd = D // self.heads
        q, k, v = self.qkv(x).split(D, -1)
        q = q.reshape(Bn, Tn, self.heads, hd).transpose(1, 2).reshape(Bn * self.heads, Tn, hd)
        k = k.reshape(Bn, Tn, self.heads, hd).transpose(1, 2).reshape(Bn * self.heads, Tn, hd)
        v = v.reshape(Bn, Tn, self.heads, hd).transpose(1, 2).reshape(Bn * self.heads, Tn, hd)
        pos = torch.arange(Tn, dtype=x.dtype)
        alibi = (self.slopes[:, None] * pos[None, :]).repeat(Bn, 1)[:, None, :]  # [B*H, 1, T]
        scores = torch.baddbmm(
            alibi,
            q,
            k.transpose(1, 2),
            beta=1.0,
            alpha=1.0 / math.sqrt(hd),
        )
        h = torch.bmm(scores.softmax(-1), v)
        h = h.reshape(Bn, self.heads, Tn, hd).transpose(1, 2).reshape(Bn * Tn, D)
        out = torch.addmm(self.b, h, self.w.t(), beta=0.5, alpha=2.0)
        extra = torch.addbmm(scores.mean(0), q, k.transpose(1, 2), beta=0.25, alpha=0.5)  # [T, T]
        return out.reshape(Bn, Tn, D) + extra.softmax(-1) @ x


class InterpolateModes(nn.Module):
    def __init__(self):
        super().__init__()
        self.table = nn.Parameter(torch.randn(1, 4, 5, 5))  # a relative-position / pos-embed table
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.head = nn.Linear(4 * 7, 5)

    def forward(self, x):
        h = self.conv(x)  # [B, 4, 8, 8]
        t1 = F.interpolate(self.table, size=(8, 8), mode="bilinear", align_corners=False)
        t2 = F.interpolate(self.table, size=(8, 8), mode="bilinear", align_corners=True)
        t3 = F.interpolate(self.table, size=(8, 8), mode="bicubic", align_corners=False)
        t4 = F.interpolate(self.table, size=(8, 8), mode="bicubic", align_corners=True)
        t5 = F.interpolate(self.table, size=(8, 8), mode="nearest")
        a1 = F.interpolate(h, scale_factor=2, mode="bilinear", align_corners=False).mean((2, 3))
        a2 = F.interpolate(h, size=(6, 6), mode="bicubic", align_corners=True).mean((2, 3))
        a3 = F.interpolate(h, scale_factor=2, mode="nearest").mean((2, 3))
        feats = [((h * t).mean((2, 3))) for t in (t1, t2, t3, t4, t5)] + [a1, a2, a3]
        return self.head(torch.tanh(torch.cat([f[:, :4] for f in feats[:7]], -1)))


class SymbolicSlice(nn.Module):
    def __init__(self, max_len=16):
        super().__init__()
        self.max_len = max_len
        self.fc = nn.Linear(D, D)
        self.bias = nn.Parameter(torch.randn(1, 1, max_len) * 0.5)
        self.table = nn.Parameter(torch.randn(max_len, D) * 0.5)
        self.out = nn.Linear(D, D)

    def forward(self, x):
        Tn = x.shape[1]
        h = self.fc(x)
        start = max(0, self.bias.size(2) - Tn)
        bias = self.bias[:, :, start:]  # MPT: [1, 1, T]
        scores = (h @ h.transpose(1, 2)) / math.sqrt(D) + bias
        h = scores.softmax(-1) @ h
        h = h + self.table[-Tn:]  # the last T rows
        first = h[:, 1 - Tn:]  # Max(0, 1 - T) .. : every row but none dropped when T >= 1
        half = h[:, : Tn // 2].mean(1, keepdim=True)
        return self.out(first + half)


def batchnorm_modes():
    torch.manual_seed(140)
    model = BatchNormModes()
    with torch.no_grad():
        for bn in (model.bn2d, model.bn1d):
            bn.running_mean.normal_(0.0, 0.2)
            bn.running_var.uniform_(0.5, 1.5)
            bn.weight.normal_(1.0, 0.2)
            bn.bias.normal_(0.0, 0.1)
    return model.eval(), {"x": _x(140, B, 3, 8, 8)}


def addmm_alpha_beta():
    torch.manual_seed(141)
    return _eval(AddmmAlphaBeta(), 141), {"x": _x(141)}


def interpolate_modes():
    torch.manual_seed(142)
    return _eval(InterpolateModes(), 142), {"x": _x(142, B, 3, 8, 8)}


def symbolic_slice():
    torch.manual_seed(143)
    return _eval(SymbolicSlice(), 143), {"x": _x(143)}


# --------------------------------------------------------------------------- (5) pads from shapes
class PadsFromShape(nn.Module):
    """Chunked (block-local) attention over blocks of 3: T = 8 is padded to 9 and unpadded."""

    def __init__(self, block=3):
        super().__init__()
        self.block = block
        self.qkv = nn.Linear(D, 3 * D)
        self.out = nn.Linear(D, D)

    def forward(self, x):
        Bn, Tn, C = x.shape
        pad = (self.block - Tn % self.block) % self.block
        h = F.pad(x, (0, 0, 0, pad))
        n_blocks = h.shape[1] // self.block
        q, k, v = self.qkv(h).reshape(Bn, n_blocks, self.block, 3, C).unbind(3)
        attn = (q @ k.transpose(-1, -2) / math.sqrt(C)).softmax(-1) @ v
        attn = attn.reshape(Bn, n_blocks * self.block, C)[:, :Tn]
        return self.out(attn)


def pads_from_shape():
    torch.manual_seed(150)
    return _eval(PadsFromShape(), 150), {"x": _x(150)}


# --------------------------------------------------------------------------- (6) frozen parameters
class FrozenParams(nn.Module):
    def __init__(self, max_pos=16):
        super().__init__()
        self.embed_positions = nn.Embedding(max_pos, D)
        with torch.no_grad():  # Whisper's sinusoids
            pos = torch.arange(max_pos)[:, None]
            inv = torch.exp(-math.log(10000) * torch.arange(D // 2) / (D // 2 - 1))
            self.embed_positions.weight.copy_(torch.cat([torch.sin(pos * inv), torch.cos(pos * inv)], 1))
        self.embed_positions.requires_grad_(False)
        self.first = nn.Linear(D, D)
        self.first.requires_grad_(False)
        self.norm = nn.LayerNorm(D)
        self.norm.weight.requires_grad = False
        self.out = nn.Linear(D, D)

    def forward(self, x):
        h = x + self.embed_positions.weight[: x.shape[1]]
        return self.out(self.norm(F.gelu(self.first(h))))


def frozen_params():
    torch.manual_seed(160)
    model = FrozenParams()
    with torch.no_grad():
        model.norm.weight.normal_(1.0, 0.1)
    return model.eval(), {"x": _x(160)}


# ----------------------------------------------------------------------- (7) zero true gradients
class ZeroTrueGrads(nn.Module):
    def __init__(self):
        super().__init__()
        self.q = nn.Linear(D, D)
        self.k = nn.Linear(D, D)  # its bias: constant along the softmax axis -> true gradient 0
        self.v = nn.Linear(D, D)
        self.row_shift = nn.Parameter(torch.ones(1))  # scales a per-query term, constant along the softmax axis
        self.pre_norm_shift = nn.Parameter(torch.randn(1))  # a constant added before LayerNorm
        self.norm = nn.LayerNorm(D)
        self.gate = nn.Parameter(torch.randn(D))  # reaches the output only through a comparison
        self.out = nn.Linear(D, D)

    def forward(self, x):
        scores = self.q(x) @ self.k(x).transpose(-1, -2) / math.sqrt(D) + self.row_shift * x.mean(-1, keepdim=True)
        h = scores.softmax(-1) @ self.v(x)
        h = self.norm(h + self.pre_norm_shift)
        h = h * (self.gate > 0).to(h.dtype)
        return self.out(h)


def zero_true_grads():
    torch.manual_seed(170)
    model = ZeroTrueGrads()
    with torch.no_grad():
        model.k.bias.normal_(0.0, 0.5)
    return model.eval(), {"x": _x(170)}


# ---------------------------------------------------------------------------- (8) multi-line calls
class MultilineCall(nn.Module):
    def __init__(self, heads=4):
        super().__init__()
        self.heads = heads
        self.w = nn.Parameter(torch.randn(D) * 0.1 + 1.0)
        self.b = nn.Parameter(torch.randn(D) * 0.1)
        self.qkv = nn.Linear(D, 3 * D)
        self.out = nn.Linear(2 * D, D)

    def forward(self, x):
        Bn, Tn, _ = x.shape
        h = F.layer_norm(
            x,
            (D,),
            weight=self.w,
            bias=self.b,
            eps=1e-2,
        )
        q, k, v = (
            self.qkv(h)
            .reshape(Bn, Tn, 3, self.heads, D // self.heads)
            .permute(2, 0, 3, 1, 4)
        )
        a = F.scaled_dot_product_attention(
            q, k, v,
            is_causal=True,
            scale=0.5,
        ).transpose(1, 2).reshape(Bn, Tn, D)
        return self.out(torch.cat(
            [a, h],
            dim=-1,
        ))


def multiline_call():
    torch.manual_seed(180)
    return _eval(MultilineCall(), 180), {"x": _x(180)}


# -------------------------------------------------------------------------------- (9) found later
def top_level_sequential():
    torch.manual_seed(190)
    model = nn.Sequential(nn.Linear(D, 64), nn.GELU(), nn.LayerNorm(64), nn.Linear(64, D))
    return model.eval(), {"input": _x(190)}


class WeightNorm(nn.Module):
    def __init__(self):
        super().__init__()
        import warnings
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self.old = nn.utils.weight_norm(nn.Conv1d(D, D, 3, padding=1), name="weight", dim=2)
        self.new = nn.utils.parametrizations.weight_norm(nn.Conv1d(D, D, 3, padding=1, groups=4), name="weight", dim=2)
        self.out = nn.Linear(D, D)

    def forward(self, x):
        h = F.gelu(self.old(x.transpose(1, 2)))
        h = F.gelu(self.new(h)).transpose(1, 2)
        return self.out(h + x)


def weight_norm():
    torch.manual_seed(191)
    return WeightNorm().eval(), {"x": _x(191)}


ALL = {
    "defect_mutate_setitem": mutate_setitem, "defect_mutate_index_put": mutate_index_put,
    "defect_mutate_copy_scatter": mutate_copy_scatter, "defect_mutate_fill_masked": mutate_fill_masked,
    "defect_mutate_view_arith": mutate_view_arith,
    "defect_tied_head_bias": tied_head_bias, "defect_tied_embed_subclass": tied_embed_subclass,
    "defect_shared_module": shared_module, "defect_tied_transpose": tied_transpose,
    "defect_module_on_buffer": module_on_buffer, "defect_module_on_weight": module_on_weight,
    "defect_batchnorm_modes": batchnorm_modes, "defect_addmm_alpha_beta": addmm_alpha_beta,
    "defect_interpolate_modes": interpolate_modes, "defect_symbolic_slice": symbolic_slice,
    "defect_pads_from_shape": pads_from_shape, "defect_frozen_params": frozen_params,
    "defect_zero_true_grads": zero_true_grads, "defect_multiline_call": multiline_call,
    "defect_top_level_sequential": top_level_sequential, "defect_weight_norm": weight_norm,
}
