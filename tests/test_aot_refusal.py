"""jaxformer/train/aot.py's reading of a compiler's RESOURCE_EXHAUSTED, on fake errors (nothing
compiles): HBM is DoesNotFit with the compiler's figure; any other memory (a Pallas kernel's
VMEM) keeps the compiler's own message."""
from __future__ import annotations

import jax
import numpy as np
import pytest

from jaxformer.train import aot

VMEM = ("RESOURCE_EXHAUSTED: Ran out of memory in memory space vmem while allocating on stack for "
        "%splash_mha_fwd = custom-call(...). Scoped allocation with size 100.00M and limit 96.00M exceeded "
        "scoped vmem limit by 4.00M.")
HBM = ("RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory in memory space hbm. Used 40.5G "
       "of 31.25G hbm. Exceeded hbm capacity by 9.25G.\nTotal hbm usage >= 41.2G:\n    reserved 1.0M\n"
       "    program 38.0G\n    arguments 2.5G\n\nOutput size 2.5G; shares 2.5G with arguments.\n\n"
       "Program hbm requirement 38.0G:\n    global 1.0M\n\n  Largest program allocations in hbm:\n\n"
       "HLO temp required for peak (38.0G) exceeds available HBM (31.25G)")


class _Refused:
    """Stands in for a jitted function whose compile the TPU compiler refuses with `message`."""

    def __init__(self, message: str):
        self.message = message

    def trace(self, *args):
        raise jax.errors.JaxRuntimeError(self.message)


@pytest.fixture
def mesh():
    return jax.sharding.Mesh(np.array(jax.devices("cpu")[:1]), ("data",))


def test_vmem_overflow_keeps_the_compilers_message(mesh):
    with pytest.raises(ValueError) as err:
        aot._compile("train_step", _Refused(VMEM), (), mesh, {"params": 1}, [])
    assert not isinstance(err.value, aot.DoesNotFit)
    text = str(err.value)
    assert text.startswith("train_step: the TPU compiler refused the program: Ran out of memory in memory space vmem")
    assert "exceeded scoped vmem limit by 4.00M" in text and "HBM" not in text


def test_hbm_overflow_is_does_not_fit_with_the_compilers_figure(mesh):
    with pytest.raises(aot.DoesNotFit) as err:
        aot._compile("train_step", _Refused(HBM), (), mesh, {"params": 1}, [])
    assert err.value.needed == 38.0 * 2**30 and err.value.state_bytes == {"params": 1}
    assert "ran out of HBM" in str(err.value)


def test_other_compiler_errors_pass_through(mesh):
    with pytest.raises(jax.errors.JaxRuntimeError, match="INTERNAL: boom"):
        aot._compile("train_step", _Refused("INTERNAL: boom"), (), mesh, {}, [])
