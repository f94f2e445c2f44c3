"""Packing without cross-document attention (data.packing: segments): a packed row gives each
document the logits and the loss it gets alone, in both trees, and JAX == torch; `concat`
leaks (the check has teeth); tokens windows carry segment ids; both trainers follow the same
trajectory on packed windows, and pmap gives the single-device losses."""
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx
from helpers import converted_pair

from jaxformer.config import ConfigError
from jaxformer.config.models import LMConfig
from jaxformer.parity.cases_mla import MLA_Q_LORA
from jaxformer.parity.cases_sinks import GPT_OSS_ATTN
from jaxformer.train import tasks
from jaxformer.train.data.tokens_data import segment_ids
from jaxformer.train.torch import tasks as torch_tasks

EOS = 2
FLAVOURS = {"gpt2_learned": LMConfig.tiny("gpt2"), "llama_rope_gqa": LMConfig.tiny("llama"),
            "gptoss_sinks_sliding": GPT_OSS_ATTN,
            "mla": LMConfig.tiny("llama", num_kv_heads=None, mla=MLA_Q_LORA)}


def _documents(rng):
    """Two rows of 15 ids: documents that end in eos, the last one of row 0 cut by the window."""
    doc = lambda n: rng.integers(3, 64, n)
    rows = [[doc(4), doc(6), doc(3)], [doc(7), doc(6)]]
    docs = [[np.r_[d, EOS] if i < len(r) - 1 or len(r) == 2 else d for i, d in enumerate(r)] for r in rows]
    tokens = np.stack([np.concatenate(r) for r in docs]).astype(np.int32)  # [2, 15]
    return tokens, [d for r in docs for d in r]


def _nll(logits, targets):
    logp = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True)) - logits.max(-1, keepdims=True)
    return -np.take_along_axis(logp, targets[..., None], -1)[..., 0]


def _per_document(logits, tokens, seg):
    """Per-document summed loss of packed logits [B, T, V] (targets tokens[:, 1:])."""
    nll = _nll(np.asarray(logits, np.float64), tokens[:, 1:])
    keep = seg[:, 1:] == seg[:, :-1]
    return [float(nll[b][keep[b] & (seg[b, 1:] == s)].sum()) for b in range(len(tokens)) for s in np.unique(seg[b])]


# the JAX model's forward and loss as compiled programs (op by op, each is hundreds of tiny ones)
_forward = nnx.jit(lambda m, x, s: m(x, segment_ids=s))
_forward_loss = nnx.jit(lambda m, batch: tasks.forward_loss("lm", m, batch, 0.0))


def _jax_logits(jmod, x, s=None) -> np.ndarray:
    return np.asarray(_forward(jmod, jnp.asarray(x), None if s is None else jnp.asarray(s)))


@pytest.mark.parametrize("flavour", sorted(FLAVOURS))
def test_packed_row_gives_each_document_its_own_loss(flavour):
    cfg = FLAVOURS[flavour]
    tmod, jmod = converted_pair("lm", cfg)
    tokens, docs = _documents(np.random.default_rng(0))
    seg = segment_ids(tokens, EOS)
    assert seg.tolist() == [[1] * 5 + [2] * 7 + [3] * 3, [1] * 8 + [2] * 7]
    x, s = tokens[:, :-1], seg[:, :-1]
    # each document alone: one row each, right-padded (causal: the padding is never seen)
    alone = np.zeros((len(docs), max(len(d) for d in docs) - 1), np.int32)
    for i, d in enumerate(docs):
        alone[i, :len(d) - 1] = d[:-1]
    jl = _jax_logits(jmod, x, s)
    with torch.no_grad():
        tl = tmod(torch.from_numpy(x), segment_ids=torch.from_numpy(s)).numpy()
        alone_t = [r[:len(d) - 1] for r, d in zip(tmod(torch.from_numpy(alone)).numpy(), docs, strict=True)]
    alone_j = [r[:len(d) - 1] for r, d in zip(_jax_logits(jmod, alone), docs, strict=True)]
    # the same logits as each document alone, in each tree, and JAX == torch
    spans = [(b, o, o + len(d) - 1) for b, r in enumerate([docs[:3], docs[3:]])
             for o, d in zip(np.cumsum([0] + [len(d) for d in r]), r, strict=False)]
    worst = {"jax": 0.0, "torch": 0.0}
    for (b, lo, hi), aj, at in zip(spans, alone_j, alone_t, strict=True):
        worst["jax"] = max(worst["jax"], float(np.abs(jl[b, lo:hi] - aj).max()))
        worst["torch"] = max(worst["torch"], float(np.abs(tl[b, lo:hi] - at).max()))
    print(f"{flavour}: packed vs alone max |dlogit| {worst}, jax vs torch {np.abs(jl - tl).max():.2e}")
    assert max(worst.values()) <= 1e-5 and np.abs(jl - tl).max() <= 1e-5
    # concat (no segment ids): the second document sees the first, and its logits move
    leak = _jax_logits(jmod, x)
    assert np.abs(leak[0, 5:11] - alone_j[1][:6]).max() > 1e-3
    # the loss: per document, and the trainers' sums (targets across a boundary dropped)
    packed_docs = _per_document(jl, tokens, seg)
    alone_docs = [float(_nll(np.asarray(a, np.float64), d[1:]).sum()) for a, d in zip(alone_j, docs, strict=True)]
    np.testing.assert_allclose(packed_docs, alone_docs, rtol=1e-5)
    batch = {"tokens": tokens, "segment_ids": seg}
    j_loss, j_count, _ = _forward_loss(jmod, {k: jnp.asarray(v) for k, v in batch.items()})
    with torch.no_grad():
        t_loss, t_count, _ = torch_tasks.forward_loss("lm", tmod, {k: torch.from_numpy(v) for k, v in batch.items()}, 0.0)
    assert float(j_count) == float(t_count) == sum(len(d) - 1 for d in docs) == 25  # 28 targets, 3 crossings
    np.testing.assert_allclose([float(j_loss), float(t_loss)], sum(alone_docs), rtol=1e-5)


def _write(path, docs, eos=EOS):
    from jaxformer.train.data.tokens import TokensWriter
    record = {"spec": "test", "kind": "tokenizers", "file": None, "sha256": "a" * 64}
    with TokensWriter(str(path), vocab_size=64, eos_id=eos, tokenizer=record, overwrite=True) as w:
        for i, d in enumerate(docs):
            w.add("eval" if i % 5 == 4 else "train", d)
    return str(path)


def test_token_windows_carry_segment_ids(tmp_path):
    from jaxformer.train.data import tokens_data
    rng = np.random.default_rng(1)
    path = _write(tmp_path / "tok", [rng.integers(3, 64, rng.integers(2, 12)) for _ in range(40)])
    train, evaluation = tokens_data.sources(tokens_data.Config(path=path, seq_len=16), 0)
    for src in (train, evaluation):
        for i in range(len(src)):
            w = src[i]
            is_eos = w["tokens"][:-1] == EOS
            assert w["segment_ids"][0] == 1 and w["segment_ids"].dtype == np.int32
            np.testing.assert_array_equal(np.diff(w["segment_ids"]), is_eos)  # +1 right after each eos
    concat, _ = tokens_data.sources(tokens_data.Config(path=path, seq_len=16, packing="concat"), 0)
    assert set(concat[0]) == {"tokens"}
    np.testing.assert_array_equal(concat[3]["tokens"], train[3]["tokens"])
    with pytest.raises(ConfigError, match="packing.*segments.*concat"):
        tokens_data.Config(path=path, packing="documents")


def test_trainers_agree_on_packed_windows_and_pmap_matches(tmp_path):
    from jaxformer.convert import load_torch_state_dict
    from jaxformer.models import build_model as jbuild
    from jaxformer.train.config import config_from_dict
    from jaxformer.train.jax_trainer import JaxTrainer
    from jaxformer.train.torch.trainer import TorchTrainer
    from torch_ref.models import build_model as tbuild
    rng = np.random.default_rng(2)
    path = _write(tmp_path / "tok", [(s + np.arange(n)) % 61 + 3 for s, n in zip(rng.integers(0, 61, 80),
                                                                             rng.integers(3, 14, 80), strict=True)])
    model = {"name": "lm", "vocab_size": 64, "max_len": 32, "d_model": 32, "num_heads": 4, "d_ff": 64,
             "num_layers": 2, "dropout": 0.0, "position": "rope", "norm": "rmsnorm", "ffn": "swiglu"}
    train = {"steps": 3, "batch_size": 16, "grad_accum_steps": 2, "lr": 1e-2, "schedule": "constant",
             "warmup_steps": 0, "eval_every": 3, "eval_batches": 1, "checkpoint_every": 3,
             "async_checkpoint": False}
    cfg = config_from_dict({"model": model, "data": {"name": "tokens", "path": path, "seq_len": 16},
                            "train": train})
    assert cfg.data.packing == "segments"
    tmod = tbuild("lm", cfg.model, seed=3)
    jmod = jbuild("lm", cfg.model, seed=0)
    load_torch_state_dict(jmod, tmod.state_dict())
    jh = JaxTrainer(cfg, str(tmp_path / "jax"), model=jmod, progress=False).run()
    th = TorchTrainer(cfg, str(tmp_path / "torch"), module=tmod, progress=False).run()
    d = max(abs(a["loss"] - b["loss"]) / max(1.0, abs(b["loss"])) for a, b in zip(jh, th, strict=False))
    pcfg = config_from_dict({**cfg.to_dict(), "parallel": {"mode": "pmap"}})
    jmod = jbuild("lm", cfg.model, seed=0)
    load_torch_state_dict(jmod, tbuild("lm", cfg.model, seed=3).state_dict())
    ph = JaxTrainer(pcfg, str(tmp_path / "pmap"), model=jmod, progress=False).run()
    dp = max(abs(a["loss"] - b["loss"]) for a, b in zip(jh, ph, strict=False))
    print(f"packed trajectory: jax vs torch max rel dloss {d:.2e}, pmap vs single {dp:.2e}")
    assert d <= 1e-4 and dp <= 1e-5


def test_bad_segment_ids_are_refused_in_both_trees():
    tmod, jmod = converted_pair("lm", LMConfig.tiny("gpt2"))
    ids = np.ones((2, 5), np.int32)
    for call, arr in ((jmod, jnp.asarray), (tmod, torch.from_numpy)):
        with pytest.raises(ValueError, match=r"segment_ids must be \[batch, 5\]"):
            call(arr(ids), segment_ids=arr(np.ones((2, 4), np.int32)))
        with pytest.raises(ValueError, match="without a cache"):
            call(arr(ids[:, :1]), segment_ids=arr(ids[:, :1]), cache=call.init_cache(2, 8), cache_index=0)
