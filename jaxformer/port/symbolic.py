"""A symbolic size of the exported graph (a sympy expression over the free dims' symbols) as
Python source: `Max(0, 1 - s1)` -> `max(0, 1 - x.shape[1])`, `FloorDiv(s0, 7)` -> `x.shape[0] // 7`.

torch.export keeps the sizes that depend on free dims as sympy expressions built from sympy's
own functions and torch's integer ones (torch/utils/_sympy/functions.py: FloorDiv, CeilDiv,
PythonMod, Max, ...). Each is written with the Python operator or builtin of the same integer
semantics (floor division and Python's modulo, as the traced Python computed them); an
expression holding any other function is refused by name."""
from __future__ import annotations

from collections.abc import Callable


class NoPythonForm(Exception):
    """A symbolic size holding a function the port cannot write."""


def python_source(expr, symbol: Callable[[str], str]) -> str:
    """Python source of sympy `expr`, each free symbol written as `symbol(name)`."""
    return _src(expr, symbol)


def _src(e, sym) -> str:
    import sympy
    if isinstance(e, sympy.Symbol):
        return sym(e.name)
    if isinstance(e, (bool, sympy.logic.boolalg.BooleanTrue, sympy.logic.boolalg.BooleanFalse)):
        return "True" if bool(e) else "False"
    if isinstance(e, (sympy.Integer, int)):
        return str(int(e))
    if isinstance(e, sympy.Rational):
        return f"({int(e.p)} / {int(e.q)})"
    if isinstance(e, (sympy.Float, float)):
        return repr(float(e))
    name = type(e).__name__
    args = [_src(a, sym) for a in e.args]
    if isinstance(e, sympy.Add):
        terms = sorted(e.args, key=lambda a: a.could_extract_minus_sign())  # positive terms first
        out = _src(terms[0], sym)
        for t in terms[1:]:
            out += f" - {_wrap(_src(-t, sym))}" if t.could_extract_minus_sign() else f" + {_wrap(_src(t, sym))}"
        return f"({out})"
    if isinstance(e, sympy.Mul):
        if e.could_extract_minus_sign():
            return f"-{_wrap(_src(-e, sym))}"
        return "(" + " * ".join(_wrap(a) for a in args) + ")"
    if isinstance(e, sympy.Pow) or name in ("PowByNatural", "FloatPow"):
        return f"({_wrap(args[0])} ** {_wrap(args[1])})"
    binary = {"FloorDiv": "//", "CleanDiv": "//", "PythonMod": "%", "Mod": "%", "IntTrueDiv": "/",
              "FloatTrueDiv": "/", "TruncToFloat": None}
    if binary.get(name):
        return f"({_wrap(args[0])} {binary[name]} {_wrap(args[1])})"
    calls = {"Max": "max", "Min": "min", "Abs": "abs", "ToFloat": "float", "TruncToInt": "int",
             "RoundToInt": "round", "Identity": ""}
    if name in calls:
        return f"{calls[name]}({', '.join(args)})"
    if name == "CeilDiv":
        return f"(-(-{_wrap(args[0])} // {_wrap(args[1])}))"
    if name in ("floor", "FloorToInt"):
        return f"int({_wrap(args[0])} // 1)"
    if name in ("ceiling", "CeilToInt"):
        return f"int(-(-{_wrap(args[0])} // 1))"
    relations = {"StrictLessThan": "<", "LessThan": "<=", "StrictGreaterThan": ">", "GreaterThan": ">=",
                 "Equality": "==", "Unequality": "!="}
    if name in relations:
        return f"({args[0]} {relations[name]} {args[1]})"
    if name in ("And", "Or"):
        return "(" + f" {name.lower()} ".join(args) + ")"
    if name == "Not":
        return f"(not {args[0]})"
    if name == "Where":
        return f"({args[1]} if {args[0]} else {args[2]})"
    if isinstance(e, sympy.Piecewise):
        out = None
        for value, cond in reversed(e.args):
            v, c = _src(value, sym), _src(cond, sym)
            out = v if out is None or c == "True" else f"({v} if {c} else {out})"
        return out
    raise NoPythonForm(f"{name}")


def _wrap(text: str) -> str:
    """`text` as an operand: parenthesised unless it is a name, a number or already enclosed."""
    import re
    if re.fullmatch(r"[\w.\[\]]+", text) or (text.startswith("(") and encloses(text)):
        return text
    return f"({text})"


def encloses(text: str) -> bool:
    """`text` is one bracketed expression: its first bracket closes at its last character."""
    if not text.endswith(")"):
        return False
    depth = 0
    for i, ch in enumerate(text):
        depth += ch == "("
        depth -= ch == ")"
        if depth == 0 and i < len(text) - 1:
            return False
    return True
