"""One registry of parity cases. A case names builders for both trees, an input maker and
per-leaf tolerances (default: the harness's OUT_TOL / GRAD_TOL, docs/numerics.md §19); `run_case`
converts torch's weights into the flax twin and compares outputs and gradients with
jaxformer.parity.check_parity (the record and its helpers: jaxformer/parity/cases.py).

Cases live in the cases_*.py modules beside this file, grouped by component, and register
themselves on import. `load_all()` imports them all.
"""
from __future__ import annotations

import importlib

from jaxformer.parity.cases import CASES, Case, case, mirror, run_case  # noqa: F401 (re-exported)

CASE_MODULES = ("jaxformer.parity.cases_layers", "jaxformer.parity.cases_models",
                "jaxformer.parity.cases_vision", "jaxformer.parity.cases_moe",
                "jaxformer.parity.cases_mla", "jaxformer.parity.cases_sinks",
                "jaxformer.parity.cases_packing", "jaxformer.parity.cases_lora",
                "jaxformer.parity.cases_blockwise", "jaxformer.parity.cases_interop",
                "jaxformer.parity.cases_diff_attn")


def load_all() -> dict[str, Case]:
    for m in CASE_MODULES:
        importlib.import_module(m)
    return CASES
