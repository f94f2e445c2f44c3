"""docs/huggingface.md's "Chat LoRA fine-tune, end to end" walkthrough, end to end through the
CLI, on a tiny random HF Llama with a tiny chat tokenizer (no download):

    convert --from hf -> data prepare --format chat -> train (train.init_from + train.lora)
    -> export --to peft -> peft.PeftModel.from_pretrained(HF base, adapter) -> generate

Checks: the run's base weights are bit-identical to the imported ones and its adapters trained
(B != 0); the run's checkpoint step exports the same adapter as model/last (paths relative to
the working dir, as a user types them); PEFT's greedy ids equal `jaxformer generate --weights
RUN`'s on the same chat-rendered prompt ids, which jaxformer's tokenizer (travelled from the
tokens dir into the run) encodes from the rendered text; and the logits of prompt + answer agree
within 1e-5 x max(1, max|logit|) (docs/numerics.md §19)."""
from __future__ import annotations

import json

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from chat_helpers import conversations, hf_tokenizer_dir, write_jsonl
from helpers import check_hf_logits, hf_lm_logits, jit_call, randomize

from jaxformer import checkpoint_io, cli
from jaxformer.convert import flax_key, param_leaves
from jaxformer.parity import setup_precision

T = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")
STEPS = 3
NEW_TOKENS = 8
QUESTION = [{"role": "user", "content": "what is the colour of the sea?"}]


def _cli(*argv) -> None:
    assert cli.main(list(argv)) == 0, argv


def _leaves(model) -> dict:
    return {flax_key(p): np.asarray(v.get_value()) for p, v in param_leaves(model).items()}


def test_chat_lora_finetune_flow(tmp_path, monkeypatch, capsys):
    setup_precision()
    monkeypatch.chdir(tmp_path)
    hf_tokenizer_dir(tmp_path / "base")  # 320 ids, chatml template, <|endoftext|> = 0 is eos
    config = T.LlamaConfig(vocab_size=320, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                           bos_token_id=3, eos_token_id=0, pad_token_id=0)
    torch.manual_seed(0)
    randomize(T.LlamaForCausalLM(config)).save_pretrained(tmp_path / "base")
    write_jsonl(tmp_path / "chat.jsonl", conversations(24))

    _cli("convert", "--from", "hf", "base", "--to", "flax", "ckpt")
    _cli("data", "prepare", "--format", "chat", "--input", "chat.jsonl", "--tokenizer", "base", "--out",
         "data", "--eval-fraction", "0.2", "--no-progress")
    _cli("train", "--config", "ckpt/train.yaml", "--workdir", "run", "--no-progress",
         "--set", "data.path=data", "--set", "data.seq_len=32", "--set", "train.lora.r=8",
         "--set", f"train.steps={STEPS}", "--set", "train.batch_size=4", "--set", "train.lr=3e-2",
         "--set", "train.warmup_steps=0", "--set", "train.schedule=constant",
         "--set", f"train.eval_every={STEPS}", "--set", "train.eval_batches=1",
         "--set", f"train.checkpoint_every={STEPS}", "--set", "train.sample_tokens=0")
    assert "final eval (jax): eval_loss" in capsys.readouterr().out

    # the run: the imported base bit for bit, beside adapters that trained
    from jaxformer.layers.lora import lora_modules
    run_model, _ = checkpoint_io.load("run")
    imported, _ = checkpoint_io.load("ckpt")
    ours, base = _leaves(run_model), _leaves(imported)
    assert set(ours) - set(base) == {k for k in ours if ".lora_A." in k or ".lora_B." in k}
    assert all(np.array_equal(ours[k], v) for k, v in base.items())
    adapted = lora_modules(run_model)
    assert len(adapted) == 14  # q k v o gate up down x 2 layers (PEFT's default targets for Llama)
    assert all(np.abs(np.asarray(m.lora_B.kernel.get_value())).max() > 1e-3 for m in adapted.values())

    _cli("export", "run", "--to", "peft", "adapter", "--base-model", "base")
    _cli("export", "run", "--step", str(STEPS), "--to", "peft", "adapter_step")  # orbax checkpoint step
    from safetensors.numpy import load_file
    a, b = load_file("adapter/adapter_model.safetensors"), load_file("adapter_step/adapter_model.safetensors")
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)

    tok = T.AutoTokenizer.from_pretrained("base")
    prompt = tok.apply_chat_template(QUESTION, tokenize=False, add_generation_prompt=True)
    prompt_ids = tok(prompt, add_special_tokens=False)["input_ids"]
    assert prompt_ids == tok.apply_chat_template(QUESTION, tokenize=True, add_generation_prompt=True,
                                                 return_dict=True)["input_ids"]
    from jaxformer.train.data.tokenizer import load_tokenizer
    run_tok = load_tokenizer("run/model/last/tokenizer.json")  # travelled: tokens dir -> run
    assert run_tok.encode(prompt).tolist() == prompt_ids

    hf_base = T.AutoModelForCausalLM.from_pretrained("base").eval()
    model = peft.PeftModel.from_pretrained(hf_base, "adapter").eval()
    def greedy():
        with torch.no_grad():
            return model.generate(torch.tensor([prompt_ids]), attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long),
                                  max_new_tokens=NEW_TOKENS, do_sample=False)[0].tolist()
    ref = greedy()
    with model.disable_adapter():
        assert greedy() != ref  # the adapter changes the answer: equal ids below need it applied
    capsys.readouterr()
    _cli("generate", "--weights", "run", "--ids", "--prompt", " ".join(map(str, prompt_ids)),
         "--max-new-tokens", str(NEW_TOKENS), "--json")
    got = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["tokens"][0]
    print(f"prompt {len(prompt_ids)} ids; PEFT greedy {ref[len(prompt_ids):]}, jaxformer {got}")
    assert got == ref[len(prompt_ids):]

    ids = np.asarray([ref], np.int64)
    mask = np.ones_like(ids)
    theirs = hf_lm_logits(model, ids, mask)
    # the run's forward as one compiled program (op by op it is hundreds of tiny ones)
    check_hf_logits("chat LoRA run vs PEFT", theirs, np.asarray(jit_call(run_model, jnp.asarray(ids, jnp.int32))), mask)


def test_train_says_when_eval_has_no_whole_batch():
    """Eval reads whole batches: an eval split smaller than one batch gives no eval metrics,
    which `jaxformer train` says (at the start, and in place of the final eval)."""
    from types import SimpleNamespace

    from jaxformer.cli.train import no_eval_reason
    cfg = SimpleNamespace(train=SimpleNamespace(batch_size=4))
    assert "holds 3 example(s), fewer than one batch (train.batch_size 4)" in \
        no_eval_reason(SimpleNamespace(eval_data=range(3)), cfg)
    assert no_eval_reason(SimpleNamespace(eval_data=range(4)), cfg) is None
