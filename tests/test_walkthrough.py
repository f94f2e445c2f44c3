"""The "Your own model on a pod" walkthrough (docs/own-model.md) runs as written (issue 48 §6): its
command block, line by line, in a copy of examples/pod/ (the block's `cd examples/pod`, run from
the repository root), each command a subprocess as a user's shell runs it: port the user's torch
model (checked, with logical axes), train it on an 8-device CPU mesh (fsdp 4 x tensor 2), compile
the same step for a v5p slice, export the trained weights under the torch module's keys, and load
them back with strict=True."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir)
MARK = "<!-- walkthrough: tests/test_walkthrough.py runs this block as written -->"


def walkthrough() -> list[str]:
    """The marked block's commands, from the one user docs page (README.md, docs/*.md) that holds
    the marker."""
    from helpers import user_docs
    pages = [path for path in user_docs() if MARK in Path(path).read_text()]
    assert len(pages) == 1, f"the walkthrough marker in one user docs page: {pages}"
    text = Path(pages[0]).read_text()
    block = re.search(re.escape(MARK) + r"\s*```bash\n(.*?)```", text, re.S)
    assert block, f"{pages[0]}: the walkthrough block and its marker"
    lines = [ln.split("  #")[0].strip() for ln in block[1].splitlines()]
    return [ln for ln in lines if ln and not ln.startswith("#")]


@pytest.mark.slow
def test_walkthrough_runs_as_written(tmp_path):
    from helpers import cli_env
    commands = walkthrough()
    assert commands[0] == "cd examples/pod", commands
    folder = tmp_path / "pod"
    shutil.copytree(os.path.join(ROOT, "examples", "pod"), folder)
    env = cli_env()
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    outputs = []
    for command in commands[1:]:
        done = subprocess.run(command, shell=True, cwd=folder, env=env, capture_output=True, text=True,
                              timeout=600, executable="/bin/bash")
        assert done.returncode == 0, f"{command}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
        outputs.append(done.stdout)
    text = "\n".join(outputs)
    assert "wrote my_gpt_jax.py (class GPT" in text and " ok" in text  # ported, parity checked
    assert "logical(" in (folder / "my_gpt_jax.py").read_text()  # sharding metadata written
    assert re.search(r"param_bytes_per_device [\d,]+", text)  # the mesh run
    assert "fits" in text and "v5p:2x2x2" in text  # the compile report
    assert (folder / "my_gpt_trained.safetensors").exists()
    assert outputs[-1].strip().startswith("b'def ")  # the trained weights, back in torch
