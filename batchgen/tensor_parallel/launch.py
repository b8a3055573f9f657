"""Starting the ranks of a tensor-parallel job, and watching them.

Rank 0 is the process that asked (``LLM(tensor_parallel=K)``). It starts ranks 1..K-1 itself as
``python -m batchgen.tensor_parallel.worker`` processes, unless a launcher already started all K (torchrun's
``RANK``/``WORLD_SIZE`` or an ``srun`` step's ``SLURM_PROCID``/``SLURM_NTASKS``): then every process ran
the same command and ranks > 0 turn into workers (``batchgen run`` checks ``launched_rank``).
Workers take their orders over a control connection (``WorkerPool.send``) and run in their own session
with stop signals ignored: rank 0 alone drains, and stops them. A worker whose parent dies is killed.

A rank that dies ends the job: the pool notices (its process or its connection), rank 0's waits raise
``RankFailed``, and if the main thread is stuck where it cannot notice (a collective during start-up),
the process exits after a few seconds anyway (1, or 75 once a stop was requested).
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from multiprocessing.connection import Client, Connection, Listener, wait
from typing import Any

import torch

from batchgen.distributed.group import ParallelGroup
from batchgen.tensor_parallel.messages import Init, Message, Stop, encode

log = logging.getLogger("batchgen")
COLLECTIVE_TIMEOUT = timedelta(minutes=30)  # start-up collectives wait for the slowest rank's load
EXIT_GRACE_S = 5.0
_AUTHKEY_ENV = "BATCHGEN_TP_AUTHKEY"


class RankFailed(RuntimeError):
    """Another rank of the tensor-parallel job died."""


@dataclass(frozen=True)
class Rendezvous:
    master: str  # host:port of the process group's store
    rank: int
    size: int
    local_rank: int


def launched_rank(size: int, env: dict[str, str] | None = None) -> Rendezvous | None:
    """The rank a launcher gave this process, when it started all ``size`` of them (else None)."""
    env = dict(os.environ) if env is None else env
    if env.get("WORLD_SIZE") == str(size) and "RANK" in env:  # torchrun
        master = f"{env.get('MASTER_ADDR', '127.0.0.1')}:{env.get('MASTER_PORT', '29500')}"
        return Rendezvous(master, int(env["RANK"]), size, int(env.get("LOCAL_RANK", env["RANK"])))
    if env.get("SLURM_STEP_NUM_TASKS", env.get("SLURM_NTASKS")) == str(size) and "SLURM_PROCID" in env:
        port = env.get("MASTER_PORT") or str(20000 + int(env.get("SLURM_JOB_ID", "0")) % 20000)
        master = f"{env.get('MASTER_ADDR', '127.0.0.1')}:{port}"
        return Rendezvous(master, int(env["SLURM_PROCID"]), size, int(env.get("SLURM_LOCALID", "0")))
    return None


def init_group(rdzv: Rendezvous, cuda: bool) -> ParallelGroup:
    import torch.distributed as dist

    if cuda:
        torch.cuda.set_device(rdzv.local_rank)
    dist.init_process_group(
        "nccl" if cuda else "gloo", init_method=f"tcp://{rdzv.master}", rank=rdzv.rank,
        world_size=rdzv.size, timeout=COLLECTIVE_TIMEOUT,
    )  # fmt: skip
    return ParallelGroup(rdzv.rank, rdzv.size, dist.group.WORLD, rdzv.local_rank)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _uses_cuda(config) -> bool:
    from batchgen.model.loader import resolve_device

    return resolve_device(config.device).type == "cuda"


class WorkerPool:
    """Rank 0's side: the connections to ranks 1..K-1, their processes (when started here), a watch."""

    def __init__(self, group: ParallelGroup, conns: list[Connection], procs: list[subprocess.Popen]) -> None:
        self.group, self.conns, self.procs = group, conns, procs
        self.failure: str | None = None
        self.stop_requested = False
        self._closing = False
        self._lock = threading.Lock()
        threading.Thread(target=self._watch, name="batchgen-tp-watch", daemon=True).start()

    def send(self, message: Message) -> None:
        self.check()
        raw = encode(message)
        for index, conn in enumerate(self.conns):
            try:
                conn.send(raw)
            except OSError as exc:
                self._fail(self._lost(index + 1, exc))
                self.check()

    def check(self) -> None:
        if self.failure is not None:
            raise RankFailed(self.failure)

    def request(self, message: Message, local: Callable[[], Any] | None = None) -> list[Any]:
        """Send to every worker, run ``local`` here meanwhile (its result first), collect one reply each."""
        with self._lock:  # the watch must not take a reply for a closed connection
            self.send(message)
            replies = [local()] if local is not None else []
            for index, conn in enumerate(self.conns):
                try:
                    replies.append(conn.recv())
                except (EOFError, OSError) as exc:
                    self._fail(self._lost(index + 1, exc))
                    raise RankFailed(self.failure) from exc
            return replies

    def close(self) -> None:
        if self._closing and not self.conns:
            return
        self._closing = True
        for conn in self.conns:
            try:
                conn.send(encode(Stop()))
                conn.close()
            except OSError:
                pass
        self.conns = []
        for proc in self.procs:
            try:
                proc.wait(timeout=0.1 if self.failure else 30)  # after a failure they may be stuck
            except subprocess.TimeoutExpired:
                proc.kill()
        _destroy_group()

    def _watch(self) -> None:
        """A worker's connection becomes readable only when it closes (workers speak when asked)."""
        while not self._closing and self.failure is None:
            ready = wait(self.conns, timeout=0.5)
            with self._lock:  # a reply to ``request`` is read there, not taken for a closed connection
                closed = [c for c in ready if not self._closing and not c.closed and c.poll()]
            if closed:
                rank = self.conns.index(closed[0]) + 1
                self._fail(f"tensor-parallel rank {rank} exited{self._exit_status(rank)}")

    def _lost(self, rank: int, exc: BaseException) -> str:
        """The failure a broken connection to ``rank`` means: how its process exited, where it has (the
        same words as the watch's, whichever of the two sees the death first)."""
        status = self._exit_status(rank)
        if status:
            return f"tensor-parallel rank {rank} exited{status}"
        return f"lost the connection to tensor-parallel rank {rank} ({exc})"

    def _exit_status(self, rank: int) -> str:
        if rank - 1 >= len(self.procs):
            return ""
        try:
            code = self.procs[rank - 1].wait(timeout=2)
        except subprocess.TimeoutExpired:
            return ""
        return f" (killed by signal {-code})" if code < 0 else f" with code {code}"

    def _fail(self, message: str) -> None:
        if self.failure is None:
            self.failure = message
            log.error("%s: stopping the job", message)
            threading.Thread(target=self._exit_later, daemon=True).start()

    def _exit_later(self) -> None:
        """The main thread raises RankFailed at its next wait; if it is stuck in a collective that will
        never complete, leave anyway."""
        time.sleep(EXIT_GRACE_S)
        sys.stderr.flush()
        os._exit(75 if self.stop_requested else 1)


def _destroy_group() -> None:
    """Leave the process group: abort NCCL's communicators (a local operation; the workers have exited
    without tearing theirs down). The caller first frees every CUDA graph that captured work on them:
    with one alive, both this and an orderly destroy hung (torch 2.11)."""
    import torch.distributed as dist

    if not dist.is_initialized():
        return
    abort = getattr(dist.distributed_c10d, "_abort_process_group", None)
    if dist.get_backend() == "nccl" and abort is not None:
        abort()
    else:
        dist.destroy_process_group()


def start_workers(config, files) -> WorkerPool:
    """Rank 0: start (or join) the other ranks, hand them the job, form the process group."""
    cuda = _uses_cuda(config)
    rdzv = launched_rank(config.tensor_parallel)
    authkey = secrets.token_bytes(16)
    listener = Listener(("127.0.0.1", 0), authkey=authkey)
    procs: list[subprocess.Popen] = []
    if rdzv is None:
        rdzv = Rendezvous(f"127.0.0.1:{_free_port()}", 0, config.tensor_parallel, 0)
        procs = [_spawn(rdzv, rank, listener.address, authkey) for rank in range(1, rdzv.size)]
        conns = _accept(listener, rdzv.size - 1, procs)
        group = None
    else:
        group = init_group(rdzv, cuda)
        _publish(listener.address, authkey)
        conns = _accept(listener, rdzv.size - 1, procs)
    for conn in conns:
        conn.send(encode(Init(config, files._replace(module=None), rdzv)))
    group = group or init_group(rdzv, cuda)
    return WorkerPool(group, conns, procs)


def _spawn(rdzv: Rendezvous, rank: int, address, authkey: bytes) -> subprocess.Popen:
    env = dict(os.environ, **{_AUTHKEY_ENV: authkey.hex()})
    cmd = [sys.executable, "-m", "batchgen.tensor_parallel.worker", "--control", f"{address[0]}:{address[1]}",
           "--rank", str(rank)]  # fmt: skip
    return subprocess.Popen(cmd, env=env, start_new_session=True, preexec_fn=_worker_setup)


def _worker_setup() -> None:
    """In the worker before exec: killed if rank 0 dies (SIGKILL of rank 0 included)."""
    try:
        import ctypes
        import signal

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _accept(listener: Listener, count: int, procs: list[subprocess.Popen]) -> list[Connection]:
    """Connections of ranks 1..count, in rank order; a worker that dies first fails the start-up."""
    conns: dict[int, Connection] = {}

    def accept_all() -> None:
        for _ in range(count):
            conn = listener.accept()
            conns[conn.recv()] = conn  # each worker says its rank first

    accepting = threading.Thread(target=accept_all, name="batchgen-tp-accept", daemon=True)
    accepting.start()
    while accepting.is_alive():
        accepting.join(0.5)
        for rank, proc in enumerate(procs, start=1):
            if proc.poll() is not None:
                listener.close()
                raise RankFailed(f"tensor-parallel rank {rank} exited with code {proc.returncode} at start")
    listener.close()
    return [conns[r] for r in sorted(conns)]


def _publish(address, authkey: bytes) -> None:
    """Launcher-started ranks learn the control address from rank 0 over the process group."""
    import torch.distributed as dist

    dist.broadcast_object_list([address, authkey], src=0)


def connect(rdzv: Rendezvous | None, control: str | None, rank: int) -> Connection:
    """A worker's control connection: to ``control`` (spawned here), else learnt over the group."""
    if control is not None:
        host, port = control.rsplit(":", 1)
        conn = Client((host, int(port)), authkey=bytes.fromhex(os.environ[_AUTHKEY_ENV]))
    else:
        import torch.distributed as dist

        box: list = [None, None]
        dist.broadcast_object_list(box, src=0)
        conn = Client(tuple(box[0]), authkey=box[1])
    conn.send(rank)
    return conn
