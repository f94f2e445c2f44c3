"""`jaxformer generate`: generate text (or token ids) with an `lm` or `seq2seq` model from
weights on disk.

    jaxformer generate --weights runs/lm --prompt "Hel" [--prompt "def "] --max-new-tokens 32
        [--tokenizer SPEC | --ids] [--config lm] [--framework jax|torch]
        [--strategy greedy|sample|beam] [--temperature T] [--top-k K] [--top-p P]
        [--num-beams W] [--length-penalty A] [--eos-id ID ...] [--seed S] [--json]
        [--weights-dtype fp32|bf16|int8] [--prefill-chunk N]

--weights is a safetensors file in torch or flax layout (as `jaxformer convert` and `jaxformer
export --to torch` write it; the layout comes from its `format` metadata), or a directory that
`jaxformer.load` reads: a training run dir (its model/last; --step best or N for others), a
jaxformer model checkpoint dir (model.yaml + params/, jaxformer/checkpoint_io.py) or a Hugging
Face dir. --config is a YAML with a `model:` section; a file without jaxformer metadata needs
it, and for a directory it must describe the model the directory holds.
An HF dir's generation_config.json supplies the decoding settings no flag gives (eos ids,
max_new_tokens, do_sample, temperature, top_k, top_p, num_beams, length_penalty).
Prompts are text (the source sentence for seq2seq), encoded with the weights' own tokenizer
(jaxformer.train.data.tokenizer.tokenizer_for_checkpoint: an HF dir's tokenizer.json or other
tokenizer files, the tokenizer a jaxformer checkpoint or run records, the byte tokenizer for the
byte vocab of 259) or --tokenizer SPEC; the output is printed as text: an lm's prompt with its
continuation, a seq2seq model's output, one block per prompt (a blank line between blocks).
With --ids, prompts are whitespace-separated token ids and one line of ids is printed per prompt.
--json prints one object: the ids ("tokens"), and in text mode the texts too.
--prefill-chunk N prefills an lm's prompts through the KV cache N tokens at a time (attention
memory O(N x length) instead of O(length^2); the same ids, docs/numerics.md §31).
"""
from __future__ import annotations

import json
import os

from jaxformer.config.module import MODULE


def add_arguments(p) -> None:
    p.add_argument("--weights", required=True,
                   help="safetensors file (torch or flax layout), training run dir, model checkpoint dir or HF dir")
    p.add_argument("--step", default=None, help="with a run dir: last (default), best or a checkpoint step")
    p.add_argument("--config", default=None, help="YAML with a `model:` section or a packaged config's name (default: file metadata)")
    p.add_argument("--prompt", action="append", required=True,
                   help="prompt text (with --ids: whitespace-separated token ids); repeat for a batch")
    p.add_argument("--ids", action="store_true", help="prompts and output are token ids, not text")
    p.add_argument("--tokenizer", default=None, metavar="SPEC",
                   help="tokenizer.json, HF dir, tokens dir or `bytes` (default: the weights' own)")
    p.add_argument("--framework", choices=["jax", "torch"], default="jax")
    # None = the HF dir's generation_config.json, else GenerationConfig's default
    p.add_argument("--max-new-tokens", type=int, default=None, help="default 32")
    p.add_argument("--strategy", choices=["greedy", "sample", "beam"], default=None, help="default greedy")
    p.add_argument("--temperature", type=float, default=None)
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--num-beams", type=int, default=None)
    p.add_argument("--length-penalty", type=float, default=None)
    p.add_argument("--eos-id", type=int, action="append", default=None,
                   help="stop at this token id; repeat for several (default: the model's eos ids)")
    p.add_argument("--no-eos-stop", action="store_true", help="always generate max-new-tokens")
    p.add_argument("--seed", type=int, default=0)
    from jaxformer.config.models import WEIGHTS_DTYPES
    p.add_argument("--weights-dtype", choices=WEIGHTS_DTYPES, default="fp32",
                   help="matmul weights to decode with: fp32 (as stored), bf16, or int8 (weight-only, "
                        "per output channel; docs/numerics.md §24)")
    p.add_argument("--prefill-chunk", type=int, default=None, metavar="N",
                   help="lm: prefill the prompts N tokens at a time (memory O(N x length); same ids)")
    p.add_argument("--json", action="store_true", help="print a JSON object instead of lines")


class GenerateError(ValueError):
    pass


def load_model(weights: str, config: str | None, framework: str, step=None):
    """-> (name, cfg, model) with the weights loaded strictly (every key checked)."""
    from jaxformer import convert
    name = cfg = None
    if config:
        from jaxformer.cli.convert import load_model_section
        name, cfg = load_model_section(config)
    if os.path.isdir(weights):
        return _load_model_dir(weights, name, cfg, framework, step)
    if step is not None:
        raise GenerateError(f"--step applies to a training run dir; {weights} is a file")
    tensors, meta = convert.read_safetensors(weights)
    if cfg is None:
        if "jaxformer_config" not in meta:
            raise GenerateError(f"{weights} carries no jaxformer metadata; pass --config")
        from jaxformer.config import model_config_from_dict
        name, cfg = model_config_from_dict({"name": meta["jaxformer_model"], **json.loads(meta["jaxformer_config"])})
    if name not in ("lm", "seq2seq"):
        raise GenerateError(f"generate needs an `lm` or `seq2seq` model, got {name!r}")
    state_dict = torch_layout(tensors, meta, name, cfg)
    if framework == "jax":
        from jaxformer.models import build_model
        model = build_model(name, cfg)
        convert.load_torch_state_dict(model, state_dict)
    else:
        from torch_ref.models import build_model
        model = build_model(name, cfg)
        convert.check_torch_load(model, {k: convert.to_torch(v) for k, v in state_dict.items()})
    return name, cfg, model


def torch_layout(tensors: dict, meta: dict, name: str, cfg) -> dict:
    """Tensors of a safetensors file -> {torch key: array in torch layout}."""
    from jaxformer import convert
    from jaxformer.models import abstract_model
    if meta.get("format", "pt") != "flax":
        return tensors
    model = abstract_model(name, cfg)
    by_key = {convert.flax_key(p): p for p in convert.param_leaves(model)}
    problems = [f"unexpected: {k}" for k in tensors if k not in by_key]
    problems += [f"missing: {k}" for k in by_key if k not in tensors]
    if problems:
        raise convert.ConversionError(problems)
    prefixes = convert.scan_prefixes(model)
    out = {}
    for k, x in tensors.items():
        out.update(convert.flax_leaf_to_torch(by_key[k], x, prefixes))
    return out


def _load_model_dir(directory: str, name, cfg, framework: str, step=None):
    """A directory jaxformer.load reads (run, model checkpoint or HF dir) -> (name, cfg, model)."""
    import jaxformer
    from jaxformer import checkpoint_io, convert
    model, dir_cfg = jaxformer.load(directory, step=step)
    from jaxformer.layers.lora import merge_lora
    merge_lora(model)  # LoRA adapters (a train.lora run) folded into the base: a plain model to decode
    dir_name = checkpoint_io.model_name(model, dir_cfg)
    if cfg is not None and (name, cfg) != (dir_name, dir_cfg):
        raise GenerateError(f"--config describes {name!r} {cfg}, but {directory} holds {dir_name!r} {dir_cfg}")
    if dir_name == MODULE:  # any causal LM module: decoded without a cache (generation.module_generate)
        if framework == "torch":
            raise GenerateError(f"{directory} holds a model.module ({dir_cfg.module}): it generates with "
                                "--framework jax")
        return dir_name, dir_cfg, model
    if dir_name not in ("lm", "seq2seq"):
        raise GenerateError(f"generate needs an `lm` or `seq2seq` model, got {dir_name!r}")
    if framework == "torch":
        from torch_ref.models import build_model
        tmodel = build_model(dir_name, dir_cfg)
        convert.check_torch_load(tmodel, {k: convert.to_torch(v) for k, v in convert.flax_to_torch_arrays(model).items()})
        model = tmodel.eval()
    return dir_name, dir_cfg, model


def _check_request_fits(name, cfg, prompts, gen, framework: str) -> None:
    """Before the cache is allocated (issue 51 §4): generation.request_bytes against the memory
    available now, the weights already loaded (torch's on the host); one line with the numbers
    when it cannot fit, not an out-of-memory kill."""
    from jaxformer import memory
    from jaxformer.generation import request_bytes
    prompt_len = max((len(p) for p in prompts), default=0)
    parts = request_bytes(name, cfg, len(prompts), prompt_len, gen)
    rows = len(prompts) * (gen.num_beams if gen.strategy == "beam" else 1)
    sizes = ", ".join(f"{k} {v / 2**30:,.2f} GiB" for k, v in parts.items())
    memory.check_bytes(sum(parts.values()), f"generating {gen.max_new_tokens} tokens for {rows} row(s) of up to "
                         f"{prompt_len} prompt tokens ({sizes})", host=framework == "torch",
                         advice="fewer prompts, beams or --max-new-tokens")


def generation_config(args, weights: str):
    """The GenerationConfig of the flags; an HF dir's generation_config.json supplies the
    settings a flag leaves unset (its unimplemented keys are printed to stderr)."""
    import sys

    from jaxformer.config.models import GenerationConfig
    fields = {}
    if os.path.isfile(os.path.join(weights, "generation_config.json")):
        from jaxformer.hf import generation_defaults
        fields, notes = generation_defaults(weights)
        for note in notes:
            print(f"note: {note}", file=sys.stderr)
    flags = dict(max_new_tokens=args.max_new_tokens, strategy=args.strategy, temperature=args.temperature,
                 top_k=args.top_k, top_p=args.top_p, num_beams=args.num_beams,
                 length_penalty=args.length_penalty,
                 eos_id=None if args.eos_id is None else tuple(args.eos_id))
    fields.update({k: v for k, v in flags.items() if v is not None})
    return GenerationConfig(**fields, stop_at_eos=not args.no_eos_stop, seed=args.seed,
                            weights_dtype=args.weights_dtype, prefill_chunk=args.prefill_chunk)


def _own_tokenizer(args, cfg):
    """The tokenizer the weights record (a directory), or the byte tokenizer for the byte vocab."""
    from jaxformer.train.data import tokenizer as tk
    if os.path.isdir(args.weights):
        return tk.tokenizer_for_checkpoint(args.weights, args.step)
    if getattr(cfg, "vocab_size", None) == tk.VOCAB_SIZE:
        return tk.ByteTokenizer()
    raise GenerateError(f"{args.weights} records no tokenizer (vocab {cfg.vocab_size}); pass "
                        f"--tokenizer SPEC ({tk.SPEC_HELP}), or prompts as ids with --ids")


def run(args) -> int:
    import numpy as np

    from jaxformer.config.models import eos_ids
    if args.ids and args.tokenizer is not None:
        raise GenerateError("--ids takes prompts as token ids; --tokenizer applies to text prompts")
    gen = generation_config(args, args.weights)
    prompts = tok = None
    if args.ids:
        try:
            prompts = [[int(t) for t in p.split()] for p in args.prompt]
        except ValueError as e:
            raise GenerateError(f"--prompt takes whitespace-separated token ids with --ids: {e}") from None
    elif args.tokenizer is not None:  # a bad spec fails before the weights load
        from jaxformer.train.data.tokenizer import load_tokenizer
        tok = load_tokenizer(args.tokenizer)
    name, cfg, model = load_model(args.weights, args.config, args.framework, args.step)
    if name == MODULE:
        return _module_run(args, model, cfg, gen, prompts, tok)
    if not args.ids:
        tok = tok or _own_tokenizer(args, cfg)
        prompts = [tok.encode(p).tolist() or ([tok.bos_id] if tok.bos_id is not None else [])
                   for p in args.prompt]
        top = max((max(p) for p in prompts if p), default=-1)
        if top >= cfg.vocab_size:
            raise GenerateError(f"the tokenizer ({tok.spec}, vocab {tok.vocab_size}) gives id {top}, "
                                f"outside the model's vocab of {cfg.vocab_size}: is it the model's "
                                "tokenizer? (--tokenizer SPEC)")
    _check_request_fits(name, cfg, prompts, gen, args.framework)
    if args.framework == "jax":
        from jaxformer import generation as g
    else:
        from torch_ref import generation as g
    if name == "lm":
        ids, mask = g.pad_prompts(prompts, cfg.pad_id)
        out = g.lm_generate(model, ids, mask, gen)
    else:
        if any(len(p) == 0 for p in prompts):
            raise GenerateError("every prompt needs at least one token")
        src = np.full((len(prompts), max(len(p) for p in prompts)), cfg.pad_id, np.int32)
        for b, p in enumerate(prompts):
            src[b, :len(p)] = p  # sources are right-padded; the mask comes from pad_id
        out = g.seq2seq_generate(model, src, None, gen)
    tokens, scores = out if isinstance(out, tuple) else (out, None)
    stop = eos_ids(cfg.eos_id if gen.eos_id is None else gen.eos_id) if gen.stop_at_eos else ()
    rows = [_trim(row, stop) for row in np.asarray(tokens)]
    texts = None
    if tok is not None:
        texts = [_text(tok, p if name == "lm" else [], [t for t in row if t not in stop])
                 for p, row in zip(prompts, rows, strict=True)]
    if args.json:
        print(json.dumps({"model": name, "framework": args.framework, "weights_dtype": gen.weights_dtype,
                          "tokens": rows, **({"texts": texts} if texts is not None else {}),
                          **({"scores": [float(s) for s in scores]} if scores is not None else {})}))
    elif texts is not None:
        print("\n\n".join(texts))
    else:
        for row in rows:
            print(" ".join(str(t) for t in row))
    return 0


def _module_run(args, model, cfg, gen, prompts, tok) -> int:
    """generate for a model.module (a causal LM: model(ids) -> logits [B, T, V]), without a KV
    cache; prompts of one length (its call takes no mask)."""
    import numpy as np

    from jaxformer.generation import module_generate
    if not args.ids:
        tok = tok or _own_tokenizer(args, cfg)
        prompts = [tok.encode(p).tolist() for p in args.prompt]
    if any(len(p) == 0 for p in prompts) or len({len(p) for p in prompts}) != 1:
        raise GenerateError("a model.module takes prompts of one length (at least one token; its call has no "
                            f"padding mask), got lengths {[len(p) for p in prompts]}")
    eos = tuple(gen.eos_id) if isinstance(gen.eos_id, (tuple, list)) else (() if gen.eos_id is None else (gen.eos_id,))
    try:
        tokens = module_generate(model, np.asarray(prompts, np.int32), gen, eos if gen.stop_at_eos else ())
    except (TypeError, IndexError, ValueError) as e:
        raise GenerateError(f"model.module {cfg.module} does not decode as a causal LM (model(ids [B, T]) -> "
                            f"logits [B, T, V]) at length {len(prompts[0]) + gen.max_new_tokens}: {str(e).splitlines()[0]}") from None
    rows = [_trim(row, eos if gen.stop_at_eos else ()) for row in tokens]
    texts = [_text(tok, p, r) for p, r in zip(prompts, rows, strict=True)] if tok is not None else None
    if args.json:
        print(json.dumps({"model": MODULE, "framework": "jax", "tokens": rows, **({"texts": texts} if texts else {})}))
    elif texts is not None:
        print("\n\n".join(texts))
    else:
        for row in rows:
            print(" ".join(str(t) for t in row))
    return 0


def _text(tok, prompt: list[int], new: list[int]) -> str:
    """An lm's prompt and continuation decoded together (so a tokenizer's spacing rules see the
    whole text), or a seq2seq output (prompt empty)."""
    return tok.decode(list(prompt) + list(new))


def _trim(row, eos: tuple[int, ...]) -> list[int]:
    """Token ids up to and including the first EOS (any of `eos`; the pads after it dropped)."""
    out = []
    for t in row.tolist():
        out.append(int(t))
        if t in eos:
            break
    return out
