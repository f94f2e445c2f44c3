"""The PyTorch components of the second seed tutorial (/work/shared/seeds/004_*.txt, a Chinese
Transformer overview), as it defines them: MultiHeadAttention (w_q/w_k/w_v/fc_out, masked_fill
with -1e9 where mask == 0), PositionalEncoding as a buffer, FeedForward, Post-LN EncoderLayer /
Encoder / DecoderLayer, the encoder-decoder Transformer, ViT's Conv2d PatchEmbedding, and the
TCN + Transformer for time series.

The tutorial uses a `Decoder` it never defines; here it is the Encoder's twin over DecoderLayers.
Its TCNTransformer builds nn.TransformerEncoderLayer without batch_first, then feeds it
[batch, seq, d_model]: the encoder attends across the batch axis. That is the code as written,
and it is kept: a port must reproduce it, not fix it. Its generate_tgt_mask (a -inf float mask)
would be inverted by this MultiHeadAttention's `mask == 0` test, so the decoder's mask here is
the 1-keeps tril form the attention expects.
"""
import math

import numpy as np
import torch
import torch.nn as nn


class MultiHeadAttention(nn.Module):
    def __init__(self, d_model, num_heads):
        super().__init__()
        assert d_model % num_heads == 0
        self.d_model = d_model
        self.num_heads = num_heads
        self.head_dim = d_model // num_heads
        self.w_q = nn.Linear(d_model, d_model)
        self.w_k = nn.Linear(d_model, d_model)
        self.w_v = nn.Linear(d_model, d_model)
        self.fc_out = nn.Linear(d_model, d_model)

    def forward(self, query, key, value, mask=None):
        batch_size = query.shape[0]
        # 1. 线性变换并拆成多头
        Q = self.w_q(query).view(batch_size, -1, self.num_heads, self.head_dim).transpose(1, 2)
        K = self.w_k(key).view(batch_size, -1, self.num_heads, self.head_dim).transpose(1, 2)
        V = self.w_v(value).view(batch_size, -1, self.num_heads, self.head_dim).transpose(1, 2)
        # 2. 计算注意力分数
        scores = torch.matmul(Q, K.transpose(-2, -1)) / math.sqrt(self.head_dim)
        # 3. 应用掩码
        if mask is not None:
            scores = scores.masked_fill(mask == 0, -1e9)
        # 4. Softmax 归一化
        attention = torch.softmax(scores, dim=-1)
        # 5. 加权求和
        out = torch.matmul(attention, V)
        # 6. 合并多头
        out = out.transpose(1, 2).contiguous().view(batch_size, -1, self.d_model)
        out = self.fc_out(out)
        return out


class PositionalEncoding(nn.Module):
    def __init__(self, d_model, max_len=5000):
        super().__init__()
        pe = torch.zeros(max_len, d_model)
        position = torch.arange(0, max_len, dtype=torch.float).unsqueeze(1)
        div_term = torch.exp(torch.arange(0, d_model, 2).float() * (-math.log(10000.0) / d_model))
        pe[:, 0::2] = torch.sin(position * div_term)
        pe[:, 1::2] = torch.cos(position * div_term)
        pe = pe.unsqueeze(0)  # [1, max_len, d_model]
        self.register_buffer('pe', pe)

    def forward(self, x):
        return x + self.pe[:, :x.size(1), :]


class FeedForward(nn.Module):
    def __init__(self, d_model, d_ff=2048, dropout=0.1):
        super().__init__()
        self.linear1 = nn.Linear(d_model, d_ff)
        self.linear2 = nn.Linear(d_ff, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        return self.linear2(self.dropout(torch.relu(self.linear1(x))))


class EncoderLayer(nn.Module):
    def __init__(self, d_model, num_heads, d_ff=2048, dropout=0.1):
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, num_heads)
        self.ffn = FeedForward(d_model, d_ff, dropout)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x, mask=None):
        attn_out = self.self_attn(x, x, x, mask)
        x = self.norm1(x + self.dropout(attn_out))
        ffn_out = self.ffn(x)
        x = self.norm2(x + self.dropout(ffn_out))
        return x


class Encoder(nn.Module):
    def __init__(self, d_model, num_heads, num_layers=6, d_ff=2048, dropout=0.1):
        super().__init__()
        self.layers = nn.ModuleList([EncoderLayer(d_model, num_heads, d_ff, dropout) for _ in range(num_layers)])

    def forward(self, x, mask=None):
        for layer in self.layers:
            x = layer(x, mask)
        return x


class DecoderLayer(nn.Module):
    def __init__(self, d_model, num_heads, d_ff=2048, dropout=0.1):
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, num_heads)
        self.cross_attn = MultiHeadAttention(d_model, num_heads)
        self.ffn = FeedForward(d_model, d_ff, dropout)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.norm3 = nn.LayerNorm(d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x, enc_output, src_mask=None, tgt_mask=None):
        attn_out = self.self_attn(x, x, x, tgt_mask)
        x = self.norm1(x + self.dropout(attn_out))
        # 交叉注意力：Q 来自 decoder，K、V 来自 encoder
        attn_out = self.cross_attn(x, enc_output, enc_output, src_mask)
        x = self.norm2(x + self.dropout(attn_out))
        ffn_out = self.ffn(x)
        x = self.norm3(x + self.dropout(ffn_out))
        return x


class Decoder(nn.Module):
    def __init__(self, d_model, num_heads, num_layers=6, d_ff=2048, dropout=0.1):
        super().__init__()
        self.layers = nn.ModuleList([DecoderLayer(d_model, num_heads, d_ff, dropout) for _ in range(num_layers)])

    def forward(self, x, enc_output, src_mask=None, tgt_mask=None):
        for layer in self.layers:
            x = layer(x, enc_output, src_mask, tgt_mask)
        return x


class Transformer(nn.Module):
    def __init__(self, src_vocab_size, tgt_vocab_size, d_model=512, num_heads=8, num_layers=6, d_ff=2048,
                 max_len=100, dropout=0.1):
        super().__init__()
        self.encoder_embedding = nn.Embedding(src_vocab_size, d_model)
        self.decoder_embedding = nn.Embedding(tgt_vocab_size, d_model)
        self.positional_encoding = PositionalEncoding(d_model, max_len)
        self.encoder = Encoder(d_model, num_heads, num_layers, d_ff, dropout)
        self.decoder = Decoder(d_model, num_heads, num_layers, d_ff, dropout)
        self.fc_out = nn.Linear(d_model, tgt_vocab_size)

    def forward(self, src, tgt, src_mask=None, tgt_mask=None):
        src_embedded = self.positional_encoding(self.encoder_embedding(src))
        enc_output = self.encoder(src_embedded, src_mask)
        tgt_embedded = self.positional_encoding(self.decoder_embedding(tgt))
        dec_output = self.decoder(tgt_embedded, enc_output, src_mask, tgt_mask)
        output = self.fc_out(dec_output)
        return output


class PatchEmbedding(nn.Module):
    def __init__(self, img_size=224, patch_size=16, in_channels=3, embed_dim=768):
        super().__init__()
        num_patches = (img_size // patch_size) ** 2  # noqa: F841 (the tutorial computes it and keeps nothing)
        self.proj = nn.Conv2d(in_channels, embed_dim, kernel_size=patch_size, stride=patch_size)

    def forward(self, x):
        x = self.proj(x)  # [batch_size, embed_dim, num_patches_height, num_patches_width]
        x = x.flatten(2)  # [batch_size, embed_dim, num_patches]
        x = x.transpose(1, 2)  # [batch_size, num_patches, embed_dim]
        return x


class TCNTransformer(nn.Module):
    def __init__(self, input_dim, d_model, num_heads, num_layers, kernel_size=3):
        super().__init__()
        self.tcn = nn.Sequential(
            nn.Conv1d(input_dim, d_model, kernel_size, padding=kernel_size // 2),
            nn.ReLU(),
            nn.Conv1d(d_model, d_model, kernel_size, padding=kernel_size // 2),
            nn.ReLU(),
        )
        encoder_layer = nn.TransformerEncoderLayer(d_model=d_model, nhead=num_heads)
        self.transformer = nn.TransformerEncoder(encoder_layer, num_layers=num_layers)

    def forward(self, x):
        # x: [batch_size, seq_len, input_dim]
        x_tcn = self.tcn(x.transpose(1, 2)).transpose(1, 2)
        x_out = self.transformer(x_tcn)
        return x_out


def make_transformer():
    torch.manual_seed(0)
    model = Transformer(src_vocab_size=64, tgt_vocab_size=48, d_model=32, num_heads=4, num_layers=2, d_ff=64,
                        max_len=32)
    rng = np.random.RandomState(0)
    src = rng.randint(1, 64, size=(2, 8)).astype(np.int64)
    src[0, 6:] = 0
    tgt = rng.randint(1, 48, size=(2, 7)).astype(np.int64)
    src_mask = (src != 0)[:, None, None, :]                       # (B, 1, 1, S)
    tgt_mask = np.tril(np.ones((7, 7), bool))[None, None]         # (1, 1, T, T)
    return model.eval(), {"src": src, "tgt": tgt, "src_mask": src_mask, "tgt_mask": tgt_mask}


def make_patch_embedding():
    torch.manual_seed(1)
    model = PatchEmbedding(img_size=16, patch_size=4, in_channels=3, embed_dim=32)
    x = np.random.RandomState(1).standard_normal((2, 3, 16, 16)).astype(np.float32)
    return model.eval(), {"x": x}


def make_tcn_transformer():
    torch.manual_seed(2)
    # nn.TransformerEncoderLayer's own defaults: dim_feedforward 2048, ReLU, Post-LN, seq-first
    model = TCNTransformer(input_dim=3, d_model=16, num_heads=2, num_layers=2)
    x = np.random.RandomState(2).standard_normal((2, 8, 3)).astype(np.float32)
    return model.eval(), {"x": x}
