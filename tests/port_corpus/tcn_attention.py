"""A TCN + attention forecaster: causal dilated Conv1d residual blocks (left padding by F.pad,
dilation 1, 2, 4), then one causal nn.MultiheadAttention (batch_first) over the time steps, and
a linear head that forecasts the next `horizon` values from the last step. Series are
[batch, time, channels] as a pandas user hands them over."""
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


class CausalConv1d(nn.Conv1d):
    def __init__(self, in_ch, out_ch, kernel_size, dilation=1):
        super().__init__(in_ch, out_ch, kernel_size, dilation=dilation, padding=0)
        self.left_pad = (kernel_size - 1) * dilation

    def forward(self, x):
        return super().forward(F.pad(x, (self.left_pad, 0)))


class TemporalBlock(nn.Module):
    def __init__(self, in_ch, out_ch, kernel_size, dilation, dropout=0.2):
        super().__init__()
        self.conv1 = CausalConv1d(in_ch, out_ch, kernel_size, dilation)
        self.conv2 = CausalConv1d(out_ch, out_ch, kernel_size, dilation)
        self.drop = nn.Dropout(dropout)
        self.downsample = nn.Conv1d(in_ch, out_ch, 1) if in_ch != out_ch else None

    def forward(self, x):
        out = self.drop(F.relu(self.conv1(x)))
        out = self.drop(F.relu(self.conv2(out)))
        res = x if self.downsample is None else self.downsample(x)
        return F.relu(out + res)


class TCNAttention(nn.Module):
    def __init__(self, n_features=3, channels=(16, 16, 16), kernel_size=3, n_heads=2, horizon=4):
        super().__init__()
        blocks = []
        for i, ch in enumerate(channels):
            blocks.append(TemporalBlock(n_features if i == 0 else channels[i - 1], ch, kernel_size, dilation=2 ** i))
        self.tcn = nn.Sequential(*blocks)
        self.attn = nn.MultiheadAttention(channels[-1], n_heads, batch_first=True)
        self.ln = nn.LayerNorm(channels[-1])
        self.head = nn.Linear(channels[-1], horizon)

    def forward(self, series):
        h = self.tcn(series.transpose(1, 2)).transpose(1, 2)   # [B, T, C]
        T = h.size(1)
        causal = torch.triu(torch.ones(T, T, dtype=torch.bool, device=h.device), diagonal=1)
        a, _ = self.attn(h, h, h, attn_mask=causal, need_weights=False)
        h = self.ln(h + a)
        return self.head(h[:, -1])                             # [B, horizon]


def make():
    torch.manual_seed(4)
    model = TCNAttention()
    t = np.arange(8, dtype=np.float32)
    rng = np.random.RandomState(4)
    series = np.stack([np.sin(t / 2.0 + p)[:, None] * np.ones(3, np.float32) for p in (0.0, 1.0)])
    series = (series + 0.1 * rng.standard_normal(series.shape)).astype(np.float32)
    return model.eval(), {"series": series}
