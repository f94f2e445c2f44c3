"""Which platforms a `jaxformer` command starts (issue 49 §7): on a host with no TPU chip, no
command initialises libtpu's runtime (it is installed to compile), so its probe errors never
reach a user's first screen; a TPU host, or JAX_PLATFORMS set, is left to jax."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from jaxformer.cli.platforms import choose_platforms

PROBE_LINES = ("Failed to find host bounds", "unexpected worker hostname", "TPU_WORKER_HOSTNAMES",
               "libtpu", "E0000")


def test_the_rule():
    assert choose_platforms({}, tpu_chips=0, plugins=set()) == "cpu"
    assert choose_platforms({}, tpu_chips=0, plugins={"xla_cuda12"}) == "cuda,cpu"  # jax skips it without a GPU
    assert choose_platforms({}, tpu_chips=4, plugins={"xla_cuda12"}) is None  # a TPU host: jax picks the TPU
    assert choose_platforms({"JAX_PLATFORMS": "cpu"}, tpu_chips=0, plugins=set()) is None
    assert choose_platforms({"JAX_PLATFORMS": ""}, tpu_chips=0, plugins=set()) is None  # jax's own "choose"
    assert choose_platforms({"JAX_FORCE_TPU_INIT": "1"}, tpu_chips=0, plugins=set()) is None
    # this host: jax's PCI probe finds no TPU chip, and the suite runs on the CPU
    assert choose_platforms({}) in ("cpu", "cuda,cpu")


COMPILER = textwrap.dedent("""
    import sys, jax, jax.numpy as jnp
    from jax.experimental import topologies
    from jax.sharding import NamedSharding, PartitionSpec as P
    devs = topologies.get_topology_desc(platform="tpu", topology_name="v5e:2x2").devices
    mesh = jax.sharding.Mesh(__import__("numpy").array(devs).reshape(4), ("d",))
    x = jax.ShapeDtypeStruct((512, 512), jnp.float32, sharding=NamedSharding(mesh, P("d")))
    f = jax.jit(lambda a: (a @ a.T).sum())
    f.lower(x).compile()
    print("compiled", flush=True)
    sys.stdin.read()  # holds libtpu until the test is done
""")


def test_a_command_without_jax_platforms_prints_no_libtpu_probe(tmp_path):
    """The CLI in a subprocess with JAX_PLATFORMS unset, alone and then while a second process
    holds libtpu as a compiler (the situation the issue met; libtpu's probe printed in the first
    here, before the fix): exit 0, the case's row, and none of libtpu's lines either time."""
    from helpers import cli_env
    # as a user's shell has it: jax set TPU_SKIP_MDS_QUERY in this process on import (no chip),
    # which would quiet the child's probe
    env = {k: v for k, v in cli_env().items() if k not in ("JAX_PLATFORMS", "JAX_FORCE_TPU_INIT", "TPU_SKIP_MDS_QUERY")}

    def cli():
        run = subprocess.run([sys.executable, "-m", "jaxformer", "parity", "-k", "sdpa_fused_nomask"], env=env,
                             cwd=tmp_path, capture_output=True, text=True, timeout=600)
        assert run.returncode == 0, run.stderr
        assert "sdpa_fused_nomask" in run.stdout and "1 passed" in run.stdout
        seen = [line for line in run.stderr.splitlines() if any(p in line for p in PROBE_LINES)]
        assert not seen, seen

    cli()
    compiler = subprocess.Popen([sys.executable, "-c", COMPILER], env={**env, "JAX_PLATFORMS": "cpu"},
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert compiler.stdout.readline().strip() == "compiled"
        cli()
    finally:
        compiler.communicate("", timeout=60)


def test_a_closed_stdout_ends_quietly(tmp_path):
    """`jaxformer parity --list | head -1`: the reader leaves, and the command stops with 141
    and nothing on stderr (it printed "error: [Errno 32] Broken pipe"). The pipe's read end is
    closed before the command starts, so its first write meets the closed pipe every time."""
    from helpers import cli_env
    read, write = os.pipe()
    os.close(read)
    try:
        run = subprocess.run([sys.executable, "-m", "jaxformer", "parity", "--list"], env=cli_env(), cwd=tmp_path,
                             stdout=write, stderr=subprocess.PIPE, text=True, timeout=600)
    finally:
        os.close(write)
    assert (run.returncode, run.stderr) == (141, ""), run.stderr
