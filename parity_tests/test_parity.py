"""One parametrized test runs every registered parity case: outputs and gradients."""
import pytest

from jaxformer.parity.registry import load_all, run_case

CASES = load_all()


@pytest.mark.parametrize("name", sorted(CASES))
def test_case(name, record_property):
    r = run_case(CASES[name])
    record_property("max_abs_out", r.max_abs_out)
    record_property("max_abs_grad", r.max_abs_grad)
    assert not r.problems, r.problems
    assert r.max_abs_out <= r.tol, f"outputs differ by {r.max_abs_out:.3e} > {r.tol}: {r.worst()}"
    assert r.max_abs_grad <= r.grad_tol * r.grad_scale, (
        f"gradients differ by {r.max_abs_grad:.3e} > {r.grad_tol} x {r.grad_scale:.3g}: {r.worst()}")


def test_every_component_has_cases():
    components = {c.component for c in CASES.values()}
    for needed in ("attention", "positional", "ffn", "norm", "conv", "encoder_layer", "decoder_layer",
                   "encoder_stack", "decoder_stack", "embedding"):
        assert needed in components
