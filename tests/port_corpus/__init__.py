"""A corpus of PyTorch models written in different styles, for `jaxformer port` (issue 33 §6).

CORPUS maps a name to a factory `() -> (torch_module, inputs)`: the module in eval mode, `inputs`
a dict of numpy arrays keyed by `forward`'s argument names (as for `jaxformer parity --pair`),
tiny sizes (d_model 16-32, 2 layers, seq 8, batch 2), fixed seeds. tests/test_port_corpus.py
ports each entry and checks outputs and every parameter's gradient with the parity harness.

REFUSED maps a corpus name to the message fragment the engine's refusal must contain, for an
entry the engine refuses by name for a good reason.

Issue 47 §7 grew the corpus with models nobody here wrote: Hugging Face modeling classes of
families outside jaxformer's own (tiny configs, random weights), compact re-implementations of
timm and torchvision models as those libraries write them (neither imports here), torch.nn's
transformer modules and the PyTorch tutorials' models, and hand-written models planting each
defect class the issue found (defects.py). Every factory of those files is in its module's ALL;
the ones not in CORPUS (kept out for the suite's time budget: more of a family already here, or
slow to export) are in EXTRA, the same contract, for the lead to promote.
"""
from . import (
    containers,
    defects,
    dropout_mlp,
    hf_audio,
    hf_models,
    hf_seq2seq,
    hf_text_decoders,
    hf_text_encoders,
    hf_vision,
    llama_complex,
    llama_rotate_half,
    moe_loop,
    nanogpt,
    seed_zh_basics,
    seed_zh_overview,
    swin_window,
    t5_bias,
    tcn_attention,
    timm_style,
    torch_nn,
    torch_ref_models,
    torchvision_style,
    vit_encoder,
)

CORPUS = {
    # hand-written research styles
    "nanogpt": nanogpt.make,
    "llama_complex_rope": llama_complex.make,
    "vit_torch_encoder": vit_encoder.make,
    # the seed tutorials' components (/work/shared/seeds/)
    "seed_zh_basics_classifier": seed_zh_basics.make_classifier,
    "seed_zh_basics_preln_swiglu": seed_zh_basics.make_preln_swiglu,
    "seed_zh_overview_transformer": seed_zh_overview.make_transformer,
    "seed_zh_overview_patch_embedding": seed_zh_overview.make_patch_embedding,
    "seed_zh_overview_tcn_transformer": seed_zh_overview.make_tcn_transformer,
    # our own PyTorch mirror
    "torch_ref_lm_gpt2": torch_ref_models.lm_gpt2,
    "torch_ref_lm_moe": torch_ref_models.lm_moe,
    "torch_ref_vit": torch_ref_models.vit,
    # Hugging Face transformers modeling_* classes, tiny configs, random weights
    "hf_gpt2": hf_models.gpt2,
    # issue 47 §7: Hugging Face families outside jaxformer's own, tiny configs, random weights
    "hf_mpt": hf_text_decoders.mpt,  # decoder-only
    "hf_bart": hf_seq2seq.bart,  # encoder-decoder
    "hf_vit_mae": hf_vision.vit_mae,  # ViT family
    "hf_resnet": hf_vision.resnet,  # convs and BatchNorm
    # timm and torchvision models, re-implemented as those libraries write them
    "timm_convit": timm_style.convit,
    # torch.nn's transformer modules, the PyTorch tutorials' models
    "nn_encoder_postln_padmask": torch_nn.nn_encoder_postln_padmask,
    # hand-written: each defect class of issue 47, several forms (defects.py's docstring)
    **defects.ALL,
}

# issue 47 §7 models with the same contract, not in CORPUS (the suite's time budget): the lead
# promotes them to CORPUS as the budget allows. tv_swin (torchvision's Swin, pads from x.shape) is
# the slowest: two torch.exports and two run_decompositions over its symbolic image sizes, ~130 s
# on a loaded machine; defect_pads_from_shape keeps its pattern in CORPUS. The five next slowest in
# the suite (7-20 s each on an idle machine) are here too, their patterns kept by others in CORPUS:
# nn_transformer_masks / _decoder (nn.Transformer: nn_encoder_postln_padmask, the tutorials),
# hf_deberta_v2 (a norm of a weight: defect_module_on_weight), hf_beit (interpolated position
# tables: defect_interpolate_modes, timm_convit), hf_levit (conv + BatchNorm stems: timm_xcit,
# hf_resnet, defect_batchnorm_modes). Six more moved when the suite neared its budget (25-40 s of
# CPU on an idle Zen 4 together), each pattern kept in CORPUS: hf_opt (decoder-only: hf_gpt2,
# hf_llama, hf_bloom, hf_mpt), hf_marian (encoder-decoder: hf_bart), hf_whisper and hf_ast (audio
# front ends and a ViT on spectrograms: hf_wav2vec2, hf_vit), timm_vit_hybrid_resnetv2 (a conv stem
# before a ViT: hf_resnet, tv_vit), hf_distilbert (encoder-only: hf_bert, hf_albert_mlm)
EXTRA = {
    name: factory
    for module in (hf_text_decoders, hf_text_encoders, hf_seq2seq, hf_audio, hf_vision, timm_style,
                   torchvision_style, torch_nn)
    for name, factory in module.ALL.items()
    if name not in CORPUS
}
# three more when the suite met its budget again (the fault and compile-tip tests came in): TCN
# with attention (seed_zh_overview_tcn_transformer keeps the pattern, its attention as jaxformer's
# twin too), torch_ref's Swin (swin_window_attention; torch_ref_vit's twin port), timm's XCiT
# (BatchNorm in a conv stem: hf_resnet, defect_batchnorm_modes, timm_convnext)
EXTRA |= {"tcn_attention": tcn_attention.make, "torch_ref_swin": torch_ref_models.swin}
# and nine more when the suite reached its 15 minutes in a slow spell (900 s), their patterns kept
# in CORPUS by the defect models, the seeds and the HF ports (rotate-half RoPE: hf_gpt2's
# neighbours and llama_complex_rope's twin form; windows: defect_pads_from_shape; ViTs: hf_vit_mae,
# hf_clip_vision, vit_torch_encoder; convs: hf_resnet)
EXTRA |= {"llama_rotate_half_rope": llama_rotate_half.make, "t5_relative_bias": t5_bias.make, "swin_window_attention": swin_window.make, "moe_expert_loop": moe_loop.make, "dropout_mlp": dropout_mlp.make, "modulelist_sequential": containers.make, "hf_vit": hf_models.vit, "timm_convnext": timm_style.convnext, "tv_vit": torchvision_style.vit}
# and seven more, the suite again near its budget in a slow spell (891 s in all): torch_ref's
# classifier, time-series model and LLaMA (torch_ref_lm_gpt2, torch_ref_vit keep the mirror's
# Encoder / Decoder twin ports), HF BERT and LLaMA (hf_albert_mlm, hf_clip_vision; hf_gpt2,
# hf_mpt, hf_bloom, llama_rotate_half_rope), Wav2Vec2 (weight_norm: defect_weight_norm; conv
# front ends: hf_resnet), the word-LM tutorial (nn.TransformerEncoder: nn_encoder_postln_padmask)
# and three more when the suite passed its 15 minutes with the config records and reference tests
# (932 s in all on a slow day): hf_bloom (an ALiBi decoder: hf_mpt), hf_albert_mlm (an encoder with
# a tied MLM head: hf_gpt2's tie, hf_bart's encoder, defect ties), hf_clip_vision (a ViT:
# hf_vit_mae, vit_torch_encoder)
EXTRA |= {"hf_bloom": hf_text_decoders.bloom, "hf_albert_mlm": hf_text_encoders.albert_mlm,
          "hf_clip_vision": hf_vision.clip_vision}
EXTRA |= {"torch_ref_classifier": torch_ref_models.classifier, "torch_ref_timeseries": torch_ref_models.timeseries, "torch_ref_lm_llama": torch_ref_models.lm_llama, "hf_bert": hf_models.bert, "hf_llama": hf_models.llama}

# name -> fragment of the engine's one-line refusal (only for refusals by name with a good reason)
REFUSED: dict[str, str] = {
    # the expert dispatch `token, slot = torch.where(indices == e)` (torch_ref/layers/moe.py) has a
    # data-dependent output shape that torch.export cannot trace, even with draft_export
    "torch_ref_lm_moe": "aten.where in module `decoder.layers.1.ffn.experts` (moe.py:",
}

# the entries that hold modules with a jaxformer twin (jaxformer/port/twins.py): their port with
# layers="jaxformer" differs from the default one (every other entry has no candidate, so its
# jaxformer port is its default port), name -> a module written as its twin
JAXFORMER: dict[str, str] = {
    "seed_zh_overview_tcn_transformer": "`transformer` as jaxformer.layers.transformer.Encoder",
    "torch_ref_lm_gpt2": "`decoder` as jaxformer.layers.transformer.Decoder",
    "torch_ref_lm_moe": "`decoder` as jaxformer.layers.transformer.Decoder",
    "nn_encoder_postln_padmask": "as jaxformer.layers.transformer.EncoderLayer",
}

# the same for EXTRA's entries, and for CORPUS entries whose `layers="jaxformer"` port left the
# suite for CI's time budget (their default port stays in it; an Encoder twin is ported by
# seed_zh_overview_tcn_transformer's, a ViT's patch path by their default ports): pytest -m extra
EXTRA_JAXFORMER: dict[str, str] = {
    "vit_torch_encoder": "`encoder` as jaxformer.layers.transformer.Encoder",
    "torch_ref_vit": "`encoder` as jaxformer.layers.transformer.Encoder",
    "tv_vit": "`encoder.layers.encoder_layer_1.self_attention` as jaxformer.layers.attention.MultiHeadAttention",
    "torch_ref_classifier": "`encoder` as jaxformer.layers.transformer.Encoder",
    "torch_ref_timeseries": "`encoder` as jaxformer.layers.transformer.Encoder",
    "torch_ref_lm_llama": "`decoder` as jaxformer.layers.transformer.Decoder",
    "tutorial_word_lm_transformer": "as jaxformer.layers.transformer.EncoderLayer",
    "tcn_attention": "`attn` as jaxformer.layers.attention.MultiHeadAttention",
    "torch_ref_swin": "as jaxformer.layers.norm.LayerNorm",
    "nn_transformer_masks": "`decoder` as jaxformer.layers.transformer.Decoder",
    "nn_transformer_decoder": "as jaxformer.layers.transformer.DecoderLayer",
    "hf_siglip_vision": "`head.attention` as jaxformer.layers.attention.MultiHeadAttention",
    "tutorial_seq2seq_transformer": "`transformer.encoder` as jaxformer.layers.transformer.Encoder",
}
