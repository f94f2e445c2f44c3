"""Every bad input a user can give the CLI, in one table. Each row asserts the exit code, a phrase
of the message, that stderr is one or two lines with no traceback, and that what the row
protects (an existing workdir, a destination, an input) is byte-for-byte unchanged, with nothing
new left behind where the command would have written.

A row runs `jaxformer ARGV` in-process (cli.main, stderr captured) from a fresh temporary
directory that its `setup` fills; `subprocess=True` runs it as a separate process instead (for
rows that need signals, resource limits or a clean interpreter).
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import yaml
from helpers import cli_env


@dataclasses.dataclass(frozen=True)
class Row:
    name: str
    argv: list[str]  # after `jaxformer`; "{tmp}" is replaced by the row's directory
    phrase: str  # must appear in stderr (case-insensitive)
    setup: Callable[[str], None] | None = None  # fills the row's directory
    code: int = 2
    protect: tuple[str, ...] = ()  # paths (relative) whose bytes and listing must not change
    absent: tuple[str, ...] = ()  # paths (relative) that must not exist afterwards
    subprocess: bool = False
    env: dict | None = None
    preexec: Callable[[], None] | None = None  # subprocess rows: runs in the child (resource limits)


def snapshot(root: str, rel: str) -> dict:
    """{relative path: sha256} of a file or every file under a folder (missing: {})."""
    path = os.path.join(root, rel)
    if os.path.isfile(path):
        return {rel: hashlib.sha256(open(path, "rb").read()).hexdigest()}
    out = {}
    for dirpath, dirs, files in os.walk(path):
        for name in dirs + files:
            p = os.path.join(dirpath, name)
            key = os.path.relpath(p, root)
            out[key] = hashlib.sha256(Path(p).read_bytes()).hexdigest() if os.path.isfile(p) else "dir"
    return out


def run_row(row: Row, tmp: str, capsys) -> tuple[int, str]:
    argv = [a.replace("{tmp}", tmp) for a in row.argv]
    if row.subprocess:
        env = cli_env(**(row.env or {}))
        if row.preexec is not None:  # a file-size limit would also hit the suite's compilation
            # cache's new entries: read only (a minimum compile time no program reaches), its
            # programs, which the other CLI children wrote, are still read
            env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "1e9"
        r = subprocess.run([sys.executable, "-m", "jaxformer", *argv], cwd=tmp, env=env,
                           capture_output=True, text=True, timeout=600, preexec_fn=row.preexec)
        return r.returncode, r.stderr
    from jaxformer import cli
    cwd = os.getcwd()
    os.chdir(tmp)
    try:
        code = cli.main(argv)
    except SystemExit as e:  # argparse usage errors
        code = e.code
    finally:
        os.chdir(cwd)
    return code, capsys.readouterr().err


# ---------------------------------------------------------------- config and workdir (train)
def _tiny(tmp: str, **train) -> None:
    from workdir_helpers import write_tiny_config
    write_tiny_config(os.path.join(tmp, "cfg.yaml"), **train)


def _flat_and_nested(tmp: str) -> None:
    """The tiny config with one option twice: its old flat key and its record path (the config
    shim, jaxformer/config/base.py, maps the flat keys)."""
    _tiny(tmp)
    path = os.path.join(tmp, "cfg.yaml")
    with open(path) as f:
        raw = yaml.safe_load(f)
    raw["model"]["sliding_window"] = 4
    raw["model"].setdefault("attention", {})["sliding_window"] = 4
    with open(path, "w") as f:
        yaml.safe_dump(raw, f)


def _write(name: str, text: str):
    def setup(tmp: str) -> None:
        with open(os.path.join(tmp, name), "w") as f:
            f.write(text)
    return setup


def _stub_run(tmp: str) -> None:
    """A workdir that looks like a run's (config.yaml, a committed checkpoint step folder: orbax's
    step metadata file in it): enough for the checks that run before any checkpoint is read."""
    import shutil
    _tiny(tmp)
    os.makedirs(os.path.join(tmp, "w", "checkpoints", "4"))
    _put(tmp, "w/checkpoints/4/_CHECKPOINT_METADATA", "{}")
    shutil.copy(os.path.join(tmp, "cfg.yaml"), os.path.join(tmp, "w", "config.yaml"))


_HELD = []  # lock file descriptors held for the rest of the test process


def _locked(tmp: str) -> None:
    import fcntl
    _tiny(tmp)
    os.makedirs(os.path.join(tmp, "w"))
    fd = os.open(os.path.join(tmp, "w", ".lock"), os.O_RDWR | os.O_CREAT)
    os.write(fd, b"pid 4242 on otherhost\n")
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # another open file: flock conflicts in-process too
    _HELD.append(fd)


def _child(tmp: str) -> None:
    """The suite's CLI child run (workdir_helpers.child_run_dict), for a row run as a process."""
    from workdir_helpers import child_run_dict
    with open(os.path.join(tmp, "cfg.yaml"), "w") as f:
        yaml.safe_dump(child_run_dict(), f)


def _tiny_files() -> None:
    """No file over 512 bytes can be written (EFBIG, as on a full disk): the run's first write,
    config.yaml, fails. (A checkpoint-time full disk: tests/test_workdir.py.)"""
    import resource
    import signal
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (512, 512))


TRAIN = ["train", "--config", "{tmp}/cfg.yaml", "--workdir", "{tmp}/w", "--no-progress"]
TRAIN_ROWS = [
    Row("train_yaml_syntax", ["train", "--config", "{tmp}/bad.yaml"], "bad.yaml: not valid YAML (line",
        setup=_write("bad.yaml", "model: {name: lm\ntrain: [\n")),
    Row("train_yaml_python_tag", ["train", "--config", "{tmp}/bad.yaml", "--workdir", "{tmp}/w"],
        "python/object", setup=_write("bad.yaml", "model: !!python/object/apply:os.system ['true']\n"),
        absent=("w",)),
    Row("train_preemption_grace_zero", [*TRAIN, "--preemption-grace", "0"],
        "--preemption-grace must be a positive number of seconds, got 0", setup=_tiny, absent=("w",)),
    Row("train_preemption_grace_env_not_a_number", TRAIN, "JAXFORMER_PREEMPTION_GRACE='soon' is not a number of seconds",
        setup=_tiny, absent=("w",), subprocess=True, env={"JAXFORMER_PREEMPTION_GRACE": "soon"}),
    Row("train_unknown_key", [*TRAIN, "--set", "train.learning_rate=1e-3"], "train.learning_rate",
        setup=_tiny, absent=("w",)),
    Row("train_flat_and_nested_key", TRAIN, "model.sliding_window and model.attention.sliding_window given together",
        setup=_flat_and_nested, absent=("w",)),
    Row("train_seq_len_above_max_len", [*TRAIN, "--set", "data.seq_len=64"],
        "data.seq_len=64 exceeds model.max_len=32", setup=_tiny, absent=("w",)),
    Row("train_lr_inf", [*TRAIN, "--set", "train.lr=.inf"], "train.lr: must be finite", setup=_tiny,
        absent=("w",)),
    Row("train_resume_and_overwrite", [*TRAIN, "--resume", "--overwrite"], "exclude each other",
        setup=_stub_run, protect=("w",)),
    Row("train_fresh_into_nonempty", TRAIN, "pass --resume to continue its run or --overwrite",
        setup=_stub_run, protect=("w",)),
    Row("train_resume_without_checkpoint", [*TRAIN, "--resume"], "no checkpoint in workdir",
        setup=_tiny, absent=("w",)),
    Row("train_resume_changed_model", [*TRAIN, "--resume", "--set", "model.d_model=64",
                                       "--set", "model.num_heads=2"],
        "model.attention.num_heads: 4 -> 2; model.d_model: 32 -> 64", setup=_stub_run, protect=("w",)),
    Row("train_resume_steps_not_above_checkpoint", [*TRAIN, "--resume"],
        "train.steps=4 is at or below the checkpoint's step 4", setup=_stub_run, protect=("w",)),
    Row("train_workdir_locked", TRAIN, "in use by pid 4242 on otherhost", setup=_locked, protect=("w",)),
    Row("train_workdir_under_a_file", [*TRAIN[:-2], "{tmp}/cfg.yaml/w", "--no-progress"],
        "not a directory", setup=_tiny),
    Row("train_nonfinite_loss", [*TRAIN, "--set", "train.lr=1e30", "--set", "train.checkpoint_every=100"],
        "non-finite loss", setup=_tiny, absent=("w/checkpoints/4", "w/model")),
    Row("train_full_disk", TRAIN, "file too large", setup=_child, subprocess=True, preexec=_tiny_files,
        absent=("w/config.yaml", "w/checkpoints")),
]


def _put(tmp: str, rel: str, text: str) -> None:
    path = os.path.join(tmp, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


def _fake_run(tmp: str, steps: tuple[int, ...] = ()) -> None:
    """A run dir by the trainer's layout (checkpoint_io's docstring) without readable weights:
    its config.yaml, and an empty checkpoints/step_<N>/model.safetensors for each of `steps`."""
    _put(tmp, "run/config.yaml", "model: {name: lm, vocab_size: 64, d_model: 32, num_heads: 4, d_ff: 64, "
                                   "num_layers: 2, max_len: 32}\ndata: {name: stdlib_docs}\n")
    for s in steps:
        _put(tmp, f"run/checkpoints/step_{s}/model.safetensors", "")


def _not_a_run(tmp: str) -> None:
    os.makedirs(os.path.join(tmp, "empty"))
    with open(os.path.join(tmp, "keep.png"), "wb") as f:
        f.write(b"an existing picture")


# ------------------------------------------------------------------------ convert and import inputs
HF_ARGV = ["convert", "--from", "hf", "{tmp}/hf", "--to", "flax", "{tmp}/out"]
TINY_LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 64,
              "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
              "num_attention_heads": 4, "max_position_embeddings": 16}


def _put_bytes(tmp: str, rel: str, data: bytes) -> None:
    with open(os.path.join(tmp, rel), "wb") as f:
        f.write(data)


def _raw_safetensors(header: dict, data_bytes: int) -> bytes:
    """A safetensors file written by hand (any header, valid or not)."""
    import json
    head = json.dumps(header).encode()
    return len(head).to_bytes(8, "little") + head + bytes(data_bytes)


def _safetensors_bytes() -> bytes:
    """A valid one-tensor safetensors file (4 float32 zeros)."""
    return _raw_safetensors({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, 16)


class _RunsCode:
    """Unpickling this runs code: it creates the file `pwned`."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (exec, (f"open({self.path!r}, 'w').write('pwned')",))


def _evil_bin(tmp: str, rel: str) -> None:
    import torch
    torch.save({"w": torch.zeros(4), "x": _RunsCode(os.path.join(tmp, "pwned"))}, os.path.join(tmp, rel))


def _model_yaml(tmp: str) -> None:
    _put_bytes(tmp, "model.yaml", b"model: {name: lm, vocab_size: 64, d_model: 32, num_heads: 4, d_ff: 64, "
                              b"num_layers: 1, max_len: 16}\n")


def _hf_dir(tmp: str, config=TINY_LLAMA, weights: bytes | None = None, bin_payload: bool = False) -> None:
    """{tmp}/hf: config.json (None: none) and model.safetensors (`weights`, default one valid
    tensor) or, with bin_payload, a pytorch_model.bin whose pickle would run code."""
    import json
    os.makedirs(os.path.join(tmp, "hf"))
    if config is not None:
        _put_bytes(tmp, "hf/config.json", json.dumps(config).encode())
    if bin_payload:
        _evil_bin(tmp, "hf/pytorch_model.bin")
    else:
        _put_bytes(tmp, "hf/model.safetensors", _safetensors_bytes() if weights is None else weights)


def _hf_index(tmp: str, shard: str, link_to: str | None = None) -> None:
    """{tmp}/hf with a model.safetensors.index.json whose weight_map names `shard` (a valid
    shard, `outside.safetensors`, sits beside {tmp}/hf); link_to: hf/shard is a symlink to it."""
    import json
    os.makedirs(os.path.join(tmp, "hf"))
    _put_bytes(tmp, "hf/config.json", json.dumps(TINY_LLAMA).encode())
    _put_bytes(tmp, "outside.safetensors", _safetensors_bytes())
    _put_bytes(tmp, "hf/model-1.safetensors", _safetensors_bytes())
    if link_to:
        os.symlink(os.path.join("..", link_to), os.path.join(tmp, "hf", shard))
    index = {"metadata": {}, "weight_map": {"a.weight": "model-1.safetensors", "w": shard}}
    _put_bytes(tmp, "hf/model.safetensors.index.json", json.dumps(index).encode())


# ------------------------------------------------------------ data prepare --format prompt_completion|chat
PREP = ["data", "prepare", "--out", "{tmp}/out", "--no-progress", "--eval-fraction", "0"]
CHAT = [*PREP, "--format", "chat", "--input", "{tmp}/c.jsonl", "--tokenizer", "bytes"]
GOOD_CHAT = '{"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]}'
DATA_ROWS = [
    Row("data_chat_not_json", [*CHAT, "--chat-template", "chatml"], "c.jsonl:2: not a JSON object",
        setup=_write("c.jsonl", GOOD_CHAT + "\n{oops\n"), protect=("c.jsonl",), absent=("out",)),
    Row("data_chat_unknown_role", [*CHAT, "--chat-template", "chatml"], "c.jsonl:2: message 1 has the unknown role 'robot'",
        setup=_write("c.jsonl", GOOD_CHAT + '\n{"messages": [{"role": "robot", "content": "x"}]}\n'),
        absent=("out",)),
    Row("data_chat_tool_role_unsupported", [*CHAT, "--chat-template", "chatml"],
        "tool roles need a template that handles them",
        setup=_write("c.jsonl", '{"messages": [{"role": "user", "content": "x"}, {"role": "tool", "content": "y"}]}\n'),
        absent=("out",)),
    Row("data_chat_empty_answer", [*CHAT, "--chat-template", "chatml"], "c.jsonl:1: message 2 is an empty answer",
        setup=_write("c.jsonl", '{"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": ""}]}\n'),
        absent=("out",)),
    Row("data_chat_template_fails", [*CHAT, "--chat-template", "{tmp}/t.jinja"], "c.jsonl:1: the chat template",
        setup=lambda t: (_write("c.jsonl", GOOD_CHAT + "\n")(t),
                         _write("t.jinja", "{{ raise_exception('no thanks') }}")(t)), absent=("out",)),
    Row("data_chat_template_syntax", [*CHAT, "--chat-template", "{tmp}/t.jinja"], "Jinja syntax error at line 1",
        setup=lambda t: (_write("c.jsonl", GOOD_CHAT + "\n")(t), _write("t.jinja", "{% for m in %}")(t)),
        absent=("out",)),
    Row("data_chat_no_template", CHAT, "tokenizer bytes has no chat template",
        setup=_write("c.jsonl", GOOD_CHAT + "\n"), absent=("out",)),
    Row("data_chat_unknown_template_name", [*CHAT, "--chat-template", "vicuna"],
        "not a named template (chatml|llama3) nor a Jinja file", setup=_write("c.jsonl", GOOD_CHAT + "\n"),
        absent=("out",)),
    Row("data_chat_not_jsonl", [*PREP, "--format", "chat", "--input", "{tmp}/c.txt", "--tokenizer", "bytes"],
        "--format chat reads JSON lines", setup=_write("c.txt", "hello\n"), absent=("out",)),
    Row("data_chat_bpe_tokenizer", [*CHAT, "--tokenizer", "bpe:300", "--chat-template", "chatml"],
        "needs an existing tokenizer", setup=_write("c.jsonl", GOOD_CHAT + "\n"), absent=("out",)),
    Row("data_text_with_chat_option", [*PREP, "--input", "{tmp}/c.txt", "--tokenizer", "bytes", "--train-on-prompt"],
        "--train-on-prompt does not apply to --format text", setup=_write("c.txt", "hello\n"), absent=("out",)),
    Row("data_prompt_completion_missing_field",
        [*PREP, "--format", "prompt_completion", "--input", "{tmp}/p.jsonl", "--tokenizer", "bytes"],
        "p.jsonl:1: no field 'completion' (its fields: prompt); name it with --completion-field",
        setup=_write("p.jsonl", '{"prompt": "x"}\n'), absent=("out",)),
]


# ------------------------------------------------------------------------ LoRA / PEFT inputs
_BUILT: dict[str, str] = {}  # what each kind of setup built once, copied into each row's dir


def _built(tmp: str, kind: str, rel: str) -> None:
    """{tmp}/rel: a copy of a tiny `kind` ("plain" / "lora" llama checkpoints, a "gpt2_lora"
    one with an adapter on q_proj, an "hf" Llama dir), built once per process."""
    import atexit
    import contextlib
    import io
    import shutil
    import tempfile
    if kind not in _BUILT:
        root = tempfile.mkdtemp(prefix="bad_input_lora_")
        atexit.register(shutil.rmtree, root, True)  # built once per worker, removed when it exits
        path = os.path.join(root, kind)
        if kind == "hf":
            import transformers
            cfg = transformers.LlamaConfig(**{k: v for k, v in TINY_LLAMA.items() if k not in ("architectures", "model_type")})
            with contextlib.redirect_stderr(io.StringIO()):  # its progress bar is no row's output
                transformers.LlamaForCausalLM(cfg).save_pretrained(path)
        else:
            from flax import nnx

            from jaxformer.checkpoint_io import save_model
            from jaxformer.config.lora import LoRAConfig
            from jaxformer.config.models import LMConfig
            from jaxformer.layers.lora import apply_lora
            from jaxformer.models import build_model
            cfg = LMConfig.tiny("gpt2" if kind == "gpt2_lora" else "llama", num_layers=1)
            model = build_model("lm", cfg)
            lora = None if kind == "plain" else LoRAConfig(r=2, target_modules=["q_proj"])
            if lora is not None:
                apply_lora(model, lora, nnx.Rngs(0))
            save_model(model, "lm", cfg, path, lora=lora)
        _BUILT[kind] = path
    shutil.copytree(_BUILT[kind], os.path.join(tmp, rel))


def _adapter(tmp: str, config: dict | None = None, tensors: dict | None = None, bin_payload: bool = False,
             base: bool = False) -> None:
    """{tmp}/a, a PEFT adapter dir: adapter_config.json (a valid r=2 one updated with `config`;
    None in it: no config file) and adapter_model.safetensors of `tensors` (default: q_proj's
    pair), or an adapter_model.bin whose pickle would run code; {tmp}/hf is the HF base (a real
    one with base=True, else the stub of _hf_dir)."""
    import json

    import numpy as np
    from safetensors.numpy import save_file
    _built(tmp, "hf", "hf") if base else _hf_dir(tmp)
    os.makedirs(os.path.join(tmp, "a"))
    full = {"peft_type": "LORA", "r": 2, "lora_alpha": 4, "target_modules": ["q_proj"], **(config or {})}
    if (config or {}).get("peft_type", "LORA") is not None:
        _put_bytes(tmp, "a/adapter_config.json", json.dumps(full).encode())
    q = "base_model.model.model.layers.0.self_attn.q_proj"
    tensors = {f"{q}.lora_A.weight": np.zeros((2, 32), np.float32),
               f"{q}.lora_B.weight": np.zeros((32, 2), np.float32)} if tensors is None else tensors
    if bin_payload:
        _evil_bin(tmp, "a/adapter_model.bin")
    elif tensors:
        save_file(tensors, os.path.join(tmp, "a", "adapter_model.safetensors"))


ADAPTER_ARGV = [*HF_ARGV, "--adapter", "{tmp}/a"]
PEFT_ROWS = [
    Row("export_peft_without_adapters", ["export", "{tmp}/plain", "--to", "peft", "{tmp}/out"],
        "has no LoRA adapters (train with train.lora", setup=lambda t: _built(t, "plain", "plain"),
        protect=("plain",), absent=("out",)),
    Row("export_hf_with_adapters_without_merge", ["export", "{tmp}/lora", "--to", "hf", "{tmp}/out"],
        "pass --merge to fold them into the base", setup=lambda t: _built(t, "lora", "lora"),
        protect=("lora",), absent=("out",)),
    Row("export_merge_without_adapters", ["export", "{tmp}/plain", "--to", "torch", "{tmp}/out.safetensors",
                                          "--merge"], "has no LoRA adapters to merge",
        setup=lambda t: _built(t, "plain", "plain"), protect=("plain",), absent=("out.safetensors",)),
    Row("export_merge_to_peft", ["export", "{tmp}/run", "--to", "peft", "{tmp}/out", "--merge"],
        "not --to peft", setup=_fake_run, protect=("run",), absent=("out",)),
    Row("export_base_model_not_peft", ["export", "{tmp}/run", "--to", "hf", "{tmp}/out", "--base-model", "x"],
        "--base-model applies to --to peft only", setup=_fake_run, protect=("run",), absent=("out",)),
    Row("export_peft_fused_module", ["export", "{tmp}/gpt2", "--to", "peft", "{tmp}/out"],
        "fuses, transposes or splits its weight", setup=lambda t: _built(t, "gpt2_lora", "gpt2"),
        protect=("gpt2",), absent=("out",)),
    Row("convert_adapter_not_from_hf", ["convert", "--from", "flax", "{tmp}/run", "--to", "hf", "{tmp}/out",
                                        "--adapter", "{tmp}/a"], "--adapter applies to --from hf imports only",
        setup=_fake_run, protect=("run",), absent=("out",)),
    Row("convert_merge_without_adapter", [*HF_ARGV, "--merge"], "--merge applies with --adapter only",
        setup=_hf_dir, protect=("hf",), absent=("out",)),
    Row("adapter_dora", ADAPTER_ARGV, "use_dora=True is not supported",
        setup=lambda t: _adapter(t, {"use_dora": True}), protect=("hf", "a"), absent=("out",)),
    Row("adapter_modules_to_save", ADAPTER_ARGV, "modules_to_save=['lm_head'] is not supported",
        setup=lambda t: _adapter(t, {"modules_to_save": ["lm_head"]}), protect=("hf", "a"), absent=("out",)),
    Row("adapter_rank_pattern_disagrees", ADAPTER_ARGV, "q_proj.lora_A.weight is (2, 32), expected (4, 32) (r=4)",
        setup=lambda t: _adapter(t, {"rank_pattern": {"q_proj": 4}}, base=True), protect=("hf", "a"),
        absent=("out",)),
    Row("adapter_bias", ADAPTER_ARGV, "bias='all' is not supported",
        setup=lambda t: _adapter(t, {"bias": "all"}), protect=("hf", "a"), absent=("out",)),
    Row("adapter_other_peft_type", ADAPTER_ARGV, "peft_type='PREFIX_TUNING' is not supported",
        setup=lambda t: _adapter(t, {"peft_type": "PREFIX_TUNING"}), protect=("hf", "a"), absent=("out",)),
    Row("adapter_without_config", ADAPTER_ARGV, "is not a PEFT adapter directory (no adapter_config.json)",
        setup=lambda t: _adapter(t, {"peft_type": None}), protect=("hf", "a"), absent=("out",)),
    Row("adapter_without_weights", ADAPTER_ARGV, "no adapter_model.safetensors (or adapter_model.bin)",
        setup=lambda t: _adapter(t, tensors={}), protect=("hf", "a"), absent=("out",)),
    Row("adapter_bin_runs_code", ADAPTER_ARGV, "refused: not a plain tensor file",
        setup=lambda t: _adapter(t, bin_payload=True), protect=("hf", "a"), absent=("out", "pwned")),
    Row("adapter_unmapped_module", ADAPTER_ARGV, "qkv_proj has no jaxformer Linear equivalent",
        setup=lambda t: _adapter(t, tensors={
            "base_model.model.model.layers.0.self_attn.qkv_proj.lora_A.weight": np.zeros((2, 32), np.float32),
            "base_model.model.model.layers.0.self_attn.qkv_proj.lora_B.weight": np.zeros((96, 2), np.float32)},
            base=True), protect=("hf", "a"), absent=("out",)),
    Row("adapter_wrong_rank", ADAPTER_ARGV, "is (3, 32), expected (2, 32)",
        setup=lambda t: _adapter(t, tensors={
            "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": np.zeros((3, 32), np.float32),
            "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight": np.zeros((32, 3), np.float32)},
            base=True), protect=("hf", "a"), absent=("out",)),
]



# ---------------------------------------------------------------- a model.module (any NNX module)
_NET = """from flax import nnx


class Net(nnx.Module):
    def __init__(self, vocab=259, *, rngs):
        self.embed = nnx.Embed(vocab, 8, rngs=rngs)
        self.head = nnx.Linear(8, vocab, rngs=rngs)

    def __call__(self, ids):
        return self.head(self.embed(ids))


class NeedsTargets(Net):
    def __call__(self, ids, targets):
        return self.head(self.embed(ids))


def not_a_class():
    return None
"""


def _module_run(module: str = "net.py:Net", task: str | None = "causal_lm", **model):
    """A YAML training the module `module` of net.py (_NET) on stdlib_docs."""
    def setup(tmp: str) -> None:
        _put(tmp, "net.py", _NET)
        raw = {"model": {"module": module, **model}, "data": {"name": "stdlib_docs", "seq_len": 8},
               "train": {"steps": 2, "batch_size": 2}}
        if task:
            raw["task"] = task
        _put(tmp, "cfg.yaml", yaml.safe_dump(raw))
    return setup


MODULE_ARGV = ["train", "--config", "{tmp}/cfg.yaml", "--workdir", "{tmp}/w"]
MODULE_ROWS = [
    Row("module_missing_file", MODULE_ARGV, "nowhere.py:Net: no such file",
        setup=_module_run("nowhere.py:Net"), absent=("w",)),
    Row("module_missing_class", MODULE_ARGV, "defines no 'Gone'", setup=_module_run("net.py:Gone"), absent=("w",)),
    Row("module_not_a_module_class", MODULE_ARGV, "not a flax.nnx.Module class",
        setup=_module_run("net.py:not_a_class"), absent=("w",)),
    Row("module_unknown_package", MODULE_ARGV, "no module 'no_such_pkg'",
        setup=_module_run("no_such_pkg.models:Net"), absent=("w",)),
    Row("module_without_task", MODULE_ARGV, "task: missing", setup=_module_run(task=None), absent=("w",)),
    Row("module_call_does_not_fit_task", MODULE_ARGV, "does not fit task causal_lm: it is called as model(token ids",
        setup=_module_run("net.py:NeedsTargets"), absent=("w",)),
    Row("module_logits_miss_the_vocab", MODULE_ARGV, "its logits have 64 entries, fewer than the 259 token ids",
        setup=_module_run(kwargs={"vocab": 64}), absent=("w",)),
    Row("module_bad_kwargs", MODULE_ARGV, "model.kwargs: Net(vocab=259, *, rngs) cannot take",
        setup=_module_run(kwargs={"width": 3}), absent=("w",)),
    Row("module_axes_name_no_parameter", MODULE_ARGV, "model.axes: 'lm_head' names no parameter of Net",
        setup=_module_run(axes={"lm_head": ["embed", "vocab"]}), absent=("w",)),
    Row("module_axes_wrong_rank", MODULE_ARGV, "gives ['embed'] to head.kernel, a 2-D parameter",
        setup=_module_run(axes={"head.kernel": ["embed"]}), absent=("w",)),
    Row("module_axes_unknown_logical_axis", MODULE_ARGV, "unknown logical axis 'width'",
        setup=_module_run(axes={"head.kernel": ["width", None]}), absent=("w",)),
    Row("module_torch_without_factory", [*MODULE_ARGV, "--framework", "torch"], "model.torch: not set",
        setup=_module_run(), absent=("w",)),
    Row("compile_module_axes_name_no_parameter", ["compile", "--config", "{tmp}/cfg.yaml", "--topology", "v5e:2x2",
                                                  "--set", "train.batch_size=4"],
        "names no parameter of Net", setup=_module_run(axes={"lm_head": ["embed", "vocab"]})),
]

ROWS: list[Row] = [
    # ---------------------------------------------------------------- plot and parity report
    Row("plot_dir_without_metrics", ["plot", "{tmp}/empty", "--out", "{tmp}/keep.png"], "no metrics.jsonl",
        setup=_not_a_run, protect=("keep.png", "empty")),
    Row("plot_missing_dir", ["plot", "{tmp}/nowhere"], "no metrics.jsonl", absent=("nowhere",)),
    # ---------------------------------------------------------------- config and workdir (train)
    *TRAIN_ROWS,
    *MODULE_ROWS,
    *DATA_ROWS,
    # ---------------------------------------------------------------- export, load, generate
    Row("export_not_a_run", ["export", "{tmp}/notes", "--to", "flax", "{tmp}/out"],
        "not a run dir, model checkpoint or HF dir: no model.yaml, config.yaml or config.json",
        setup=lambda t: _put(t, "notes/readme.txt", "hello"), protect=("notes",), absent=("out",)),
    Row("export_missing_step", ["export", "{tmp}/run", "--step", "7", "--to", "torch", "{tmp}/out.safetensors"],
        "has no checkpoint of step 7; its steps: 2", setup=lambda t: _fake_run(t, steps=(2,)),
        protect=("run",), absent=("out.safetensors",)),
    Row("export_bad_step", ["export", "{tmp}/run", "--step", "newest", "--to", "flax", "{tmp}/out"],
        "step must be 'last', 'best' or a step number", setup=_fake_run, protect=("run",), absent=("out",)),
    Row("export_out_exists", ["export", "{tmp}/run", "--to", "flax", "{tmp}/out"],
        "exists; choose another output or pass --overwrite",
        setup=lambda t: (_fake_run(t), _put(t, "out/keep.txt", "mine")), protect=("run", "out")),
    Row("export_out_is_run_dir", ["export", "{tmp}/run", "--to", "hf", "{tmp}/run", "--overwrite"],
        "is RUN_DIR", setup=_fake_run, protect=("run",)),
    Row("export_out_inside_run_dir", ["export", "{tmp}/run", "--to", "flax", "{tmp}/run/model/x"],
        "inside RUN_DIR", setup=_fake_run, protect=("run",)),
    Row("generate_not_a_run", ["generate", "--weights", "{tmp}/notes", "--prompt", "5 6"],
        "not a run dir, model checkpoint or HF dir", setup=lambda t: _put(t, "notes/a.txt", "x"),
        protect=("notes",)),
    Row("generate_corrupted_model_yaml", ["generate", "--weights", "{tmp}/run", "--prompt", "5 6"],
        "model.yaml is corrupted",
        setup=lambda t: (_fake_run(t), _put(t, "run/model/last/model.yaml", "model: [name: lm\n  {")),
        protect=("run",)),
    Row("export_hf_corrupt_tokenizer", ["export", "{tmp}/plain", "--to", "hf", "{tmp}/out"],
        "plain/tokenizer.json is not a `tokenizers` tokenizer.json",
        setup=lambda t: (_built(t, "plain", "plain"), _put(t, "plain/tokenizer.json", '{"not": "a tokenizer"')),
        protect=("plain",), absent=("out",)),
    Row("export_flax_corrupt_tokenizer", ["export", "{tmp}/plain", "--to", "flax", "{tmp}/out"],
        "pass --no-tokenizer to export the weights alone",
        setup=lambda t: (_built(t, "plain", "plain"), _put(t, "plain/tokenizer.json", "[1, 2]")),
        protect=("plain",), absent=("out",)),
    Row("export_run_without_weights", ["export", "{tmp}/run", "--step", "best", "--to", "flax", "{tmp}/out"],
        "has no model/best", setup=_fake_run, protect=("run",), absent=("out",)),
    # ---------------------------------------------------------------- convert and import
    Row("index_dotdot_path", HF_ARGV, "leaves the checkpoint directory",
        setup=lambda t: _hf_index(t, "../outside.safetensors"), protect=("hf", "outside.safetensors"),
        absent=("out",)),
    Row("index_absolute_path", HF_ARGV, "is an absolute path",
        setup=lambda t: _hf_index(t, os.path.join(t, "outside.safetensors")),
        protect=("hf", "outside.safetensors"), absent=("out",)),
    Row("index_symlink_escapes", HF_ARGV, "outside the checkpoint directory",
        setup=lambda t: _hf_index(t, "link.safetensors", link_to="outside.safetensors"),
        protect=("hf", "outside.safetensors"), absent=("out",)),
    Row("config_json_is_a_list", HF_ARGV, "config.json must be a JSON object",
        setup=lambda t: _hf_dir(t, config=[{"architectures": ["LlamaForCausalLM"]}]),
        protect=("hf",), absent=("out",)),
    Row("model_type_mismatch", HF_ARGV, "model_type='gpt2' does not match",
        setup=lambda t: _hf_dir(t, config={"architectures": ["LlamaForCausalLM"], "model_type": "gpt2"}),
        protect=("hf",), absent=("out",)),
    Row("safetensors_negative_shape", HF_ARGV, "not a list of non-negative integers",
        setup=lambda t: _hf_dir(t, weights=_raw_safetensors({"w": {"dtype": "F32", "shape": [-1, 4],
                                                                     "data_offsets": [0, 16]}}, 16)),
        protect=("hf",), absent=("out",)),
    Row("safetensors_truncated", HF_ARGV, "truncated",
        setup=lambda t: _hf_dir(t, weights=_safetensors_bytes()[:-10]), protect=("hf",), absent=("out",)),
    Row("safetensors_header_longer_than_file", HF_ARGV, "does not fit in the file",
        setup=lambda t: _hf_dir(t, weights=(10 ** 6).to_bytes(8, "little") + b"{}"),
        protect=("hf",), absent=("out",)),
    Row("hf_bin_runs_code", HF_ARGV, "refused: not a plain tensor file",
        setup=lambda t: _hf_dir(t, bin_payload=True), protect=("hf",), absent=("out", "pwned")),
    Row("hf_dir_without_config_json", HF_ARGV, "has no config.json",
        setup=lambda t: _hf_dir(t, config=None), protect=("hf",), absent=("out",)),
    Row("file_bin_runs_code", ["convert", "{tmp}/evil.bin", "{tmp}/out.safetensors", "--to", "flax",
                               "--config", "{tmp}/model.yaml"], "refused: not a plain tensor file",
        setup=lambda t: (_evil_bin(t, "evil.bin"), _model_yaml(t)), protect=("evil.bin",),
        absent=("out.safetensors", "pwned")),
    Row("file_dst_exists", ["convert", "{tmp}/w.safetensors", "{tmp}/out.safetensors", "--to", "flax",
                            "--config", "{tmp}/model.yaml"], "pass --overwrite",
        setup=lambda t: (_put_bytes(t, "w.safetensors", _safetensors_bytes()), _put_bytes(t, "out.safetensors", b"keep"),
                         _model_yaml(t)), protect=("w.safetensors", "out.safetensors")),
    Row("file_dst_is_src", ["convert", "{tmp}/w.safetensors", "{tmp}/w.safetensors", "--to", "flax",
                            "--overwrite", "--config", "{tmp}/model.yaml"], "is the input file",
        setup=lambda t: (_put_bytes(t, "w.safetensors", _safetensors_bytes()), _model_yaml(t)),
        protect=("w.safetensors",)),
    Row("file_dst_is_src_via_symlink", ["convert", "{tmp}/w.safetensors", "{tmp}/link.safetensors",
                                        "--to", "flax", "--overwrite"], "is the input file",
        setup=lambda t: (_put_bytes(t, "w.safetensors", _safetensors_bytes()),
                         os.symlink("w.safetensors", os.path.join(t, "link.safetensors"))),
        protect=("w.safetensors",)),
    Row("file_dst_is_src_via_hardlink", ["convert", "{tmp}/w.safetensors", "{tmp}/hard.safetensors",
                                         "--to", "flax", "--overwrite"], "is the input file",
        setup=lambda t: (_put_bytes(t, "w.safetensors", _safetensors_bytes()),
                         os.link(os.path.join(t, "w.safetensors"), os.path.join(t, "hard.safetensors"))),
        protect=("w.safetensors", "hard.safetensors")),
    Row("file_input_is_a_directory", ["convert", "{tmp}/hf", "{tmp}/out.safetensors", "--to", "flax",
                                      "--config", "{tmp}/model.yaml"], "is a directory",
        setup=lambda t: (_hf_dir(t), _model_yaml(t)), protect=("hf",), absent=("out.safetensors",)),
    Row("config_yaml_syntax_error", ["convert", "{tmp}/w.safetensors", "{tmp}/out.safetensors", "--to",
                                     "flax", "--config", "{tmp}/bad.yaml"], "bad.yaml: not a valid config (line",
        setup=lambda t: (_put_bytes(t, "w.safetensors", _safetensors_bytes()),
                         _put_bytes(t, "bad.yaml", b"model:\n  name: lm\n d_model: [32\n")),
        protect=("w.safetensors",), absent=("out.safetensors",)),
    Row("config_yaml_python_tag", ["convert", "{tmp}/w.safetensors", "{tmp}/out.safetensors", "--to",
                                   "flax", "--config", "{tmp}/evil.yaml"], "refused",
        setup=lambda t: (_put_bytes(t, "w.safetensors", _safetensors_bytes()),
                         _put_bytes(t, "evil.yaml", f"model: !!python/object/apply:os.system ['touch "
                                                f"{t}/pwned']\n".encode())),
        protect=("w.safetensors",), absent=("out.safetensors", "pwned")),
    *PEFT_ROWS,
]


@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
def test_bad_input(row: Row, tmp_path, capsys):
    tmp = str(tmp_path)
    if row.setup:
        row.setup(tmp)
    before = {p: snapshot(tmp, p) for p in row.protect}
    code, err = run_row(row, tmp, capsys)
    assert code == row.code, f"exit {code}, expected {row.code}; stderr:\n{err}"
    assert row.phrase.lower() in err.lower(), err
    assert "Traceback" not in err, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert 1 <= len(lines) <= 2, f"{len(lines)} lines on stderr:\n{err}"
    for p in row.protect:
        assert snapshot(tmp, p) == before[p], f"{p} changed"
    for p in row.absent:
        assert not os.path.lexists(os.path.join(tmp, p)), f"{p} was left behind"
    leftovers = [n for n in os.listdir(tmp) if n.startswith(".tmp-")]
    assert not leftovers, f"temporary files left behind: {leftovers}"
