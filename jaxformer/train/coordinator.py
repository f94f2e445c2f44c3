"""The coordination service of a multi-process run, hosted in a process of its own
(docs/scale.md, "Faults on a multi-process run"; issue 51).

jax.distributed.initialize starts the coordination service inside process 0. Every other
process's JAX runtime polls it, and when process 0 dies (SIGKILL, the OOM killer) that polling
fails and JAX aborts each of them from C++ with a stack trace, before any Python code can run:
no line, no clean exit. So process 0 starts the service in a child process instead (`Hosted`,
given to jax.distributed.initialize in place of its own service object by `hosted_service`).
When process 0 dies the service stays up, the survivors' PeerWatch sees process 0's beat stop
and they end with their one line (faults.py). The child ends with its parent: at once when
jax shuts down normally (it is told "stop" and shuts the service down, as JAX would have),
`linger` seconds after its parent vanished without a word (long enough for every survivor to
see the loss and end). It ignores SIGINT and has a session of its own, so a Ctrl-C in process
0's terminal ends process 0 and leaves the others their clean exit.

Run as `python -m jaxformer.train.coordinator BIND COUNT HEARTBEAT SHUTDOWN RECOVERABLE LINGER`:
it prints "ready" once the service listens (or "error: ..." and exits 1), then reads stdin."""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    bind, count, heartbeat, shutdown, recoverable, linger = argv
    from jax._src.lib import _jax  # jaxlib alone: this process never starts a backend
    try:
        service = _jax.get_distributed_runtime_service(
            bind, int(count), heartbeat_timeout=int(heartbeat), shutdown_timeout=int(shutdown),
            recoverable=recoverable == "1")
    except Exception as e:  # the address taken, say: said to the parent, which raises it
        print(f"error: {e}".replace("\n", " "), flush=True)
        return 1
    print("ready", flush=True)
    if sys.stdin.readline().strip() == "stop":  # jax.distributed.shutdown in the parent
        service.shutdown()
        return 0
    time.sleep(float(linger))  # the parent is gone: the survivors' watches need the service a while
    os._exit(0)  # no shutdown barrier: the processes it would wait for are gone or going


class Hosted:
    """The service in a child process; what jax.distributed keeps as its `service` (it calls
    `shutdown()` after its client's shutdown barrier)."""

    def __init__(self, address: str, num_nodes: int, *, linger: float, heartbeat_timeout: int | None = None,
                 shutdown_timeout: int | None = None, recoverable: bool | None = None, **_):
        args = [address, str(num_nodes), str(heartbeat_timeout or 100), str(shutdown_timeout or 300),
                "1" if recoverable else "0", f"{linger:g}"]
        self.proc = subprocess.Popen([sys.executable, "-m", "jaxformer.train.coordinator", *args],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     start_new_session=True, env={**os.environ, "JAX_PLATFORMS": "cpu"})
        line = self.proc.stdout.readline().strip()
        if line != "ready":
            self.proc.wait()
            raise RuntimeError(f"the coordination service could not start on {address}: "
                               f"{line.removeprefix('error: ') or f'its process exited {self.proc.returncode}'}")

    def shutdown(self) -> None:
        with contextlib.suppress(OSError):
            self.proc.stdin.write("stop\n")
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


_LOCK = threading.Lock()


@contextlib.contextmanager
def hosted_service(linger: float):
    """Within it, jax.distributed.initialize starts its coordination service as `Hosted` (in a
    child process) rather than in this process. jax's distributed module reads the service
    factory off jaxlib's module at call time; only that one name is replaced, for this call."""
    from jax._src import distributed

    real = distributed._jax

    class _Jaxlib:
        def __getattr__(self, name):
            return getattr(real, name)

        @staticmethod
        def get_distributed_runtime_service(address, num_nodes, **kwargs):
            return Hosted(address, num_nodes, linger=linger, **kwargs)

    with _LOCK:
        distributed._jax = _Jaxlib()
        try:
            yield
        finally:
            distributed._jax = real


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
