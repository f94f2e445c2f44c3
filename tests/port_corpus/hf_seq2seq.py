"""Hugging Face transformers encoder-decoder text models (issue 47 §7), each its
`*ForConditionalGeneration` / `*ForCausalLM`-free seq2seq class from a tiny config with random
weights (no download): vocab 64, d_model 32, 2+2 layers, 4 heads, ffn 64, source and target
length 8, batch 2, use_cache=False, eager attention. `input_ids` with the second row's last two
tokens padded in `attention_mask`, `decoder_input_ids` given (no shift from labels). Outputs are
the models' Seq2SeqLMOutput objects (logits and the encoder's last hidden state), as returned.

  - BART (BartForConditionalGeneration): learned positions offset by 2, embedding LayerNorm, the
    scaled word embedding (BartScaledWordEmbedding: an nn.Embedding subclass with its own forward
    multiplying by sqrt(d_model), scale_embedding=True) shared by encoder and decoder and tied to
    lm_head, plus a `final_logits_bias` buffer.
  - mBART (MBartForConditionalGeneration): pre-LN layers with a final LayerNorm per stack.
  - Marian (MarianMTModel): sinusoidal positions (MarianSinusoidalPositionalEmbedding, an
    nn.Embedding whose table is written at init, a trainable parameter), scaled embeddings,
    encoder and decoder embed_tokens tied to `shared` and lm_head.
  - Pegasus (PegasusForConditionalGeneration): sinusoidal positions, pre-LN, final LayerNorms.
  - Blenderbot (BlenderbotForConditionalGeneration): pre-LN with learned positions, final LayerNorms.
"""
import numpy as np
import torch

B, T, V = 2, 8, 64


def _ids(seed, low=3):
    return np.random.RandomState(seed).randint(low, V, size=(B, T)).astype(np.int64)


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


_SIZES = dict(d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
              encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=32, use_cache=False,
              pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2,
              attn_implementation="eager")


def _build(config_cls, model_cls, seed, **cfg):
    torch.manual_seed(seed)
    config = config_cls(vocab_size=V, **{**_SIZES, **cfg})
    model = _perturb_norms(model_cls(config).eval())
    if hasattr(model, "final_logits_bias"):  # a buffer of zeros at init: nonzero, so it shows
        with torch.no_grad():
            model.final_logits_bias.normal_(0.0, 0.1)
    return model, {"input_ids": _ids(seed), "attention_mask": _mask(), "decoder_input_ids": _ids(seed + 100)}


def bart():
    from transformers import BartConfig, BartForConditionalGeneration
    return _build(BartConfig, BartForConditionalGeneration, 40, scale_embedding=True)


def mbart():
    from transformers import MBartConfig, MBartForConditionalGeneration
    return _build(MBartConfig, MBartForConditionalGeneration, 41)


def marian():
    from transformers import MarianConfig, MarianMTModel
    return _build(MarianConfig, MarianMTModel, 42, decoder_vocab_size=V)


def pegasus():
    from transformers import PegasusConfig, PegasusForConditionalGeneration
    return _build(PegasusConfig, PegasusForConditionalGeneration, 43)


def blenderbot():
    from transformers import BlenderbotConfig, BlenderbotForConditionalGeneration
    return _build(BlenderbotConfig, BlenderbotForConditionalGeneration, 44)


ALL = {"hf_bart": bart, "hf_mbart": mbart, "hf_marian": marian, "hf_pegasus": pegasus, "hf_blenderbot": blenderbot}
