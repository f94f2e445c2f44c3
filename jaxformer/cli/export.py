"""`jaxformer export`: write a training run's weights (or any weights `jaxformer.load` reads)
as a product others can use.

    jaxformer export RUN_DIR [--step last|best|N] --to flax|torch|hf|peft OUT [--merge] [--overwrite]
                     [--no-tokenizer]

--to flax   OUT/ is a jaxformer model checkpoint (model.yaml + orbax params/, flax layout):
            what `generate --weights`, `train.init_from` and `jaxformer.load` read
--to torch  OUT is one .safetensors file of the torch_ref state dict, with jaxformer metadata
            (format pt, model name and config), so `jaxformer convert` reads it back; or a .pt
            file, the same state dict saved with torch.save (a plain state_dict). A model given
            by model.module (any NNX module, a port's) is written under its torch module's own
            state_dict keys (model.torch's factory builds it: tied weights under each of their
            names, its buffers; a `--layers jaxformer` port's torch.nn Transformer modules back
            from jaxformer.interop's names), so the user's class loads it with
            load_state_dict(strict=True);
            without model.torch, under the NNX module's paths with convert's leaf names
--to hf     OUT/ is a Hugging Face dir (config.json + model.safetensors) for transformers'
            AutoModel*.from_pretrained (jaxformer.hf.save_pretrained)
--to peft   OUT/ is the weights' LoRA adapter alone as a PEFT adapter dir (adapter_config.json +
            adapter_model.safetensors, HF module names) for peft.PeftModel.from_pretrained on
            the HF base (jaxformer/hf/adapters.py); --base-model records the base's name or path

Weights with LoRA adapters (a `lora:` section in model.yaml): --to flax keeps them as they are;
--to hf and --to torch need --merge, which folds each adapter into its base weight (W + scaling
B A, layers/lora.merge_lora) and writes a plain model; --to peft writes the adapter only.

--step: "last" (default) is RUN_DIR/model/last, the latest checkpoint's weights; "best" the
best eval's; N the params of checkpoint step N. RUN_DIR may also be a model checkpoint dir or
a Hugging Face dir (no --step). The write is atomic: nothing at OUT on failure. An existing OUT
is refused without --overwrite; OUT may never be RUN_DIR, lie inside it or contain it.

The tokenizer the weights record goes with --to flax and --to hf; the output says which, or
"none written" and why. A recorded tokenizer that cannot be read (a corrupt tokenizer.json, a
sha256 that differs, a tokens dir that moved) is refused; --no-tokenizer writes the weights alone.
"""
from __future__ import annotations

import os
import tempfile

from jaxformer.config.module import MODULE


def add_arguments(p) -> None:
    p.add_argument("run_dir", metavar="RUN_DIR",
                   help="a training run dir (or a model checkpoint dir or a Hugging Face dir)")
    p.add_argument("out", metavar="OUT", help="output: a directory (flax, hf) or a .safetensors / .pt file (torch)")
    p.add_argument("--to", required=True, choices=["flax", "torch", "hf", "peft"], help="what to write")
    p.add_argument("--merge", action="store_true",
                   help="fold LoRA adapters into the base weights (--to flax|torch|hf)")
    p.add_argument("--base-model", default=None,
                   help="--to peft: adapter_config.json's base_model_name_or_path (hub id or path)")
    p.add_argument("--step", default=None, help="last (default), best, or a checkpoint step number")
    p.add_argument("--overwrite", action="store_true", help="replace an existing OUT")
    p.add_argument("--no-tokenizer", action="store_true",
                   help="write no tokenizer (one the weights record but that cannot be read is refused without it)")


def check_destination(src: str, out: str, overwrite: bool) -> str:
    """-> OUT as an absolute path, or ValueError/FileExistsError before anything is read."""
    src_real, out_real = os.path.realpath(src), os.path.realpath(out)
    if out_real == src_real or out_real.startswith(src_real + os.sep):
        raise ValueError(f"OUT {out} is {'RUN_DIR' if out_real == src_real else 'inside RUN_DIR'} "
                         f"{src}; export to a path outside it")
    if src_real.startswith(out_real + os.sep):
        raise ValueError(f"OUT {out} contains RUN_DIR {src}; export to a path outside it")
    if os.path.lexists(out) and not overwrite:
        raise FileExistsError(f"{out} exists; choose another output or pass --overwrite")
    return os.path.abspath(out)


def run(args) -> int:
    import jaxformer
    from jaxformer import checkpoint_io
    out = check_destination(args.run_dir, args.out, args.overwrite)
    if args.to == "torch" and not out.endswith((".safetensors", ".pt")):
        raise ValueError(f"--to torch writes one .safetensors or .pt file; OUT {args.out} has another suffix")
    if args.to == "peft" and args.merge:
        raise ValueError("--merge folds the adapter into the base: it applies to --to flax|torch|hf, "
                         "not --to peft (which writes the adapter alone)")
    if args.base_model is not None and args.to != "peft":
        raise ValueError("--base-model applies to --to peft only")
    step = checkpoint_io.parse_step(args.step)
    model, cfg = jaxformer.load(args.run_dir, step=step)
    name = checkpoint_io.model_name(model, cfg)
    if name == MODULE and args.to not in ("flax", "torch"):
        raise ValueError(f"--to {args.to} writes jaxformer's own families; {args.run_dir} holds a model.module "
                         f"({cfg.module}): export it --to torch (its torch module's keys) or --to flax")
    lora = checkpoint_io.lora_config(args.run_dir, step) if checkpoint_io.path_kind(args.run_dir) != "hf" else None
    merged = _merge_or_refuse(model, lora, args)
    tok = _tokenizer(args.run_dir, step, args.to, args.no_tokenizer)
    if args.to == "peft":
        from jaxformer.hf.adapters import save_adapter
        r = save_adapter(model, name, cfg, lora, out, overwrite=args.overwrite, base_model=args.base_model)
        print(f"wrote {out}: PEFT LoRA adapter (r={lora.r}, {r['modules']} modules, target_modules "
              f"{r['target_modules']}, {r['family']} names), from {args.run_dir}"
              + (f" (step {step})" if step is not None else ""))
        return 0
    if args.to == "flax":
        with tempfile.TemporaryDirectory() as d:
            entry = tok.describe() if tok is not None else None
            checkpoint_io.save_model(model, name, cfg, out, overwrite=args.overwrite, tokenizer=entry,
                                     tokenizer_file=tok.save(d) if tok is not None else None,
                                     lora=None if merged else lora)
        what = "model checkpoint (model.yaml + params/)"
    elif args.to == "torch":
        tensors, what = _torch_tensors(model, name, cfg)
        _write_torch(out, tensors, name, cfg)
        what = f"{what} ({len(tensors)} tensors, {'safetensors' if out.endswith('.safetensors') else 'torch.save'})"
    else:
        from jaxformer.hf import save_pretrained
        from jaxformer.train.data.tokenizer import hf_tokenizer_files
        files = hf_tokenizer_files(tok, getattr(cfg, "pad_id", None)) if tok is not None else {}
        r = save_pretrained(model, name, cfg, out, overwrite=args.overwrite, files=files)
        what = f"Hugging Face {r['architecture']} dir ({r['tensors']} tensors)"
    print(f"wrote {out}: {name} {what}, from {args.run_dir}"
          + (f" (step {step})" if step is not None else ""))
    if merged:
        print(f"  merged {len(merged)} LoRA adapter(s) into their base weights (r={lora.r})")
    if tok is not None and args.to != "torch":
        copied = tok.content is not None or (args.to == "hf" and tok.kind == "bytes")
        print(f"  tokenizer: {tok.spec} ({tok.kind}" + (", tokenizer.json)" if copied else ", no file to copy)"))
    elif args.to in ("flax", "hf"):
        why = "--no-tokenizer" if args.no_tokenizer else f"{args.run_dir} records none"
        print(f"  tokenizer: none written ({why})")
    return 0


def _torch_tensors(model, name: str, cfg) -> tuple[dict, str]:
    """({torch key: array or tensor}, what they are): the torch_ref state dict of our families;
    a model.module's under its torch module's own keys (model.torch's factory), or, without
    one, under the NNX module's paths (jaxformer.module_weights)."""
    from jaxformer import convert, module_weights
    if name != MODULE:
        return convert.flax_to_torch_arrays(model), "torch_ref state dict"
    if cfg.torch is None:
        return module_weights.flax_arrays(model), (f"{cfg.module} weights under its parameter paths (no "
                                                   "model.torch to give the torch module's own keys)")
    from torch_ref.models import build_model
    module = build_model(MODULE, cfg)
    return module_weights.torch_state_dict(model, module), f"state dict of {cfg.torch}()'s module"


def _write_torch(out: str, tensors: dict, name: str, cfg) -> None:
    """OUT.safetensors (numpy copies, jaxformer's metadata) or OUT.pt (torch.save of the state
    dict; a tied weight stays one tensor under its names), written atomically."""
    from jaxformer import convert
    if out.endswith(".safetensors"):
        convert.write_safetensors(out, {k: convert.to_numpy(v) for k, v in tensors.items()},
                                  {"format": "pt", **convert.model_metadata(name, cfg)})
        return
    import torch

    from jaxformer.fileio import atomic_file
    state = {k: v if isinstance(v, torch.Tensor) else convert.to_torch(v) for k, v in tensors.items()}
    with atomic_file(out) as tmp:
        torch.save(state, tmp)


def _merge_or_refuse(model, lora, args) -> list[str]:
    """--merge: fold the adapters into the base (-> the merged paths). Without it, adapters go
    only where they can be kept (--to flax, --to peft)."""
    from jaxformer.layers.lora import has_adapters, merge_lora
    adapted = has_adapters(model)
    if args.merge:
        if not adapted:
            raise ValueError(f"--merge: {args.run_dir} has no LoRA adapters to merge")
        return merge_lora(model)
    if args.to == "peft" and not adapted:
        raise ValueError(f"--to peft: {args.run_dir} has no LoRA adapters (train with train.lora, "
                         "or export the whole model with --to hf)")
    if adapted and args.to in ("hf", "torch"):
        raise ValueError(f"{args.run_dir} has LoRA adapters: pass --merge to fold them into the base "
                         f"for --to {args.to}, or write the adapter alone with --to peft")
    if adapted and lora is None:
        raise ValueError(f"{args.run_dir}: the model has LoRA adapters but no LoRA config is recorded")
    return []


def _tokenizer(src: str, step, to: str, skip: bool):
    """The tokenizer the weights were trained with, when they record one (else None): it goes
    with the export (model.yaml's entry and tokenizer.json; an HF dir's tokenizer.json). One
    they record but that cannot be read (a corrupt file, a moved tokens dir) is refused, never
    dropped without a word: --no-tokenizer exports the weights alone. --to torch and --to peft
    write no tokenizer, so they do not read it."""
    from jaxformer.train.data.tokenizer import NoTokenizer, tokenizer_for_checkpoint
    if skip or to in ("torch", "peft"):
        return None
    try:
        return tokenizer_for_checkpoint(src, step if step == "best" else None)
    except NoTokenizer:
        return None
    except ValueError as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise ValueError(f"{first[:300]}; the export would have no tokenizer: repair it, or pass "
                         "--no-tokenizer to export the weights alone") from None
