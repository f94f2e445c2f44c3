"""fp32 numerics for every test: JAX matmuls at 'highest', TF32 off in torch; 8 host devices."""
import os

# 8 host devices, and XLA:CPU's LLVM codegen at optimisation level 0 with its older elemental
# emitter for loop fusions (not the MLIR fusion emitters), in one LLVM module per program (no
# parallel codegen split: the suite's two workers already use both cores): each test compiles
# many small programs that run once on tiny shapes, where code generation is most of the
# compile time. Each changes fp32 results by a few ulps (other machine code for the same HLO), no
# farther from float64 than the defaults are (docs/numerics.md §39, §43); a flag the caller set
# wins.
_FLAGS = {"--xla_force_host_platform_device_count": "8", "--xla_backend_optimization_level": "0",
          "--xla_cpu_use_fusion_emitters": "false", "--xla_cpu_parallel_codegen_split_count": "1"}
_set = os.environ.get("XLA_FLAGS", "")
os.environ["XLA_FLAGS"] = " ".join([_set] + [f"{k}={v}" for k, v in _FLAGS.items() if k not in _set]).strip()
# One torch (OpenMP/MKL) thread per test process: the suite runs one xdist worker per core, and
# two torch threads per worker on two cores contend with each other and with XLA's threads (a
# tiny LM's eager forwards measured 6-30x slower on the loaded 2-core machine). Set before torch
# loads; CLI subprocesses inherit it.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# The suite runs on the CPU backend. libtpu (the test extra brings it, for the TPU compile
# tests: jaxformer/train/aot.py) would otherwise be tried as a backend at the first jax call in
# every process, CLI subprocesses included, and print its host-discovery warnings to stderr.
os.environ.setdefault("JAX_PLATFORMS", "cpu")

from jaxformer.parity import setup_precision

setup_precision()
__import__("torch").set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
# Strict dtype promotion is on in parity_tests/ only: optax itself mixes int32 step counts
# with float decay rates (adam bias correction), which strict mode rejects.


import pytest


@pytest.fixture(scope="session", autouse=True)
def compilation_cache(tmp_path_factory):
    """One JAX persistent compilation cache for the CLI subprocesses the tests start (through the
    environment), which run the same small configs many times. The test processes themselves do
    not use it (except where a test's own run compiles what its child runs next:
    tests/workdir_helpers.writing_compilation_cache): at this suite's sizes writing an entry costs about what compiling it did, and few
    programs repeat across the two workers (measured over the whole suite on a Zen 5: 4416 entries
    written in 34.8 s, 679 hits saving 16.6 s of compiles for 3.7 s of reads, a net cost of
    21.9 s CPU). It lives in this run's pytest temp folder (pytest keeps the last three), so it
    never outlives the code it was compiled from."""
    root = tmp_path_factory.getbasetemp()
    path = str((root.parent if os.environ.get("PYTEST_XDIST_WORKER") else root) / "jax-cache")
    os.environ["JAX_COMPILATION_CACHE_DIR"] = path
    os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    yield


def pytest_collection_finish(session):
    """Python's cyclic garbage collector, tuned for a test process: the objects alive once the
    tests are collected (torch, transformers, jax and their modules, millions of them) are
    frozen out of its scans, and it runs after 100,000 net allocations instead of 700, with the
    older generations rarer in step. Tracing allocates heavily, and at the defaults each
    collection walked the whole heap so often that the collector took 9-14% of a worker's CPU
    (perf, test_models + test_parity_harness on a Zen 5: 36.8-42.1 s CPU at the defaults,
    30.1-30.8 s tuned, peak RSS 1.61 GB both). Garbage cycles are still collected, later."""
    import gc
    gc.collect()
    gc.freeze()
    gc.set_threshold(100_000, 50, 100)


@pytest.fixture
def whole_replica_saves():
    """orbax's jax.Array handler without replica-parallel saving while the test runs: the
    checkpoint is the same, but each device's replica of a small replicated array is no longer
    cut into its own slice, a jitted program per (shape, device) (~160 of them on a 2 x 2 x 2
    mesh; test_lora_train and test_moe_train use it). Tests that restore what they saved on a mesh
    keep orbax's default."""
    import jax
    from orbax.checkpoint import type_handlers as th
    default = th.get_type_handler(jax.Array)
    th.register_type_handler(jax.Array, th.ArrayHandler(use_replica_parallel=False), override=True)
    yield
    th.register_type_handler(jax.Array, default, override=True)


# The files whose tests are the longest (seconds each, fixtures of whole ports and training runs;
# measured per file with --durations=0, docs/testing.md), run first. pytest-xdist's worksteal
# hands each worker a contiguous half of the collected order and then balances by stealing from
# the other's queue end: with the long tests first, the queue ends hold short ones, so the two
# workers finish together instead of one idling while the other runs a 40 s test collected last
# (alphabetically, test_walkthrough and test_user_module* were).
LONG_FIRST = ("test_walkthrough.py", "test_user_module_tasks.py", "test_user_module.py", "test_scale.py",
              "test_faults.py", "test_port_corpus.py")


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONG_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(LONG_FIRST)))  # stable: the rest keep their order
