"""Hugging Face transformers encoder-only text models outside jaxformer's own families (issue 47 §7),
each its modeling class from a tiny config with random weights (no download): vocab 64, hidden 32,
2 layers, 4 heads, seq 8, batch 2, the second row's last two tokens padded in `attention_mask`.
Outputs are the models' own ModelOutput objects, as they return them.

  - ALBERT (AlbertForMaskedLM): factorised embedding (16 -> 32), one shared layer group run twice,
    the MLM decoder a Linear WITH bias tied to the word embedding (a tied head that keeps its own
    bias); eager.
  - BERT MLM (BertForMaskedLM): the BERT-style MLM head (transform + decoder tied to the word
    embedding, its bias a separate parameter); eager.
  - DistilBERT (DistilBertModel): sinusoidal-free learned positions, no token types; eager.
  - ELECTRA (ElectraForPreTraining): embedding 16 projected to hidden 32, discriminator head; eager.
  - DeBERTa-v2 (DebertaV2Model): disentangled attention with relative-position buckets, the
    relative embedding table passed through a LayerNorm (`norm_rel_ebd="layer_norm"`: a module
    applied to a weight), c2p|p2c; eager by construction.
  - MPNet (MPNetModel): a relative-position bias from a bucketed Embedding (32 buckets: its
    compute_position_bias always buckets into 32, whatever the config says); eager.
  - ConvBERT (ConvBertModel): span-based dynamic convolution heads mixed with self-attention,
    head_ratio 2, conv_kernel_size 3; eager.
  - ESM (EsmModel): rotary position embedding, pre-LN, token dropout off; eager.
  - Funnel (FunnelBaseModel): the funnel's pooling between blocks (block_sizes [1, 1]), relative
    attention; eager by construction.
"""
import numpy as np
import torch

B, T, V = 2, 8, 64


def _ids(seed):
    return np.random.RandomState(seed).randint(3, V, size=(B, T)).astype(np.int64)


def _mask():
    m = np.ones((B, T), np.int64)
    m[1, 6:] = 0
    return m


def _perturb_norms(model):
    with torch.no_grad():
        for name, p in model.named_parameters():
            low = name.lower()
            if ("norm" in low or "ln" in low) and p.ndim == 1:
                p.add_(torch.randn_like(p) * 0.1)
    return model


def _build(config_cls, model_cls, seed, *, token_types=False, **cfg):
    torch.manual_seed(seed)
    config = config_cls(vocab_size=V, pad_token_id=0, **cfg)
    model = _perturb_norms(model_cls(config).eval())
    inputs = {"input_ids": _ids(seed), "attention_mask": _mask()}
    if token_types:
        tt = np.zeros((B, T), np.int64)
        tt[:, 4:] = 1
        inputs["token_type_ids"] = tt
    return model, inputs


_SIZES = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
              max_position_embeddings=32)


def albert_mlm():
    from transformers import AlbertConfig, AlbertForMaskedLM
    return _build(AlbertConfig, AlbertForMaskedLM, 30, token_types=True, embedding_size=16, **_SIZES,
                  attn_implementation="eager")


def bert_mlm():
    from transformers import BertConfig, BertForMaskedLM
    return _build(BertConfig, BertForMaskedLM, 31, token_types=True, **_SIZES, attn_implementation="eager")


def distilbert():
    from transformers import DistilBertConfig, DistilBertModel
    return _build(DistilBertConfig, DistilBertModel, 32, dim=32, n_layers=2, n_heads=4, hidden_dim=64,
                  max_position_embeddings=32, attn_implementation="eager")


def electra():
    from transformers import ElectraConfig, ElectraForPreTraining
    return _build(ElectraConfig, ElectraForPreTraining, 33, token_types=True, embedding_size=16, **_SIZES,
                  attn_implementation="eager")


def deberta_v2():
    from transformers import DebertaV2Config, DebertaV2Model
    return _build(DebertaV2Config, DebertaV2Model, 34, **_SIZES, type_vocab_size=0, relative_attention=True,
                  position_buckets=8, max_relative_positions=16, norm_rel_ebd="layer_norm",
                  pos_att_type=["p2c", "c2p"], share_att_key=True, position_biased_input=False)


def mpnet():
    from transformers import MPNetConfig, MPNetModel
    return _build(MPNetConfig, MPNetModel, 35, **_SIZES, relative_attention_num_buckets=32)


def convbert():
    from transformers import ConvBertConfig, ConvBertModel
    return _build(ConvBertConfig, ConvBertModel, 36, token_types=True, embedding_size=32, head_ratio=2,
                  conv_kernel_size=3, **_SIZES)


def esm():
    from transformers import EsmConfig, EsmModel
    return _build(EsmConfig, EsmModel, 37, **_SIZES, position_embedding_type="rotary", token_dropout=False,
                  mask_token_id=1, attn_implementation="eager")


def funnel():
    from transformers import FunnelBaseModel, FunnelConfig
    return _build(FunnelConfig, FunnelBaseModel, 38, token_types=True, block_sizes=[1, 1], d_model=32, n_head=4,
                  d_head=8, d_inner=64, num_decoder_layers=1)


ALL = {
    "hf_albert_mlm": albert_mlm, "hf_bert_mlm": bert_mlm, "hf_distilbert": distilbert, "hf_electra": electra,
    "hf_deberta_v2": deberta_v2, "hf_mpnet": mpnet, "hf_convbert": convbert, "hf_esm": esm, "hf_funnel": funnel,
}
