"""`jaxformer port` never hands out a wrong file (issue 47): the engine's guards, each shown
able to fail. The corpus (tests/test_port_corpus.py, tests/port_corpus/defects.py) proves parity
on every defect class; these tests pin what the engine does around it:

- writes (index assignment, in-place ops, writes through views) are made functional by torch's
  functionalization, and a write left after it is refused by name, never dropped;
- a buffer forward updates is written back; a write into an input is said in the header;
- every file is shown to run at the traced and the free sizes with torch's output shapes before
  it is returned (port/verify.py), and the CLI checks parity before writing, by default;
- frozen parameters are non-trainable state; BatchNorm computes train mode as torch does;
- the locator compares conv values in torch's layout; the float64 twin excuses a leaf only
  where both fp32 answers are off float64 and the twin gives torch's float64 answer;
- refusals name the user's line; a call written over several lines is shown whole."""
from __future__ import annotations

import copy

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from flax import nnx

from jaxformer.parity.harness import ParityOptions, check_parity
from jaxformer.parity.results import OUT_TOL, Tolerance
from jaxformer.port import PortError, api, from_torch, port, trace


def _x(seed, *shape):
    return np.random.RandomState(seed).standard_normal(shape).astype(np.float32)


def _torch(module, inputs):
    with torch.no_grad():
        return module(**{k: torch.from_numpy(v) for k, v in inputs.items()})


def _close(got, want) -> None:
    want = np.asarray(want, np.float64)
    assert np.abs(np.asarray(got, np.float64) - want).max() <= OUT_TOL.bound(float(np.abs(want).max()))


# ----------------------------------------------------------------------------- writes
class Counter(nn.Module):
    """Index assignment, a write through a view, and a buffer forward updates."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x):
        buf = torch.zeros(x.shape[0], 3, 4)
        buf[:, 1] = x.sum(-1, keepdim=True).expand(-1, 4)
        y = self.lin(x)
        y[:, :2] += 1.0
        y.view(-1).mul_(2)
        self.calls += 1
        return buf.sum(1) + y * self.calls


def test_writes_are_functional_and_a_buffer_update_is_kept():
    torch.manual_seed(0)
    module = Counter().eval()
    inputs = {"x": _x(0, 2, 4)}
    result = port(module, inputs)
    assert "forward updates the buffer `calls` in place" in " ".join(result.source.split())
    ported = api._loaded(result, copy.deepcopy(module))
    for _ in range(3):  # the buffer counts calls on both sides: the outputs stay equal
        _close(ported(jnp.asarray(inputs["x"])), _torch(module, inputs).numpy())
    assert float(ported.calls[...]) == float(module.calls) == 3.0


def test_a_write_into_an_input_is_said():
    class Scales(nn.Module):
        def forward(self, x):
            x.mul_(2)
            return x + 1

    result = port(Scales().eval(), {"x": _x(1, 2, 3)})
    assert "forward writes into its input `x` in place" in " ".join(result.source.split())


def test_a_write_functionalization_leaves_is_refused_by_name(monkeypatch):
    """The guard behind functionalization: with torch's pass made a no-op, the graph keeps its
    copy_ and the port refuses it by name instead of dropping it (the old silent wrong file)."""
    monkeypatch.setattr(torch.export.ExportedProgram, "run_decompositions", lambda self, table=None: self)

    class SetItem(nn.Module):
        def forward(self, x):
            buf = torch.zeros(x.shape[0], 3)
            buf[:, 1] = x.sum(-1)
            return buf

    with pytest.raises(PortError, match=r"in-place aten op aten\.copy_: .*buf\[:, 1\] = x\.sum\(-1\)"):
        port(SetItem().eval(), {"x": _x(2, 2, 4)})


def test_norms_in_training_form_count_as_writes():
    """F.batch_norm(training=True) with running stats updates them though its schema says not."""
    class Functional(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("mean", torch.zeros(3))
            self.register_buffer("var", torch.ones(3))

        def forward(self, x, train: bool):
            return F.batch_norm(x, self.mean, self.var, training=train)

    for train, writes in ((True, True), (False, False)):
        program = torch.export.export(Functional(), (torch.randn(4, 3), train), strict=False)
        assert any(trace.mutating(n) for n in program.graph.nodes) is writes


# ----------------------------------------------------------------------------- the file runs
class Pooled(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return self.lin(x).mean(1)


def test_verify_refuses_a_file_that_does_not_give_torchs_shapes(monkeypatch):
    """A translation that drops the reduced axis' keepdims-free shape (a planted bug) gives a file
    that runs but returns the wrong shape: the port refuses it, naming the sizes."""
    from jaxformer.port import ops
    monkeypatch.setitem(ops.TABLE, "aten.mean", lambda c, a: f"{c.r(a['self'])}.mean(axis=1, keepdims=True)")
    with pytest.raises(PortError, match=r"output out is float32\[2, 1, 4\] where torch's is float32\[2, 4\] "
                                        r"\(at the traced sizes\)"):
        port(Pooled().eval(), {"x": _x(3, 2, 5, 4)})


def test_verify_refuses_a_file_that_fails_at_a_free_size(monkeypatch):
    """A translation that bakes the traced length in (a planted bug) runs at the traced sizes
    only: the port refuses it, naming the free size it was tried at."""
    from jaxformer.port import ops
    monkeypatch.setitem(ops.TABLE, "aten.mean", lambda c, a: f"{c.r(a['self'])}.reshape(2, 5, 4).mean(axis=1)")
    with pytest.raises(PortError, match=r"does not run at x\.shape\[0\] = 3, x\.shape\[1\] = 6: TypeError"):
        port(Pooled().eval(), {"x": _x(3, 2, 5, 4)})


def test_cli_checks_by_default_and_keeps_a_good_file(tmp_path, monkeypatch, capsys):
    import os
    import sys

    from jaxformer.cli import main
    name = f"pooled_factory_{os.getpid()}_{abs(hash(str(tmp_path))) % 10**8}"
    (tmp_path / f"{name}.py").write_text(
        f"import sys\nsys.path.insert(0, {os.path.dirname(__file__)!r})\nimport numpy as np, torch\n"
        "from test_port_safety import Pooled\n"
        "def make():\n    torch.manual_seed(0)\n    return Pooled().eval(), {'x': np.ones((2, 5, 4), np.float32)}\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, name, raising=False)
    assert main(["port", f"{name}:make", "--out", "p.py"]) == 0
    out = capsys.readouterr().out
    assert "wrote p.py" in out and " ok" in out  # the parity row: checked without --check
    good = (tmp_path / "p.py").read_text()
    from jaxformer.port import ops
    monkeypatch.setitem(ops.TABLE, "aten.mean", lambda c, a: f"{c.r(a['self'])}.sum(axis=1)")  # a wrong file
    assert main(["port", f"{name}:make", "--out", "p.py"]) == 1
    assert "parity check failed; p.py not written" in capsys.readouterr().err
    assert main(["port", f"{name}:make", "--out", "p.py", "--no-check"]) == 0  # runs, unchecked
    assert (tmp_path / "p.py").read_text() != good
    monkeypatch.setitem(ops.TABLE, "aten.mean", lambda c, a: f"{c.r(a['self'])}.sum(axis=(1, 2))")
    (tmp_path / "p.py").write_text(good)
    assert main(["port", f"{name}:make", "--out", "p.py", "--no-check"]) == 2  # wrong shape: refused
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "where torch's is float32[2, 4]" in err
    assert (tmp_path / "p.py").read_text() == good


# ----------------------------------------------------------------------------- frozen, batch norm
def test_frozen_parameters_are_state_no_optimiser_sees():
    class Frozen(nn.Module):
        def __init__(self):
            super().__init__()
            self.table = nn.Embedding(8, 4).requires_grad_(False)
            self.gain = nn.Parameter(torch.full((4,), 1.5), requires_grad=False)
            self.lin = nn.Linear(4, 4)

        def forward(self, x):
            return self.lin(x * self.gain + self.table.weight[: x.shape[1]])

    torch.manual_seed(0)
    module = Frozen().eval()
    inputs = {"x": _x(4, 2, 6, 4)}
    ported = from_torch(module, inputs)
    trained = {".".join(map(str, p)) for p, _ in nnx.to_flat_state(nnx.state(ported, nnx.Param))}
    assert trained == {"lin.kernel", "lin.bias"}
    report = check_parity(module, ported, inputs, ParityOptions(state_map=api.state_map(module, ported)))
    assert report.ok and "gradient not compared: gain, table.weight" in " ".join(report.notes)
    optimizer = nnx.Optimizer(ported, __import__("optax").sgd(0.1), wrt=nnx.Param)
    before = np.asarray(ported.gain[...])
    grads = nnx.grad(lambda m: m(jnp.asarray(inputs["x"])).sum())(ported)
    optimizer.update(ported, grads)
    assert np.array_equal(np.asarray(ported.gain[...]), before)


class ConvBN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.bn = nn.BatchNorm2d(4)
        self.bn1 = nn.BatchNorm1d(4, affine=False, momentum=None)

    def forward(self, x):
        return self.bn1(self.bn(self.conv(x)).mean((2, 3)))


def test_batch_norm_both_modes_as_torch():
    torch.manual_seed(0)
    module = ConvBN()
    with torch.no_grad():
        module.bn.running_mean.normal_()
        module.bn.running_var.uniform_(0.5, 2.0)
    module.eval()
    inputs = {"x": _x(5, 4, 3, 8, 8)}
    ported = from_torch(module, inputs, check=True)  # eval: running statistics
    src = " ".join(api.port(module, inputs).source.split())
    assert "Train mode of BatchNorm (model.train()): batch statistics, the running ones updated as torch " \
           "does, in `bn`, `bn1`." in src
    reference = copy.deepcopy(module).double().train()
    module.train()
    ported.train()
    for step in range(2):
        x = _x(6 + step, 4, 3, 8, 8)
        want = _torch(module, {"x": x}).numpy()
        got = np.asarray(ported(jnp.asarray(x)))
        truth = _torch(reference, {"x": x.astype(np.float64)}).numpy()  # torch's CPU kernel sums in double
        tol = OUT_TOL.bound(float(np.abs(truth).max()))
        assert np.abs(got - truth).max() <= tol and np.abs(want - truth).max() <= tol
    for name in ("bn.running_mean", "bn.running_var", "bn.num_batches_tracked", "bn1.running_mean",
                 "bn1.running_var", "bn1.num_batches_tracked"):
        owner, leaf = name.split(".")
        want = getattr(getattr(reference, owner), leaf).numpy()
        got = np.asarray(getattr(getattr(ported, owner), leaf)[...])
        assert np.abs(got - want).max() <= OUT_TOL.bound(float(np.abs(want).max())), name
    assert isinstance(ported.bn.running_mean, nnx.BatchStat)


# ----------------------------------------------------------------------------- locator, referee
class ConvLC(nn.Module):
    """A Conv1d whose output [B, C, L] has L == C: flax's [B, L, C] has torch's shape."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv1d(8, 8, 3, padding=1)
        self.out = nn.Linear(8, 8)

    def forward(self, x):
        return self.out(F.gelu(self.conv1(x)).permute(0, 2, 1))


def test_locator_compares_conv_values_in_torchs_layout():
    from jaxformer.parity.locate import first_parting
    torch.manual_seed(0)
    module = ConvLC().eval()
    x = _x(7, 2, 8, 8)
    ported = from_torch(module, {"x": x})
    assert first_parting(module, ported, (x,), {}, OUT_TOL) is None  # nothing parts: nothing blamed
    ported.out.bias.set_value(ported.out.bias[...] + 1.0)  # a planted bug after the conv
    parting = first_parting(module, ported, (x,), {}, OUT_TOL)
    assert parting.module == "out" and parting.inputs_agree


def test_float64_twin_excuses_only_what_float32_cannot_resolve():
    """At a tolerance no fp32 answer meets (1e-12), every leaf is off float64 on both sides: the
    twin (the file in float64) gives torch's float64 answer, so each is excused; a twin of a file
    with a planted bug (another GELU) does not, and the leaves fail."""
    torch.manual_seed(0)
    module = ConvLC().eval()
    inputs = {"x": _x(8, 2, 8, 8)}
    result = api.port(module, inputs)
    ported = api._loaded(result, module)
    tight = Tolerance(1e-12, 0.0)
    twin = lambda: api.twin64(result, module)
    report = check_parity(module, ported, inputs, ParityOptions(out_tol=tight, grad_tol=tight, twin64=twin,
                                                                state_map=api.state_map(module, ported)))
    assert report.ok, report.message()
    judged = report.row()["referee"]
    assert judged and all(r["excused"] and r["side"] == "both" and r["twin_err"] < 1e-12 for r in judged.values())
    bad = api.PortResult(result.source.replace("approximate=False", "approximate=True"), result.class_name, [])
    report = check_parity(module, ported, inputs, ParityOptions(out_tol=tight, grad_tol=tight,
                                                                twin64=lambda: api.twin64(bad, module),
                                                                state_map=api.state_map(module, ported)))
    assert not report.ok
    assert all("different functions" in leaf.referee.describe() for leaf in report.outputs.values())
    assert check_parity(module, ported, inputs, ParityOptions(state_map=api.state_map(module, ported))).ok  # no twin


# ----------------------------------------------------------------------------- source lines, sizes
class GridSample(nn.Module):
    def forward(self, x, grid):
        y = x * 2
        return F.grid_sample(
            y,
            grid,
            align_corners=False,
        )


def test_refusal_names_the_users_whole_statement():
    with pytest.raises(PortError) as refusal:
        port(GridSample().eval(), {"x": _x(9, 1, 2, 4, 4), "grid": _x(10, 1, 3, 3, 2)})
    text = str(refusal.value)
    assert len(text.splitlines()) == 1
    assert "test_port_safety.py" in text and "return F.grid_sample(y, grid, align_corners=False)" in text
    assert "functional.py" not in text


class Sizes(nn.Module):
    """Slices and pads whose bounds are functions of a free size (MPT's Max(0, 1 - s),
    torchvision Swin's pad to a multiple of its window)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.register_buffer("alibi", torch.randn(16))

    def forward(self, x):
        s = x.shape[1]
        a = self.alibi[max(0, 12 - s):]
        pad = (7 - s % 7) % 7
        h = F.pad(self.lin(x), (0, 0, 0, pad))
        return h[:, : (s + pad) // 7 * 7].sum(1) + a[: s // 2].sum()


def test_sizes_from_symbolic_expressions_at_other_sizes():
    torch.manual_seed(0)
    module = Sizes().eval()
    ported = from_torch(module, {"x": _x(11, 2, 9, 4)}, check=True)
    src = api.port(module, {"x": _x(11, 2, 9, 4)}).source
    assert "max(0, (12 - x.shape[1]))" in src and "jax.lax.pad(" in src
    step = nnx.jit(lambda m, x: m(x))
    for t in (5, 8, 13):
        x = _x(t, 3, t, 4)
        _close(step(ported, jnp.asarray(x)), _torch(module, {"x": x}).numpy())


# ----------------------------------------------------------------------------- output objects, layers
def test_model_output_is_returned_as_itself():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=32, n_positions=16, n_embd=16, n_layer=1, n_head=2, use_cache=False,
                                  attn_implementation="eager")
    module = transformers.GPT2LMHeadModel(cfg).eval()
    ids = np.random.RandomState(0).randint(0, 32, (2, 6)).astype(np.int64)
    ported = from_torch(module, {"input_ids": ids}, check=True)
    out = nnx.jit(lambda m, x: m(x))(ported, jnp.asarray(ids))
    assert type(out).__name__ == "CausalLMOutputWithCrossAttentions" and list(out.keys()) == ["logits"]
    assert out.logits is out["logits"] and out[0] is out.logits
    assert jax.tree.leaves(out)[0].shape == (2, 6, 32)


def test_layers_jaxformer_never_crashes_where_the_default_port_works():
    """nn.Transformer with a key padding mask in eval mode: the eager run that finds twins takes
    torch's nested-tensor fast path unless it is turned off; with it off the twins stand in."""
    torch.manual_seed(0)

    class Seq2Seq(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(20, 16)
            self.tr = nn.Transformer(16, 4, 1, 1, 32, batch_first=True)

        def forward(self, src, tgt, pad):
            return self.tr(self.emb(src), self.emb(tgt), src_key_padding_mask=pad, memory_key_padding_mask=pad)

    rng = np.random.RandomState(0)
    pad = np.zeros((2, 6), bool)
    pad[1, 4:] = True
    inputs = {"src": rng.randint(0, 20, (2, 6)), "tgt": rng.randint(0, 20, (2, 5)), "pad": pad}
    module = Seq2Seq().eval()
    result = api.port(module, inputs, layers="jaxformer")
    assert "`tr.encoder` as jaxformer.layers.transformer.Encoder" in " ".join(result.source.split())
    report = api.check(module, api._loaded(result, module), inputs, result=result)
    assert report.ok, report.message()


def test_layers_jaxformer_falls_back_when_the_eager_run_fails():
    class EagerOnly(nn.Module):
        def __init__(self):
            super().__init__()
            self.attn = nn.MultiheadAttention(8, 2, batch_first=True)

        def forward(self, x):
            if not torch.compiler.is_exporting():
                raise RuntimeError("this model refuses eager runs")
            return self.attn(x, x, x, need_weights=False)[0]

    result = api.port(EagerOnly().eval(), {"x": _x(12, 2, 5, 8)}, layers="jaxformer")
    src = " ".join(result.source.split())
    assert "Note: `attn` written op by op: recording their calls failed (RuntimeError: this model refuses" in src
    assert "import jaxformer" not in src and "from jaxformer" not in src



class Merged(nn.Module):
    """A Linear called on an expression that starts with a bracket: (att @ v).transpose(...)."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, a, v):
        return self.proj((a @ v).transpose(1, 2).reshape(a.shape[0], a.shape[2], 8))


def test_an_argument_that_starts_with_a_bracket_keeps_it():
    """`self.proj((a @ v).transpose(1, 2)...)` was once written `self.proj(a @ v).transpose(1, 2)...`:
    the argument's outer brackets were taken for its own."""
    torch.manual_seed(0)
    inputs = {"a": _x(13, 2, 2, 5, 5), "v": _x(14, 2, 2, 5, 4)}
    result = port(Merged().eval(), inputs)
    assert "self.proj((a@v).swapaxes(1,2).reshape(" in "".join(result.source.split())
    from_torch(Merged().eval(), inputs, check=True)


class SmallIndex(nn.Module):
    def forward(self, x, idx):
        return torch.gather(x * 2, 1, idx)


def test_gather_reads_only_the_index_extent():
    """torch.gather with an index smaller than the input in another dim (ViT-MAE's kept patches
    at a batch the noise does not share) reads only that extent; take_along_axis would broadcast."""
    inputs = {"x": _x(15, 4, 6), "idx": np.array([[0, 5, 2], [1, 1, 4]])}
    ported = from_torch(SmallIndex().eval(), inputs, check=True)
    _close(ported(jnp.asarray(inputs["x"]), jnp.asarray(inputs["idx"])), _torch(SmallIndex(), inputs).numpy())
