"""torch.nn's own transformer modules, and the PyTorch tutorials' model classes as they write them
(issue 47 §7). d_model 32, 4 heads, ffn 64, 2 layers, seq 8, batch 2; dropout modules kept at the
tutorials' rates (the module is in eval mode).

  - nn.Transformer (batch_first) with every kind of mask: a boolean causal tgt_mask, boolean
    src_key_padding_mask and memory_key_padding_mask (the second row's last two source tokens).
  - nn.TransformerDecoder alone: pre-LN (norm_first) GELU layers, a final LayerNorm, the float
    causal mask nn.Transformer.generate_square_subsequent_mask writes (0 / -inf) and a
    tgt_key_padding_mask.
  - nn.TransformerEncoder, post-LN, enable_nested_tensor=True, with a src_key_padding_mask: in eval
    mode without grad torch takes its fast path (nested tensors, _transformer_encoder_layer_fwd).
  - The PyTorch "Language Translation with nn.Transformer" tutorial's Seq2SeqTransformer
    (TokenEmbedding scaled by sqrt(emb_size), PositionalEncoding built with slice assignments
    into a 5000-row buffer, nn.Transformer sequence-first, generator), called as the tutorial's
    create_mask makes its masks: a boolean all-False src_mask, the float -inf causal tgt_mask, and
    the boolean padding masks `(src == PAD_IDX).transpose(0, 1)`.
  - The PyTorch "Language Modeling with nn.Transformer" tutorial's TransformerModel (sequence-first
    nn.TransformerEncoder, init_weights, the causal mask made inside forward with
    nn.Transformer.generate_square_subsequent_mask(len(src)) when none is passed).
"""
import math

import numpy as np
import torch
import torch.nn as nn
from torch import Tensor
from torch.nn import Transformer, TransformerEncoder, TransformerEncoderLayer

B, T, D, V = 2, 8, 32, 64


def _randn(seed, *shape):
    return np.random.RandomState(seed).standard_normal(shape).astype(np.float32)


def _causal_bool():
    return np.triu(np.ones((T, T), bool), k=1)


def _causal_float():
    return nn.Transformer.generate_square_subsequent_mask(T).numpy().astype(np.float32)


def _pad_mask():
    m = np.zeros((B, T), bool)
    m[1, 6:] = True
    return m


def _perturb_norms(model):
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name and p.ndim == 1:
                p.add_(torch.randn_like(p) * 0.1)
    return model


def nn_transformer_masks():
    torch.manual_seed(100)
    model = nn.Transformer(d_model=D, nhead=4, num_encoder_layers=2, num_decoder_layers=2, dim_feedforward=64,
                           dropout=0.1, batch_first=True)
    return _perturb_norms(model).eval(), {
        "src": _randn(100, B, T, D), "tgt": _randn(101, B, T, D), "tgt_mask": _causal_bool(),
        "src_key_padding_mask": _pad_mask(), "memory_key_padding_mask": _pad_mask()}


def nn_transformer_decoder():
    torch.manual_seed(101)
    layer = nn.TransformerDecoderLayer(D, 4, 64, dropout=0.1, activation="gelu", batch_first=True, norm_first=True)
    model = nn.TransformerDecoder(layer, num_layers=2, norm=nn.LayerNorm(D))
    tgt_pad = np.zeros((B, T), bool)
    tgt_pad[0, 7] = True
    return _perturb_norms(model).eval(), {
        "tgt": _randn(102, B, T, D), "memory": _randn(103, B, 6, D), "tgt_mask": _causal_float(),
        "tgt_key_padding_mask": tgt_pad}


def nn_encoder_postln_padmask():
    torch.manual_seed(102)
    layer = nn.TransformerEncoderLayer(D, 4, 64, dropout=0.1, batch_first=True)
    model = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=True)
    return _perturb_norms(model).eval(), {"src": _randn(104, B, T, D), "src_key_padding_mask": _pad_mask()}


# ------------------------------------------------ the translation tutorial (translation_transformer.py)
class PositionalEncoding(nn.Module):
    def __init__(self,
                 emb_size: int,
                 dropout: float,
                 maxlen: int = 5000):
        super().__init__()
        den = torch.exp(- torch.arange(0, emb_size, 2) * math.log(10000) / emb_size)
        pos = torch.arange(0, maxlen).reshape(maxlen, 1)
        pos_embedding = torch.zeros((maxlen, emb_size))
        pos_embedding[:, 0::2] = torch.sin(pos * den)
        pos_embedding[:, 1::2] = torch.cos(pos * den)
        pos_embedding = pos_embedding.unsqueeze(-2)

        self.dropout = nn.Dropout(dropout)
        self.register_buffer('pos_embedding', pos_embedding)

    def forward(self, token_embedding: Tensor):
        return self.dropout(token_embedding + self.pos_embedding[:token_embedding.size(0), :])


class TokenEmbedding(nn.Module):
    def __init__(self, vocab_size: int, emb_size):
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, emb_size)
        self.emb_size = emb_size

    def forward(self, tokens: Tensor):
        return self.embedding(tokens.long()) * math.sqrt(self.emb_size)


class Seq2SeqTransformer(nn.Module):
    def __init__(self,
                 num_encoder_layers: int,
                 num_decoder_layers: int,
                 emb_size: int,
                 nhead: int,
                 src_vocab_size: int,
                 tgt_vocab_size: int,
                 dim_feedforward: int = 512,
                 dropout: float = 0.1):
        super().__init__()
        self.transformer = Transformer(d_model=emb_size,
                                       nhead=nhead,
                                       num_encoder_layers=num_encoder_layers,
                                       num_decoder_layers=num_decoder_layers,
                                       dim_feedforward=dim_feedforward,
                                       dropout=dropout)
        self.generator = nn.Linear(emb_size, tgt_vocab_size)
        self.src_tok_emb = TokenEmbedding(src_vocab_size, emb_size)
        self.tgt_tok_emb = TokenEmbedding(tgt_vocab_size, emb_size)
        self.positional_encoding = PositionalEncoding(
            emb_size, dropout=dropout)

    def forward(self,
                src: Tensor,
                trg: Tensor,
                src_mask: Tensor,
                tgt_mask: Tensor,
                src_padding_mask: Tensor,
                tgt_padding_mask: Tensor,
                memory_key_padding_mask: Tensor):
        src_emb = self.positional_encoding(self.src_tok_emb(src))
        tgt_emb = self.positional_encoding(self.tgt_tok_emb(trg))
        outs = self.transformer(src_emb, tgt_emb, src_mask, tgt_mask, None,
                                src_padding_mask, tgt_padding_mask, memory_key_padding_mask)
        return self.generator(outs)


PAD_IDX = 1


def tutorial_seq2seq_transformer():
    torch.manual_seed(103)
    model = Seq2SeqTransformer(2, 2, D, 4, V, V, dim_feedforward=64)
    for p in model.parameters():  # the tutorial's init
        if p.dim() > 1:
            nn.init.xavier_uniform_(p)
    rs = np.random.RandomState(103)
    src = rs.randint(4, V, size=(T, B)).astype(np.int64)  # sequence-first
    src[6:, 1] = PAD_IDX
    tgt = rs.randint(4, V, size=(T, B)).astype(np.int64)
    tgt[7:, 0] = PAD_IDX
    # create_mask(src, tgt) of the tutorial
    src_mask = np.zeros((T, T), bool)
    tgt_mask = _causal_float()
    src_padding_mask = (src == PAD_IDX).transpose(1, 0)
    tgt_padding_mask = (tgt == PAD_IDX).transpose(1, 0)
    return model.eval(), {"src": src, "trg": tgt, "src_mask": src_mask, "tgt_mask": tgt_mask,
                          "src_padding_mask": src_padding_mask, "tgt_padding_mask": tgt_padding_mask,
                          "memory_key_padding_mask": src_padding_mask.copy()}


# --------------------------------------------- the language-modeling tutorial (transformer_tutorial.py)
class TransformerModel(nn.Module):

    def __init__(self, ntoken: int, d_model: int, nhead: int, d_hid: int,
                 nlayers: int, dropout: float = 0.5):
        super().__init__()
        self.model_type = 'Transformer'
        self.pos_encoder = LMPositionalEncoding(d_model, dropout)
        encoder_layers = TransformerEncoderLayer(d_model, nhead, d_hid, dropout)
        self.transformer_encoder = TransformerEncoder(encoder_layers, nlayers)
        self.embedding = nn.Embedding(ntoken, d_model)
        self.d_model = d_model
        self.linear = nn.Linear(d_model, ntoken)

        self.init_weights()

    def init_weights(self) -> None:
        initrange = 0.1
        self.embedding.weight.data.uniform_(-initrange, initrange)
        self.linear.bias.data.zero_()
        self.linear.weight.data.uniform_(-initrange, initrange)

    def forward(self, src: Tensor, src_mask: Tensor = None) -> Tensor:
        """
        Arguments:
            src: Tensor, shape ``[seq_len, batch_size]``
            src_mask: Tensor, shape ``[seq_len, seq_len]``

        Returns:
            output Tensor of shape ``[seq_len, batch_size, ntoken]``
        """
        src = self.embedding(src) * math.sqrt(self.d_model)
        src = self.pos_encoder(src)
        if src_mask is None:
            """Generate a square causal mask for the sequence. The masked positions are filled with float('-inf').
            Unmasked positions are filled with float(0.0).
            """
            src_mask = nn.Transformer.generate_square_subsequent_mask(len(src)).to(src.device)
        output = self.transformer_encoder(src, src_mask)
        output = self.linear(output)
        return output


class LMPositionalEncoding(nn.Module):
    """The tutorial's PositionalEncoding (renamed here: the translation tutorial's has the name)."""

    def __init__(self, d_model: int, dropout: float = 0.1, max_len: int = 5000):
        super().__init__()
        self.dropout = nn.Dropout(p=dropout)

        position = torch.arange(max_len).unsqueeze(1)
        div_term = torch.exp(torch.arange(0, d_model, 2) * (-math.log(10000.0) / d_model))
        pe = torch.zeros(max_len, 1, d_model)
        pe[:, 0, 0::2] = torch.sin(position * div_term)
        pe[:, 0, 1::2] = torch.cos(position * div_term)
        self.register_buffer('pe', pe)

    def forward(self, x: Tensor) -> Tensor:
        """
        Arguments:
            x: Tensor, shape ``[seq_len, batch_size, embedding_dim]``
        """
        x = x + self.pe[:x.size(0)]
        return self.dropout(x)


def tutorial_word_lm_transformer():
    torch.manual_seed(104)
    model = TransformerModel(V, D, 4, 64, 2, dropout=0.2)
    src = np.random.RandomState(104).randint(0, V, size=(T, B)).astype(np.int64)  # sequence-first
    return _perturb_norms(model).eval(), {"src": src}


ALL = {
    "nn_transformer_masks": nn_transformer_masks, "nn_transformer_decoder": nn_transformer_decoder,
    "nn_encoder_postln_padmask": nn_encoder_postln_padmask,
    "tutorial_seq2seq_transformer": tutorial_seq2seq_transformer,
    "tutorial_word_lm_transformer": tutorial_word_lm_transformer,
}
