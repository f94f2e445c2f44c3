"""Faults of a multi-process run (docs/scale.md, "Faults on a multi-process run"): a peer that
dies or stops responding, and preemption.

A lost peer. Every process runs a PeerWatch: two threads that beat through the coordination
service's key-value store and watch the others' beats. A peer silent for `timeout` seconds
(SIGKILLed, SIGSTOPped, its host gone), or a coordination service that stops answering, is lost:
the survivor prints one line naming it and the step, and ends at once with os._exit(PEER_LOST),
with no unwinding through a collective, an orbax barrier or jax's shutdown barrier, any of
which would wait on the dead peer. Left to itself the survivor sits in its collective until
JAX's own heartbeat timeout (100 s by default) and is then aborted from C++ with a stack trace.
A checkpoint being written at that moment stays under orbax's temporary name (never read as a
step; the next run removes it); committed steps are never touched, so a restart of every
process with --resume continues from the newest committed one. Process 0 is no different: the
coordination service, which jax.distributed would host inside it (and whose loss makes JAX's
runtime abort every other process from C++ before any Python runs), lives in a child process
of its own (coordinator.py) that outlives a crashed process 0 until the survivors are out.

Preemption. JAX's preemption sync manager (started by jax.distributed.initialize) catches
SIGTERM in C++ (or takes the runtime's own preemption notice), tells every process through the
coordination service, and they agree on one step (the fastest process's step + 1); the trainer
asks `reached_preemption` (orbax's CheckpointManager, which asks JAX) at every step, saves
that step on every process and ends with exit 0. `grace` bounds the whole stop: a watchdog
started when a preemption notice is seen ends the process with GRACE_EXPIRED and one line if it
has not exited by then (nothing partial is kept: see above)."""
from __future__ import annotations

import contextlib
import os
import sys
import threading
import time

PEER_LOST = 69  # EX_UNAVAILABLE: a peer process stopped responding; nothing was saved for the step
GRACE_EXPIRED = 124  # a preemption stop ran past --preemption-grace; the step was not saved


class _Run:
    """What the messages say: set by the trainer as it goes (plain attributes: read from
    another thread, written by the main thread)."""
    step: int | None = None  # the step the train loop has dispatched last
    ckpt_dir: str | None = None
    workdir: str | None = None


RUN = _Run()


def _say_and_exit(line: str, code: int) -> None:
    """One line on stderr, then end the process without unwinding (os._exit: no atexit, no
    finally, no collective or barrier waited on). The coordination service outlives this
    process (coordinator.py), so the others still print their own line."""
    with contextlib.suppress(BaseException):
        sys.stderr.flush()
    with contextlib.suppress(OSError):
        os.write(2, (line + "\n").encode())
        # nothing after the line: the main thread's collective may fail now that a peer is
        # gone (gloo's "connection reset"), and its traceback or the runtime's log is noise
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
    os._exit(code)


def _committed() -> str:
    if not RUN.ckpt_dir:
        return ""
    from jaxformer.train.checkpoint import committed_steps
    with contextlib.suppress(OSError):
        steps = committed_steps(RUN.ckpt_dir)
        return f"newest committed checkpoint: step {steps[-1]}" if steps else "no committed checkpoint yet"
    return ""


def lost_peer_line(process: int, count: int, why: str) -> str:
    """The one line a survivor prints."""
    at = f" at step {RUN.step}" if RUN.step is not None else " before the first step"
    saved = _committed()
    wd = f" --workdir {RUN.workdir}" if RUN.workdir else ""
    return (f"jaxformer train: error: process {process} of {count} stopped responding ({why}){at}; no checkpoint "
            f"was written for that step{'; ' + saved if saved else ''}; restart all {count} processes with --resume{wd}")


SERVICE_LINGER = 10.0  # seconds the service outlives a crashed process 0, past the watches' timeout


def initialize(coordinator: str, num_processes: int, process_id: int, timeout: float) -> PeerWatch | None:
    """jax.distributed.initialize, then this process's PeerWatch (started; None for a single
    process). JAX's own heartbeat timeout is set well past `timeout` (2 x timeout + 5 s): it is
    the backstop, which aborts the process from C++ (no Python callback can be given: jaxlib's
    missed-heartbeat callback takes an absl::Status it cannot pass to Python). Process 0 hosts
    the coordination service in a child process (coordinator.py), which outlives a crash of
    process 0 by `timeout` + SERVICE_LINGER seconds: the others' watches see the loss first."""
    import jax

    from jaxformer.train.coordinator import hosted_service
    with hosted_service(linger=timeout + SERVICE_LINGER) if num_processes > 1 else contextlib.nullcontext():
        jax.distributed.initialize(coordinator_address=coordinator, num_processes=num_processes,
                                   process_id=process_id, heartbeat_timeout_seconds=int(2 * timeout + 5))
    if num_processes < 2:
        return None
    watch = PeerWatch(distributed_client(), process_id, num_processes, timeout)
    watch.start()
    return watch


ALIVE = "jaxformer/alive/"  # coordination-service keys: ALIVE + process index -> beat count or "done"


class PeerWatch:
    """Every process beats (a counter under ALIVE + its index in the coordination service's
    key-value store, every `interval` seconds) and reads every other's, on a thread of its own
    (the main thread may be inside a collective that will never complete). A peer whose beat
    has not changed for `timeout` seconds, or a coordination service that has not answered for
    that long, is lost: one line naming it, then os._exit(PEER_LOST). A process that finished
    its run writes "done" and is never waited for; `stop()` ends the watch."""

    def __init__(self, client, me: int, count: int, timeout: float, interval: float = 0.5):
        self.client, self.me, self.count, self.timeout = client, me, count, timeout
        self.interval = min(interval, timeout / 4)
        self._stop = threading.Event()
        now = time.monotonic()
        self.answered = now  # the service's last answer
        self.seen: dict[int, tuple[str | None, float]] = {p: (None, now) for p in range(count) if p != me}

    def start(self) -> None:
        self._threads = [threading.Thread(target=self._beat, name="jaxformer-peer-beat", daemon=True),
                         threading.Thread(target=self._judge, name="jaxformer-peer-judge", daemon=True)]
        for t in self._threads:
            t.start()

    def _beat(self) -> None:
        beat = 0
        while not self._stop.is_set():
            beat += 1
            try:
                self.client.key_value_set(f"{ALIVE}{self.me}", str(beat), allow_overwrite=True)
                entries = self.client.key_value_dir_get(ALIVE)
            except Exception:  # the service gone: _judge sees no answer
                if self._stop.wait(self.interval):
                    return
                continue
            now = time.monotonic()
            self.answered = now
            for key, value in entries:
                p = int(key.rsplit("/", 1)[-1]) if key.rsplit("/", 1)[-1].isdigit() else None
                if p in self.seen and self.seen[p][0] != value:
                    self.seen[p] = (value, now)
            self._stop.wait(self.interval)

    def _judge(self) -> None:
        while not self._stop.wait(self.interval):
            now = time.monotonic()
            # the service (process 0's child) silent: to the others, process 0 is lost (process 0
            # itself would name itself here; JAX's runtime ends it when its service is gone)
            if now - self.answered > self.timeout and self.me != 0:
                self._lost(0, f"the coordination service that process 0 started did not answer for "
                              f"{self.timeout:g} s")
            for p, (value, since) in self.seen.items():
                if value != "done" and now - since > self.timeout:
                    self._lost(p, f"no heartbeat for {self.timeout:g} s")

    def _lost(self, p: int, why: str) -> None:
        if self._stop.is_set():
            return
        _say_and_exit(lost_peer_line(p, self.count, why), PEER_LOST)

    def settle(self) -> None:
        """Wait long enough for the watch to find a lost peer (it then ends the process with
        its line): the caller's error may be the first sign of it (a collective whose peer is
        gone fails: gloo's "connection reset by peer"). Returns when none was found."""
        end = time.monotonic() + self.timeout + 4 * self.interval
        while not self._stop.is_set() and time.monotonic() < end:
            time.sleep(self.interval / 2)

    def stop(self, done: bool) -> None:
        """End the watch; `done`: this process finished its run (peers stop waiting for it)."""
        self._stop.set()
        for t in getattr(self, "_threads", ()):  # no beat in flight when jax shuts its client down
            t.join(timeout=2 * self.interval + 1)
        if done:
            with contextlib.suppress(Exception):
                self.client.key_value_set(f"{ALIVE}{self.me}", "done", allow_overwrite=True)


def distributed_client():
    """The jax.distributed client (None in a single-process run)."""
    from jax._src import distributed
    return distributed.global_state.client


class GraceWatchdog:
    """Ends the process with GRACE_EXPIRED and one line when a preemption stop has not finished
    `grace` seconds after it began (`start`). Inert when grace is None."""

    def __init__(self, grace: float | None):
        self.grace = grace
        self.started: float | None = None
        self._done = threading.Event()

    def start(self, what: str) -> None:
        if self.grace is None or self.started is not None:
            return
        self.started = time.monotonic()
        threading.Thread(target=self._watch, args=(what,), name="jaxformer-grace", daemon=True).start()

    def _watch(self, what: str) -> None:
        if self._done.wait(self.grace):
            return
        saved = _committed()
        at = f" at step {RUN.step}" if RUN.step is not None else ""
        _say_and_exit(f"jaxformer train: error: {what}: not stopped within the grace period "
                      f"(--preemption-grace {self.grace:g} s){at}; nothing was saved for it"
                      f"{'; ' + saved if saved else ''}; continue with --resume", GRACE_EXPIRED)

    def cancel(self) -> None:
        self._done.set()


# JAX's preemption sync manager announces a notice under this coordination-service key
# (xla/tsl/distributed_runtime/preemption/preemption_sync_manager.cc kPreemptionNoticeKey)
PREEMPTION_NOTICE_KEY = "RECEIVED_PREEMPTION_NOTICE"


class NoticeWatch:
    """Multi-process: a thread that polls the coordination service for JAX's preemption notice
    (any process's SIGTERM, or the runtime's notice) and starts the grace watchdog when it
    appears: the grace counts from the notice on every process."""

    def __init__(self, watchdog: GraceWatchdog, interval: float = 0.25):
        self.watchdog, self.interval = watchdog, interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self):
        client = distributed_client()
        if client is not None and self.watchdog.grace is not None:
            self._thread = threading.Thread(target=self._poll, args=(client,), name="jaxformer-notice",
                                            daemon=True)
            self._thread.start()
        return self

    def _poll(self, client) -> None:
        while not self._stop.wait(self.interval):
            try:
                seen = client.key_value_try_get(PREEMPTION_NOTICE_KEY)
            except Exception:  # NOT_FOUND until a notice; other errors: the heartbeat callback's
                continue
            if seen:
                self.watchdog.start("preemption notice")
                return

    def __exit__(self, *exc) -> None:
        self._stop.set()
