"""LoRA on MoE expert and router weights as PEFT saves it (target_parameters, its ParamWrapper;
jaxformer/hf/expert_adapters.py, layers/lora.py ParamLoRA) against `peft` itself, on tiny random
Mixtral, Qwen3-MoE, DeepSeek-V3 and gpt-oss (one layer, 4 experts, vocab 64):

  * import: an adapter made by peft.get_peft_model (every B random) loads with
    hf.from_pretrained(base, adapter=) and gives PeftModel's logits, adapted and merged;
  * export: that model saved as a checkpoint (model.yaml's lora: section) and exported by
    `jaxformer export --to peft` gives PEFT's tensors back bit for bit, and
    PeftModel.from_pretrained of the export gives jaxformer's logits;
  * the options PEFT writes: Mixtral's "all-linear" and the MLP names of Qwen3-MoE and DeepSeek
    (a regex) become target_parameters with a doubled rank and alpha for the fused gate_up_proj;
    gpt-oss's interleaved gate_up_proj, named by target_parameters directly;
  * refusals by name, and LoRA training of an expert adapter in both trainers.
Measured worst |logit| differences are printed by check_hf_logits (run with -s).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx
from helpers import check_hf_logits, hf_lm_logits, randomize

from jaxformer import hf
from jaxformer.config import ConfigError
from jaxformer.config.lora import LoRAConfig
from jaxformer.convert import ConversionError
from jaxformer.parity import setup_precision

T = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")
V = 64
IDS = np.random.RandomState(7).randint(3, V, size=(2, 8))
MASK = np.ones_like(IDS)
MASK[1, :3] = 0  # a left-padded row
SMALL = dict(vocab_size=V, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
             max_position_embeddings=64, bos_token_id=1, eos_token_id=2, pad_token_id=0)
# (HF class, tiny config, PEFT LoraConfig kwargs) per family
FAMILIES = {
    "mixtral": (T.MixtralForCausalLM, dict(SMALL, intermediate_size=16, num_local_experts=4, num_experts_per_tok=2),
                dict(r=2, lora_alpha=4, target_modules="all-linear")),
    "qwen3_moe": (T.Qwen3MoeForCausalLM, dict(SMALL, intermediate_size=40, head_dim=8, num_experts=4,
                                              num_experts_per_tok=2, moe_intermediate_size=16, norm_topk_prob=True),
                  dict(r=3, lora_alpha=5, use_rslora=True,
                       target_modules=["q_proj", "gate_proj", "up_proj", "down_proj", "gate"])),
    "deepseek_v3": (T.DeepseekV3ForCausalLM, dict(
        SMALL, intermediate_size=40, num_key_value_heads=4, q_lora_rank=None, kv_lora_rank=8, qk_nope_head_dim=4,
        qk_rope_head_dim=4, v_head_dim=8, n_routed_experts=4, num_experts_per_tok=2, n_group=2, topk_group=1,
        moe_intermediate_size=12, n_shared_experts=1, first_k_dense_replace=0, routed_scaling_factor=1.5),
        dict(r=2, lora_alpha=8, init_lora_weights="gaussian", target_modules=r".*\.(kv_b_proj|gate_proj|up_proj|down_proj)")),
    "gpt_oss": (T.GptOssForCausalLM, dict(SMALL, intermediate_size=24, head_dim=8, num_local_experts=4,
                                          num_experts_per_tok=2, sliding_window=3, swiglu_limit=1.5,
                                          rope_parameters=dict(rope_type="default", rope_theta=300.0)),
                dict(r=2, lora_alpha=6, target_modules=["q_proj", "o_proj"],
                     target_parameters=["experts.gate_up_proj", "experts.down_proj", "router.weight"])),
}


@pytest.fixture(autouse=True)
def _precision():
    setup_precision()


@nnx.jit
def _call(model, ids, mask):
    return model(ids, mask)


def _ours(model) -> np.ndarray:
    return np.asarray(_call(model, jnp.asarray(IDS), jnp.asarray(MASK)))


def _hf(fam: str, path: str):
    return FAMILIES[fam][0].from_pretrained(path).eval()


@pytest.fixture(scope="module")
def adapters(tmp_path_factory):
    """fam -> (HF base dir, PEFT adapter dir, PeftModel logits), built once: a tiny random HF
    model, and PEFT's adapter on it with every B random (B = 0 would make it a no-op)."""
    cache = {}

    def get(fam):
        if fam not in cache:
            cls, kw, options = FAMILIES[fam]
            root = tmp_path_factory.mktemp(fam)
            torch.manual_seed(0)
            randomize(cls(cls.config_class(**kw))).save_pretrained(str(root / "base"))
            pm = peft.get_peft_model(_hf(fam, str(root / "base")), peft.LoraConfig(task_type="CAUSAL_LM", **options))
            with torch.no_grad():
                for n, p in pm.named_parameters():
                    if "lora_B" in n:
                        p.copy_(torch.randn(p.shape) * 0.3)
            pm.save_pretrained(str(root / "adapter"))
            cache[fam] = (str(root / "base"), str(root / "adapter"), hf_lm_logits(pm.eval(), IDS, MASK))
        return cache[fam]
    return get


# ----------------------------------------------------------------------------- both ways
@pytest.mark.parametrize("fam", FAMILIES)
def test_peft_expert_adapter_both_ways(fam, adapters, tmp_path):
    from safetensors.numpy import load_file

    from jaxformer import checkpoint_io, cli
    from jaxformer.layers.lora import merge_lora, parameter_adapters
    base, src, ref = adapters(fam)
    config = json.loads(Path(os.path.join(src, "adapter_config.json")).read_text())
    assert config["target_parameters"]  # PEFT adapted the experts in place
    model, name, cfg, report = hf.from_pretrained(base, adapter=src, return_report=True)
    lora = report["lora"]
    experts = parameter_adapters(model)
    router = fam != "deepseek_v3"  # the regex names no router ("gate")
    assert {p.rsplit(".", 1)[1] for p in experts} == {"gate_up_proj", "down_proj"} | ({"weight"} if router else set())
    # PEFT doubles r and alpha of the fused gate_up_proj (fam's own r without it)
    r = FAMILIES[fam][2]["r"]
    assert {m.r for p, m in experts.items() if p.endswith("gate_up_proj")} == {2 * r if fam != "gpt_oss" else r}
    check_hf_logits(f"PEFT -> jaxformer {fam}", ref, ours := _ours(model), MASK)
    # export: PEFT's own tensors back, and PeftModel on them gives our logits
    checkpoint_io.save_model(model, name, cfg, str(tmp_path / "ckpt"), lora=lora)
    assert cli.main(["export", str(tmp_path / "ckpt"), "--to", "peft", str(tmp_path / "back")]) == 0
    theirs, back = load_file(os.path.join(src, "adapter_model.safetensors")), \
        load_file(str(tmp_path / "back" / "adapter_model.safetensors"))
    assert set(back) == set(theirs) and all(np.array_equal(back[k], theirs[k]) for k in theirs)
    loaded = peft.PeftModel.from_pretrained(_hf(fam, base), str(tmp_path / "back")).eval()
    check_hf_logits(f"jaxformer -> PEFT {fam}", hf_lm_logits(loaded, IDS, MASK), ours, MASK)
    merge_lora(model)
    assert not parameter_adapters(model)
    check_hf_logits(f"PEFT -> jaxformer merged {fam}", ref, _ours(model), MASK)


# ----------------------------------------------------------------------------- refusals
def test_peft_rank_pattern_decides_the_shapes(adapters, tmp_path):
    """Without PEFT's rank_pattern the fused gate_up_proj pair has the wrong rank: named."""
    import shutil
    base, src, _ = adapters("mixtral")
    shutil.copytree(src, tmp_path / "a")
    config = json.loads((tmp_path / "a" / "adapter_config.json").read_text())
    config["rank_pattern"] = {}
    (tmp_path / "a" / "adapter_config.json").write_text(json.dumps(config))
    with pytest.raises(ConversionError, match=r"shape: base_model\.model\.model\.layers\.0\.mlp\.experts\.base_layer"
                                              r"\.lora_A\.weight is \(16, 32\), expected \(8, 32\) \(r=2 for "
                                              r"model\.layers\.0\.mlp\.experts\.gate_up_proj\)"):
        hf.from_pretrained(base, adapter=str(tmp_path / "a"))


def test_expert_targets_refused_by_name(adapters, tmp_path, monkeypatch):
    import dataclasses

    from jaxformer.hf.adapters import save_adapter
    from jaxformer.layers.lora import apply_lora
    from jaxformer.models import abstract_model
    from jaxformer.train.config import TrainLoRAConfig
    with pytest.raises(ConfigError, match="dropout: must be 0 with target_parameters"):
        LoRAConfig(r=2, dropout=0.1, target_parameters=["down_proj"])
    with pytest.raises(ConfigError, match="base_dtype: 'int8' stores Linear bases only"):
        TrainLoRAConfig(r=2, target_parameters=["down_proj"], base_dtype="int8")
    model, name, cfg = hf.from_pretrained(adapters("deepseek_v3")[0])
    with pytest.raises(ConfigError, match=r"experts\.up_proj \(the gated experts' gate and up weights take one "
                                          r"adapter: gate_up_proj\)"):
        apply_lora(model, LoRAConfig(r=2, target_modules=[], target_parameters=["up_proj"]), nnx.Rngs(0))
    with pytest.raises(ConfigError, match=r"q_proj\.weight \(a Linear layer's weight: name the layer in target_modules\)"):
        apply_lora(model, LoRAConfig(r=2, target_modules=[], target_parameters=["q_proj.weight"]), nnx.Rngs(0))
    scanned = abstract_model("lm", dataclasses.replace(cfg, scan_layers=True))
    with pytest.raises(ConfigError, match=r"a scanned layer's \(leading layer axis\): build with scan_layers false"):
        apply_lora(scanned, LoRAConfig(r=2, target_modules=[], target_parameters=["down_proj"]), nnx.Rngs(0))
    # PEFT < 0.22 rewrites DeepSeek's gate_proj/up_proj/down_proj targets into the experts' on
    # load, dropping the shared experts' Linear adapter: refused there (the version faked here)
    lora = LoRAConfig(r=2, target_modules=["shared_experts.up_proj"], target_parameters=["down_proj"])
    apply_lora(model, lora, nnx.Rngs(0))
    with monkeypatch.context() as m:
        m.setattr(peft, "__version__", "0.21.2")
        with pytest.raises(ConversionError, match=r"decoder\.layers\.0\.ffn\.shared_experts\.up_proj: PEFT < 0.22 "
                                                  r"\(installed\) turns target_modules 'up_proj' of this model type"):
            save_adapter(model, name, cfg, lora, str(tmp_path / "out"))
    assert not os.path.exists(tmp_path / "out")
    # PEFT >= 0.22 (#3945) keeps it: the export loads into PeftModel with both adapters, same logits
    from packaging.version import Version
    if Version(peft.__version__) >= Version("0.22"):
        for path, v in nnx.to_flat_state(nnx.state(model, nnx.Param)):
            if "lora_B" in map(str, path):
                v.set_value(jnp.asarray(np.random.default_rng(len(path)).normal(0, 0.3, v.shape), v.dtype))
        save_adapter(model, name, cfg, lora, str(tmp_path / "out"))
        loaded = peft.PeftModel.from_pretrained(_hf("deepseek_v3", adapters("deepseek_v3")[0]),
                                                str(tmp_path / "out")).eval()
        names = {n for n, _ in loaded.named_parameters() if "lora_B" in n}
        assert any("shared_experts.up_proj.lora_B" in n for n in names) and any("mlp.experts.lora_B" in n for n in names), \
            sorted(names)
        check_hf_logits("jaxformer -> PEFT 0.22 shared and routed experts", hf_lm_logits(loaded, IDS, MASK),
                        _ours(model), MASK)


# ----------------------------------------------------------------------------- training
def test_expert_adapters_train_in_both_trainers(tmp_path):
    """train.lora with target_parameters: the expert and router adapters are the only trained
    leaves (JAX: the state's params; torch: requires_grad), they get a gradient (B moves from 0)
    and the base, experts included, stays bit-identical in both trainers."""
    import jax

    from jaxformer.train.config import config_from_dict
    from jaxformer.train.jax_trainer import JaxTrainer, params_numpy
    from jaxformer.train.torch.trainer import TorchTrainer
    model = {"name": "lm", "vocab_size": 259, "max_len": 16, "d_model": 16, "num_heads": 2, "d_ff": 32,
             "num_layers": 1, "position": "rope", "norm": "rmsnorm", "ffn": "swiglu", "bias": False,
             "dropout": 0.0, "moe": {"num_experts": 4, "top_k": 2, "router": "softmax_topk", "d_expert": 8,
                                     "expert_ffn": "swiglu"}}
    lora = {"r": 2, "alpha": 4, "target_modules": [], "rank_pattern": {"gate_up_proj": 4},
            "target_parameters": ["experts.gate_up_proj", "experts.down_proj", "router.weight"]}
    cfg = config_from_dict({"model": model, "data": {"name": "stdlib_docs", "seq_len": 8},
                            "train": {"steps": 2, "batch_size": 4, "lr": 1e-2, "warmup_steps": 0, "eval_batches": 1,
                                      "async_checkpoint": False, "lora": lora}})
    jt = JaxTrainer(cfg, str(tmp_path / "jax"), progress=False)
    trained = {".".join(map(str, p)) for p, _ in nnx.to_flat_state(jt.state["params"])}
    assert trained == {f"decoder.layers.0.ffn.{m}_lora.lora_{ab}" for m in ("experts.gate_up_proj",
                                                                             "experts.down_proj", "router.weight")
                       for ab in "AB"}
    frozen = [np.asarray(x).copy() for x in jax.tree.leaves(jt.state["frozen"])]
    jt.run()
    assert all(np.array_equal(a, np.asarray(b)) for a, b in zip(frozen, jax.tree.leaves(jt.state["frozen"]), strict=True))
    jp = params_numpy(jt.state)
    assert all(np.abs(jp[k]).max() > 0 for k in jp if k.endswith("_lora.lora_B"))
    tt = TorchTrainer(cfg, str(tmp_path / "torch"), progress=False)
    assert {n for n, p in tt.module.named_parameters() if p.requires_grad} == trained
    before = {n: p.detach().clone() for n, p in tt.module.named_parameters() if not p.requires_grad}
    tt.run()
    after = dict(tt.module.named_parameters())
    assert all(torch.equal(v, after[n]) for n, v in before.items())
    assert all(after[k].abs().max() > 0 for k in trained if k.endswith("lora_B"))


def test_patterns_and_target_parameters_in_the_config():
    """PEFT's pattern rule (first matching key, `(.*\\.)?(key)$`), and the fields through YAML."""
    from jaxformer.config import to_dict
    from jaxformer.config.lora import lora_config_from_dict
    cfg = LoRAConfig(r=2, alpha=4, use_rslora=True, target_parameters=["gate_up_proj"],
                     rank_pattern={"gate_up_proj": 4, r"layers\.1\..*": 3}, alpha_pattern={"q_proj": 6})
    assert cfg.rank_of("decoder.layers.1.ffn.experts.gate_up_proj") == 4  # the first key that matches
    assert cfg.rank_of("decoder.layers.1.self_attn.q_proj") == 3 and cfg.rank_of("decoder.layers.0.x_gate_up_proj") == 2
    assert cfg.scaling_of("decoder.layers.0.self_attn.q_proj") == 6 / 2 ** 0.5
    assert lora_config_from_dict(to_dict(cfg)) == cfg and cfg.target_parameters == ("gate_up_proj",)
    for bad, msg in ((dict(rank_pattern={"q_proj": 0}), "rank_pattern: 'q_proj': must be a positive int"),
                     (dict(alpha_pattern={"(q": 2}), "alpha_pattern: '\\(q' is not a regular expression"),
                     (dict(target_parameters=[]), "target_parameters: must be None or a non-empty list")):
        with pytest.raises(ConfigError, match=msg):
            LoRAConfig(r=2, **bad)
