"""fp32 numerics for every test: JAX matmuls at 'highest', TF32 off in torch; 8 host devices."""
import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

from jaxformer.parity import setup_precision  # noqa: E402

setup_precision()
# Strict dtype promotion is on in parity_tests/ only: optax itself mixes int32 step counts
# with float decay rates (adam bias correction), which strict mode rejects.
