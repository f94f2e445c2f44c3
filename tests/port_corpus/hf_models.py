"""Hugging Face transformers `modeling_*` classes built from tiny configs with random weights
(no download). Attention implementation per model, each noted:
  - GPT-2 (GPT2LMHeadModel): "eager" (its hand-written attention with the causal mask);
  - Llama (LlamaForCausalLM): "sdpa" (F.scaled_dot_product_attention with GQA), 2 kv heads;
  - BERT (BertModel, with pooler): "eager", with a padded attention_mask and token_type_ids;
  - ViT (ViTForImageClassification): "sdpa".
use_cache=False, so the outputs are the logits / hidden states only (no cache objects)."""
import numpy as np
import torch

B, T = 2, 8


def _ids(seed, vocab):
    return np.random.RandomState(seed).randint(0, vocab, size=(B, T)).astype(np.int64)


def gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=2, n_head=4, use_cache=False,
                     attn_implementation="eager")
    return GPT2LMHeadModel(cfg).eval(), {"input_ids": _ids(0, 64)}


def llama():
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(1)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32, use_cache=False,
                      attn_implementation="sdpa")
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # norms away from their all-ones init, so a dropped scale shows
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.normal_(1.0, 0.1)
    return model, {"input_ids": _ids(1, 64)}


def bert():
    from transformers import BertConfig, BertModel
    torch.manual_seed(2)
    cfg = BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=64, max_position_embeddings=32, type_vocab_size=2,
                     attn_implementation="eager")
    input_ids = _ids(2, 64)
    attention_mask = np.ones((B, T), np.int64)
    attention_mask[1, 6:] = 0
    token_type_ids = np.zeros((B, T), np.int64)
    token_type_ids[:, 4:] = 1
    return BertModel(cfg).eval(), {"input_ids": input_ids, "attention_mask": attention_mask,
                                   "token_type_ids": token_type_ids}


def vit():
    from transformers import ViTConfig, ViTForImageClassification
    torch.manual_seed(3)
    cfg = ViTConfig(image_size=16, patch_size=4, num_channels=3, hidden_size=32, num_hidden_layers=2,
                    num_attention_heads=4, intermediate_size=64, num_labels=5, attn_implementation="sdpa")
    pixel_values = np.random.RandomState(3).standard_normal((B, 3, 16, 16)).astype(np.float32)
    return ViTForImageClassification(cfg).eval(), {"pixel_values": pixel_values}
