"""The asynchronous CUDA runner: three streams ordered by events, two buffer slots, decode CUDA graphs.

Step N uses slot ``N % num_slots``. Per slot: pinned host inputs -> (H2D stream) device inputs ->
(compute stream) graph replay or eager forward + sampling -> device tokens -> (D2H stream) pinned host
tokens. Events order the streams and guard slot reuse:
- the host refills a slot's pinned inputs only after that slot's last H2D copy finished;
- the H2D stream overwrites a slot's device inputs only after the compute that read them finished;
- the compute stream overwrites a slot's device outputs only after the D2H copy that read them finished;
- the host blocks only in ``fetch``, on the D2H event of the step whose tokens it needs.
Carry-over: a decode's input token produced by step N-1 is gathered on the device from the other slot's
output buffer, inside the graph. Graphs of the greedy variant are captured at start-up, those of the
sampling / log-probability variants when the caller says it will need them (``LLM.prepare``), else
lazily on first use (a device sync each). Decode-only steps replay a graph captured per (slot, batch bucket,
sampling variant); steps with prefill chunks run eagerly on the compute stream (they are GPU-bound, so
launch overhead does not matter there, and the host still runs ahead).
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import torch

from batchgen.engine.batch import StepInputs
from batchgen.engine.runner import Sampler, StepResult, apply_carry_over, forward_and_sample
from batchgen.engine.sampler import SamplingTensors, sample
from batchgen.model.attention import PagedContext
from batchgen.model.backends import KernelBackend
from batchgen.model.forward import ModelForward

_TOKEN_FIELDS = ("input_ids", "carry_rows", "positions", "slot_mapping")  # [T]
_SAMPLE_FIELDS = ("logits_indices", "temperature", "top_p", "top_k", "rng_keys", "rng_steps")  # [S]
_PAD = {"carry_rows": -1, "slot_mapping": -1, "top_p": 1.0}  # padding rows: no KV write, no carry


def decode_buckets(max_num_seqs: int) -> list[int]:
    sizes = [1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256, 320, 384, 448, 512]
    return sorted({s for s in sizes if s < max_num_seqs} | {max_num_seqs})


class Slot:
    """Pinned host and device buffers of one slot, and the events that guard their reuse."""

    def __init__(self, device: torch.device, max_tokens: int, max_seqs: int, max_blocks: int) -> None:
        shapes = {name: (max_tokens,) for name in _TOKEN_FIELDS}
        shapes |= {name: (max_seqs,) for name in _SAMPLE_FIELDS}
        shapes |= {
            "cu_seqlens_q": (max_seqs + 1,),
            "seq_lens": (max_seqs,),
            "block_tables": (max_seqs, max_blocks),
        }
        dtypes = {"temperature": torch.float32, "top_p": torch.float32}
        dtypes |= {name: torch.int32 for name in ("cu_seqlens_q", "seq_lens", "block_tables")}
        self.host = {
            n: torch.zeros(s, dtype=dtypes.get(n, torch.int64), pin_memory=True) for n, s in shapes.items()
        }
        self.dev = {
            n: torch.zeros(s, dtype=dtypes.get(n, torch.int64), device=device) for n, s in shapes.items()
        }
        self.out_tokens = torch.zeros(max_seqs, dtype=torch.int64, device=device)
        self.out_logprobs = torch.zeros(max_seqs, dtype=torch.float32, device=device)
        self.host_tokens = torch.zeros(max_seqs, dtype=torch.int64, pin_memory=True)
        self.host_logprobs = torch.zeros(max_seqs, dtype=torch.float32, pin_memory=True)
        self.h2d_done = torch.cuda.Event()
        self.compute_start = torch.cuda.Event(enable_timing=True)
        self.compute_done = torch.cuda.Event(enable_timing=True)
        self.d2h_done = torch.cuda.Event()
        for name, value in _PAD.items():
            self.dev[name].fill_(value)


def _zeros(shape: tuple[int, ...], dtype: torch.dtype | None, **where) -> torch.Tensor:
    return torch.zeros(shape, dtype=dtype or torch.int64, **where)


class Shape(NamedTuple):
    """How many rows of each kind a launch uses (padded to the bucket for graph replays)."""

    tokens: int
    seqs: int
    samples: int


class CudaHandle(NamedTuple):
    step_id: int
    slot: int
    samples: int
    want_logprobs: bool


class CudaRunner:
    def __init__(
        self,
        forward: ModelForward,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        backend: KernelBackend,
        device: torch.device,
        max_num_seqs: int,
        max_batch_tokens: int,
        max_model_len: int,
        block_size: int,
        num_slots: int = 2,
        cuda_graphs: bool = True,
        sampler: Sampler = sample,
    ) -> None:
        self.forward, self.kv_caches, self.backend, self.device = forward, kv_caches, backend, device
        self.sampler = sampler
        self.max_model_len = max_model_len
        max_blocks = -(-max_model_len // block_size)
        max_tokens = max(max_batch_tokens, max_num_seqs)
        self.slots = [Slot(device, max_tokens, max_num_seqs, max_blocks) for _ in range(num_slots)]
        self.h2d, self.compute, self.d2h = (torch.cuda.Stream(device) for _ in range(3))
        self.buckets = decode_buckets(max_num_seqs) if cuda_graphs else []
        self.graphs: dict[tuple[int, int, bool, bool], torch.cuda.CUDAGraph] = {}
        self.pool = torch.cuda.graph_pool_handle() if cuda_graphs else None
        self.gpu_busy_s = 0.0
        self.prep_s = 0.0
        self.graph_memory: dict[str, int] = {}
        # Tensor parallelism: raises when another rank died, so a wait on work that waits for a
        # collective with that rank fails instead of hanging.
        self.check_alive: Callable[[], None] | None = None

    # --- per step ---------------------------------------------------------------------------------

    @torch.inference_mode()
    def launch(self, inputs: StepInputs) -> CudaHandle:
        t0 = time.perf_counter()
        slot_id = inputs.step_id % len(self.slots)
        slot = self.slots[slot_id]
        bucket = self._bucket(inputs)
        shape = (
            Shape(bucket, bucket, bucket)
            if bucket
            else Shape(inputs.num_tokens, len(inputs.seq_lens), len(inputs.logits_indices))
        )
        graph = self._graph(slot_id, bucket, inputs.any_sampling, inputs.want_logprobs) if bucket else None
        self._wait(slot.h2d_done)  # the pinned inputs of this slot's last step are on the device
        _fill_host(slot, inputs, shape)
        self._copy_inputs(slot, shape)
        with torch.cuda.stream(self.compute):
            self.compute.wait_event(slot.h2d_done)
            self.compute.wait_event(slot.d2h_done)  # its previous tokens were copied out
            slot.compute_start.record(self.compute)
            if graph is not None:
                graph.replay()
            else:
                self._forward(slot_id, shape, inputs)
            slot.compute_done.record(self.compute)
        self._copy_outputs(slot, shape.samples, inputs.want_logprobs)
        self.prep_s += time.perf_counter() - t0
        return CudaHandle(inputs.step_id, slot_id, len(inputs.logits_indices), inputs.want_logprobs)

    def reset(self) -> None:
        """Nothing to forget: carry-over reads the other slot's outputs, and a fresh stream's first
        step carries nothing over."""

    def fetch(self, handle: CudaHandle) -> StepResult:
        slot = self.slots[handle.slot]
        self._wait(slot.d2h_done)
        self.gpu_busy_s += slot.compute_start.elapsed_time(slot.compute_done) / 1000.0
        tokens = slot.host_tokens[: handle.samples].tolist()
        logprobs = slot.host_logprobs[: handle.samples].tolist() if handle.want_logprobs else None
        return StepResult(handle.step_id, tokens, logprobs)

    def _wait(self, work: torch.cuda.Event | torch.cuda.Stream) -> None:
        if self.check_alive is None:
            work.synchronize()
            return
        while not work.query():
            self.check_alive()
            time.sleep(20e-6)

    def _bucket(self, inputs: StepInputs) -> int:
        if not self.buckets or not inputs.decode_only:
            return 0
        i = bisect.bisect_left(self.buckets, len(inputs.seq_lens))
        return self.buckets[i] if i < len(self.buckets) else 0

    def _copy_inputs(self, slot: Slot, shape: Shape) -> None:
        with torch.cuda.stream(self.h2d):
            self.h2d.wait_event(slot.compute_done)  # the last compute that read these device inputs
            for name, host in slot.host.items():
                rows = _rows(name, shape)
                slot.dev[name][:rows].copy_(host[:rows], non_blocking=True)
            slot.h2d_done.record(self.h2d)

    def _copy_outputs(self, slot: Slot, samples: int, want_logprobs: bool) -> None:
        with torch.cuda.stream(self.d2h):
            self.d2h.wait_event(slot.compute_done)
            slot.host_tokens[:samples].copy_(slot.out_tokens[:samples], non_blocking=True)
            if want_logprobs:
                slot.host_logprobs[:samples].copy_(slot.out_logprobs[:samples], non_blocking=True)
            slot.d2h_done.record(self.d2h)

    # --- the step body: eager or captured ---------------------------------------------------------

    def _forward(self, slot_id: int, shape: Shape, inputs: StepInputs, bounds: tuple[int, int] | None = None):
        """Forward + sampling from the slot's device buffers into its output buffers (no host sync)."""
        slot, other = self.slots[slot_id], self.slots[(slot_id - 1) % len(self.slots)]
        dev = slot.dev
        max_q_len, max_seq_len = bounds or (inputs.max_q_len, inputs.max_seq_len)
        ctx = PagedContext(
            self.kv_caches,
            dev["slot_mapping"][: shape.tokens],
            dev["cu_seqlens_q"][: shape.seqs + 1],
            dev["seq_lens"][: shape.seqs],
            dev["block_tables"][: shape.seqs],
            max_q_len,
            max_seq_len,
            self.backend,
        )
        ids = apply_carry_over(
            dev["input_ids"][: shape.tokens], dev["carry_rows"][: shape.tokens], other.out_tokens
        )
        params = SamplingTensors(*(dev[n][: shape.samples] for n in _SAMPLE_FIELDS[1:]))
        positions, kept = dev["positions"][: shape.tokens], dev["logits_indices"][: shape.samples]
        tokens, logprobs = forward_and_sample(
            self.forward, self.sampler, ids, positions, kept, ctx, params, inputs
        )
        slot.out_tokens[: shape.samples].copy_(tokens)
        if logprobs is not None:
            slot.out_logprobs[: shape.samples].copy_(logprobs)

    def _graph(
        self, slot_id: int, bucket: int, any_sampling: bool, want_logprobs: bool
    ) -> torch.cuda.CUDAGraph:
        key = (slot_id, bucket, any_sampling, want_logprobs)
        graph = self.graphs.get(key)
        if graph is None:
            graph = self.graphs[key] = self._capture(slot_id, bucket, any_sampling, want_logprobs)
        return graph

    def _capture(
        self, slot_id: int, bucket: int, any_sampling: bool, want_logprobs: bool
    ) -> torch.cuda.CUDAGraph:
        """Capture a decode step of ``bucket`` sequences; replays read whatever the slot buffers hold."""
        dummy = _dummy_inputs(bucket, any_sampling, want_logprobs)
        shape = Shape(bucket, bucket, bucket)
        bounds = (1, self.max_model_len)
        with torch.cuda.stream(self.compute):
            # Warm-up runs (JIT compiles, allocator settles) happen eagerly, outside the capture, on
            # all-padding inputs: stale inputs of an earlier step would rewrite its KV slots.
            self.compute.wait_stream(torch.cuda.current_stream(self.device))
            self.compute.wait_stream(self.h2d)
            self.compute.wait_event(self.slots[slot_id].d2h_done)  # its last tokens were copied out
            _reset_inputs(self.slots[slot_id])
            for _ in range(2):
                self._forward(slot_id, shape, dummy, bounds)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool, stream=self.compute):
                self._forward(slot_id, shape, dummy, bounds)
        self._wait(self.compute)
        return graph

    @torch.inference_mode()
    def capture_all(
        self, any_sampling: bool = False, want_logprobs: bool = False, progress: bool = True
    ) -> None:
        """Capture every (slot, bucket) decode graph of one sampling variant up front (those already
        captured are kept); the first call records what the graphs cost in memory."""
        from tqdm import tqdm

        keys = [(s, b) for s in range(len(self.slots)) for b in reversed(self.buckets)]
        keys = [k for k in keys if (*k, any_sampling, want_logprobs) not in self.graphs]
        first = not self.graph_memory
        # Capturing empties the allocator's cache first: do it now, or blocks freed earlier (weights
        # replaced by merged copies, say) would vanish from the baseline and make the cost negative.
        torch.cuda.empty_cache()
        base = torch.cuda.memory_reserved(self.device)
        for slot_id, bucket in tqdm(keys, desc="capturing CUDA graphs", disable=not progress, leave=False):
            self._graph(slot_id, bucket, any_sampling, want_logprobs)
            if first and slot_id == 0 and bucket == self.buckets[0]:
                self.graph_memory["one_slot"] = torch.cuda.memory_reserved(self.device) - base
        if first:
            self.graph_memory["all_slots"] = torch.cuda.memory_reserved(self.device) - base


def _rows(name: str, shape: Shape) -> int:
    if name in _TOKEN_FIELDS:
        return shape.tokens
    if name in _SAMPLE_FIELDS:
        return shape.samples
    return shape.seqs + 1 if name == "cu_seqlens_q" else shape.seqs


def _reset_inputs(slot: Slot) -> None:
    for name, dev in slot.dev.items():
        dev.fill_(_PAD.get(name, 0))


def _fill_host(slot: Slot, inputs: StepInputs, shape: Shape) -> None:
    """Copy the step's arrays into the slot's pinned buffers; pad up to ``shape`` with inert rows."""
    for name, host in slot.host.items():
        src = getattr(inputs, name)
        view = host.numpy()
        n = len(src)
        if src.ndim == 2:  # block tables: columns past the step's widest table are never read
            view[:n, : src.shape[1]] = src
        else:
            view[:n] = src
        rows = _rows(name, shape)
        if rows > n:
            pad = src[-1] if name == "cu_seqlens_q" else _PAD.get(name, 0)  # empty padding sequences
            view[n:rows] = pad


def _dummy_inputs(bucket: int, any_sampling: bool, want_logprobs: bool) -> StepInputs:
    """An all-padding decode step: what the slot buffers hold while a graph is captured."""
    zeros = np.zeros(bucket, np.int64)
    return StepInputs(
        -1, zeros, zeros - 1, zeros, zeros - 1, np.zeros(bucket + 1, np.int32), np.zeros(bucket, np.int32),
        np.zeros((bucket, 1), np.int32), zeros, np.zeros(bucket, np.float32), np.ones(bucket, np.float32),
        zeros, zeros, zeros, any_sampling, want_logprobs, 1, 1,
    )  # fmt: skip
