"""One parametrized test runs every registered parity case: outputs and gradients, each leaf
against atol + rtol * max |torch leaf| (docs/numerics.md §19)."""
import pytest

from jaxformer.parity.registry import load_all, run_case

CASES = load_all()


@pytest.mark.parametrize("name", sorted(CASES))
def test_case(name, record_property):
    r = run_case(CASES[name])
    row = r.row()
    for k in ("max_abs_out", "tol_out", "max_abs_grad", "tol_grad", "ratio"):
        record_property(k, row[k])
    assert not r.problems, r.problems
    assert r.ok, f"{name}: worst {r.worst()}"


def test_every_component_has_cases():
    components = {c.component for c in CASES.values()}
    for needed in ("attention", "positional", "ffn", "norm", "conv", "encoder_layer", "decoder_layer",
                   "encoder_stack", "decoder_stack", "embedding"):
        assert needed in components
