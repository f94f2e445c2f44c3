"""Run outputs shared by both trainers: metrics.jsonl, TensorBoard events, a progress bar."""
from __future__ import annotations

import json
import math
import os
import sys
import time


class MetricsWriter:
    """WORKDIR/metrics.jsonl (one object per step) and TensorBoard events under WORKDIR/tb.
    On resume, lines past the restored step are dropped so the file stays one line per step."""

    def __init__(self, workdir: str, *, resume_step: int | None = None, enabled: bool = True,
                 tensorboard: bool = True):
        self.enabled = enabled
        self.path = os.path.join(workdir, "metrics.jsonl")
        self.tb = None
        if not enabled:
            return
        if resume_step is None:
            open(self.path, "w").close()
        elif os.path.exists(self.path):
            keep = []
            with open(self.path) as f:
                for line in f:
                    try:
                        if json.loads(line)["step"] <= resume_step:
                            keep.append(line)
                    except (ValueError, KeyError):
                        break  # a torn last line from a kill
            with open(self.path, "w") as f:
                f.writelines(keep)
        if tensorboard:
            from tensorboardX import SummaryWriter
            self.tb = SummaryWriter(os.path.join(workdir, "tb"))

    def write(self, record: dict) -> None:
        if not self.enabled:
            return
        clean = {k: (float(v) if not isinstance(v, (int, str)) else v) for k, v in record.items()}
        with open(self.path, "a") as f:
            f.write(json.dumps(clean) + "\n")
        if self.tb is not None:
            for k, v in clean.items():
                if k != "step" and isinstance(v, (int, float)) and math.isfinite(v):
                    self.tb.add_scalar(k, v, clean["step"])

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()


class Progress:
    """tqdm bar with loss, learning rate and items (tokens or samples) per second."""

    def __init__(self, total: int, initial: int, unit: str, enabled: bool = True):
        self.unit = unit
        self.bar = None
        self.t0 = time.perf_counter()
        self.items = 0
        if enabled:
            from tqdm import tqdm
            self.bar = tqdm(total=total, initial=initial, dynamic_ncols=True, file=sys.stderr,
                            mininterval=0.5, desc="train")

    def update(self, loss: float, lr: float, items: int) -> None:
        self.items += items
        if self.bar is None:
            return
        rate = self.items / max(time.perf_counter() - self.t0, 1e-9)
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
