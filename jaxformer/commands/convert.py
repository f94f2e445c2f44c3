"""`jaxformer convert`: convert weights between torch and flax layouts, file to file.

    jaxformer convert --to flax --config configs/lm.yaml model.safetensors flax.safetensors
    jaxformer convert --to torch flax.safetensors model.safetensors   # config from metadata

Input and output are safetensors (`.pt`/`.bin` inputs are read with weights_only=True).
The conversion is strict and atomic: on any problem it prints every missing, unexpected or
mis-shaped key and writes no output file.
"""
from __future__ import annotations

import sys


def add_arguments(p) -> None:
    p.add_argument("src", help="input .safetensors (or .pt/.bin, loaded with weights_only=True)")
    p.add_argument("dst", help="output .safetensors")
    p.add_argument("--to", required=True, choices=["flax", "torch"], help="target layout")
    p.add_argument("--config", default=None,
                   help="YAML with a `model:` section (or a bare model section); needed unless "
                        "the input carries jaxformer metadata")


def load_model_section(path: str):
    import yaml

    from jaxformer.config import model_config_from_dict
    with open(path) as f:
        data = yaml.safe_load(f)
    section = data.get("model", data) if isinstance(data, dict) else data
    return model_config_from_dict(section)


def run(args) -> int:
    from jaxformer.convert import ConversionError, convert_file
    name = cfg = None
    if args.config:
        name, cfg = load_model_section(args.config)
    src = args.src
    if not src.endswith(".safetensors"):
        src = _torch_file_to_safetensors(src)
    try:
        report = convert_file(src, args.dst, to=args.to, name=name, cfg=cfg)
    except ConversionError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"wrote {report['dst']}: {report['tensors']} tensors, model {report['model']}, layout {args.to}")
    return 0


def _torch_file_to_safetensors(path: str) -> str:
    """Load a torch checkpoint safely (weights_only=True: no arbitrary code) into a temp file."""
    import os
    import tempfile

    import torch

    from jaxformer.convert import to_numpy, write_safetensors
    sd = torch.load(path, map_location="cpu", weights_only=True)
    if isinstance(sd, dict) and "state_dict" in sd and isinstance(sd["state_dict"], dict):
        sd = sd["state_dict"]
    tmp = os.path.join(tempfile.mkdtemp(), "in.safetensors")
    write_safetensors(tmp, {k: to_numpy(v) for k, v in sd.items()}, {"format": "pt"})
    return tmp
