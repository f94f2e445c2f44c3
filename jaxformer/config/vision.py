"""Configs for the vision and time-series models (ViT, Swin, TCN-Transformer), shared by both trees.

Imports neither jax nor torch. Images are channels-last [B, H, W, C] in both frameworks; series
are [B, L, C] (L time steps). Every default that differs between frameworks or reference
implementations (LayerNorm eps, GELU variant, conv padding) is a named field here.
"""
from __future__ import annotations

from dataclasses import dataclass

from jaxformer.config.base import check, check_choice, check_positive, check_prob
from jaxformer.config.transformer import FFN_KINDS, NORM_POSITIONS, TransformerConfig

VIT_POOLS = ("cls", "mean", "cls_mean")
VIT_HEADS = ("classifier", "pooler")
TCN_PADDINGS = ("causal", "same")
TS_POSITIONS = ("sinusoidal", "learned", "none")
TS_POOLS = ("last", "mean")


def _check_eps(obj, name: str = "norm_eps") -> None:
    value = getattr(obj, name)
    check(isinstance(value, float) and value > 0, name, f"must be a float > 0, got {value!r}")


@dataclass(frozen=True)
class ViTConfig:
    """ViT (Dosovitskiy et al. 2021): patchify conv, [CLS] token, learned positions, Pre-LN
    encoder, classification head. HF ViT uses norm_eps=1e-12 and exact GELU ("gelu").

    DINOv2 (Oquab et al. 2023; HF Dinov2Model / Dinov2ForImageClassification) is this model
    with layer_scale (LayerScale on every sublayer output, also timm's ViTs with init_values),
    interpolate_positions (other image sizes, the position table resampled bicubically as
    torch does; docs/numerics.md §37) and pool="cls_mean" (the head reads [CLS] concatenated
    with the mean of the patch outputs); num_classes=0 is the headless model (Dinov2Model)."""

    image_size: int = 16  # square images, H = W = image_size (the position table's grid)
    patch_size: int = 4
    num_channels: int = 3
    num_classes: int = 10  # 0 = no head: the model returns the pooled features (timm's convention)
    d_model: int = 64
    num_heads: int = 4
    d_ff: int = 128
    num_layers: int = 2
    ffn: str = "gelu"
    norm_eps: float = 1e-6  # big_vision / the paper's code; HF ViT uses 1e-12
    bias: bool = True  # biases on o_proj and the FFN, and on q/k/v unless qkv_bias says otherwise
    qkv_bias: bool | None = None  # biases on q/k/v; None = bias (HF ViT's qkv_bias)
    class_token: bool = True
    pool: str = "cls"  # "cls": the [CLS] output; "mean": mean of the patch outputs;
    #   "cls_mean": [CLS] concatenated with the mean of the patch outputs, [B, 2D] (DINOv2's head)
    layer_scale: float | None = None  # LayerScale's initial value; None = no LayerScale
    interpolate_positions: bool = False  # accept H x W other than image_size x image_size: the
    #   patch positions are resampled bicubically to the image's grid (HF DINOv2; §37)
    # "classifier": logits [B, num_classes] (num_classes=0: the pooled features); "pooler": HF
    # ViTModel's pooler, tanh(dense) of the [CLS] output -> [B, D] (num_classes unused)
    head: str = "classifier"
    scan_layers: bool = False  # JAX: run the encoder layers with lax.scan over stacked params
    dropout: float = 0.0
    attn_dropout: float = 0.0
    embed_dropout: float = 0.0

    def __post_init__(self) -> None:
        check_positive(self, "image_size", "patch_size", "num_channels", "d_model",
                       "num_heads", "d_ff", "num_layers")
        check_choice(self, "head", VIT_HEADS)
        check(self.head != "pooler" or self.pool == "cls", "head",
              "head='pooler' (HF ViTModel's pooler) pools the [CLS] output: it needs pool='cls'")
        check(isinstance(self.num_classes, int) and self.num_classes >= 0, "num_classes",
              f"must be an int >= 0 (0 = no head), got {self.num_classes!r}")
        check(self.image_size % self.patch_size == 0, "image_size",
              f"image_size={self.image_size} is not divisible by patch_size={self.patch_size}")
        check(self.d_model % self.num_heads == 0, "d_model",
              f"d_model={self.d_model} is not divisible by num_heads={self.num_heads}")
        check_choice(self, "ffn", FFN_KINDS)
        check_choice(self, "pool", VIT_POOLS)
        check(self.pool not in ("cls", "cls_mean") or self.class_token, "pool",
              f"pool={self.pool!r} needs class_token=True (use pool='mean' without a class token)")
        check(self.layer_scale is None or (isinstance(self.layer_scale, (int, float))
                                           and not isinstance(self.layer_scale, bool)), "layer_scale",
              f"must be a number (LayerScale's initial value) or null, got {self.layer_scale!r}")
        check_prob(self, "dropout", "attn_dropout", "embed_dropout")
        _check_eps(self)

    @property
    def grid_size(self) -> int:
        return self.image_size // self.patch_size

    @property
    def num_patches(self) -> int:
        return self.grid_size ** 2

    @property
    def num_tokens(self) -> int:
        return self.num_patches + int(self.class_token)

    @property
    def pooled_dim(self) -> int:
        """The width of the pooled vector the head reads: 2D for "cls_mean", else D."""
        return 2 * self.d_model if self.pool == "cls_mean" else self.d_model

    def encoder_config(self) -> TransformerConfig:
        """The Pre-LN encoder stack; positions are added by the model, not the stack."""
        return TransformerConfig(
            vocab_size=1, d_model=self.d_model, num_heads=self.num_heads, d_ff=self.d_ff,
            num_layers=self.num_layers, ffn=self.ffn, norm="layernorm", norm_eps=self.norm_eps,
            norm_position="pre", final_norm=True, bias=self.bias, attn_qkv_bias=self.qkv_bias,
            dropout=self.dropout,
            attn_dropout=self.attn_dropout, position="none", max_len=self.num_tokens,
            scale_embedding=False, scan_layers=self.scan_layers, layer_scale=self.layer_scale)


@dataclass(frozen=True)
class SwinConfig:
    """Swin Transformer (Liu et al. 2021), laid out like HF SwinForImageClassification.

    Stage i has depths[i] blocks of width embed_dim * 2**i with num_heads[i] heads, alternating
    W-MSA and SW-MSA (shift window_size // 2); a patch merging layer halves the resolution
    between stages. Inputs of any size are padded like HF (to the patch size, to the window,
    to even sizes before merging); where a stage's resolution is <= window_size the window is
    clamped to it and the shift is dropped (HF's rule)."""

    image_size: int = 32  # nominal input size (data, docs); other sizes are padded, not rejected
    patch_size: int = 2
    num_channels: int = 3
    num_classes: int = 10
    embed_dim: int = 32
    depths: tuple[int, ...] = (2, 2)
    num_heads: tuple[int, ...] = (2, 4)
    window_size: int = 4
    mlp_ratio: float = 4.0
    qkv_bias: bool = True  # o_proj and the MLP always have biases (HF, reference code)
    ffn: str = "gelu"  # HF hidden_act="gelu" is exact GELU
    norm_eps: float = 1e-5  # the blocks' and the final LayerNorm (HF layer_norm_eps)
    patch_norm_eps: float = 1e-5  # the patch-embedding and patch-merging norms: HF builds them
    # with torch's default eps whatever layer_norm_eps says
    dropout: float = 0.0  # on attention and MLP outputs (HF hidden_dropout_prob)
    attn_dropout: float = 0.0
    embed_dropout: float = 0.0  # after the patch embedding (HF hidden_dropout_prob too)
    drop_path_rate: float = 0.0  # stochastic depth, linear in block index (HF, timm)

    def __post_init__(self) -> None:
        check_positive(self, "image_size", "patch_size", "num_channels", "num_classes",
                       "embed_dim", "window_size")
        check(len(self.depths) > 0, "depths", "needs at least one stage")
        check(len(self.depths) == len(self.num_heads), "num_heads",
              f"has {len(self.num_heads)} entries but depths has {len(self.depths)}")
        for i, (d, h) in enumerate(zip(self.depths, self.num_heads, strict=True)):
            check(isinstance(d, int) and d > 0, f"depths[{i}]", f"must be a positive int, got {d!r}")
            check(isinstance(h, int) and h > 0, f"num_heads[{i}]", f"must be a positive int, got {h!r}")
            check(self.stage_dim(i) % h == 0, f"num_heads[{i}]",
                  f"stage width {self.stage_dim(i)} is not divisible by {h} heads")
        check(self.mlp_ratio > 0 and int(self.mlp_ratio * self.embed_dim) > 0, "mlp_ratio",
              f"must be > 0, got {self.mlp_ratio}")
        check_choice(self, "ffn", FFN_KINDS)
        check(self.ffn not in ("swiglu", "geglu", "geglu_tanh"), "ffn",
              f"Swin's MLP is not gated; use relu, gelu or gelu_tanh, got {self.ffn!r}")
        check_prob(self, "dropout", "attn_dropout", "embed_dropout", "drop_path_rate")
        _check_eps(self)
        _check_eps(self, "patch_norm_eps")

    def stage_dim(self, i: int) -> int:
        return self.embed_dim * 2 ** i

    @property
    def num_features(self) -> int:
        return self.stage_dim(len(self.depths) - 1)

    def drop_path_rates(self) -> list[float]:
        """One rate per block, 0 -> drop_path_rate linearly over all blocks."""
        n = sum(self.depths)
        return [self.drop_path_rate * i / max(n - 1, 1) for i in range(n)]


@dataclass(frozen=True)
class TimeSeriesConfig:
    """TCN + Transformer forecaster (Bai et al. 2018 for the TCN): Conv1d+ReLU layers with
    explicit padding, positions, an encoder stack, then a head that predicts the next
    `horizon` values of the `target_channels`.

    padding="causal" pads (k-1)*dilation on the left only, so step t sees inputs <= t;
    padding="same" splits it (left = total // 2, the rest right, like torch padding='same')."""

    input_len: int = 48  # L: the longest series the model accepts (positions table size)
    num_channels: int = 1  # C: input channels
    target_channels: tuple[int, ...] = (0,)  # input channels to forecast; C_out = len(...)
    horizon: int = 8
    d_model: int = 32
    num_heads: int = 4
    d_ff: int = 64
    num_layers: int = 2
    conv_layers: int = 2
    kernel_size: int = 3
    dilation_base: int = 1  # layer i uses dilation dilation_base ** i (2 = WaveNet/TCN style)
    padding: str = "causal"
    ffn: str = "relu"
    norm_position: str = "post"  # nn.TransformerEncoderLayer's default
    norm_eps: float = 1e-5
    final_norm: bool = False  # as nn.TransformerEncoder without `norm`
    position: str = "sinusoidal"
    pool: str = "last"  # head input: the last step's state, or the mean over steps
    dropout: float = 0.0
    attn_dropout: float = 0.0

    def __post_init__(self) -> None:
        check_positive(self, "input_len", "num_channels", "horizon", "d_model", "num_heads",
                       "d_ff", "num_layers", "conv_layers", "kernel_size", "dilation_base")
        check(len(self.target_channels) > 0, "target_channels", "needs at least one channel")
        for i, c in enumerate(self.target_channels):
            check(isinstance(c, int) and 0 <= c < self.num_channels, f"target_channels[{i}]",
                  f"must be a channel in [0, num_channels={self.num_channels}), got {c!r}")
        check(len(set(self.target_channels)) == len(self.target_channels), "target_channels",
              f"has duplicates: {self.target_channels}")
        check(self.d_model % self.num_heads == 0, "d_model",
              f"d_model={self.d_model} is not divisible by num_heads={self.num_heads}")
        check_choice(self, "padding", TCN_PADDINGS)
        check_choice(self, "ffn", FFN_KINDS)
        check_choice(self, "norm_position", NORM_POSITIONS)
        check_choice(self, "position", TS_POSITIONS)
        check_choice(self, "pool", TS_POOLS)
        check_prob(self, "dropout", "attn_dropout")
        _check_eps(self)
        check(self.input_len >= self.receptive_field, "input_len",
              f"input_len={self.input_len} is shorter than the conv stack's receptive field "
              f"{self.receptive_field}")

    @property
    def num_targets(self) -> int:
        return len(self.target_channels)

    def dilation(self, i: int) -> int:
        return self.dilation_base ** i

    @property
    def receptive_field(self) -> int:
        """Input steps that one output step of the conv stack sees: 1 + sum((k-1) * d_i)."""
        return 1 + sum((self.kernel_size - 1) * self.dilation(i) for i in range(self.conv_layers))

    def conv_padding(self, i: int) -> tuple[int, int]:
        """(left, right) zero padding of conv layer i; output length = input length."""
        total = (self.kernel_size - 1) * self.dilation(i)
        return (total, 0) if self.padding == "causal" else (total // 2, total - total // 2)

    def encoder_config(self) -> TransformerConfig:
        return TransformerConfig(
            vocab_size=1, d_model=self.d_model, num_heads=self.num_heads, d_ff=self.d_ff,
            num_layers=self.num_layers, ffn=self.ffn, norm="layernorm", norm_eps=self.norm_eps,
            norm_position=self.norm_position, final_norm=self.final_norm, dropout=self.dropout,
            attn_dropout=self.attn_dropout, position="none", max_len=self.input_len,
            scale_embedding=False)
