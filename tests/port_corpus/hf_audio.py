"""Hugging Face transformers audio models (issue 47 §7): the front ends (mel-feature conv stems, raw
waveform conv feature extractors, spectrogram patch embeds) and their transformers, each its
modeling class from a tiny config with random weights (no download): d_model 32, 2 layers,
4 heads, ffn 64, batch 2, eager attention. Outputs are the models' own ModelOutput objects.

  - Whisper (WhisperForConditionalGeneration): two Conv1d+GELU over 8 mel bins x 16 frames, the
    encoder's sinusoidal `embed_positions` frozen (`requires_grad_(False)`), decoder with learned
    positions, proj_out tied to the decoder's embed_tokens; decoder_input_ids given.
  - Speech2Text (Speech2TextForConditionalGeneration): the Conv1d+GLU subsampler (2 layers,
    stride 2) over 32 frames x 8 features, sinusoidal positions (a buffer), attention_mask with
    padded frames (downsampled inside the model).
  - Wav2Vec2 (Wav2Vec2Model): the raw-waveform conv feature extractor (GroupNorm on the first
    conv layer), feature projection, the positional Conv1d under weight_norm (parametrizations:
    original0 / original1), post-LN encoder; 400 samples.
  - HuBERT (HubertModel): the "layer" feature-extractor norm (LayerNorm over channels after each
    conv, transposed around it), the stable-layer-norm (pre-LN) encoder, weight-normed pos conv.
  - AST (ASTForAudioClassification): overlapping spectrogram patches (Conv2d, stride < patch) over
    a 16 x 8 mel spectrogram, cls and distillation tokens, pooled head.
"""
import numpy as np
import torch

B = 2
_TEXT = dict(vocab_size=64, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
             decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, use_cache=False, pad_token_id=1,
             bos_token_id=0, eos_token_id=2, decoder_start_token_id=2, attn_implementation="eager")
_ENC = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
            attn_implementation="eager")


def _randn(seed, *shape):
    return np.random.RandomState(seed).standard_normal(shape).astype(np.float32)


def _ids(seed):
    return np.random.RandomState(seed).randint(3, 64, size=(B, 8)).astype(np.int64)


def _perturb_norms(model):
    with torch.no_grad():
        for name, p in model.named_parameters():
            low = name.lower()
            if ("norm" in low or "ln" in low) and p.ndim == 1:
                p.add_(torch.randn_like(p) * 0.1)
    return model


def whisper():
    from transformers import WhisperConfig, WhisperForConditionalGeneration
    torch.manual_seed(70)
    cfg = WhisperConfig(**_TEXT, num_mel_bins=8, max_source_positions=8, max_target_positions=16)
    model = _perturb_norms(WhisperForConditionalGeneration(cfg).eval())
    return model, {"input_features": _randn(70, B, 8, 16), "decoder_input_ids": _ids(70)}


def speech2text():
    from transformers import Speech2TextConfig, Speech2TextForConditionalGeneration
    torch.manual_seed(71)
    cfg = Speech2TextConfig(**_TEXT, input_feat_per_channel=8, input_channels=1, num_conv_layers=2,
                            conv_channels=16, conv_kernel_sizes=[5, 5], max_source_positions=64,
                            max_target_positions=16)
    model = _perturb_norms(Speech2TextForConditionalGeneration(cfg).eval())
    mask = np.ones((B, 32), np.int64)
    mask[1, 24:] = 0
    return model, {"input_features": _randn(71, B, 32, 8), "attention_mask": mask, "decoder_input_ids": _ids(71)}


def _wav2vec2_like(config_cls, model_cls, seed, **cfg):
    torch.manual_seed(seed)
    config = config_cls(**_ENC, conv_dim=(16, 16), conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=16,
                        num_conv_pos_embedding_groups=4, apply_spec_augment=False, **cfg)
    model = _perturb_norms(model_cls(config).eval())
    return model, {"input_values": _randn(seed, B, 400)}


def wav2vec2():
    from transformers import Wav2Vec2Config, Wav2Vec2Model
    return _wav2vec2_like(Wav2Vec2Config, Wav2Vec2Model, 72, feat_extract_norm="group", do_stable_layer_norm=False)


def hubert():
    from transformers import HubertConfig, HubertModel
    return _wav2vec2_like(HubertConfig, HubertModel, 73, feat_extract_norm="layer", do_stable_layer_norm=True,
                          conv_bias=True)


def ast():
    from transformers import ASTConfig, ASTForAudioClassification
    torch.manual_seed(74)
    cfg = ASTConfig(**_ENC, patch_size=4, frequency_stride=2, time_stride=4, max_length=16, num_mel_bins=8,
                    num_labels=5)
    model = _perturb_norms(ASTForAudioClassification(cfg).eval())
    return model, {"input_values": _randn(74, B, 16, 8)}


ALL = {"hf_whisper": whisper, "hf_speech2text": speech2text, "hf_wav2vec2": wav2vec2, "hf_hubert": hubert,
       "hf_ast": ast}
