"""fp32 numerics for every test: JAX matmuls at 'highest', TF32 off in torch; 8 host devices."""
import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import jax  # noqa: E402

from jaxformer.parity import setup_precision  # noqa: E402

setup_precision()
# Strict dtype promotion is on in parity_tests/ only: optax itself mixes int32 step counts
# with float decay rates (adam bias correction), which strict mode rejects.


# ----------------------------------------------------------------------------- model pairs
# Shared by the model tests: `from conftest import converted_pair`.
def converted_pair(name: str, cfg, seed: int = 0):
    """torch_ref model `name` and its jaxformer twin holding the same (converted) weights, both
    in eval mode. Token embeddings are rescaled to N(0, 1/D) first (realistic_embeddings in
    jaxformer/parity/cases_models.py: with the constructor's N(0, 1) tied tables, logits
    reach |x| ~ 100, where float32's spacing alone exceeds the 1e-5 tolerances)."""
    from jaxformer import convert
    from jaxformer.models import build_model as jbuild
    from jaxformer.parity.cases_models import realistic_embeddings
    from torch_ref.models import build_model as tbuild
    t = realistic_embeddings(tbuild(name, cfg, seed=seed).eval())
    j = jbuild(name, cfg, seed=seed)
    convert.load_torch_state_dict(j, t.state_dict())
    j.eval()
    return t, j
# ----------------------------------------------------------------------------- end model pairs
