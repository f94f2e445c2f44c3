import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
# one torch thread per test process (tests/conftest.py says why)
os.environ.setdefault("OMP_NUM_THREADS", "1")

import jax
import pytest

from jaxformer.parity import setup_precision

setup_precision()
__import__("torch").set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


@pytest.fixture(scope="session", autouse=True)
def compilation_cache(tmp_path_factory):
    """The suite's JAX compilation cache for CLI subprocesses (tests/conftest.py says why and
    where)."""
    root = tmp_path_factory.getbasetemp()
    path = str((root.parent if os.environ.get("PYTEST_XDIST_WORKER") else root) / "jax-cache")
    os.environ["JAX_COMPILATION_CACHE_DIR"] = path
    os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    yield


def pytest_collection_finish(session):
    """The garbage collector tuned for a test process (tests/conftest.py says why)."""
    import gc
    gc.collect()
    gc.freeze()
    gc.set_threshold(100_000, 50, 100)


@pytest.fixture(autouse=True)
def strict_dtype_promotion():
    """Strict promotion for the parity cases only (a context, not a global flag: optax and the
    bf16 model tests in tests/ mix dtypes on purpose and run in the same session)."""
    with jax.numpy_dtype_promotion("strict"):
        yield
