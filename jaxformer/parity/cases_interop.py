"""Parity cases for jaxformer.interop: a live torch.nn module, called as its users call it,
against the twin interop.from_torch builds, called with the masks interop.masks_from_torch
converts from the same call's arguments and flags (docs/numerics.md §23).

- nn.MultiheadAttention(add_bias_kv=True, add_zero_attn=True) called with is_causal=True and no
  key_padding_mask: torch's need_weights=False path (SDPA's causal mask over the S + 2 keys)
  hides the two appended slots, its need_weights=True path (attn_mask, slots padded visible)
  shows them; the two differ by 0.34-0.92. One case per path: masks_from_torch is given the
  call's need_weights (without it the call is refused, as the paths differ).

The torch module's keys are mapped onto the twin's by interop.torch_state (in_proj split into
q/k/v_proj, out_proj -> o_proj, bias_k / bias_v [1, 1, E] -> [E]), for the weights and for
every parameter's gradient.
"""
from __future__ import annotations

from jaxformer.parity.cases import case, normal

B, T, D, H = 2, 5, 16, 4


def _mha_state(torch_module, sd: dict) -> dict:
    """{"attn.<torch name>": tensor} -> {"attn.<twin key>": tensor}."""
    from jaxformer import interop
    inner = interop.torch_state(torch_module.attn, {k.removeprefix("attn."): v for k, v in sd.items()})
    return {f"attn.{k}": v for k, v in inner.items()}


def _mha_is_causal(need_weights: bool):
    """Builder: torch's nn.MultiheadAttention with both appended slots, called with
    is_causal=True and `need_weights`, and its interop twin, called with the mask
    masks_from_torch gives for the same flags."""
    def build(seed: int):
        import numpy as np
        import torch
        from flax import nnx
        from torch import nn

        from jaxformer import interop

        class TorchCall(nn.Module):
            def __init__(self, attn):
                super().__init__()
                self.attn = attn

            def forward(self, x):  # [B, T, D]
                causal = nn.Transformer.generate_square_subsequent_mask(x.shape[1], dtype=x.dtype)  # 0 / -inf
                return self.attn(x, x, x, attn_mask=causal, is_causal=True, need_weights=need_weights)[0]

        class FlaxCall(nnx.Module):
            def __init__(self, attn):
                self.attn = attn

            def __call__(self, x):  # [B, T, D]
                t = x.shape[1]
                causal = np.triu(np.full((t, t), -np.inf, np.float32), 1)  # torch's, 0 / -inf
                mask, bias = interop.masks_from_torch(attn_mask=causal, is_causal=True, need_weights=need_weights,
                                                      attention=self.attn)
                return self.attn(x, mask=mask, bias=bias)

        torch.manual_seed(seed)
        mha = nn.MultiheadAttention(D, H, batch_first=True, add_bias_kv=True, add_zero_attn=True).eval()
        with torch.no_grad():  # torch inits these to 0 or near it: random ones make the slots matter
            for p in (mha.in_proj_bias, mha.out_proj.bias, mha.bias_v):
                p.normal_()
        return TorchCall(mha).eval(), FlaxCall(interop.from_torch(mha))
    return build


for need_weights, path in ((False, "sdpa"), (True, "weights")):
    case(f"interop_mha_slots_is_causal_{path}", "interop", _mha_is_causal(need_weights),
         lambda r: {"x": normal(B, T, D)(r)},
         state_map=_mha_state)


# ----------------------------------------------------------------- torch.nn's own options
# kdim / vdim, add_bias_kv, add_zero_attn: interop.TorchMultiheadAttention against
# nn.MultiheadAttention itself. Keys and values from streams of other widths; learned and zero
# key/value slots, which stay visible in a row whose every key is masked, and under which the
# key bias keeps its gradient (docs/numerics.md §23). Both sides get the same bool mask [B, 1,
# T, S] and additive bias [B, H, T, S]: torch as one float attn_mask [B * H, T, S] (-inf where
# masked), which it pads with visible columns for the slots, as the twin pads its mask and bias.
S = 4


def _mha_options(need_weights: bool = False, **options):
    """Builder: nn.MultiheadAttention(**options), called with (x, kv, value, mask, bias) as
    above, and its interop twin called with the mask and bias themselves."""
    def build(seed: int):
        import torch
        from flax import nnx
        from torch import nn

        from jaxformer import interop

        class TorchCall(nn.Module):
            def __init__(self, attn):
                super().__init__()
                self.attn = attn

            def forward(self, x, mask, kv=None, value=None, bias=None):
                kv = x if kv is None else kv
                value = kv if value is None else value
                full = (x.shape[0], H, x.shape[1], kv.shape[1])  # [B, H, T, S]
                mask = torch.as_tensor(mask).expand(full)
                add = torch.zeros(full) if bias is None else bias.expand(full)
                attn_mask = add.masked_fill(~mask, float("-inf")).reshape(-1, *full[2:])  # [B * H, T, S]
                out, weights = self.attn(x, kv, value, attn_mask=attn_mask, need_weights=need_weights,
                                         average_attn_weights=False)
                return (out, weights) if need_weights else out

        class FlaxCall(nnx.Module):
            def __init__(self, attn):
                self.attn = attn

            def __call__(self, x, mask, kv=None, value=None, bias=None):
                return self.attn(x, kv, value=value, mask=mask, bias=bias, return_weights=need_weights)

        torch.manual_seed(seed)
        mha = nn.MultiheadAttention(D, H, batch_first=True, **options).eval()
        with torch.no_grad():  # torch inits the biases to 0: random ones make them matter
            for p in (mha.in_proj_bias, mha.out_proj.bias, mha.bias_v):
                if p is not None:
                    p.normal_()
        return TorchCall(mha).eval(), FlaxCall(interop.from_torch(mha))
    return build


def _pad(lengths, s):
    """Key padding [B, 1, 1, s] bool, True = attend."""
    import numpy as np
    return (np.arange(s)[None, :] < np.asarray(lengths)[:, None])[:, None, None, :]


def _no_keys():
    """[B, 1, T, T]: batch row 1's query 2 sees no key at all (only the appended slots)."""
    import numpy as np
    m = np.ones((B, 1, T, T), bool)
    m[1, 0, 2] = False
    return m


case("interop_mha_kdim_vdim_cross", "interop", _mha_options(kdim=24, vdim=20),
     lambda r: {"x": normal(B, T, D)(r), "kv": normal(B, S, 24)(r), "value": normal(B, S, 20)(r),
                "mask": _pad([4, 2], S)},
     state_map=_mha_state)
case("interop_mha_bias_kv_zero_attn", "interop", _mha_options(add_bias_kv=True, add_zero_attn=True),
     lambda r: {"x": normal(B, T, D)(r), "mask": _no_keys() & _pad([5, 3], T), "bias": normal(B, H, T, T)(r)},
     state_map=_mha_state)
case("interop_mha_bias_kv_weights", "interop", _mha_options(need_weights=True, add_bias_kv=True),
     lambda r: {"x": normal(B, T, D)(r), "mask": _pad([5, 3], T)},
     state_map=_mha_state)
