"""SIGTERM / SIGINT / SIGUSR1: drain, then exit 75; a second SIGINT (or the drain timeout) abandons.

Handlers run in the main thread between bytecodes. Draining only sets a flag that the request feed reads.
Abandoning raises ``Interrupt`` — but only while the main thread sits inside the engine (or is loading
the model), where unwinding is safe; elsewhere it sets a flag that the main loop checks.
"""

from __future__ import annotations

import logging
import queue
import signal
import threading
from collections.abc import Callable
from types import FrameType

DRAIN_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)


log = logging.getLogger("batchgen")


class Interrupt(BaseException):
    """Abandon the in-flight rows now (a BaseException: the engine must not swallow it)."""


class StoppedEarly(SystemExit):
    """A stop signal before the run's own handlers are set (imports, reading the input's head): nothing
    started and nothing was written, so there is nothing to save. A SystemExit, so that no
    ``except Exception`` on the way up takes it for a failure."""

    def __init__(self, signum: int, code: int) -> None:
        super().__init__(code)
        self.signal_name = signal.Signals(signum).name

    def text(self) -> str:
        return (
            f"{self.signal_name}: interrupted before any row started; nothing lost, "
            f"re-run the same command to start (exit {self.code})"
        )


class SignalControl:
    def __init__(self, drain_timeout: float) -> None:
        self.drain_timeout = drain_timeout
        self.draining = threading.Event()
        self.abandon = False
        self.signal_name: str | None = None
        self.interruptible = False  # set by the main loop around engine calls
        self.loading = False  # before the engine runs, a first signal stops at once
        self.on_drain: Callable[[], None] | None = None  # tells the engine to stop admitting rows
        self._saved: dict[int, object] = {}
        # A handler must not write to a stream the interrupted code may be writing to (reentrant call):
        # it queues its messages (SimpleQueue.put is reentrant) and other code logs them.
        self._notices: queue.SimpleQueue[str] = queue.SimpleQueue()

    def __enter__(self) -> SignalControl:
        if threading.current_thread() is not threading.main_thread():
            return self  # signal handlers can only be set from the main thread (e.g. library use)
        for sig in (*DRAIN_SIGNALS, signal.SIGALRM):
            self._saved[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        if self._saved:
            signal.setitimer(signal.ITIMER_REAL, 0)
        for sig, handler in self._saved.items():
            signal.signal(sig, handler)
        self._saved.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if signum == signal.SIGALRM:
            self._say(f"drain timeout ({self.drain_timeout:g} s): abandoning the in-flight rows")
            return self._abandon()
        if self.draining.is_set():
            if signum == signal.SIGINT:
                self._say("second SIGINT: abandoning the in-flight rows (they are redone on resume)")
                self._abandon()
            return None
        self.signal_name = signal.Signals(signum).name
        self.draining.set()
        if self.on_drain is not None:
            self.on_drain()
        if self.loading:
            self._say(f"{self.signal_name}: stopping before any row started")
            return self._abandon()
        self._say(
            f"{self.signal_name}: no new rows; finishing the in-flight ones (up to {self.drain_timeout:g} s"
            ", a second Ctrl-C abandons them), then saving"
        )
        if self.drain_timeout > 0:
            signal.setitimer(signal.ITIMER_REAL, self.drain_timeout)
        else:
            self._abandon()
        return None

    def _abandon(self) -> None:
        self.abandon = True
        if self.interruptible or self.loading:
            raise Interrupt

    def _say(self, message: str) -> None:
        self._notices.put(message)

    def log_notices(self) -> None:
        """Log what the handlers had to say (called from the writer thread and at the end)."""
        while True:
            try:
                log.info(self._notices.get_nowait())
            except queue.Empty:
                return
