"""The memory a request may use, checked before anything is allocated: the train state
(train/init.py), a generate call's cache (cli/generate.py), an HF model read into memory
(hf/__init__.py). A request these refuse cannot fit; one that passes may still need the
activations on top (each check says what it counts)."""
from __future__ import annotations

import os

import jax
import numpy as np


def available_bytes(host: bool = False) -> tuple[int, str]:
    """(bytes the arrays may use, where): the local devices' memory limits, less what they hold,
    summed (a state that exceeds it cannot fit however it is sharded), or, on CPU (or
    host=True), the host's available memory (psutil when installed, else os.sysconf)."""
    devices = jax.local_devices()
    if devices[0].platform != "cpu" and not host:
        stats = [d.memory_stats() or {} for d in devices]
        if all(s.get("bytes_limit") for s in stats):  # less what they hold already (loaded weights)
            return int(sum(s["bytes_limit"] - s.get("bytes_in_use", 0) for s in stats)), \
                f"the {len(devices)} local {devices[0].platform} device(s)"
    try:
        import psutil
        return int(psutil.virtual_memory().available), "this host"
    except ImportError:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"), "this host"


def check_fits(abstract, what: str) -> None:
    """Before anything is allocated: the (abstract) tree's bytes against available_bytes();
    a ValueError naming both when it cannot fit (a config of sizes a hostile or mistyped file
    gave would otherwise fail deep inside XLA, or take the machine's memory)."""
    need = sum(int(np.prod(x.shape)) * getattr(x.dtype, "itemsize", 8) for x in jax.tree.leaves(abstract)
               if hasattr(x, "shape") and hasattr(x, "dtype"))
    check_bytes(need, what)


def check_bytes(need: int, what: str, host: bool = False, advice: str = "check the model's sizes") -> None:
    """ValueError naming both when `need` bytes exceed available_bytes(host)."""
    have, where = available_bytes(host)
    if need > have:
        raise ValueError(f"{what} needs {need / 2**30:,.1f} GiB, more than the {have / 2**30:,.1f} GiB "
                         f"available on {where}; {advice}")
