"""`jaxformer port`'s engine: the written source, the weights, the op table, refusals, the CLI.

The corpus (tests/test_port_corpus.py) proves parity on many models; these tests pin the
properties every port must have, on one tiny model written here: the file imports only jax,
flax and numpy, compiles, is black-formatted, carries the torch source lines, keeps torch's
state_dict keys as attribute paths (tied weight and buffer included), loads strictly, runs at
sizes other than the traced ones, and ports dropout's train mode."""
from __future__ import annotations

import ast
import math
import sys
import textwrap

import jax.numpy as jnp
import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from flax import nnx

from jaxformer import convert
from jaxformer.parity.results import OUT_TOL
from jaxformer.port import PortError, api, from_torch, ops, port, port_source


class Attention(nn.Module):
    def __init__(self, d: int, heads: int, p: float):
        super().__init__()
        self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, d)
        self.heads, self.p = heads, p
        self.register_buffer("mask", torch.tril(torch.ones(16, 16)).bool())

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        att = torch.einsum("bhtd,bhsd->bhts", q, k) / math.sqrt(C // self.heads)
        att = att.masked_fill(~self.mask[:T, :T], float("-inf"))
        att = F.dropout(att.softmax(-1), self.p, self.training)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        return self.out(y)


class TinyLM(nn.Module):
    def __init__(self, vocab=40, d=16, heads=2, layers=2, p=0.0):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.randn(1, 16, d) * 0.02)
        self.layers = nn.ModuleList(nn.ModuleDict({"norm": nn.LayerNorm(d), "attn": Attention(d, heads, p),
                                                   "mlp": nn.Sequential(nn.Linear(d, 2 * d), nn.GELU("tanh"),
                                                                        nn.Linear(2 * d, d))})
                                    for _ in range(layers))
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, idx):
        x = self.embed(idx) + self.pos[:, : idx.shape[1]]
        for layer in self.layers:
            x = x + layer["attn"](layer["norm"](x))
            x = x + layer["mlp"](x)
        return F.log_softmax(self.head(x), dim=-1)


def make_tiny(p: float = 0.0):
    torch.manual_seed(0)
    model = TinyLM(p=p).eval()
    return model, {"idx": np.random.RandomState(0).randint(0, 40, (2, 8)).astype(np.int64)}


@pytest.fixture(scope="module")
def tiny():
    model, inputs = make_tiny()
    return model, inputs, port(model, inputs)


def _imports(source: str) -> set[str]:
    tree = ast.parse(source)
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            names.add((node.module or "").split(".")[0])
    return names


# ----------------------------------------------------------------------------- the written file
def test_source_imports_only_jax_flax_numpy_and_is_formatted(tiny):
    import black
    _, _, result = tiny
    assert _imports(result.source) <= {"jax", "flax", "numpy"}, _imports(result.source)
    compile(result.source, "port.py", "exec")
    assert black.format_str(result.source, mode=black.Mode(line_length=100)) == result.source
    names = {n.id for n in ast.walk(ast.parse(result.source)) if isinstance(n, ast.Name)}
    assert "torch" not in names and "F" not in names


def test_source_reads_like_the_torch_code(tiny):
    _, _, result = tiny
    src = result.source
    assert "class TinyLM(nnx.Module):" in src and "class Attention(nnx.Module):" in src
    assert "def __call__(self, idx):" in src and "def __init__(self, *, rngs: nnx.Rngs):" in src
    # the torch line above its block, and the torch code's own local names
    assert "# test_port.py:" in src and "q, k, v = self.qkv(x).chunk(3, dim=-1)" in src
    assert "att = " in src and "jax.nn.gelu(" in src and "approximate=True" in src
    assert "self.embed.attend(" in src  # the head tied to the embedding
    assert "Free dimensions: idx.shape[0] >= 2; idx.shape[1] in 2..16" in src
    assert "Train mode" not in src  # no dropout (p = 0): train mode computes what eval mode does


def test_attribute_paths_are_the_state_dict_keys(tiny):
    model, _, result = tiny
    ported = result.build()
    keys = {convert.torch_key(p) for p in convert.param_leaves(ported)}
    assert keys == set(model.state_dict()) - {"head.weight"}  # the tied alias is the same tensor
    assert "layers.1.attn.mask" in keys and "layers.0.mlp.2.weight" in keys


def test_weights_load_strictly(tiny):
    model, _, result = tiny
    ported = api.load_torch_weights(result.build(), model)
    assert np.array_equal(np.asarray(ported.layers[0]["attn"].qkv.kernel[...]),
                          model.layers[0]["attn"].qkv.weight.detach().numpy().T)
    extra = TinyLM().eval()
    extra.register_buffer("stray", torch.zeros(3))
    with pytest.raises(convert.ConversionError, match="unexpected: stray"):
        api.load_torch_weights(result.build(), extra)


def test_port_matches_torch_at_other_sizes(tiny):
    model, inputs, result = tiny
    ported = api.load_torch_weights(result.build(), model)
    ported.eval()
    run = nnx.jit(lambda m, x: m(x))  # one program per size, not one compile per op and size
    for shape in ((3, 5), (1, 16)):
        idx = np.random.RandomState(1).randint(0, 40, shape)
        want = model(torch.from_numpy(idx)).detach().numpy()
        got = np.asarray(run(ported, jnp.asarray(idx)))
        assert np.abs(got - want).max() <= OUT_TOL.bound(float(np.abs(want).max()))


def test_check_passes_and_prints_the_row(tiny, capsys):
    model, inputs, _ = tiny
    from_torch(model, inputs, check=True)
    row = capsys.readouterr().out
    assert "'ok': True" in row and "max_abs_grad" in row


def test_dropout_is_ported_for_train_mode():
    model, inputs = make_tiny(p=0.5)
    result = port(model, inputs)  # one port: its file, and the module from_torch would return
    assert "nnx.Dropout(0.5" in result.source
    assert "Train mode: dropout as nnx.Dropout (model.train() / model.eval()) in a functional dropout in " \
           "`layers.0.attn`, a functional dropout in `layers.1.attn`." in result.source
    ported = api._loaded(result, model)
    ported.eval()  # as from_torch leaves an eval-mode torch module's port
    idx = jnp.asarray(inputs["idx"])
    run = nnx.jit(lambda m, x: m(x))  # a program per mode, not a compile per op (RNG state updated)
    eval_a, eval_b = np.asarray(run(ported, idx)), np.asarray(run(ported, idx))
    assert np.array_equal(eval_a, eval_b)  # eval: deterministic, as torch's
    ported.train()
    train_a, train_b = np.asarray(run(ported, idx)), np.asarray(run(ported, idx))
    assert not np.allclose(train_a, eval_a) and not np.allclose(train_a, train_b)


# ----------------------------------------------------------------------------- the header
class Pinned(nn.Module):
    """x [B, T, 4]: the Linear fixes the last size, the [6, 8] position table fixes T; B stays free."""

    def __init__(self, batch_table: bool = False):
        super().__init__()
        self.proj = nn.Linear(4, 8)
        self.pos = nn.Parameter(torch.randn(2, 6, 8) if batch_table else torch.randn(6, 8))

    def forward(self, x):
        return self.proj(x) + self.pos


def test_header_free_dimensions_are_the_exported_graphs():
    """Every input size is asked to stay free; the header lists those the exported graph keeps
    symbolic, not the ones a later op fixed. The one it lists is free: the port runs at another
    batch size and matches torch there."""
    torch.manual_seed(0)
    model = Pinned().eval()
    result = port(model, {"x": np.ones((2, 6, 4), np.float32)})
    assert "Free dimensions: x.shape[0] >= 2; every other size is fixed." in result.source
    ported = api.load_torch_weights(result.build(), model)
    x = np.random.RandomState(0).randn(3, 6, 4).astype(np.float32)
    want = model(torch.from_numpy(x)).detach().numpy()
    got = np.asarray(nnx.jit(lambda m, x: m(x))(ported, jnp.asarray(x)))  # one program, not a compile per op
    assert np.abs(got - want).max() <= OUT_TOL.bound(float(np.abs(want).max()))
    static = port(Pinned(batch_table=True).eval(), {"x": np.ones((2, 6, 4), np.float32)})
    assert "Free dimensions: none (static shapes); every other size is fixed." in static.source


def test_header_train_mode_only_where_it_differs():
    """A module that reads `training` for something other than dropout: the train-mode graph runs
    other ops, which the port does not write, and the header says so."""
    class Doubled(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x):
            y = self.lin(x)
            return y * 2 if self.training else y

    src = port_source(Doubled().eval(), {"x": np.ones((2, 4), np.float32)})
    assert "Train mode: not ported (torch's train-mode graph runs other ops than eval mode); the file " \
           "computes eval mode." in src


# ----------------------------------------------------------------------------- op table
class Ops(nn.Module):
    """Ops the table translates, each where its torch semantics bite (dims, corrections)."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(6, 6) * 0.3)

    def forward(self, x, mask):
        B, T, D = x.shape
        h = x @ self.w
        a, b = h.split([2, 4], dim=-1)
        var = h.var(-1, keepdim=True, unbiased=True)
        mean = h.mean(dim=(1, 2), keepdim=True)
        rms = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
        pos = torch.arange(T, dtype=torch.float32)
        rot = torch.cat([torch.cos(pos)[None, :, None] * a, torch.sin(pos)[None, :, None] * b], dim=-1)
        causal = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
        q = rms.view(B, T, 2, 3).permute(0, 2, 1, 3)
        att = F.scaled_dot_product_attention(q, q, q, attn_mask=mask[:, None, None, :])
        scores = (q @ q.transpose(-1, -2)).masked_fill(causal, -1e9).softmax(-1)
        out = torch.stack([F.silu(rot), F.gelu(var * rot), mean.expand(B, T, D)], 0).sum(0)
        return out + att.transpose(1, 2).flatten(2) + (scores @ q).transpose(1, 2).reshape(B, T, D)


def test_op_table_matches_torch():
    torch.manual_seed(0)
    inputs = {"x": np.random.RandomState(0).randn(2, 5, 6).astype(np.float32),
              "mask": np.array([[True] * 5, [True, True, True, False, False]])}
    from_torch(Ops().eval(), inputs, check=True)


def test_unknown_op_is_refused_by_name():
    class Odd(nn.Module):
        def forward(self, x):
            return torch.special.bessel_j0(x) + 1

    with pytest.raises(PortError) as e:
        port_source(Odd().eval(), {"x": np.ones((2, 3), np.float32)})
    msg = str(e.value)
    assert len(msg.splitlines()) == 1
    assert "aten.special_bessel_j0" in msg and "`(top level)`" in msg
    assert "test_port.py:" in msg and "torch.special.bessel_j0(x)" in msg


class Experts(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 8, 8) * 0.3)

    def forward(self, x, idx):
        out = torch.zeros_like(x)
        for e in range(4):
            token, slot = torch.where(idx == e)
            if token.numel() == 0:
                continue
            out = out.index_add(0, token, x[token] @ self.w[e])
        return out


class Routed(nn.Module):
    """Top-2 routing, then a Python loop over the experts on the tokens each was given: the token
    list has a data-dependent length, which torch.export cannot trace (draft_export neither)."""

    def __init__(self):
        super().__init__()
        self.router = nn.Linear(8, 4)
        self.experts = Experts()

    def forward(self, x):
        return self.experts(x, self.router(x).topk(2, dim=-1).indices)


def test_export_failure_names_the_op():
    torch.manual_seed(0)
    with pytest.raises(PortError) as e:
        port_source(Routed().eval(), {"x": np.random.RandomState(0).randn(6, 8).astype(np.float32)})
    msg = str(e.value)
    assert len(msg.splitlines()) == 1
    assert msg.startswith("cannot port Routed: aten.where in module `experts` (test_port.py:")
    assert "token, slot = torch.where(idx == e)): torch.export failed: " in msg


def test_export_failure_without_an_op_says_so():
    """A Python-level failure (a tensor's data pointer read while tracing): no op to name."""
    class Pointer(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(8, 8)

        def forward(self, x):
            key = x.data_ptr()  # a cache key, say
            return self.lin(x) + key * 0

    with pytest.raises(PortError) as e:
        port_source(Pointer().eval(), {"x": np.ones((2, 8), np.float32)})
    msg = str(e.value)
    assert len(msg.splitlines()) == 1
    assert msg.startswith("cannot port Pointer: no aten op (a Python-level failure: no op was being traced) "
                          "in module `(top level)` (test_port.py:")
    assert "key = x.data_ptr()" in msg and "RuntimeError: Cannot access data pointer" in msg


def test_failing_op_reads_a_guard_on_a_data_dependent_size():
    """torch.export (not draft) stops at the guard `token.numel() == 0`, in Python: the op is the
    one whose output carries the guarded symbol, found in the graph being traced."""
    from jaxformer.port import trace
    model = Routed().eval()
    kwargs = trace.torch_inputs(model, {"x": np.random.RandomState(0).randn(6, 8).astype(np.float32)})
    with pytest.raises(Exception) as e:
        trace._export(model, kwargs, dynamic=True, preserve=(), draft=False)
    assert "data-dependent" in str(e.value)
    assert trace.failing_op(e.value) == "aten.where"


def test_table_entries_are_named_aten_ops():
    assert all(name.startswith("aten.") for name in ops.TABLE)
    with pytest.raises(ops.Unsupported):
        ops.translate(None, None, "aten.not_an_op")


# ----------------------------------------------------------------------------- CLI
FACTORY = """
import numpy as np, torch, sys
sys.path.insert(0, {test_dir!r})
from test_port import make_tiny

def make():
    return make_tiny()

def bad():
    return 42

class Odd(torch.nn.Module):
    def forward(self, x):
        return torch.special.bessel_j0(x)

def odd():
    return Odd().eval(), {{"x": np.ones((2, 3), np.float32)}}
"""


@pytest.fixture
def factory_dir(tmp_path, monkeypatch):
    import os
    name = f"port_factory_{os.getpid()}_{abs(hash(str(tmp_path))) % 10**8}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(FACTORY.format(test_dir=os.path.dirname(__file__))))
    monkeypatch.chdir(tmp_path)
    yield tmp_path, name
    sys.modules.pop(name, None)


def test_cli_writes_the_file_and_checks(factory_dir, capsys):
    from jaxformer.cli import main
    tmp, mod = factory_dir
    assert main(["port", f"{mod}:make", "--out", "tiny.py", "--class-name", "Tiny", "--check"]) == 0
    out = capsys.readouterr().out
    assert "wrote tiny.py (class Tiny" in out and " ok" in out
    assert "class Tiny(nnx.Module):" in (tmp / "tiny.py").read_text()


def test_cli_refusal_is_one_line_and_writes_nothing(factory_dir, capsys):
    from jaxformer.cli import main
    tmp, mod = factory_dir
    assert main(["port", f"{mod}:odd", "--out", "odd.py"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("jaxformer port: error: cannot port aten op aten.special_bessel_j0")
    assert len(err.splitlines()) == 1 and not (tmp / "odd.py").exists()
    assert main(["port", f"{mod}:bad", "--out", "x.py"]) == 2
    assert "must return (torch module, inputs dict)" in capsys.readouterr().err
    assert main(["port", "no_such_module:make", "--out", "x.py"]) == 2
    assert "no module 'no_such_module'" in capsys.readouterr().err


def test_cli_failed_check_exits_1_and_writes_nothing(factory_dir, capsys, monkeypatch):
    """A porting bug (GELU's tanh approximation written as the exact one) is caught by the
    check, named where the trees part, and leaves no file."""
    from jaxformer.cli import main
    tmp, mod = factory_dir
    monkeypatch.setitem(ops.TABLE, "aten.gelu", lambda c, a: f"jax.nn.gelu({c.r(a['self'])}, approximate=False)")
    assert main(["port", f"{mod}:make", "--out", "tiny.py", "--check"]) == 1
    err = capsys.readouterr().err
    assert "parity check failed; tiny.py not written" in err and "outputs part first" in err
    assert "layers.0.mlp" in err
    assert not (tmp / "tiny.py").exists()


def test_ported_module_trains_in_an_optax_loop(tiny):
    """docs/port.md's example: the ported module is an ordinary NNX module (dropout in train mode,
    gradients through every parameter, including the tied embedding)."""
    import optax
    from flax import nnx
    model, inputs, result = tiny
    ported = api.load_torch_weights(result.build(), model)
    ported.train()
    optimizer = nnx.Optimizer(ported, optax.adam(1e-2), wrt=nnx.Param)
    idx = jnp.asarray(inputs["idx"])
    targets = jnp.roll(idx, -1, axis=1)

    @nnx.jit
    def step(ported, optimizer):
        def loss_fn(ported):
            return -jnp.take_along_axis(ported(idx), targets[..., None], axis=-1).mean()
        loss, grads = nnx.value_and_grad(loss_fn)(ported)
        optimizer.update(ported, grads)
        return loss

    losses = [float(step(ported, optimizer)) for _ in range(8)]
    assert losses[-1] < 0.8 * losses[0], losses
