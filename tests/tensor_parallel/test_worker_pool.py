"""Rank 0's worker pool names the rank that died, whichever thread sees it first: the watch (its
connection closed) or the main thread (a send or receive on it failed)."""

from __future__ import annotations

import subprocess
import sys
import time
from multiprocessing import Pipe

import pytest

from batchgen.distributed.group import ParallelGroup
from batchgen.tensor_parallel.launch import RankFailed, WorkerPool
from batchgen.tensor_parallel.messages import Stats


@pytest.fixture
def pool_with_dead_rank_2(monkeypatch):
    """Ranks 1 and 2 by pipes; rank 2's process has exited with code 3 and its end of the pipe is closed.
    The pool's delayed process exit after a failure is switched off (it would end pytest)."""
    monkeypatch.setattr(WorkerPool, "_exit_later", lambda self: None)
    alive, alive_end = Pipe()
    dead, dead_end = Pipe()
    dead_end.close()
    procs = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"]),
             subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])]  # fmt: skip
    procs[1].wait()
    pool = WorkerPool(ParallelGroup(0, 3), [alive, dead], procs)
    yield pool, alive_end
    procs[0].kill()
    procs[0].wait()


@pytest.fixture
def without_watch(monkeypatch):
    monkeypatch.setattr(WorkerPool, "_watch", lambda self: None)


def test_a_failed_send_or_receive_names_the_dead_rank(without_watch, pool_with_dead_rank_2):
    pool, alive_end = pool_with_dead_rank_2
    alive_end.send("ready")  # rank 1's reply, should the send to rank 2 not fail and its receive must
    with pytest.raises(RankFailed, match=r"^tensor-parallel rank 2 exited with code 3$"):
        pool.request(Stats())


def test_the_watch_names_the_dead_rank(pool_with_dead_rank_2):
    pool, _ = pool_with_dead_rank_2
    deadline = time.monotonic() + 5
    while pool.failure is None and time.monotonic() < deadline:  # the watch polls every 0.5 s
        time.sleep(0.05)
    assert pool.failure == "tensor-parallel rank 2 exited with code 3"
