"""The engine's request iterator in ``batchgen run``: the prompt thread's queue of prepared chunks, handed
on one request at a time, until the input ends, a drain or stop, or a failure elsewhere."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from typing import Any

from batchgen.app.prepare import END, Preparer
from batchgen.app.signals import SignalControl
from batchgen.engine.completions import GenerationRequest
from batchgen.io.faults import Faults
from batchgen.threads import HostTurns


class Feed:
    """The engine's request iterator: the preparer's queue, until it ends, a drain, or a failure."""

    def __init__(
        self,
        preparer: Preparer,
        signals: SignalControl,
        stop: threading.Event,
        faults: Faults,
        failure: Callable[[], BaseException | None],
        turns: HostTurns | None = None,
    ) -> None:
        self.preparer, self.signals, self.stop, self.faults = preparer, signals, stop, faults
        self.failure, self.turns = failure, turns
        self.ended = False
        self.snapshot: Callable[[], dict[str, Any]] | None = None
        self._chunk: Iterator[GenerationRequest] = iter(())  # the preparer's latest list, handed on lazily

    def __iter__(self) -> Iterator[GenerationRequest]:
        return self

    def __next__(self) -> GenerationRequest:
        while True:
            if (exc := self.failure()) is not None:
                raise exc  # out through the engine: in-flight rows are abandoned
            if self.signals.draining.is_set() or self.stop.is_set():
                raise StopIteration  # rows not handed on yet are left for the resume
            if (item := next(self._chunk, None)) is not None:
                self.faults.hit("submit", self.snapshot)
                return item
            try:
                chunk = self._get()
            except queue.Empty:
                continue
            if chunk is END:
                if (exc := self.failure()) is not None:
                    raise exc
                self.ended = True
                raise StopIteration
            self._chunk = iter(chunk)

    def _get(self) -> Any:
        """The preparer's next item (after a short wait at most); while none is ready the engine waits for it,
        which is the helper threads' turn."""
        if self.turns is None or not self.preparer.queue.empty():
            return self.preparer.queue.get(timeout=0.05)
        with self.turns.engine_waits():
            return self.preparer.queue.get(timeout=0.05)
