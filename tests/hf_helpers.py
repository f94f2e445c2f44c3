"""What the Hugging Face tests share (tests/test_hf*.py), imported by name like helpers.py: a row
of the family table (tests/hf_rows.py), its tiny random HF model built, saved and imported once
per test process, HF generate on a left-padded batch and its comparison with
jaxformer.generation, and the round trip every row is checked with (tests/test_hf_table.py).

Models built here are shared by every test of the process that names the row. A test that
changes an HF model's state (HF's dynamic RoPE keeps the longest length it has seen, §20) works
on a copy; hf_generate puts back the generation_config eos it changes.
"""
from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field

import jax.numpy as jnp
import numpy as np
from flax import nnx
from helpers import check_hf_encoder, check_hf_logits, hf_lm_logits, randomize, realigned

_KEEP = object()
_MISSING = object()


def lm_batch(vocab: int, seed: int, length: int, pad: int):
    """ids [2, length] in [3, vocab) and their mask, row 1 left-padded by `pad` tokens."""
    ids = np.random.RandomState(seed).randint(3, vocab, size=(2, length))
    mask = np.ones_like(ids)
    mask[1, :pad] = 0
    return ids, mask


def encoder_batch(vocab: int, pad_id: int, seed: int = 0):
    """ids [3, 11]: a full row, a right-padded row (7 tokens), a left-padded row (8 tokens)."""
    ids = np.random.RandomState(seed).randint(3, vocab, size=(3, 11))
    mask = np.ones_like(ids)
    mask[1, 7:] = 0
    mask[2, :3] = 0
    ids[mask == 0] = pad_id
    return ids, mask


@dataclass(eq=False)
class Row:
    """One (family, case) of the table: the HF class and its tiny config, what the import must
    give, whether generation is compared, and what the export must carry back.

    batch: (seed, length, left pad) of an LM's ids, (pad id,) of an encoder's.
    expect: dotted attributes of the imported config (a part ending in "()" is called) -> value.
    generate: (greedy tokens, beam tokens) compared with HF generate, or None; beam None = greedy
        only. Beam search reorders every layer's cache: the rows whose caches differ (a ring, mixed
        layers, sinks, MLA's latent) run it; rows with plain caches check greedy only (the suite's
        time budget), beam on plain caches being test_hf_families.test_beam_matches_hf's.
    export: run the round trip (export, transformers load-back, identical logits).
    export_class: the class the export loads as when not hf_class (Mistral without a window).
    keys: HF config attributes equal after the round trip; subset_keys: dicts whose original
    entries come back (export may spell out defaults); back_expect: dotted attributes of the
    loaded-back HF model -> value.
    same_files: the export's safetensors keys are save_pretrained's; same_weights: its
    state_dict is the original's, value for value.
    prepare: applied to the randomized HF model before saving (buffers randomize leaves)."""
    family: str
    case: str
    hf_class: str
    config: dict
    batch: tuple
    expect: dict = field(default_factory=dict)
    generate: tuple | None = None
    export: bool = True
    export_class: str | None = None
    keys: tuple = ()
    subset_keys: tuple = ()
    back_expect: dict = field(default_factory=dict)
    same_files: bool = False
    same_weights: bool = False
    max_len: int | None = None
    seed: int = 0
    prepare: Callable | None = None
    kind: str = "lm"
    auto: str = "AutoModelForCausalLM"

    @property
    def id(self) -> str:
        return f"{self.family}/{self.case}"

    def inputs(self):
        vocab = self.config["vocab_size"]
        return lm_batch(vocab, *self.batch) if self.kind == "lm" else encoder_batch(vocab, *self.batch)


_BUILT: dict[str, tuple] = {}


def built(row: Row, tmp_path_factory):
    """(HF model, its save_pretrained directory, (model, name, cfg) of hf.from_pretrained),
    built on first use and kept for the rest of the test process."""
    if row.id not in _BUILT:
        import transformers

        from jaxformer import hf
        cls = getattr(transformers, row.hf_class)
        model = randomize(cls(cls.config_class(**row.config)), seed=row.seed)
        if row.prepare is not None:
            model = row.prepare(model)
        path = str(tmp_path_factory.mktemp(row.id.replace("/", "-")))
        model.save_pretrained(path)
        _BUILT[row.id] = (model, path, hf.from_pretrained(path, max_len=row.max_len))
    return _BUILT[row.id]


def attr(obj, dotted: str):
    """obj.a.b.c for "a.b.c"; a part ending in "()" is called."""
    for part in dotted.split("."):
        obj = getattr(obj, part.removesuffix("()"))
        obj = obj() if part.endswith("()") else obj
    return obj


def lm_logits(model, ids, mask) -> np.ndarray:
    """A jaxformer LM's logits, one jitted function for every test of the process (a model of a
    structure seen before reuses its compilation)."""
    return np.asarray(_forward(model, jnp.asarray(ids), jnp.asarray(mask)))


_forward = nnx.jit(lambda m, i, k: m(i, k))


def check_fields(obj, expect: dict, what: str) -> None:
    """expect's keys are dotted attributes; a record field may be named by its flat key (the
    tables keep them), read at its record path (TransformerConfig.FLAT_PATHS)."""
    paths = getattr(type(obj), "FLAT_PATHS", {})
    for key, want in expect.items():
        head, dot, rest = key.partition(".")
        key = paths.get(head, head) + dot + rest
        got = attr(obj, key)
        assert got == want, f"{what}.{key}: {got!r}, expected {want!r}"


def hf_generate(hf_model, ids, mask, n: int, eos=_KEEP, **kw) -> np.ndarray:
    """The ids HF generate adds to a left-padded batch (pad 0), greedy or with kw's num_beams;
    eos, when given, replaces the model's generation_config eos for this call only."""
    import torch
    config = hf_model.generation_config
    config.pad_token_id = 0
    kept = config.eos_token_id
    if eos is not _KEEP:
        config.eos_token_id = eos
    try:
        with torch.no_grad():
            out = hf_model.generate(torch.from_numpy(ids), attention_mask=torch.from_numpy(mask), max_new_tokens=n,
                                    do_sample=False, **kw)
    finally:
        config.eos_token_id = kept
    return out[:, ids.shape[1]:].numpy()


def check_generate(hf_model, model, ids, mask, greedy: int | None = None, beam: int | None = None) -> None:
    """jaxformer.generation's ids equal HF generate's: `greedy` tokens with the model's own eos
    (compared up to where HF stops; HF pads after it), and `beam` tokens of 3-beam search with
    eos never produced (every hypothesis runs to the end, so HF's and jaxformer's stopping rules
    agree)."""
    from jaxformer import generation as jgen
    from jaxformer.config.models import GenerationConfig
    if greedy:
        ref = hf_generate(hf_model, ids, mask, greedy)
        ours = jgen.generate(model, ids, mask, gen=GenerationConfig(max_new_tokens=greedy))
        np.testing.assert_array_equal(ours[:, :ref.shape[1]], ref)
    if beam:
        ref = hf_generate(hf_model, ids, mask, beam, eos=None, num_beams=3, length_penalty=1.0)
        ours, _ = jgen.generate(model, ids, mask, gen=GenerationConfig(max_new_tokens=beam, strategy="beam",
                                                                       num_beams=3, stop_at_eos=False,
                                                                       length_penalty=1.0))
        np.testing.assert_array_equal(ours, ref)


def check_round_trip(row: Row, hf_model, path: str, imported, out_dir: str) -> None:
    """The table's check of one row: the import's config fields; its outputs within
    1e-5 x max(1, max|out|) of transformers' (LM logits on real tokens, helpers.check_hf_logits;
    an encoder's every output, helpers.check_hf_encoder, which also exports); for an LM,
    generation against HF generate, then the export loaded by transformers (no missing,
    unexpected or mismatched keys) as the expected class, with the row's config keys and
    identical logits."""
    import transformers

    from jaxformer import hf
    model, name, cfg = imported
    ids, mask = row.inputs()
    auto = getattr(transformers, row.auto)
    if row.kind == "encoder":
        _, model, cfg = check_hf_encoder(row.id, hf_model, path, ids, mask, auto, out_dir)
        check_fields(cfg, row.expect, "cfg")
        return
    assert name == "lm", name
    check_fields(cfg, row.expect, "cfg")
    ref = hf_lm_logits(realigned(hf_model), ids, mask)
    check_hf_logits(row.id, ref, lm_logits(model, ids, mask), mask)
    if row.generate:
        check_generate(hf_model, model, ids, mask, *row.generate)
    if not row.export:
        return
    hf.save_pretrained(model, name, cfg, out_dir)
    if row.same_files:
        from safetensors.numpy import load_file
        assert set(load_file(os.path.join(out_dir, "model.safetensors"))) == set(
            load_file(os.path.join(path, "model.safetensors")))
    with open(os.path.join(out_dir, "config.json")) as f:
        assert json.load(f)["architectures"] == [row.export_class or row.hf_class]
    back, info = auto.from_pretrained(out_dir, output_loading_info=True)
    assert not any(info.get(k) for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    back = realigned(back.eval())
    assert type(back).__name__ == (row.export_class or row.hf_class), type(back)
    for key in row.keys:
        assert getattr(back.config, key, _MISSING) == getattr(hf_model.config, key, _MISSING), key
    for key in row.subset_keys:
        theirs = getattr(hf_model.config, key)
        assert {k: getattr(back.config, key)[k] for k in theirs} == theirs, key
    check_fields(back, row.back_expect, "back")
    if row.same_weights:
        sd, sd2 = hf_model.state_dict(), back.state_dict()
        assert sorted(sd) == sorted(sd2)
        assert all(np.array_equal(sd[k].numpy(), sd2[k].numpy()) for k in sd)
    np.testing.assert_array_equal(hf_lm_logits(back, ids, mask), ref)


def copy_config(src: str, dst) -> None:
    """A new directory dst holding src's config.json."""
    os.makedirs(dst)
    with open(os.path.join(src, "config.json")) as f, open(os.path.join(dst, "config.json"), "w") as g:
        g.write(f.read())


def same_params(a, b) -> None:
    """Two jaxformer models hold the same params, bit for bit (so the same logits, no compile)."""
    from jaxformer.convert import param_leaves
    la, lb = param_leaves(a), param_leaves(b)
    assert set(la) == set(lb)
    for p in la:
        np.testing.assert_array_equal(np.asarray(la[p].get_value()), np.asarray(lb[p].get_value()), err_msg=str(p))


def check_in_memory_layout(hf_model, path: str, model, out_dir) -> dict:
    """transformers' own state_dict (its in-memory layout, e.g. fused gate_up_proj / down_proj
    experts) saved as a checkpoint beside `path`'s config.json imports as exactly the params of
    `model`, imported from save_pretrained's files. -> that state_dict (numpy)."""
    from safetensors.numpy import save_file

    from jaxformer import hf
    sd = {k: v.numpy() for k, v in hf_model.state_dict().items()}
    copy_config(path, out_dir)
    save_file(sd, os.path.join(out_dir, "model.safetensors"))
    same_params(hf.from_pretrained(str(out_dir))[0], model)
    return sd
