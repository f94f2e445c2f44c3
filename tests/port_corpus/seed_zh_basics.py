"""The PyTorch components of the first seed tutorial (/work/shared/seeds/000_*.txt, a Chinese
from-scratch Transformer walk-through), as it defines them: ScaledDotProductAttention returning
(context, weights) with masked_fill(mask == 0, -1e9); a Post-LN MultiHeadAttention with the
residual and LayerNorm inside; the sinusoidal PositionalEncoding buffer with its own dropout;
PositionwiseFeedForward (ReLU) and a SwiGLU FFN; EncoderLayer, TransformerEncoder (embedding
scaled by sqrt(d_model)), the [CLS]-token TransformerClassifier returning (logits, attention
weights of every layer); the Pre-LN attention variant. The tutorial leaves some `class` lines
out; the names here are the ones its text uses.

Masks follow the attention's docstring: (batch, seq_len, seq_len) or anything broadcasting to it
before `unsqueeze(1)`. The tutorial's create_padding_mask returns (batch, 1, 1, seq_len), which
after that unsqueeze broadcasts the batch against itself; its training loop passes it anyway, and
that runs only at batch size 1, so here the padding mask is given as (batch, 1, seq_len).
"""
import math

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


class ScaledDotProductAttention(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, Q, K, V, mask=None):
        d_k = K.size(-1)
        # 计算注意力分数: Q @ K^T / sqrt(d_k)
        scores = torch.matmul(Q, K.transpose(-2, -1)) / math.sqrt(d_k)
        if mask is not None:
            scores = scores.masked_fill(mask == 0, -1e9)
        attention_weights = F.softmax(scores, dim=-1)
        context = torch.matmul(attention_weights, V)
        return context, attention_weights


class MultiHeadAttention(nn.Module):
    def __init__(self, d_model, num_heads, dropout=0.1):
        super().__init__()
        assert d_model % num_heads == 0, "d_model必须能被num_heads整除"
        self.d_model = d_model
        self.num_heads = num_heads
        self.d_k = d_model // num_heads
        self.W_q = nn.Linear(d_model, d_model)
        self.W_k = nn.Linear(d_model, d_model)
        self.W_v = nn.Linear(d_model, d_model)
        self.W_o = nn.Linear(d_model, d_model)
        self.attention = ScaledDotProductAttention()
        self.dropout = nn.Dropout(dropout)
        self.layer_norm = nn.LayerNorm(d_model)

    def forward(self, query, key, value, mask=None):
        batch_size = query.size(0)
        residual = query
        # 1. 线性投影
        Q = self.W_q(query)
        K = self.W_k(key)
        V = self.W_v(value)
        # 2. 分割多头
        Q = Q.view(batch_size, -1, self.num_heads, self.d_k).transpose(1, 2)
        K = K.view(batch_size, -1, self.num_heads, self.d_k).transpose(1, 2)
        V = V.view(batch_size, -1, self.num_heads, self.d_k).transpose(1, 2)
        # 3. 扩展mask维度以匹配多头
        if mask is not None:
            mask = mask.unsqueeze(1)
        # 4. 计算注意力
        context, attn_weights = self.attention(Q, K, V, mask)
        # 5. 合并多头
        context = context.transpose(1, 2).contiguous()
        context = context.view(batch_size, -1, self.d_model)
        # 6. 输出投影
        output = self.W_o(context)
        output = self.dropout(output)
        # 7. 残差连接 + 层归一化
        output = self.layer_norm(output + residual)
        return output, attn_weights


class PositionalEncoding(nn.Module):
    def __init__(self, d_model, max_len=5000, dropout=0.1):
        super().__init__()
        self.dropout = nn.Dropout(p=dropout)
        pe = torch.zeros(max_len, d_model)
        position = torch.arange(0, max_len, dtype=torch.float).unsqueeze(1)
        div_term = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float) * (-math.log(10000.0) / d_model))
        pe[:, 0::2] = torch.sin(position * div_term)
        pe[:, 1::2] = torch.cos(position * div_term)
        pe = pe.unsqueeze(0)
        self.register_buffer('pe', pe)

    def forward(self, x):
        x = x + self.pe[:, :x.size(1)]
        return self.dropout(x)


class PositionwiseFeedForward(nn.Module):
    def __init__(self, d_model, d_ff, dropout=0.1):
        super().__init__()
        self.w_1 = nn.Linear(d_model, d_ff)
        self.w_2 = nn.Linear(d_ff, d_model)
        self.dropout = nn.Dropout(dropout)
        self.layer_norm = nn.LayerNorm(d_model)

    def forward(self, x):
        residual = x
        x = self.w_2(self.dropout(F.relu(self.w_1(x))))
        x = self.layer_norm(x + residual)
        return x


class SwiGLUFeedForward(nn.Module):
    def __init__(self, d_model, d_ff, dropout=0.1):
        super().__init__()
        self.w_gate = nn.Linear(d_model, d_ff, bias=False)
        self.w_up = nn.Linear(d_model, d_ff, bias=False)
        self.w_down = nn.Linear(d_ff, d_model, bias=False)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        gate = F.silu(self.w_gate(x))  # SiLU = Swish
        return self.w_down(self.dropout(gate * self.w_up(x)))


class EncoderLayer(nn.Module):
    def __init__(self, d_model, num_heads, d_ff, dropout=0.1):
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, num_heads, dropout)
        self.feed_forward = PositionwiseFeedForward(d_model, d_ff, dropout)

    def forward(self, x, mask=None):
        attn_output, attn_weights = self.self_attn(x, x, x, mask)
        ff_output = self.feed_forward(attn_output)
        return ff_output, attn_weights


class TransformerEncoder(nn.Module):
    def __init__(self, vocab_size, d_model, num_heads, d_ff, num_layers, max_len=5000, dropout=0.1):
        super().__init__()
        self.d_model = d_model
        self.token_embedding = nn.Embedding(vocab_size, d_model)
        self.positional_encoding = PositionalEncoding(d_model, max_len, dropout)
        self.layers = nn.ModuleList([EncoderLayer(d_model, num_heads, d_ff, dropout) for _ in range(num_layers)])
        self.layer_norm = nn.LayerNorm(d_model)

    def forward(self, x, mask=None):
        x = self.token_embedding(x) * math.sqrt(self.d_model)
        x = self.positional_encoding(x)
        attn_weights_all = []
        for layer in self.layers:
            x, attn_weights = layer(x, mask)
            attn_weights_all.append(attn_weights)
        x = self.layer_norm(x)
        return x, attn_weights_all


class TransformerClassifier(nn.Module):
    def __init__(self, vocab_size, d_model, num_heads, d_ff, num_layers, num_classes, max_len=512, dropout=0.1):
        super().__init__()
        self.encoder = TransformerEncoder(vocab_size, d_model, num_heads, d_ff, num_layers, max_len, dropout)
        self.classifier = nn.Linear(d_model, num_classes)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x, mask=None):
        encoded, attn_weights = self.encoder(x, mask)
        cls_output = encoded[:, 0]
        cls_output = self.dropout(cls_output)
        logits = self.classifier(cls_output)
        return logits, attn_weights


class PreLNMultiHeadAttention(nn.Module):
    def __init__(self, d_model, num_heads, dropout=0.1):
        super().__init__()
        self.d_model = d_model
        self.num_heads = num_heads
        self.d_k = d_model // num_heads
        self.W_q = nn.Linear(d_model, d_model)
        self.W_k = nn.Linear(d_model, d_model)
        self.W_v = nn.Linear(d_model, d_model)
        self.W_o = nn.Linear(d_model, d_model)
        self.attention = ScaledDotProductAttention()
        self.dropout = nn.Dropout(dropout)
        self.layer_norm = nn.LayerNorm(d_model)

    def forward(self, query, key, value, mask=None):
        batch_size = query.size(0)
        residual = query
        # Pre-LN: 先归一化再计算
        query = self.layer_norm(query)
        key = self.layer_norm(key)
        value = self.layer_norm(value)
        Q = self.W_q(query).view(batch_size, -1, self.num_heads, self.d_k).transpose(1, 2)
        K = self.W_k(key).view(batch_size, -1, self.num_heads, self.d_k).transpose(1, 2)
        V = self.W_v(value).view(batch_size, -1, self.num_heads, self.d_k).transpose(1, 2)
        if mask is not None:
            mask = mask.unsqueeze(1)
        context, attn_weights = self.attention(Q, K, V, mask)
        context = context.transpose(1, 2).contiguous().view(batch_size, -1, self.d_model)
        output = self.W_o(context)
        output = self.dropout(output)
        output = output + residual
        return output, attn_weights


def create_causal_mask(seq_len):
    """(1, 1, seq_len, seq_len): 1 on and below the diagonal."""
    mask = torch.tril(torch.ones(seq_len, seq_len)).unsqueeze(0).unsqueeze(0)
    return mask


class PreLNSwiGLUDecoderBlock(nn.Module):
    """The tutorial's Pre-LN attention and SwiGLU FFN put together as a causal block (its section
    8 names the pattern, `x + Sublayer(LayerNorm(x))`); the causal mask is create_causal_mask's,
    squeezed once so that the attention's unsqueeze(1) gives (1, 1, T, T)."""

    def __init__(self, d_model, num_heads, d_ff, dropout=0.1):
        super().__init__()
        self.attn = PreLNMultiHeadAttention(d_model, num_heads, dropout)
        self.ffn_norm = nn.LayerNorm(d_model)
        self.ffn = SwiGLUFeedForward(d_model, d_ff, dropout)

    def forward(self, x):
        mask = create_causal_mask(x.size(1)).squeeze(0)
        x, attn_weights = self.attn(x, x, x, mask)
        x = x + self.ffn(self.ffn_norm(x))
        return x


def make_classifier():
    torch.manual_seed(0)
    model = TransformerClassifier(vocab_size=64, d_model=32, num_heads=4, d_ff=64, num_layers=2,
                                  num_classes=2, max_len=32, dropout=0.1)
    rng = np.random.RandomState(0)
    x = rng.randint(1, 64, size=(2, 8)).astype(np.int64)
    x[1, 5:] = 0  # pad_idx 0
    mask = (x != 0)[:, None, :]  # (batch, 1, seq_len)
    return model.eval(), {"x": x, "mask": mask}


def make_preln_swiglu():
    torch.manual_seed(1)
    block = PreLNSwiGLUDecoderBlock(d_model=32, num_heads=4, d_ff=64)
    x = np.random.RandomState(1).standard_normal((2, 8, 32)).astype(np.float32)
    return block.eval(), {"x": x}
