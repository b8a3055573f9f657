"""How many cores a CPU run computes on: torch's intra-op threads, and the tokenizers' own pool.

torch's default, one thread per core, is the worst choice on a machine shared with other work: every
parallel op waits at a barrier for its slowest thread, and a thread that lost its core to another process
stalls the op for a scheduler time slice. On a loaded 2-core machine, with OpenMP's default spinning,
B4's generation ran slower on 2 threads than on 1, and by far (docs/results.md).

So on the CPU (unless ``--threads N`` / ``LLM(threads=N)`` fixes the count):
- the run starts with the cores this process may use (``os.sched_getaffinity``: taskset, cgroups, Slurm)
  less those other work keeps busy (their idle time over ``busy_cores``' window; the 1-minute load average
  without /proc), at least one; ``OMP_NUM_THREADS`` caps it, and so does a lower count set on torch
  beforehand;
- every couple of seconds a ``ThreadGovernor`` looks at what happened since: one thread fewer while this
  process's threads waited for a CPU (their run-queue delay in ``/proc/self/task/*/schedstat``), one
  more while a core of its affinity sat idle (``/proc/stat``), waiting longer after each step down so a
  bursty neighbour does not make it flap.
The tokenizers' Rust pool is switched off (``TOKENIZERS_PARALLELISM=false`` unless set): prompts are
tokenized one at a time in the prompt thread, and a pool would only compete with the engine's threads.

The command line also shortens how long an idle OpenMP thread spins before it sleeps: 1000 rounds
(``GOMP_SPINCOUNT=1000``, unless it or ``OMP_WAIT_POLICY`` is set; read once, when torch loads) instead
of 300000. Beside other work, a spinning thread burns the time slice its descheduled partner needs:
under load the short spin ran B4's steps far faster than the default, and on an idle machine about as
fast, where never spinning (``OMP_WAIT_POLICY=PASSIVE``) was slower (docs/results.md).

While ``batchgen run`` generates, the interpreter hands the GIL over every ``ENGINE_SWITCH_S`` instead
of Python's longer default (``engine_switching``). The engine thread gives the GIL up at every torch call
and numpy copy; another thread that takes it keeps it until it blocks or the switch interval ends, and
the GPU waits. In process, with the embedded model's shape at 1024 rows (B7w), that shortened the launch
of a step by more than half; at 256 rows it changed nothing beyond noise. Whole-command B7w runs did not
reproduce the gain, and moving prompt encoding to another process did not help either: the interval
bounds a wait, it is not shown to be the limit (docs/results.md).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    import torch

log = logging.getLogger("batchgen")

_INTERVAL_S = 2.0  # how often the governor looks: several decode steps of a small model on the CPU
_WAITING_CORES = 0.25  # run-queue delay, in cores' worth of this process's threads, that means contention
_IDLE_CORES = 0.75  # idle time, in cores, that means a core is free
_HOLD_S, _MAX_HOLD_S = 10.0, 300.0  # no step up for this long after a step down, doubled each time


ENGINE_SWITCH_S = 2e-4  # GIL switch interval while the engine runs (Python's default is far longer)
TURN_TIMEOUT_S = 0.05  # a helper's longest wait for the engine to block: longer than a wave of new rows
SHORT_SPINS = {"GOMP_SPINCOUNT": "1000"}
DEFAULTED: set[str] = set()  # the variables prefer_short_spins set (the user had not)


def prefer_short_spins() -> None:
    """Before torch loads (the command line's first step): idle OpenMP threads soon sleep, see above."""
    if "OMP_WAIT_POLICY" in os.environ:  # the user chose how OpenMP waits
        return
    for key, value in SHORT_SPINS.items():
        if key not in os.environ:
            os.environ[key] = value
            DEFAULTED.add(key)


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity), else the machine's count."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # macOS and Windows have no affinity call
        return max(1, os.cpu_count() or 1)


_ours: int | None = None  # the count batchgen last gave torch


def max_threads() -> int:
    """The most threads an automatic count may use: the cores available, capped by ``OMP_NUM_THREADS``
    and by a lower count set on torch before (``torch.set_num_threads`` in a library user's code)."""
    import torch

    cap = available_cores()
    omp = os.environ.get("OMP_NUM_THREADS", "")
    if omp.isdigit() and int(omp) > 0:
        cap = min(cap, int(omp))
    current = torch.get_num_threads()
    return cap if current == _ours else min(cap, current)


def _apply(threads: int) -> None:
    import torch

    global _ours
    torch.set_num_threads(threads)
    _ours = threads


def default_threads(limit: int | None = None) -> int:
    """The cores free now: the affinity's, less those busy (``busy_cores``), at least 1."""
    return max(1, min(limit or max_threads(), available_cores() - busy_cores()))


def busy_cores(window_s: float = 0.1) -> int:
    """Cores of this process's affinity that other work keeps busy: their idle time over a short window
    (/proc/stat), else the 1-minute load average. The load average lags by a minute: right after another
    job ended it still counts that job's cores, and a run that starts then would take too few threads."""
    try:
        idle0, t0 = _idle_seconds(), time.monotonic()
        time.sleep(window_s)
        idle = (_idle_seconds() - idle0) / max(time.monotonic() - t0, 1e-6)  # idle cores, on average
        return max(0, round(available_cores() - idle))
    except (OSError, ValueError, AttributeError):
        pass
    try:
        return int(os.getloadavg()[0])
    except (AttributeError, OSError):
        return 0


class Sample(NamedTuple):
    when: float  # monotonic seconds
    waited_s: dict[int, float]  # thread id -> its total run-queue delay so far
    idle_s: float  # idle time so far, summed over the affinity's cores


def read_sample(clock: Callable[[], float] = time.monotonic) -> Sample | None:
    """This process's threads' run-queue delays and its cores' idle time; None without /proc."""
    try:
        waited = {}
        for tid in os.listdir("/proc/self/task"):
            try:
                with open(f"/proc/self/task/{tid}/schedstat") as f:
                    waited[int(tid)] = int(f.read().split()[1]) / 1e9
            except (OSError, IndexError, ValueError):  # the thread just ended
                continue
        return Sample(clock(), waited, _idle_seconds())
    except (OSError, ValueError, AttributeError):
        return None


def _idle_seconds() -> float:
    cores = {f"cpu{c}" for c in os.sched_getaffinity(0)}
    ticks = 0
    with open("/proc/stat") as f:
        for line in f:
            fields = line.split()
            if fields and fields[0] in cores:
                ticks += int(fields[4]) + int(fields[5])  # idle + iowait
    return ticks / os.sysconf("SC_CLK_TCK")


class ThreadGovernor:
    """Moves torch's intra-op thread count by one, between 1 and ``limit``, as the machine's load moves.

    ``tick`` must run on the thread that runs the model (torch's count is per thread under OpenMP): the
    CPU kernel backend calls it from its attention, a cheap clock read when no look is due.
    """

    def __init__(
        self,
        threads: int,
        limit: int,
        sampler: Callable[[], Sample | None] = read_sample,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.threads, self.limit = threads, limit
        self._sampler, self._clock = sampler, clock
        self._last = sampler()
        self._hold = _HOLD_S
        self._no_raise_until = 0.0
        self.changes = 0

    def tick(self) -> None:
        if self._last is None or self._clock() < self._last.when + _INTERVAL_S:
            return
        sample = self._sampler()
        if sample is None:
            return
        waiting, idle = _rates(self._last, sample)
        self._last = sample
        if self.threads > 1 and waiting > _WAITING_CORES:
            self._no_raise_until = sample.when + self._hold
            self._hold = min(2 * self._hold, _MAX_HOLD_S)
            self._set(self.threads - 1, f"threads waited {waiting:.2f} cores for a CPU")
        elif self.threads < self.limit and idle > _IDLE_CORES and sample.when >= self._no_raise_until:
            self._set(self.threads + 1, f"{idle:.2f} cores idle")

    def _set(self, threads: int, why: str) -> None:
        log.info("CPU threads %d -> %d: %s", self.threads, threads, why)
        self.threads = threads
        self.changes += 1
        _apply(threads)


def _rates(old: Sample, new: Sample) -> tuple[float, float]:
    """(cores' worth of this process's threads waiting for a CPU, idle cores), averaged in between."""
    span = max(new.when - old.when, 1e-6)
    waited = sum(max(0.0, w - old.waited_s.get(tid, w)) for tid, w in new.waited_s.items())
    return waited / span, max(0.0, new.idle_s - old.idle_s) / span


def set_cpu_threads(requested: int | None, device: torch.device, ranks: int = 1) -> ThreadGovernor | None:
    """Apply ``--threads``, or on the CPU the default above; the governor when the count is automatic.

    On CUDA with no explicit count nothing changes: the host only schedules there. The ``ranks`` processes
    of a tensor-parallel CPU job share the automatic count (fixed: each rank's governor would fight the
    others).
    """
    if requested is None and device.type != "cpu":
        return None
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    limit = max_threads()
    threads = requested if requested is not None else max(1, default_threads(limit) // ranks)
    _apply(threads)
    how = "--threads" if requested is not None else "automatic, following the load"
    log.info("CPU threads: %d (%s; %d cores available)", threads, how, available_cores())
    if requested is not None or limit == 1 or ranks > 1:
        return None
    return ThreadGovernor(threads, limit)


@contextlib.contextmanager
def engine_switching(interval_s: float = ENGINE_SWITCH_S):
    """A short GIL switch interval while the block runs (never a longer one); the old one after."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(min(old, interval_s))
    try:
        yield
    finally:
        sys.setswitchinterval(old)


class HostTurns:
    """When the helper threads of a GPU run (prompt preparer, writer) do their Python work: while the
    engine thread is blocked (on the device, or on an empty prompt queue), so neither holds the GIL when
    the engine has a step to get ready.

    A helper calls ``take()`` before each short unit of work (a prompt rendered, a batch of records
    written). Outside ``generating()`` it returns at once; inside, it waits until the engine enters
    ``engine_waits()``, at most ``timeout_s``. A wait that times out means the engine is host-bound: from
    then on ``take()`` returns at once until the engine next waits, so the writer never falls behind on
    a host-bound run (each helper also stops taking turns when its own queue says it is behind). A unit
    started during a wait may run on into the engine's next step, until the unit ends or the GIL's switch
    interval (``ENGINE_SWITCH_S``) hands the GIL back. In B7's in-process A/Bs the turns made the host's
    long pauses between decode steps fewer (docs/results.md).
    """

    def __init__(self, timeout_s: float = TURN_TIMEOUT_S) -> None:
        self.timeout_s = timeout_s
        self._open = threading.Event()
        self._open.set()
        self._generating = False
        self._waits = 0  # the engine's waits so far
        self._timed_out_at = -1  # the count when a take() last timed out: no turns until it changes

    @contextlib.contextmanager
    def generating(self):
        """The engine thread runs steps: helpers wait their turns (open again after, for good)."""
        self._generating = True
        self._open.clear()
        try:
            yield
        finally:
            self._generating = False
            self._open.set()

    @contextlib.contextmanager
    def engine_waits(self):
        """The engine thread blocks (device, input): the helpers' turn."""
        self._waits += 1
        self._open.set()
        try:
            yield
        finally:
            if self._generating:
                self._open.clear()

    @property
    def helpers_turn(self) -> bool:
        """Whether a ``take()`` now returns at once."""
        return self._open.is_set() or self._timed_out_at == self._waits

    def take(self) -> None:
        if self._timed_out_at == self._waits:  # host-bound since the last wait: no point waiting
            return
        if not self._open.wait(self.timeout_s):
            self._timed_out_at = self._waits
