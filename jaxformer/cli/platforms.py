"""Which JAX platforms a `jaxformer` command starts.

`pip install -e '.[test]'` brings libtpu, as a compiler for `jaxformer compile`. With
JAX_PLATFORMS unset, jax initialises every backend it has a plugin for, libtpu's TPU runtime
included, and on a host with no TPU that runtime prints its probe errors ("Failed to find host
bounds for accelerator type", "E0000 ... unexpected worker hostname") before the first step.
So a command on a host with no TPU chip names the platforms itself: the CUDA plugin's where one
is installed (jax skips it when no NVIDIA GPU is visible), then the CPU. A host with a TPU
chip, JAX_PLATFORMS or JAX_FORCE_TPU_INIT set, is left to jax: the TPU is used where there is
one. jax's own probe (`hardware_utils`: the PCI devices) decides what a TPU host is."""
from __future__ import annotations

import importlib.metadata
import os
import sys


def _plugin_names() -> set[str]:
    """The names of the installed jax PJRT plugins (entry points and the jax_plugins namespace)."""
    import pkgutil
    names = {ep.name for ep in importlib.metadata.entry_points(group="jax_plugins")}
    try:
        import jax_plugins
        names |= {m.name for m in pkgutil.iter_modules(jax_plugins.__path__)}
    except ImportError:
        pass
    return names


def choose_platforms(environ=None, tpu_chips=None, plugins=None) -> str | None:
    """The JAX_PLATFORMS value a command sets, or None to leave the choice to jax.
    tpu_chips / plugins: given by tests, else probed."""
    environ = os.environ if environ is None else environ
    if "JAX_PLATFORMS" in environ or "JAX_FORCE_TPU_INIT" in environ:
        return None
    if tpu_chips is None:
        from jax._src import hardware_utils
        tpu_chips = hardware_utils.num_available_tpu_chips_and_device_id()[0]
    if tpu_chips > 0:
        return None
    plugins = _plugin_names() if plugins is None else plugins
    out = ["cuda"] if any("cuda" in n for n in plugins) else []
    if any("rocm" in n for n in plugins) and os.path.exists("/dev/kfd"):
        out.append("rocm")
    return ",".join([*out, "cpu"])


def set_platforms() -> str | None:
    """Apply choose_platforms to this process (before its first computation); -> the value set."""
    value = choose_platforms()
    if value is not None:
        os.environ["JAX_PLATFORMS"] = value
        if "jax" in sys.modules:  # the variable is read when jax is imported; its config after
            sys.modules["jax"].config.update("jax_platforms", value)
    return value
