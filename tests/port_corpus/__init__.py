"""A corpus of PyTorch models written in different styles, for `jaxformer port` (issue 33 §6).

CORPUS maps a name to a factory `() -> (torch_module, inputs)`: the module in eval mode, `inputs`
a dict of numpy arrays keyed by `forward`'s argument names (as for `jaxformer parity --pair`),
tiny sizes (d_model 16-32, 2 layers, seq 8, batch 2), fixed seeds. tests/test_port_corpus.py
ports each entry and checks outputs and every parameter's gradient with the parity harness.

REFUSED maps a corpus name to the message fragment the engine's refusal must contain, for an
entry the engine refuses by name for a good reason.
"""
from . import (
    containers,
    dropout_mlp,
    hf_models,
    llama_complex,
    llama_rotate_half,
    moe_loop,
    nanogpt,
    seed_zh_basics,
    seed_zh_overview,
    swin_window,
    t5_bias,
    tcn_attention,
    torch_ref_models,
    vit_encoder,
)

CORPUS = {
    # hand-written research styles
    "nanogpt": nanogpt.make,
    "llama_complex_rope": llama_complex.make,
    "llama_rotate_half_rope": llama_rotate_half.make,
    "t5_relative_bias": t5_bias.make,
    "vit_torch_encoder": vit_encoder.make,
    "swin_window_attention": swin_window.make,
    "moe_expert_loop": moe_loop.make,
    "tcn_attention": tcn_attention.make,
    "dropout_mlp": dropout_mlp.make,
    "modulelist_sequential": containers.make,
    # the seed tutorials' components (/work/shared/seeds/)
    "seed_zh_basics_classifier": seed_zh_basics.make_classifier,
    "seed_zh_basics_preln_swiglu": seed_zh_basics.make_preln_swiglu,
    "seed_zh_overview_transformer": seed_zh_overview.make_transformer,
    "seed_zh_overview_patch_embedding": seed_zh_overview.make_patch_embedding,
    "seed_zh_overview_tcn_transformer": seed_zh_overview.make_tcn_transformer,
    # our own PyTorch mirror
    "torch_ref_lm_gpt2": torch_ref_models.lm_gpt2,
    "torch_ref_lm_llama": torch_ref_models.lm_llama,
    "torch_ref_lm_moe": torch_ref_models.lm_moe,
    "torch_ref_classifier": torch_ref_models.classifier,
    "torch_ref_vit": torch_ref_models.vit,
    "torch_ref_timeseries": torch_ref_models.timeseries,
    "torch_ref_swin": torch_ref_models.swin,
    # Hugging Face transformers modeling_* classes, tiny configs, random weights
    "hf_gpt2": hf_models.gpt2,
    "hf_llama": hf_models.llama,
    "hf_bert": hf_models.bert,
    "hf_vit": hf_models.vit,
}

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
    "vit_torch_encoder": "`encoder` as jaxformer.layers.transformer.Encoder",
    "tcn_attention": "`attn` as jaxformer.layers.attention.MultiHeadAttention",
    "seed_zh_overview_tcn_transformer": "`transformer` as jaxformer.layers.transformer.Encoder",
    "torch_ref_lm_gpt2": "`decoder` as jaxformer.layers.transformer.Decoder",
    "torch_ref_lm_llama": "`decoder` as jaxformer.layers.transformer.Decoder",
    "torch_ref_lm_moe": "`decoder` as jaxformer.layers.transformer.Decoder",
    "torch_ref_classifier": "`encoder` as jaxformer.layers.transformer.Encoder",
    "torch_ref_vit": "`encoder` as jaxformer.layers.transformer.Encoder",
    "torch_ref_timeseries": "`encoder` as jaxformer.layers.transformer.Encoder",
    "torch_ref_swin": "as jaxformer.layers.norm.LayerNorm",
}
