import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import jax  # noqa: E402
import pytest  # noqa: E402

from jaxformer.parity import setup_precision  # noqa: E402

setup_precision()


@pytest.fixture(autouse=True)
def strict_dtype_promotion():
    """Strict promotion for the parity cases only (a context, not a global flag: optax and the
    bf16 model tests in tests/ mix dtypes on purpose and run in the same session)."""
    with jax.numpy_dtype_promotion("strict"):
        yield
