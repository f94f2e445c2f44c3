"""`jaxformer port` on the corpus (issue 33 §6): every model in tests/port_corpus/ is ported with
the engine's API and checked with the parity harness at its default tolerances: every output
leaf, and the gradient of every torch parameter (and float input), each against its own scale.
The ported module is loaded again through the strict converter (check_parity's convert=True),
so its attribute paths must be the torch state_dict keys (up to the converter's own leaf rule:
a custom `scale` / `embedding` parameter is read from torch's `weight`, port.api.converter_state). An entry in REFUSED must instead be refused,
by name, with its message fragment. There is no skip: without `jaxformer.port` these fail. The corpus'
EXTRA entries (the same contract, out of the suite for its time budget) are marked `extra`,
which the suite's addopts deselect: `python -m pytest tests/test_port_corpus.py -m extra` runs them.

With layers="jaxformer" the entries in JAXFORMER (those holding a module with a jaxformer twin)
are ported and checked again, the same way, torch's names mapped onto the twins' (port.api.
state_map): torch_ref_lm_moe, which the default port refuses, passes there. Every other entry has
no module that could be a twin, so its jaxformer port is its default port (checked cheaply).

The dropout entry is also checked in train mode, on one port with both dropouts on (hidden 0.5,
output 0.25, the rates the file writes); each check switches the dropout it does not look at off
on both sides (torch's p, the port's nnx.Dropout rate). torch and JAX draw different masks, so
what is checked is what holds for any correct dropout: at p = 0 the train-mode port equals torch's
train-mode output; with only the output dropout on (p = 0.25) every element is 0 or the eval
output / (1 - p), the dropped fraction is p within 4 binomial standard deviations (a fixed seed,
so not flaky), and a second call draws a different mask; with only the hidden dropout on
(p = 0.5, before the last Linear), 256 train-mode draws average to the eval output (inverted
dropout is unbiased) and their variance is the one that rate gives, computed from torch's
weights: Var[y_j] = p / (1 - p) * sum_i W2[j, i]^2 h_i^2 (a wrong rate is off by a factor).
"""
from __future__ import annotations

import inspect
import math
import re

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from port_corpus import CORPUS, EXTRA, EXTRA_JAXFORMER, JAXFORMER, REFUSED, dropout_mlp

from jaxformer.parity.harness import OUT_TOL, ParityOptions, check_parity

MAX_PARAMS = 200_000  # tiny models only: the suite has a 15-minute budget on 2 cores


def _check_factory(module, inputs) -> None:
    """The factory's contract: an eval-mode module, numpy inputs keyed by forward's arguments."""
    assert isinstance(module, torch.nn.Module) and not module.training
    assert isinstance(inputs, dict) and inputs
    params = inspect.signature(module.forward).parameters
    for k, v in inputs.items():
        assert k in params, f"input {k!r} is not an argument of {type(module).__name__}.forward"
        assert isinstance(v, np.ndarray), f"input {k!r} is {type(v).__name__}, not a numpy array"
    assert sum(p.numel() for p in module.parameters()) <= MAX_PARAMS


def test_refused_names_are_corpus_entries():
    assert set(REFUSED) <= set(CORPUS), sorted(set(REFUSED) - set(CORPUS))
    assert set(JAXFORMER) <= set(CORPUS), sorted(set(JAXFORMER) - set(CORPUS))
    assert len(CORPUS) >= 20


@pytest.mark.parametrize("name", sorted(CORPUS) + [pytest.param(n, marks=pytest.mark.extra) for n in sorted(EXTRA)])
def test_port_corpus(name):
    module, inputs = {**CORPUS, **EXTRA}[name]()
    _check_factory(module, inputs)
    from jaxformer.port import from_torch  # no skip: a missing engine fails here
    if name in REFUSED:
        from jaxformer.port import PortError
        with pytest.raises(PortError, match=re.escape(REFUSED[name])) as refusal:
            from_torch(module, inputs)
        assert len(str(refusal.value).splitlines()) == 1, "a refusal is one line"
        return
    from jaxformer.port import api
    result = api.port(module, inputs)
    _check_port(name, module, inputs, result, api._loaded(result, module))


def _check_port(name, module, inputs, result, ported) -> None:
    from jaxformer.port.api import state_map, twin64
    # the converter reads a custom module's `scale` / `embedding` leaf from torch's `weight`, and
    # a torch.nn module written as its jaxformer twin under interop's names: state_map renames
    # those keys (state dict and gradients alike), nothing else. The float64 twin is the port's
    # check's (jaxformer.port.api.check; docs/numerics.md §45)
    rename = state_map(module, ported)
    report = check_parity(module, ported, inputs, ParityOptions(case=f"port:{name}", state_map=rename,
                                                                twin64=lambda: twin64(result, module)))
    print(report.row())
    assert report.ok, report.message()
    # nothing passes by comparing nothing: every output leaf and every trainable parameter's
    # gradient (a frozen one, requires_grad=False, is state on both sides: the report names it)
    assert report.outputs
    trained = {n: p for n, p in module.named_parameters() if p.requires_grad}
    missing = set(rename(trained)) - set(report.grads)
    assert not missing, f"gradients not compared: {sorted(missing)}"
    frozen = sorted(n for n, p in module.named_parameters() if not p.requires_grad)
    if frozen:
        assert f"gradient not compared: {', '.join(frozen)}" in " ".join(report.notes)


@pytest.mark.parametrize("name", sorted(JAXFORMER) + [pytest.param(n, marks=pytest.mark.extra)
                                                        for n in sorted(EXTRA_JAXFORMER)])
def test_port_corpus_jaxformer_layers(name):
    from jaxformer.port import api
    module, inputs = {**CORPUS, **EXTRA}[name]()
    result = api.port(module, inputs, layers="jaxformer")
    assert {**JAXFORMER, **EXTRA_JAXFORMER}[name] in " ".join(result.source.split())  # the header names the twins
    _check_port(name, module, inputs, result, api._loaded(result, module))


def test_port_corpus_jaxformer_layers_change_only_those():
    """Every entry outside JAXFORMER and EXTRA_JAXFORMER holds no module that could be a jaxformer
    twin: its port with layers="jaxformer" is its default port, which test_port_corpus proves."""
    from jaxformer.port import trace, twins
    for name in sorted(set(CORPUS) - set(JAXFORMER) - set(EXTRA_JAXFORMER)):
        module, inputs = CORPUS[name]()
        assert twins.find(module, trace.torch_inputs(module, inputs)) == ({}, []), name


# ----------------------------------------------------------------------------- dropout, train mode
def _torch_out(module, inputs, *, train: bool) -> np.ndarray:
    module.train(train)
    with torch.no_grad():
        out = module(**{k: torch.from_numpy(v) for k, v in inputs.items()})
    module.eval()
    return out.numpy()


def _jax_out(ported, inputs) -> np.ndarray:
    return np.asarray(ported(**{k: jnp.asarray(v) for k, v in inputs.items()}))


P_HIDDEN, P_OUT = 0.5, 0.25


@pytest.fixture(scope="module")
def dropout_ported():
    """(torch module, inputs, its port): one port for the train-mode checks below."""
    from jaxformer.port import from_torch
    module, inputs = dropout_mlp.make(p_hidden=P_HIDDEN, p_out=P_OUT)
    ported = from_torch(module, inputs)
    assert (ported.drop_hidden.rate, ported.drop_out.rate) == (P_HIDDEN, P_OUT)  # the rates written
    return module, inputs, ported


@pytest.fixture
def dropout_port(dropout_ported):
    """A fresh copy of the shared port (its RNG streams as from_torch left them: the same masks
    in any test order) and of the torch module."""
    import copy

    from flax import nnx
    module, inputs, ported = dropout_ported
    return copy.deepcopy(module), inputs, nnx.clone(ported)


def _rates(module, ported, hidden: float, out: float) -> None:
    """Both dropouts' rates on both sides (torch's p, the port's nnx.Dropout rate)."""
    module.drop_hidden.p, module.drop_out.p = hidden, out
    ported.drop_hidden.rate, ported.drop_out.rate = hidden, out


def test_port_dropout_train_mode_p0_equals_torch(dropout_port):
    module, inputs, ported = dropout_port
    _rates(module, ported, 0.0, 0.0)
    ported.train()
    want = _torch_out(module, inputs, train=True)
    got = _jax_out(ported, inputs)
    assert np.abs(got - want).max() <= OUT_TOL.bound(float(np.abs(want).max()))


def test_port_dropout_train_mode_mask(dropout_port):
    module, inputs, ported = dropout_port
    p = P_OUT
    _rates(module, ported, 0.0, p)
    ported.eval()
    eval_out = _torch_out(module, inputs, train=False)
    assert np.abs(_jax_out(ported, inputs) - eval_out).max() <= OUT_TOL.bound(float(np.abs(eval_out).max()))
    ported.train()
    first, second = _jax_out(ported, inputs), _jax_out(ported, inputs)
    live = np.abs(eval_out) > 1e-4  # elements whose dropped and kept values cannot be confused
    kept_value = eval_out / (1 - p)
    for out in (first, second):
        dropped = out == 0
        kept_ok = np.abs(out - kept_value) <= OUT_TOL.bound(float(np.abs(kept_value).max()))
        assert np.all(dropped | kept_ok), "a train-mode element is neither 0 nor eval / (1 - p)"
        rate = float(dropped[live].mean())
        n = int(live.sum())
        assert abs(rate - p) <= 4 * math.sqrt(p * (1 - p) / n), f"dropped {rate:.3f} of {n}, p = {p}"
    assert np.any((first == 0) != (second == 0)), "two train-mode calls drew the same mask"


def test_port_dropout_train_mode_hidden_rate(dropout_port):
    from flax import nnx
    module, inputs, ported = dropout_port
    p, draws = P_HIDDEN, 256
    _rates(module, ported, p, 0.0)
    eval_out = _torch_out(module, inputs, train=False)
    with torch.no_grad():
        h = module.act(module.fc1(torch.from_numpy(inputs["x"]))).double().numpy()  # [B, T, F]
    w2 = module.fc2.weight.detach().double().numpy()  # [D, F]
    var = p / (1 - p) * np.einsum("btf,df->btd", h ** 2, w2 ** 2)  # per output element
    ported.train()
    step = nnx.jit(lambda m, x: m(x))
    x = jnp.asarray(inputs["x"])
    samples = np.stack([np.asarray(step(ported, x)) for _ in range(draws)]).astype(np.float64)
    assert np.any(samples[0] != samples[1]), "two train-mode calls gave the same output"
    mean_err = np.abs(samples.mean(0) - eval_out)
    assert np.all(mean_err <= 5 * np.sqrt(var / draws) + OUT_TOL.bound(float(np.abs(eval_out).max()))), \
        f"train-mode mean is off the eval output by up to {float((mean_err / np.sqrt(var / draws)).max()):.1f} sigma"
    ratio = float((samples.var(0, ddof=1) / var).mean())
    assert 0.85 <= ratio <= 1.15, f"train-mode variance is {ratio:.2f}x the one dropout p={p} gives"
