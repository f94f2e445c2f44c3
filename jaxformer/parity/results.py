"""What a parity check finds, leaf by leaf: the tolerances (`Tolerance`, the defaults
OUT_TOL and GRAD_TOL), each leaf's difference (`LeafDiff`), the float64 referee's verdict on a
leaf past its tolerance (`Referee`, docs/numerics.md §32), and the whole report
(`ParityReport`, `ParityError`). harness.py fills them in.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np


@dataclasses.dataclass(frozen=True)
class Tolerance:
    """|a - b| <= atol + rtol * max |reference leaf|, per leaf."""
    atol: float
    rtol: float

    def bound(self, ref_max: float) -> float:
        return self.atol + self.rtol * ref_max


# Measured over the registry (docs/numerics.md §19): torch and JAX each sit within 5.1e-7 x max
# |leaf| of the float64 answer on outputs, 2.5e-6 on gradients; the defaults leave a margin
# above the worst honest case and stay below the smallest porting bug in the self-test.
OUT_TOL = Tolerance(atol=1e-6, rtol=2e-6)
GRAD_TOL = Tolerance(atol=1e-6, rtol=1e-5)


def _ratio(diff: float, tol: float) -> float:
    return diff / tol if tol > 0 else (0.0 if diff == 0 else float("inf"))


# A float64 twin (the flax module run in float64) is the same function as torch's when the two
# agree this closely at float64: two summation orders of the same sums in float64 part by the
# input's condition number times 1e-16; a change of formula (an eps, a GELU variant, a scale)
# parts them by 1e-8 and more (docs/numerics.md §44).
TWIN64_TOL = Tolerance(atol=1e-9, rtol=1e-9)


@dataclasses.dataclass(frozen=True)
class Referee:
    """A leaf that failed against torch fp32, measured against torch rerun in float64
    (docs/numerics.md §32). The leaf passes when jaxformer is within tolerance of float64 and
    no farther from it than torch fp32 is: then the difference is torch's rounding. Where both
    fp32 answers are past tolerance of float64 (an ill-conditioned leaf: a true value of 0 under
    rounding noise, a softmax near a tie), and the flax module rerun in float64 (its twin) gives
    torch's float64 answer within TWIN64_TOL, the leaf passes too: the two compute the same
    function, and float32 cannot resolve it on this input (docs/numerics.md §44)."""
    jax_err: float  # max |jax fp32 - float64|
    torch_err: float  # max |torch fp32 - float64|
    tol: float  # atol + rtol * max |float64 leaf|
    twin_err: float | None = None  # max |jax float64 - torch float64|, where the twin ran
    twin_tol: float | None = None  # TWIN64_TOL at the leaf's float64 scale

    @property
    def ill_conditioned(self) -> bool:
        """Both fp32 answers past tolerance of float64: the tolerance is not attainable here."""
        return self.jax_err > self.tol and self.torch_err > self.tol

    @property
    def twin_agrees(self) -> bool:
        return self.twin_err is not None and self.twin_err <= self.twin_tol

    @property
    def excused(self) -> bool:
        if self.jax_err <= self.tol and self.jax_err <= self.torch_err:
            return True
        return self.ill_conditioned and self.twin_agrees

    @property
    def side(self) -> str:
        """Which side is off: 'torch' (excused), 'jax', or 'both' (each past tolerance)."""
        if self.excused and not self.ill_conditioned:
            return "torch"
        return "both" if self.ill_conditioned else "jax"

    def describe(self) -> str:
        verdict = {"torch": "torch's rounding, excused",
                   "both": f"both are off, {'jax' if self.jax_err >= self.torch_err else 'torch'} farther",
                   "jax": "jax is off" if self.jax_err > self.tol else "jax is farther from it than torch"}
        text = (f"float64 referee: jax {self.jax_err:.2e} off, torch {self.torch_err:.2e} off "
                f"(tol {self.tol:.1e}): {verdict[self.side]}")
        if self.twin_err is not None:
            same = "the same function" if self.twin_agrees else "different functions"
            why = (", float32 cannot resolve this leaf: excused" if self.excused else
                   ", though jax's float32 answer is farther from it" if self.twin_agrees else "")
            text += f"; float64 twin: jax {self.twin_err:.1e} from torch at float64 (tol {self.twin_tol:.0e}): {same}{why}"
        return text


@dataclasses.dataclass
class LeafDiff:
    diff: float  # max |jax - torch|
    tol: float  # atol + rtol * ref_max
    ref_max: float  # max |torch|
    referee: Referee | None = None  # only for a leaf past tol, when the float64 referee ran

    @property
    def ok(self) -> bool:
        return self.diff <= self.tol or (self.referee is not None and self.referee.excused)

    @property
    def ratio(self) -> float:
        """|diff| / tol (<= 1 passes); for a leaf the float64 referee excused, |jax - float64|
        / its tolerance instead (<= 1 too), so a passing leaf never reads as past tolerance."""
        if self.referee is not None and self.referee.excused:
            return _ratio(self.referee.jax_err, self.referee.tol)
        return _ratio(self.diff, self.tol)


@dataclasses.dataclass
class ParityReport:
    """Per-leaf comparison. The row figures (max_abs_out/tol_out, max_abs_grad/tol_grad) are
    those of the leaf nearest to (or furthest past) its own tolerance."""
    case: str
    ok: bool
    outputs: dict[str, LeafDiff] = dataclasses.field(default_factory=dict)  # per output leaf
    grads: dict[str, LeafDiff] = dataclasses.field(default_factory=dict)  # per param / float input
    problems: list[str] = dataclasses.field(default_factory=list)
    out_tol: Tolerance = OUT_TOL
    grad_tol: Tolerance = GRAD_TOL
    # reference=True: {"torch out"|"jax out"|"torch grad"|"jax grad": worst |x - f64| / max |f64|}
    spread: dict[str, float] = dataclasses.field(default_factory=dict)
    parting: Any = None  # on failure: where outputs part first (jaxformer.parity.locate.Parting)
    notes: list[str] = dataclasses.field(default_factory=list)  # why the referee or locator could not run

    @staticmethod
    def _worst(leaves: Mapping[str, LeafDiff]) -> tuple[str | None, LeafDiff | None]:
        if not leaves:
            return None, None
        k = max(leaves, key=lambda n: leaves[n].ratio)
        return k, leaves[k]

    @property
    def max_abs_out(self) -> float:
        return max((d.diff for d in self.outputs.values()), default=0.0)

    @property
    def max_abs_grad(self) -> float:
        return max((d.diff for d in self.grads.values()), default=0.0)

    @property
    def worst_ratio(self) -> float:
        """max over leaves of |diff| / tolerance (<= 1 passes)."""
        return max((d.ratio for d in (*self.outputs.values(), *self.grads.values())), default=0.0)

    @property
    def worst_leaf(self) -> str | None:
        items = {**{f"out {k}": v for k, v in self.outputs.items()},
                 **{f"grad {k}": v for k, v in self.grads.items()}}
        name, _ = self._worst(items)
        return name

    def _leaves(self) -> dict[str, LeafDiff]:
        return {**{f"out {k}": v for k, v in self.outputs.items()}, **{f"grad {k}": v for k, v in self.grads.items()}}

    @property
    def refereed(self) -> dict[str, Referee]:
        """{"out k" | "grad k": Referee} for every leaf the float64 referee judged."""
        return {k: v.referee for k, v in self._leaves().items() if v.referee is not None}

    def row(self) -> dict:
        _, o = self._worst(self.outputs)
        _, g = self._worst(self.grads)
        row = {"case": self.case, "max_abs_out": o.diff if o else None, "tol_out": o.tol if o else None,
               "max_abs_grad": g.diff if g else None, "tol_grad": g.tol if g else None,
               "worst_leaf": self.worst_leaf, "ratio": self.worst_ratio, "ok": self.ok}
        if self.refereed:  # leaves past tolerance against torch, judged against float64 (§32)
            row["referee"] = {k: {"jax_err": r.jax_err, "torch_err": r.torch_err, "tol": r.tol, "side": r.side,
                                  **({"twin_err": r.twin_err, "twin_tol": r.twin_tol} if r.twin_err is not None else {}),
                                  "excused": r.excused}
                              for k, r in self.refereed.items()}
        if self.parting is not None:
            row["first_parting"] = self.parting.module or "(top level)"
        if self.notes:
            row["notes"] = self.notes
        return row

    @staticmethod
    def _leaf_text(k: str, v: LeafDiff) -> str:
        text = f"{k}={v.diff:.2e} (tol {v.tol:.1e})"
        return text + (f" [{v.referee.describe()}]" if v.referee is not None else "")

    def worst(self, n: int = 3) -> str:
        items = sorted(self._leaves().items(), key=lambda kv: -kv[1].ratio)
        return ", ".join(self._leaf_text(k, v) for k, v in items[:n])

    def message(self) -> str:
        """The failure in a few lines: where outputs part first, every output leaf, the worst
        leaves (each with the float64 referee's verdict), the rule and any problems."""
        outs = sorted(self.outputs.items(), key=lambda kv: -kv[1].ratio)
        lines = [f"parity failed for {self.case}"]
        if self.parting is not None:
            lines.append(self.parting.describe())
        lines.append("outputs: " + (", ".join(self._leaf_text(k, v) for k, v in outs[:6]) or "none compared")
                     + (f" (+{len(outs) - 6} more)" if len(outs) > 6 else ""))
        lines.append(f"worst: {self.worst()}")
        lines.append(f"rule |d| <= atol + rtol * max|torch leaf|: outputs {self.out_tol}, gradients {self.grad_tol}"
                     "; past it, judged against torch in float64 (docs/numerics.md §32)")
        lines += [f"problem: {p}" for p in self.problems] + [f"note: {n}" for n in self.notes]
        return "\n  ".join(lines)


class ParityError(AssertionError):
    pass


def _compare(a: np.ndarray, b: np.ndarray, tol: Tolerance) -> LeafDiff:
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    ref = float(np.abs(b64).max(initial=0))
    return LeafDiff(float(np.abs(a64 - b64).max(initial=0)), tol.bound(ref), ref)


def judge(jax_value, torch_value, float64_value, tol: Tolerance) -> Referee:
    """The float64 referee's measurement of one leaf (docs/numerics.md §32)."""
    ref = np.asarray(float64_value, np.float64)
    err = lambda x: float(np.abs(np.asarray(x, np.float64) - ref).max(initial=0))
    return Referee(err(jax_value), err(torch_value), tol.bound(float(np.abs(ref).max(initial=0))))
