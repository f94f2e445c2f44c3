"""Run outputs shared by both trainers: metrics.jsonl, TensorBoard events, a progress bar."""
from __future__ import annotations

import json
import math
import os
import sys
import time

from jaxformer.fileio import json_loads, open_append
from jaxformer.train.config import flatten


class MetricsWriter:
    """WORKDIR/metrics.jsonl (one JSON object per step) and TensorBoard events under WORKDIR/tb.

    The file is only ever appended: a resumed run adds its lines after the old ones. Steps that
    the resumed run redoes (those logged after its checkpoint) appear twice; the later line is
    the one the run continued from, and `read_metrics` keeps the last line of each step.
    Strict JSON: a NaN or infinite value is written as null (and the record's `nonfinite`
    field, when present, names the quantity)."""

    def __init__(self, workdir: str, *, resume_step: int | None = None, enabled: bool = True,
                 tensorboard: bool = True):
        self.enabled = enabled
        self.path = os.path.join(workdir, "metrics.jsonl")
        self.tb = None
        self._last_tick: tuple[int, float] | None = None  # (step, time) of write_throughput
        if not enabled:
            return
        if resume_step is not None:
            _end_torn_line(self.path)
        if tensorboard:
            from tensorboardX import SummaryWriter
            self.tb = SummaryWriter(os.path.join(workdir, "tb"))

    def write(self, record: dict) -> None:
        if not self.enabled:
            return
        clean = {k: _json_value(v) for k, v in record.items()}
        with open_append(self.path) as f:  # never through a link planted at metrics.jsonl
            f.write(json.dumps(clean, allow_nan=False) + "\n")
        if self.tb is not None:
            for k, v in clean.items():
                if k != "step" and isinstance(v, (int, float)) and math.isfinite(v):
                    self.tb.add_scalar(tb_tag(k), v, clean["step"])

    # ---- TensorBoard only (tensorboardX): throughput, text, hparams
    def write_throughput(self, step: int, items: int, unit: str = "tokens",
                         step_time: float | None = None) -> None:
        """perf/step_time_s and perf/<unit>_per_s (`items` per step). step_time: the measured
        seconds per step (the JAX trainer's, compilation excluded); None: the wall time since
        the previous call (the first call only starts the clock, so compilation is not counted)."""
        now = time.perf_counter()
        last, self._last_tick = self._last_tick, (step, now)
        if step_time is not None:
            dt = step_time
        elif last is None or step <= last[0]:
            return
        else:
            dt = (now - last[1]) / (step - last[0])
        if self.tb is None:
            return
        self.tb.add_scalar("perf/step_time_s", dt, step)
        self.tb.add_scalar(f"perf/{_UNITS.get(unit, unit)}_per_s", items / max(dt, 1e-9), step)

    def write_text(self, tag: str, text: str, step: int) -> None:
        """A text entry (e.g. the generated end-of-run sample) under `tag`."""
        if self.tb is not None:
            self.tb.add_text(tag, text, step)

    def write_hparams(self, cfg_dict: dict, metrics: dict, step: int | None = None) -> None:
        """The run config, flattened to "train.lr"-style keys, as TensorBoard hparams, with the
        finite final metrics (e.g. the last eval) as hparam/<name>, under tb/hparams."""
        if self.tb is None:
            return
        hp = {k: (v if isinstance(v, (bool, int, float, str)) else str(v))
              for k, v in flatten(cfg_dict).items()}
        m = {f"hparam/{k}": float(v) for k, v in metrics.items()
             if isinstance(v, (int, float)) and math.isfinite(v)}
        self.tb.add_hparams(hp, m, name="hparams", global_step=step)

    def write_many(self, records: list[dict]) -> None:
        for record in records:
            self.write(record)

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()


def _json_value(v):
    if isinstance(v, (bool, str)) or v is None:
        return v
    if isinstance(v, int):
        return v
    v = float(v)
    return v if math.isfinite(v) else None


def _end_torn_line(path: str) -> None:
    """A run killed mid-write can leave a last line without its newline: end it, so the
    resumed run's first line starts on a line of its own (read_metrics skips the torn one)."""
    if os.path.exists(path) and os.path.getsize(path):
        with open(path, "rb") as f:
            f.seek(-1, os.SEEK_END)
            last = f.read(1)
        if last != b"\n":
            with open_append(path) as f:
                f.write("\n")


def read_metrics(path: str, skipped: list | None = None) -> list[dict]:
    """The records of a metrics.jsonl, one per step in step order: the last line of each step
    wins (a resumed run's redone steps), torn lines are skipped. `path`: the file or its workdir.
    `skipped`: gets (line number, why) of each line that is not a JSON object with an integer
    step (torn, not JSON, nested too deeply, a null, list or string step), for the caller to report."""
    if os.path.isdir(path):
        path = os.path.join(path, "metrics.jsonl")
    by_step: dict[int, dict] = {}
    with open(path, errors="replace") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json_loads(line, path)  # depth-limited: a hostile line is skipped, not a crash
            except ValueError as e:
                if skipped is not None:
                    skipped.append((number, str(e).removeprefix(f"{path}: ")))
                continue
            step = record.get("step") if isinstance(record, dict) else None
            if isinstance(step, int) and not isinstance(step, bool):
                by_step[step] = record
            elif skipped is not None:
                why = f"a JSON {type(record).__name__}, not an object" if not isinstance(record, dict) else \
                    "no step" if "step" not in record else f"step is {_short(step)}, not a step number"
                skipped.append((number, why))
    return [by_step[s] for s in sorted(by_step)]


def _short(value) -> str:
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


_UNITS = {"tok": "tokens"}  # the progress bar's short unit -> the TensorBoard tag's


def tb_tag(key: str) -> str:
    """metrics.jsonl key -> TensorBoard tag, grouped: eval_loss -> eval/loss, loss -> train/loss."""
    if key.startswith("eval_"):
        return "eval/" + key[len("eval_"):]
    return key if "/" in key else "train/" + key


def write_tb_text(workdir: str, tag: str, text: str, step: int) -> None:
    """A text entry in WORKDIR/tb after the run's writer is closed (the end-of-run sample). Its
    own events file: tensorboardX names files by the second, so without the suffix it would
    replace the run's file written in the same second."""
    from tensorboardX import SummaryWriter
    with SummaryWriter(os.path.join(workdir, "tb"), filename_suffix=f".text.{time.time_ns()}") as tb:
        tb.add_text(tag, text, step)


class Progress:
    """tqdm bar with loss, learning rate and items (tokens or samples) per second: the items
    and seconds given to `timed` (the JAX trainer's, compilation excluded), or else the items
    given to `update` over the wall time since the bar started."""

    def __init__(self, total: int, initial: int, unit: str, enabled: bool = True):
        self.unit = unit
        self.bar = None
        self.t0 = time.perf_counter()
        self.items = 0
        self.seconds: float | None = None  # set by timed()
        if enabled:
            from tqdm import tqdm
            self.bar = tqdm(total=total, initial=initial, dynamic_ncols=True, file=sys.stderr,
                            mininterval=0.5, desc="train")

    def timed(self, items: int, seconds: float) -> None:
        self.items += items
        self.seconds = (self.seconds or 0.0) + seconds

    def update(self, loss: float, lr: float, items: int = 0) -> None:
        self.items += items
        if self.bar is None:
            return
        seconds = self.seconds if self.seconds is not None else time.perf_counter() - self.t0
        rate = self.items / max(seconds, 1e-9)
        self.bar.set_postfix_str(f"loss {loss:.4f} lr {lr:.2e} {rate:,.0f} {self.unit}/s", refresh=False)
        self.bar.update(1)

    def write(self, msg: str) -> None:
        if self.bar is not None:
            self.bar.write(msg)
        else:
            print(msg, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
