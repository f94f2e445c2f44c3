import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import jax  # noqa: E402

from jaxformer.parity import setup_precision  # noqa: E402

setup_precision()
jax.config.update("jax_numpy_dtype_promotion", "strict")
