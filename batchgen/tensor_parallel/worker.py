"""A tensor-parallel worker (ranks 1..K-1): build the same engine rank as rank 0, then run every step
rank 0 sends, on this rank's shard.

A worker keeps one step in flight like rank 0's engine (it fetches step N-1 after launching N), so its
host never runs far ahead of its GPU, and its busy time is measured the same way. It has no scheduler,
no sampler output to read and no files: its sampled tokens equal rank 0's and only feed the carry-over.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import signal
import sys
from collections import deque
from multiprocessing.connection import Connection

from batchgen.lean_imports import hide_inherited
from batchgen.tensor_parallel.launch import Rendezvous, connect, init_group
from batchgen.tensor_parallel.messages import (
    Capture,
    Init,
    Launch,
    Reset,
    Sample,
    Stats,
    Stop,
    TimeAllReduce,
    UnknownMessage,
    decode,
)

log = logging.getLogger("batchgen")


def serve(conn: Connection, runner, group) -> None:
    """Run rank 0's orders until it says stop or goes away; an order this loop does not know raises."""
    import torch

    inflight: deque = deque()
    while True:
        try:
            raw = conn.recv()
        except (EOFError, OSError):
            return  # rank 0 is gone
        message = decode(raw)
        if isinstance(message, Launch):
            inflight.append(runner.launch(message.inputs))
            if len(inflight) > 1:  # rank 0 sampled it before launching this one
                runner.fetch(inflight.popleft())
            continue
        if isinstance(message, Sample):  # the newest step is masked: rank 0's token masks, then its sampling
            mask = torch.from_numpy(message.masks)
            runner.mask_buffer(inflight[-1], mask.shape[1]).copy_(mask)
            runner.sample(inflight[-1])
            continue
        while inflight:
            runner.fetch(inflight.popleft())
        if isinstance(message, Reset):
            runner.reset()
        elif isinstance(message, Capture):
            runner.capture_all(message.features, progress=False, mask_width=message.mask_width)
        elif isinstance(message, Stats):
            conn.send(runner.busy_stats())
        elif isinstance(message, TimeAllReduce):
            conn.send(group.time_all_reduce(message.shape, message.count))
        elif isinstance(message, Stop):
            return
        else:
            raise UnknownMessage(f"a serving worker takes no {type(message).__name__} order: {message!r}")


def run_worker(conn: Connection, rdzv: Rendezvous | None, rank: int) -> None:
    """Receive the job from rank 0, join the group, build this rank, serve."""
    import torch

    from batchgen.engine.rank_engine import build_rank
    from batchgen.model import attention
    from batchgen.tensor_parallel.launch import _uses_cuda

    job = decode(conn.recv())
    if not isinstance(job, Init):
        raise UnknownMessage(f"a starting worker expects the job first, got {job!r}")
    config, files, rank0 = job.config, job.files, job.rendezvous
    if rdzv is None:  # started by rank 0: same store, this rank, the rank-th visible GPU
        rdzv = dataclasses.replace(rank0, rank=rank, local_rank=rank)
        group = init_group(rdzv, _uses_cuda(config))
    else:
        import torch.distributed as dist

        from batchgen.distributed.group import ParallelGroup

        group = ParallelGroup(rdzv.rank, rdzv.size, dist.group.WORLD, rdzv.local_rank)
    attention.register()
    with torch.inference_mode():
        engine = build_rank(config, files, group, progress=False)
    serve(conn, engine.runner, group)


def ignore_stop_signals() -> None:
    """Rank 0 alone handles stop signals (a terminal's Ctrl-C, Slurm's SIGTERM to the whole step)."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1):
        signal.signal(sig, signal.SIG_IGN)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m batchgen.tensor_parallel.worker")
    parser.add_argument("--control", required=True, help="host:port of rank 0's control listener")
    parser.add_argument("--rank", type=int, required=True)
    args = parser.parse_args(argv)
    hide_inherited()
    ignore_stop_signals()
    logging.basicConfig(format=f"batchgen[rank {args.rank}]: %(message)s", level=logging.INFO)
    conn = connect(None, args.control, args.rank)
    run_worker(conn, None, args.rank)
    _leave()


def _leave() -> None:
    """Exit without interpreter teardown: NCCL's destructors can wait for ranks that already left."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def serve_launched(rdzv: Rendezvous, cuda: bool) -> None:
    """A rank > 0 that a launcher (torchrun, srun) started with the same command as rank 0."""
    ignore_stop_signals()
    init_group(rdzv, cuda)
    conn = connect(rdzv, None, rdzv.rank)
    run_worker(conn, rdzv, rdzv.rank)
    _leave()


if __name__ == "__main__":
    main()
