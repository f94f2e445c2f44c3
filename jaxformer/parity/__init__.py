"""Parity between a torch module and its Flax NNX twin.

`harness` compares one pair (outputs and gradients); `registry` names the built-in cases
(`cases_*.py`), which `jaxformer parity` and `parity_tests/` run. This package and `convert`
are the only places that hold both trees; torch and torch_ref are imported lazily, inside the
functions that need them.
"""
from jaxformer.parity.harness import (  # noqa: F401 (the package's API)
    ParityOptions,
    accepts,
    assert_parity,
    check_parity,
    first_divergence,
    name_mapper,
    parity_precision,
    setup_precision,
)
from jaxformer.parity.results import GRAD_TOL, OUT_TOL, LeafDiff, ParityError, ParityReport, Referee, Tolerance  # noqa: F401 (API)
from jaxformer.parity.trees import flatten  # noqa: F401 (the package's API)
