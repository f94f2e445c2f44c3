"""Parity between a torch module and its Flax NNX twin.

`harness` compares one pair (outputs and gradients); `registry` names the built-in cases
(`cases_*.py`), which `jaxformer parity` and `parity_tests/` run. This package and `convert`
are the only places that hold both trees; torch and torch_ref are imported lazily, inside the
functions that need them.
"""
from jaxformer.parity.harness import (ParityError, ParityReport, accepts, assert_parity,  # noqa: F401
                                      check_parity, first_divergence, flatten, setup_precision)
