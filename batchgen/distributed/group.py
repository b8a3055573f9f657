"""The process group a sharded model communicates through (``ParallelGroup.single()`` for one process).

Collectives run in place on the caller's current stream, so they are captured in CUDA graphs like any
other kernel (NCCL >= 2.9.6); on the CPU they are gloo's blocking calls.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class ParallelGroup:
    rank: int
    size: int
    process_group: Any = None  # torch.distributed ProcessGroup; None for one process
    local_rank: int = 0  # which of the node's visible GPUs this rank uses

    @staticmethod
    def single() -> ParallelGroup:
        return ParallelGroup(0, 1)

    @property
    def is_parallel(self) -> bool:
        return self.size > 1

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum over ranks, in place (returns ``x``)."""
        if self.size > 1:
            import torch.distributed as dist

            dist.all_reduce(x, group=self.process_group)
        return x

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        """[size, *x.shape]: every rank's ``x``, in rank order."""
        if self.size == 1:
            return x.unsqueeze(0)
        import torch.distributed as dist

        out = torch.empty((self.size * x.shape[0], *x.shape[1:]), dtype=x.dtype, device=x.device)
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # renamed in 2.13
        gather(out, x.contiguous(), group=self.process_group)
        return out.view(self.size, *x.shape)

    def min_int(self, value: int, device: torch.device) -> int:
        """The smallest ``value`` over ranks (a host-side agreement, e.g. on the KV pool size)."""
        if self.size == 1:
            return value
        t = torch.tensor([value], dtype=torch.int64, device=device)
        import torch.distributed as dist

        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.process_group)
        return int(t.item())

    def time_all_reduce(
        self, shape: tuple[int, ...], count: int, dtype: torch.dtype = torch.bfloat16
    ) -> float:
        """Median ms of ``count`` all-reduces of ``shape`` replayed from one CUDA graph: the communication
        a decode step pays (every rank must call it at the same time)."""
        x = torch.randn(shape, dtype=dtype, device="cuda")
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.stream(stream):
            for _ in range(3):  # eager first: the communicator exists before the capture
                self.all_reduce(x)
            with torch.cuda.graph(graph, stream=stream):
                for _ in range(count):
                    self.all_reduce(x)
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        times = []
        for _ in range(10):
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        del graph  # its captured NCCL work must be gone before the group can be torn down
        return sorted(times)[len(times) // 2]
