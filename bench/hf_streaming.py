"""Peak memory of `jaxformer convert --from hf` on a large sharded checkpoint (not a test).

Builds a synthetic LLaMA-shaped Hugging Face checkpoint of >= 2 GB on disk, written shard by
shard with numpy + safetensors (the HF model is never built in memory), converts it with the
CLI in a child process, and measures the child's peak RSS two ways: the kernel's high-water
mark VmHWM, which the child reads from /proc/self/status at exit, and VmRSS polled from the
parent every 20 ms. (getrusage's ru_maxrss is printed too, but on Linux it keeps the parent's
RSS at fork time across exec, so with a parent that just wrote a 500 MB shard it overstates a
small child; RUSAGE_CHILDREN has the same problem.) A second child that only imports the same
modules gives the baseline. Then (--verify) a third
child restores the orbax output and compares a few tensors with the source shards. Files are
deleted at the end (unless --keep).

    python bench/hf_streaming.py                      # ~2.3 GB float32, 500 MB shards
    python bench/hf_streaming.py --layers 4 --shard-mb 200 --dtype bfloat16
    python bench/hf_streaming.py --preset llama3-1b   # Llama-3.2-1B's shapes: 2.5 GB bfloat16
                                                      # in 1 GB shards, kept bfloat16
    python bench/hf_streaming.py --preset phi3-fused  # Phi3ForCausalLM (fused qkv_proj and
                                                      # gate_up_proj, longrope): Phi-3-mini's
                                                      # widths, 10 layers: 2.6 GB bfloat16
                                                      # in 1 GB shards
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def llama_tensors(cfg: dict):
    """(name, shape) of a LlamaForCausalLM in HF order."""
    d, f, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    kv = cfg["num_key_value_heads"] * d // cfg["num_attention_heads"]
    yield "model.embed_tokens.weight", (v, d)
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        yield p + "self_attn.q_proj.weight", (d, d)
        yield p + "self_attn.k_proj.weight", (kv, d)
        yield p + "self_attn.v_proj.weight", (kv, d)
        yield p + "self_attn.o_proj.weight", (d, d)
        yield p + "mlp.gate_proj.weight", (f, d)
        yield p + "mlp.up_proj.weight", (f, d)
        yield p + "mlp.down_proj.weight", (d, f)
        yield p + "input_layernorm.weight", (d,)
        yield p + "post_attention_layernorm.weight", (d,)
    yield "model.norm.weight", (d,)
    if not cfg.get("tie_word_embeddings"):
        yield "lm_head.weight", (v, d)


def phi3_tensors(cfg: dict):
    """(name, shape) of a Phi3ForCausalLM in HF order: LLaMA's with q/k/v and gate/up fused."""
    d, f = cfg["hidden_size"], cfg["intermediate_size"]
    kv = cfg["num_key_value_heads"] * d // cfg["num_attention_heads"]
    for name, shape in llama_tensors(cfg):
        if name.endswith(("self_attn.k_proj.weight", "self_attn.v_proj.weight", "mlp.up_proj.weight")):
            continue
        if name.endswith("self_attn.q_proj.weight"):
            name, shape = name.replace("q_proj", "qkv_proj"), (d + 2 * kv, d)
        elif name.endswith("mlp.gate_proj.weight"):
            name, shape = name.replace("gate_proj", "gate_up_proj"), (2 * f, d)
        yield name, shape


ARCHS = {"LlamaForCausalLM": ("llama", llama_tensors), "Phi3ForCausalLM": ("phi3", phi3_tensors)}


def write_checkpoint(path: str, cfg: dict, shard_bytes: int, dtype: str, seed: int = 0,
                     arch: str = "LlamaForCausalLM") -> dict:
    """config.json + model-0000i-of-0000n.safetensors + the index; one shard in memory at a time."""
    import ml_dtypes
    from safetensors.numpy import save_file
    np_dtype = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    rng = np.random.default_rng(seed)
    os.makedirs(path)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump({**cfg, "architectures": [arch], "model_type": ARCHS[arch][0], "dtype": dtype}, f, indent=1)
    tensors = ARCHS[arch][1]
    shards: list[dict] = [{}]
    size, weight_map, sizes, total = 0, {}, [], 0

    def flush():
        name = f"model-{len(sizes) + 1:05d}.safetensors"
        save_file(shards[-1], os.path.join(path, name), metadata={"format": "pt"})
        for k in shards[-1]:
            weight_map[k] = name
        sizes.append(size)
        shards[-1] = {}

    for key, shape in tensors(cfg):
        n = int(np.prod(shape)) * np_dtype.itemsize
        if size and size + n > shard_bytes:
            flush()
            size = 0
        x = rng.standard_normal(shape, dtype=np.float32) * 0.02
        if key.endswith("norm.weight"):
            x += 1.0
        shards[-1][key] = x.astype(np_dtype)
        size += n
        total += n
    flush()
    # HF names shards -0000i-of-0000n; rename now that n is known
    n = len(sizes)
    renamed = {}
    for i in range(n):
        old, new = f"model-{i + 1:05d}.safetensors", f"model-{i + 1:05d}-of-{n:05d}.safetensors"
        os.rename(os.path.join(path, old), os.path.join(path, new))
        renamed[old] = new
    with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total},
                   "weight_map": {k: renamed[v] for k, v in weight_map.items()}}, f)
    return {"bytes": total, "shards": n, "largest_shard": max(sizes),
            "largest_tensor": max(int(np.prod(s)) for _, s in tensors(cfg)) * np_dtype.itemsize}


def run_measured(cmd: list[str]) -> dict:
    """Run cmd; -> {rc, seconds, peak_rss_proc (polled VmRSS), stdout, stderr}."""
    t0 = time.time()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    peak = 0
    import threading
    out: dict = {}

    def drain(stream, key):
        out[key] = stream.read()

    threads = [threading.Thread(target=drain, args=(p.stdout, "stdout")),
               threading.Thread(target=drain, args=(p.stderr, "stderr"))]
    for t in threads:
        t.start()
    while p.poll() is None:
        try:
            with open(f"/proc/{p.pid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        peak = max(peak, int(line.split()[1]) * 1024)
        except OSError:
            pass
        time.sleep(0.02)
    for t in threads:
        t.join()
    return {"rc": p.returncode, "seconds": time.time() - t0, "peak_rss_proc": peak, **out}


# runs `python -m jaxformer ARGS` (or only the imports) and reports the child's own peak RSS
# (VmHWM, KiB) and ru_maxrss (KiB) on its last stderr line
SELF_MEASURED = r"""
import resource, runpy, sys
try:
    if sys.argv[1:] == ["--imports-only"]:
        import flax.nnx, orbax.checkpoint, jaxformer.cli, jaxformer.hf, jaxformer.models
        import jaxformer.hf.files, jaxformer.hf.streaming
        import jaxformer.cli.convert
        from orbax.checkpoint.experimental.v1 import partial
    else:
        sys.argv = ["jaxformer"] + sys.argv[1:]
        runpy.run_module("jaxformer", run_name="__main__")
finally:
    # VmHWM: this process's own peak. ru_maxrss would also count the parent's RSS at fork time
    # (Linux keeps the high-water mark across fork + exec), so it is reported for reference only.
    hwm = [l.split()[1] for l in open("/proc/self/status") if l.startswith("VmHWM:")][0]
    print("MAXRSS_KIB", hwm, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)
"""


def self_maxrss(run: dict, field: int = 1) -> int:
    """The child's VmHWM (field 1) or ru_maxrss (field 2), in bytes."""
    for line in reversed(run.get("stderr", "").splitlines()):
        if line.startswith("MAXRSS_KIB"):
            return int(line.split()[field]) * 1024
    return 0


VERIFY = r"""
import json, sys, numpy as np, jax, orbax.checkpoint as ocp
from flax import nnx
from jaxformer.checkpoint_io import load_model_config
from jaxformer.hf.files import HFCheckpoint
from jaxformer.models import abstract_model
from jaxformer.checkpoint_io import load_param_dtype
from jaxformer.models import cast_params
src, out = sys.argv[1], sys.argv[2]
name, cfg = load_model_config(out)
model = abstract_model(name, cfg)
cast_params(model, load_param_dtype(out))
abstract = nnx.to_pure_dict(nnx.state(model, nnx.Param))
target = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), abstract)
params = ocp.StandardCheckpointer().restore(out + "/params", target)
ck = HFCheckpoint(src)
layer0 = params["decoder"]["layers"][0]
checks = {"model.embed_tokens.weight": params["embed"]["embed_tokens"]["embedding"],
          "model.layers.0.self_attn.k_proj.weight": layer0["self_attn"]["k_proj"]["kernel"].T,
          f"model.layers.{cfg.num_layers - 1}.mlp.down_proj.weight":
              params["decoder"]["layers"][cfg.num_layers - 1]["ffn"]["down_proj"]["kernel"].T,
          "model.norm.weight": params["decoder"]["final_norm"]["scale"]}
if "lm_head" in params:
    checks["lm_head.weight"] = params["lm_head"]["kernel"].T
fused = "model.layers.0.self_attn.qkv_proj.weight" in ck.tensors  # Phi-3: compare the fused rows
if fused:
    del checks["model.layers.0.self_attn.k_proj.weight"]
    checks["model.layers.0.self_attn.qkv_proj.weight"] = np.concatenate(
        [np.asarray(layer0["self_attn"][p]["kernel"]).T for p in ("q_proj", "k_proj", "v_proj")])
    checks["model.layers.0.mlp.gate_up_proj.weight"] = np.concatenate(
        [np.asarray(layer0["ffn"][p]["kernel"]).T for p in ("gate_proj", "up_proj")])
ok = {k: bool(np.array_equal(np.asarray(v).astype(np.float32), ck.read(k).astype(np.float32)))
      for k, v in checks.items()}
ok["dtype"] = sorted({str(x.dtype) for x in jax.tree.leaves(params)})
n = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params))
print(json.dumps({"equal": ok, "params": n}))
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=10)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--intermediate", type=int, default=5504)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--shard-mb", type=int, default=500)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--param-dtype", default="auto", choices=["auto", "float32", "bfloat16"],
                    help="the converted params' dtype (convert --param-dtype)")
    ap.add_argument("--preset", choices=["llama3-1b", "phi3-fused"], default=None,
                    help="llama3-1b: Llama-3.2-1B's shapes (vocab 128256, 16 layers, d 2048, GQA "
                         "32/8 heads, tied, rope_scaling llama3), bfloat16 in 1 GB shards; "
                         "phi3-fused: Phi3ForCausalLM with Phi-3-mini's widths (vocab 32064, d 3072, "
                         "ffn 8192, 32 heads, fused qkv_proj / gate_up_proj, longrope) and 10 layers, "
                         "bfloat16 in 1 GB shards")
    ap.add_argument("--workdir", default=None, help="default: a temp dir under /tmp")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--no-verify", action="store_true")
    args = ap.parse_args()
    if args.preset == "llama3-1b":
        args.layers, args.hidden, args.intermediate, args.vocab = 16, 2048, 8192, 128256
        args.dtype, args.shard_mb = "bfloat16", 1000
    if args.preset == "phi3-fused":
        args.layers, args.hidden, args.intermediate, args.vocab = 10, 3072, 8192, 32064
        args.dtype, args.shard_mb = "bfloat16", 1000
    cfg = {"hidden_size": args.hidden, "intermediate_size": args.intermediate, "num_hidden_layers": args.layers,
           "num_attention_heads": 16, "num_key_value_heads": 4, "vocab_size": args.vocab,
           "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
           "hidden_act": "silu", "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2}
    if args.preset == "llama3-1b":
        cfg.update(num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=131072,
                   rope_theta=500000.0, tie_word_embeddings=True, bos_token_id=128000,
                   eos_token_id=[128001, 128008, 128009],
                   rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                 "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})
    arch = "LlamaForCausalLM"
    if args.preset == "phi3-fused":  # Phi-3-mini-128k's RoPE: longrope, 48 factors per set
        arch, k2 = "Phi3ForCausalLM", 3072 // 32 // 2
        cfg.update(num_attention_heads=32, num_key_value_heads=32, max_position_embeddings=131072,
                   original_max_position_embeddings=4096, bos_token_id=1, eos_token_id=32000, pad_token_id=32000,
                   rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0,
                                    "short_factor": [1.0 + 0.01 * i for i in range(k2)],
                                    "long_factor": [1.0 + 0.5 * i for i in range(k2)]})
        del cfg["rope_theta"]
    work = args.workdir or tempfile.mkdtemp(prefix="hf_streaming_", dir="/tmp")
    os.makedirs(work, exist_ok=True)
    src, out = os.path.join(work, "hf"), os.path.join(work, "ckpt")
    mib = lambda b: f"{b / 2**20:,.0f} MiB"
    try:
        t = time.time()
        info = write_checkpoint(src, cfg, args.shard_mb << 20, args.dtype, arch=arch)
        print(f"wrote {src}: {mib(info['bytes'])} in {info['shards']} shards (largest shard "
              f"{mib(info['largest_shard'])}, largest tensor {mib(info['largest_tensor'])}), "
              f"{time.time() - t:.0f} s", flush=True)
        base = run_measured([sys.executable, "-c", SELF_MEASURED, "--imports-only"])
        conv = run_measured([sys.executable, "-c", SELF_MEASURED, "convert", "--from", "hf", src, "--to", "flax", out,
                            "--param-dtype", args.param_dtype])
        if conv["rc"] != 0:
            print(conv["stdout"], conv["stderr"], file=sys.stderr)
            return 1
        print(conv["stdout"].strip())
        out_bytes = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(out) for f in fs)
        baseline, peak = self_maxrss(base), self_maxrss(conv)
        result = {
            "model_bytes": info["bytes"], "shards": info["shards"], "largest_shard_bytes": info["largest_shard"],
            "largest_tensor_bytes": info["largest_tensor"], "dtype": args.dtype,
            "param_dtype": args.param_dtype, "preset": args.preset, "output_bytes": out_bytes,
            "baseline_peak_rss (imports only, VmHWM)": baseline,
            "convert_peak_rss (VmHWM)": peak, "convert_peak_rss (VmRSS polled)": conv["peak_rss_proc"],
            "convert_ru_maxrss (includes the parent's RSS at fork)": self_maxrss(conv, 2),
            "convert_seconds": round(conv["seconds"], 1),
            "peak_minus_baseline": peak - baseline,
            "peak_over_largest_shard": round(peak / info["largest_shard"], 2),
            "peak_minus_baseline_over_largest_shard": round((peak - baseline) / info["largest_shard"], 2),
            "peak_over_model": round(peak / info["bytes"], 2)}
        if not args.no_verify:
            v = run_measured([sys.executable, "-c", VERIFY, src, out])
            result["verify"] = json.loads(v["stdout"].strip().splitlines()[-1]) if v["rc"] == 0 else v["stderr"][-2000:]
        print(f"peak RSS {mib(peak)} = baseline {mib(baseline)} + {mib(peak - baseline)}; largest shard "
              f"{mib(info['largest_shard'])}, largest tensor {mib(info['largest_tensor'])}, model {mib(info['bytes'])}")
        print(json.dumps(result))
        return 0
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
