"""`jaxformer convert`: convert weights between torch and flax layouts, file to file, or import
and export Hugging Face model directories.

    jaxformer convert --to flax --config lm model.safetensors flax.safetensors
    jaxformer convert --to torch flax.safetensors model.safetensors   # config from metadata
    jaxformer convert --from hf HF_DIR --to flax OUT    # OUT/model.yaml, OUT/params, OUT/train.yaml
    jaxformer convert --from flax CKPT --to hf OUT      # OUT/config.json, OUT/model.safetensors
    jaxformer convert --from hf HF_DIR --adapter PEFT_DIR --to flax OUT [--merge]
                                  # the base with a PEFT LoRA adapter applied (hf/adapters.py):
                                  # OUT/model.yaml records it (`lora:`), or --merge folds it in

File mode: input and output are safetensors (`.pt`/`.bin` inputs are read with
weights_only=True). HF mode: see jaxformer/hf/ (config.json plus model.safetensors, sharded
safetensors with model.safetensors.index.json, or pytorch_model.bin read with
weights_only=True; converted shard by shard with bounded memory).
Every conversion is strict and atomic: on any problem it names the first missing, unexpected
or mis-shaped key (or unsupported config option; --debug lists them all) and writes nothing.
An existing output is replaced only with --overwrite, and the input never is.
"""
from __future__ import annotations


def add_arguments(p) -> None:
    p.add_argument("src", help="input: a .safetensors (.pt/.bin) file; with --from hf a Hugging Face "
                               "model directory; with --from flax a jaxformer model checkpoint dir")
    p.add_argument("dst", help="output: a .safetensors file; with --from hf|flax a directory")
    p.add_argument("--to", required=True, choices=["flax", "torch", "hf"], help="target layout")
    p.add_argument("--from", dest="source", default=None, choices=["hf", "flax"],
                   help="directory modes: hf (a Hugging Face dir, with --to flax) or flax (a "
                        "jaxformer model checkpoint, with --to hf); omit for file mode")
    p.add_argument("--config", default=None,
                   help="file mode: YAML with a `model:` section (or a bare model section) or a packaged "
                        "config's name; needed "
                        "unless the input carries jaxformer metadata")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an existing output (never the input itself)")
    p.add_argument("--adapter", default=None,
                   help="--from hf: a PEFT LoRA adapter dir (adapter_config.json + adapter_model."
                        "safetensors) to apply on the base")
    p.add_argument("--merge", action="store_true",
                   help="with --adapter: fold the adapter into the base weights")
    p.add_argument("--param-dtype", default="float32", choices=["float32", "bfloat16", "auto"],
                   help="--from hf: the params' storage dtype (auto: bfloat16 for a bfloat16 "
                        "checkpoint, else float32); bfloat16 halves memory, and the model still "
                        "computes in its config's dtype")


def load_model_section(path: str):
    """(name, cfg) from a YAML file's `model:` section (or a bare model section); a packaged
    config's name (lm, llama, ...) reads that config. Read with
    yaml.safe_load: plain data only, so a `!!python/...` tag is refused, not run."""
    import yaml

    from jaxformer.config import ConfigError, model_config_from_dict
    from jaxformer.fileio import yaml_load
    from jaxformer.train.config import resolve_config
    path = resolve_config(path)  # a packaged config's name (lm, llama, ...) works as in train
    with open(path) as f:
        try:
            data = yaml_load(f)
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
            what = getattr(e, "problem", None) or str(e).splitlines()[0]
            if isinstance(e, yaml.constructor.ConstructorError):
                what = f"refused: {what}; only plain YAML data is read (yaml.safe_load)"
            raise ConfigError(f"{path}: not a valid config{where}: {what}") from None
    section = data.get("model", data) if isinstance(data, dict) else data
    if not isinstance(section, dict):
        raise ConfigError(f"{path}: expected a mapping with a `model:` section (or the model "
                          f"fields themselves), not a {type(section).__name__}")
    return model_config_from_dict(section)


MODES = {None: ("flax", "torch"), "hf": ("flax",), "flax": ("hf",)}


def run(args) -> int:
    """Errors are raised (the jaxformer CLI prints them: one or two lines, exit 2)."""
    if args.param_dtype != "float32" and args.source != "hf":
        raise ValueError("--param-dtype applies to --from hf imports only")
    if args.to not in MODES[args.source]:
        src = f"--from {args.source}" if args.source else "file mode (no --from)"
        raise ValueError(f"{src} converts --to {' or '.join(MODES[args.source])}, not --to {args.to}")
    if args.adapter is not None and args.source != "hf":
        raise ValueError("--adapter applies to --from hf imports only (a PEFT adapter on its HF base)")
    if args.merge and args.adapter is None:
        raise ValueError("--merge applies with --adapter only")
    if args.source == "hf":
        return _import_hf_adapter(args) if args.adapter is not None else _import_hf(args)
    if args.source == "flax":
        return _export_hf(args)
    return _convert_file(args)


def _convert_file(args) -> int:
    from jaxformer.convert import check_destination, convert_file
    check_destination(args.src, args.dst, overwrite=args.overwrite)  # before reading --config
    name = cfg = None
    if args.config:
        name, cfg = load_model_section(args.config)
    report = convert_file(args.src, args.dst, to=args.to, name=name, cfg=cfg, overwrite=args.overwrite)
    print(f"wrote {report['dst']}: {report['tensors']} tensors, model {report['model']}, layout {args.to}")
    return 0


def _import_hf(args) -> int:
    """The HF conversion, plus OUT/train.yaml (jaxformer.train.finetune) written into the same
    atomic output."""
    import os

    from jaxformer.hf import convert_hf_to_flax
    from jaxformer.train.data import tokenizer as tk
    from jaxformer.train.finetune import finetune_yaml, prepare_command, tokens_path
    out = os.path.abspath(args.dst)
    why = []
    # the checkpoint's own tokenizer: its tokenizer.json goes into OUT (generate reads it) and
    # train.yaml's data is a tokens dir prepared with it
    tok, tok_note = None, None
    if os.path.isdir(args.src) and tk.has_hf_tokenizer(args.src):
        try:
            tok = tk.hf_dir_tokenizer(args.src)
        except ValueError as e:  # the weights convert without it
            tok_note = f"tokenizer not copied: {e}"

    def train_yaml(name: str, cfg) -> dict[str, str]:
        text, reason = finetune_yaml(name, cfg, out, os.path.join(out, "train.yaml"),
                                     tokenizer=os.path.abspath(args.src) if tok is not None else None)
        why.append(reason)
        files = {"train.yaml": text}
        if tok is not None and tok.content is not None:
            files[tk.FILE] = tok.content.decode("utf-8")
        return files

    r = convert_hf_to_flax(args.src, out, overwrite=args.overwrite, extra_files=train_yaml,
                           param_dtype=args.param_dtype)
    print(f"wrote {r['out']}: {r['architecture']} -> jaxformer {r['model']}, {r['params']} {r['param_dtype']} "
          f"params from {r['tensors']} HF tensors in {r['shards']} shard(s) ({r['bytes'] / 2**20:.1f} MiB)")
    for k in r["skipped"]:
        print(f"  skipped {k} (a buffer, a copy identical to a tied weight, or a part a note below names)")
    for note in r["notes"]:
        print(f"  note: {note}")
    status = f"written with a placeholder data section: {why[0]}" if why[0] else "written"
    print(f"  train.yaml: {status}")
    if tok is not None:
        print(f"  tokenizer: {tk.FILE if tok.content is not None else 'none copied'} ({tok.kind}, "
              f"vocab {tok.vocab_size})")
        if r["model"] == "lm":
            print(f"  data: {prepare_command(os.path.abspath(args.src), tokens_path(out))}")
    elif tok_note:
        print(f"  note: {tok_note}")
    print(f"  fine-tune: jaxformer train --config {r['out']}/train.yaml")
    return 0


def _import_hf_adapter(args) -> int:
    """The HF base with a PEFT adapter on it, built in memory (hf.from_pretrained(adapter=)),
    written as a model checkpoint with the adapter (or merged into the base with --merge)."""
    import os
    import tempfile

    from jaxformer.checkpoint_io import save_model
    from jaxformer.hf import _refuse_same, from_pretrained
    from jaxformer.layers.lora import merge_lora
    from jaxformer.train.data import tokenizer as tk
    _refuse_same(args.src, args.dst, adapter=args.adapter)
    if os.path.lexists(args.dst) and not args.overwrite:
        raise FileExistsError(f"{args.dst} exists; choose another output or pass --overwrite")
    model, name, cfg, r = from_pretrained(args.src, adapter=args.adapter, param_dtype=args.param_dtype,
                                          return_report=True)
    lora = r["lora"]
    merged = merge_lora(model) if args.merge else []
    tok = tk.hf_dir_tokenizer(args.src) if tk.has_hf_tokenizer(args.src) else None
    with tempfile.TemporaryDirectory() as d:
        save_model(model, name, cfg, args.dst, overwrite=args.overwrite, lora=None if merged else lora,
                   tokenizer=tok.describe() if tok is not None else None,
                   tokenizer_file=tok.save(d) if tok is not None else None)
    how = f"merged into {len(merged)} base weights" if merged else "kept as adapters (model.yaml `lora:`)"
    print(f"wrote {os.path.abspath(args.dst)}: {r['architecture']} -> jaxformer {name} with the PEFT adapter "
          f"{args.adapter} (r={lora.r}, alpha={lora.alpha}, {len(lora.target_modules)} target names), {how}")
    return 0


def _export_hf(args) -> int:
    from jaxformer.hf import convert_flax_to_hf
    r = convert_flax_to_hf(args.src, args.dst, overwrite=args.overwrite)
    print(f"wrote {r['out']}: jaxformer {r['model']} -> {r['architecture']} ({r['tensors']} tensors); "
          f"load it with transformers' AutoModel*.from_pretrained")
    return 0

