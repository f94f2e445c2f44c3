"""A conv-patch ViT on torch's own nn.TransformerEncoder (batch_first, pre-norm, GELU), the way
a course project writes it: Conv2d patchify, a learned [CLS] token and position embedding as
bare nn.Parameters, the [CLS] row through a LayerNorm + Linear head."""
import numpy as np
import torch
import torch.nn as nn


class ViT(nn.Module):
    def __init__(self, img_size=16, patch=4, in_ch=3, n_classes=10, dim=32, depth=2, heads=4, mlp_dim=64):
        super().__init__()
        n_patches = (img_size // patch) ** 2
        self.patch_embed = nn.Conv2d(in_ch, dim, kernel_size=patch, stride=patch)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.randn(1, n_patches + 1, dim) * .02)
        layer = nn.TransformerEncoderLayer(d_model=dim, nhead=heads, dim_feedforward=mlp_dim, dropout=0.1,
                                           activation="gelu", batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers=depth, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, n_classes)
        nn.init.trunc_normal_(self.cls_token, std=.02)

    def forward(self, img):
        x = self.patch_embed(img)              # B, dim, H/p, W/p
        x = x.flatten(2).transpose(1, 2)       # B, N, dim
        cls = self.cls_token.expand(x.shape[0], -1, -1)
        x = torch.cat([cls, x], dim=1) + self.pos_embed
        x = self.encoder(x)
        return self.head(self.norm(x[:, 0]))


def make():
    torch.manual_seed(3)
    model = ViT()
    img = np.random.RandomState(3).standard_normal((2, 3, 16, 16)).astype(np.float32)
    return model.eval(), {"img": img}
