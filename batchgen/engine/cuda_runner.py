"""The asynchronous CUDA runner: three streams ordered by events, two buffer slots, CUDA graphs.

Step N uses slot ``N % num_slots``. Per slot: pinned host inputs -> (H2D stream) device inputs ->
(compute stream) graph replay or eager forward + sampling -> device tokens -> (D2H stream) pinned host
tokens. Events order the streams and guard slot reuse:
- the host refills a slot's pinned inputs only after that slot's last H2D copy finished;
- the H2D stream overwrites a slot's device inputs only after the compute that read them finished;
- the compute stream overwrites a slot's device outputs only after the D2H copy that read them finished;
- the host blocks only in ``fetch``, on the D2H event of the step whose tokens it needs.
Carry-over: a decode's input token produced by step N-1 is gathered on the device from the other slot's
output buffer, inside the graph. Decode-only steps replay a graph captured per (slot, batch bucket,
sampling variant). Steps with new prompts or prefill chunks run eagerly on the compute stream, or,
where a token bucket's eager runs were bound by their launch (small models), replay a graph of that
bucket (``cuda_slots.mixed_shape``: its tokens, and as many sequence rows, up to ``max_num_seqs``;
mixed_graphs.py). Graphs are captured on demand (``capture_after``, graph_capture.py): a key's first
uses run eagerly at the bucket's shape and bounds, the very computation the graph replays, and the next
use captures it (cheaply: it only records, the eager runs were its warm-up); a token bucket's key also waits
for the bucket's verdict. A run then pays only for the buckets it uses often, and its first token waits for no
capture (capturing every greedy graph of a small model up front was a large part of its start-up).
``capture_after=0`` captures a decode key on first use, and ``capture_all`` every decode key up front (tensor
parallelism: every rank captures together; it has no mixed graphs).
A masked step (structured output) runs as two parts on the compute stream, each a graph for decode
steps: ``launch`` enqueues its forward into a logits buffer; ``sample`` copies the token masks the engine
filled meanwhile (H2D stream) and enqueues the sampling behind that copy. The engine calls ``sample``
before it launches the next step, so the compute stream always runs forward, sampling, forward, ...:
one logits buffer serves both slots.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import NamedTuple

import torch

from batchgen.engine.admission import StepCosts
from batchgen.engine.batch import StepInputs
from batchgen.engine.cuda_slots import (
    SAMPLE_FIELDS,
    Shape,
    Slot,
    decode_buckets,
    fill_host,
    step_layout,
    verify_buckets,
)
from batchgen.engine.graph_capture import GraphCaptures
from batchgen.engine.idle_gaps import IdleGaps
from batchgen.engine.mixed_graphs import MixedGraphs, bucket_for, token_buckets
from batchgen.engine.row_tokens import RowTokens, ready_row_tokens
from batchgen.engine.runner import Sampler, apply_carry_over, full_vocab, with_prompt_rows
from batchgen.engine.runner_protocol import Runner, StepResult
from batchgen.engine.sampler import PromptScores, SamplingTensors, sample, score_prompt
from batchgen.engine.step_sampling import SamplingFeatures
from batchgen.model.backends import KernelBackend, PagedContext
from batchgen.model.forward import ModelForward


class CudaHandle(NamedTuple):
    step_id: int
    slot: int
    samples: int
    features: SamplingFeatures
    masked: bool = False  # sampled by ``sample``, after ``launch``
    shape: Shape | None = None
    bucket: int = 0  # > 0: graphs of this bucket: decode rows, or tokens when ``mixed``
    replayed: bool = False  # a graph ran it (else an eager forward)
    launch_ms: float = 0.0  # host time ``launch`` took
    mixed: bool = False  # new prompts or prefill chunks, padded to a token bucket
    captured: bool = False  # its launch captured a graph: its times are not a step's
    prompt: PromptScores | None = None  # its scored prompt positions (an eager step)
    verify: bool = False  # a verify step (engine/speculative) padded to a token bucket


class CudaRunner(GraphCaptures, Runner):
    tells_waits = True  # ``ready`` asks the step's event

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
        capture_after: int = 0,
        mixed_graphs: bool | None = None,
        vocab_size: int = 0,  # the logits' width: the size of the per-row statistics (RowTokens)
        max_samples: int = 0,  # sampled rows a step may have, when more than max_num_seqs (verify steps)
    ) -> None:
        self.forward, self.kv_caches, self.backend, self.device = forward, kv_caches, backend, device
        self.sampler = sampler
        self.vocab_size = vocab_size
        self.row_tokens: RowTokens | None = None  # made by the first step (or capture) that reads them
        self.max_model_len = max_model_len
        max_blocks = -(-max_model_len // block_size)
        max_tokens = max(max_batch_tokens, max_num_seqs)
        # Verify steps (engine/speculative) pad to a token bucket, each token a sample: as many sample rows
        self.verify_buckets = verify_buckets(max_tokens, max_samples) if cuda_graphs and max_samples else []
        max_samples = max([max_samples, *self.verify_buckets])
        self.slots = [
            Slot(device, max_tokens, max_num_seqs, max_blocks, max_samples) for _ in range(num_slots)
        ]
        self.h2d, self.compute, self.d2h = (torch.cuda.Stream(device) for _ in range(3))
        self.buckets = decode_buckets(max_num_seqs) if cuda_graphs else []
        # Steps with new prompts: graphs per token bucket where measured host-bound (None), always, never.
        self.mixed = MixedGraphs(token_buckets(max_tokens) if cuda_graphs else [], mixed_graphs)
        # (slot, bucket, part, SamplingFeatures) -> graph; part: "step" (forward + sampling), "mixed" (the
        # same, padded to a token bucket), or a masked step's "logits" and "sample" (_run)
        self.graphs: dict[tuple[int, int, str, SamplingFeatures], torch.cuda.CUDAGraph] = {}
        self.capture_after = capture_after  # eager uses of a key before its graph is captured
        self._eager_uses: dict[tuple[int, int, str, SamplingFeatures], int] = {}
        self.padded_steps = 0  # steps whose own key was not captured, replayed in a larger bucket's graph
        self._logits: torch.Tensor | None = None  # [max_seqs, V / K] float32: a masked step's logits
        self.pool = torch.cuda.graph_pool_handle() if cuda_graphs else None
        self.gpu_busy_s = 0.0
        self.prep_s = 0.0
        self.replay_s = 0.0  # of prep_s: inside graph.replay() (the driver's launch of the graph's kernels)
        self.graph_memory: dict[str, int] = {}
        self.idle = IdleGaps()  # the compute stream's gaps between steps, by the kind of step that waited
        self.step_costs = StepCosts()  # eager launches against graph replays: when new rows join (engine)
        # Tensor parallelism: raises when another rank died, so a wait on work that waits for a
        # collective with that rank fails instead of hanging.
        self.check_alive: Callable[[], None] | None = None

    # --- per step ---------------------------------------------------------------------------------

    @torch.inference_mode()
    def launch(self, inputs: StepInputs) -> CudaHandle:
        t0 = time.perf_counter()
        slot_id = inputs.step_id % len(self.slots)
        slot = self.slots[slot_id]
        bucket, part, shape, bounds = step_layout(
            inputs, self.buckets, self.mixed.bucket, self.slots[0].max_seqs, self.max_model_len,
            self._verify_bucket,
        )  # fmt: skip
        features = inputs.features
        if inputs.row_inits or features.stateful:
            self._ready_row_tokens(inputs.rows_capacity)  # before a graph that reads them is chosen
        graphs = len(self.graphs)
        graph = self._graph(slot_id, bucket, part, features) if bucket else None
        if graph is None and bucket and (padded := self._padded(slot_id, bucket, part, features)):
            (bucket, part, shape, bounds), graph = padded
            self.padded_steps += 1
        self._wait(slot.h2d_done)  # the pinned inputs of this slot's last step are on the device
        views = slot.views(shape)
        fill_host(views.host, inputs)
        self._copy_inputs(slot, views.nbytes)
        with torch.cuda.stream(self.compute):
            self.compute.wait_event(slot.h2d_done)
            self.compute.wait_event(slot.d2h_done)  # its previous tokens were copied out
            self._init_rows(inputs)
            slot.compute_start.record(self.compute)
            self.idle.start(inputs.step_id, self.compute)
            prompt = None
            if graph is not None:
                t1 = time.perf_counter()
                graph.replay()
                self.replay_s += time.perf_counter() - t1
            else:  # a bucket not captured yet runs as its graph would (same shape and bounds)
                prompt = self._run(part, slot_id, shape, features, bounds, inputs)
            (slot.logits_done if inputs.masked else slot.compute_done).record(self.compute)
            self.idle.end(inputs.step_id, self.compute)
        if not inputs.masked:
            self._copy_outputs(slot, shape.samples, features)
        took = time.perf_counter() - t0
        self.prep_s += took
        samples, masked = len(inputs.logits_indices), inputs.masked
        return CudaHandle(
            inputs.step_id, slot_id, samples, features, masked, shape, bucket, graph is not None,
            1e3 * took, part == "mixed", len(self.graphs) > graphs, prompt, part == "verify",
        )  # fmt: skip

    def _verify_bucket(self, num_tokens: int) -> int:
        """The token bucket a verify step of ``num_tokens`` pads to (0: eager at its own shape)."""
        return bucket_for(self.verify_buckets, num_tokens)

    def _init_rows(self, inputs: StepInputs) -> None:
        """Rebuild the device statistics of the rows the step's new requests took (on the compute stream:
        after every earlier step's updates of those rows)."""
        if inputs.row_inits:
            self.row_tokens.init(inputs.row_inits)

    def _ready_row_tokens(self, capacity: int = 0) -> RowTokens:
        """The per-row statistics for ``capacity`` rows of the persistent batch (at least max_num_seqs),
        made or grown on the compute stream, after the steps that update them; graphs captured on
        statistics that grew are dropped (they are captured again on their next use)."""
        with torch.cuda.stream(self.compute):
            current = ready_row_tokens(
                self.row_tokens, max(capacity, self.slots[0].max_seqs), self.vocab_size, self.device
            )
        if self.row_tokens is not None and current is not self.row_tokens:
            self.graphs = {key: graph for key, graph in self.graphs.items() if not key[3].stateful}
            # A pool whose graphs are all gone is released, and capturing into its handle again fails
            # an allocator assertion: later captures take a new pool (the old one lives on with the
            # graphs that remain, if any).
            self.pool = torch.cuda.graph_pool_handle()
        self.row_tokens = current
        return current

    def mask_buffer(self, handle: CudaHandle, width: int) -> torch.Tensor:
        """Where the engine writes a masked step's token bitmask: [S, width] int32, pinned host memory."""
        slot = self.slots[handle.slot]
        slot.mask_buffers(width)
        self._wait(slot.mask_ready)  # this slot's previous masks are on the device
        return slot.mask_host[: handle.samples]

    @torch.inference_mode()
    def sample(self, handle: CudaHandle) -> None:
        """Enqueue a masked step's sampling behind the copy of its masks (``mask_buffer``)."""
        t0 = time.perf_counter()
        slot, rows = self.slots[handle.slot], handle.shape.samples
        graph = self._graph(handle.slot, handle.bucket, "sample", handle.features) if handle.bucket else None
        slot.mask_host[handle.samples : rows] = -1  # graph padding rows: unconstrained
        with torch.cuda.stream(self.h2d):
            self.h2d.wait_event(slot.compute_done)  # the last sampling that read this slot's masks
            slot.mask_dev[:rows].copy_(slot.mask_host[:rows], non_blocking=True)
            slot.mask_ready.record(self.h2d)
        with torch.cuda.stream(self.compute):
            self.compute.wait_event(slot.mask_ready)
            slot.sample_start.record(self.compute)
            if graph is not None:
                graph.replay()
            else:
                self._run("sample", handle.slot, handle.shape, handle.features, (1, 1, 0))
            slot.compute_done.record(self.compute)
            self.idle.end(handle.step_id, self.compute)
        self._copy_outputs(slot, handle.samples, handle.features)
        self.prep_s += time.perf_counter() - t0

    def reset(self) -> None:
        """Nothing to forget: carry-over reads the other slot's outputs, and a fresh stream's first
        step carries nothing over."""

    def warming(self, handle: CudaHandle) -> bool:
        """A graph key's eager use before its capture, or the capture itself."""
        return handle.captured or (handle.bucket > 0 and not handle.replayed)

    def ready(self, handle: CudaHandle) -> bool:
        """Whether ``fetch(handle)`` would return without waiting for the device."""
        return bool(self.slots[handle.slot].d2h_done.query())

    def fetch(self, handle: CudaHandle) -> StepResult:
        slot = self.slots[handle.slot]
        self._wait(slot.d2h_done)
        if handle.masked:
            busy = slot.compute_start.elapsed_time(slot.logits_done)
            busy += slot.sample_start.elapsed_time(slot.compute_done)
        else:
            busy = slot.compute_start.elapsed_time(slot.compute_done)
        self.gpu_busy_s += busy / 1000.0
        decode = handle.bucket > 0 and not handle.mixed
        kind = "verify" if handle.verify else "graph" if decode else "mixed" if handle.replayed else "eager"
        gap = self.idle.fetched(handle.step_id, kind, handle.samples, busy)
        if not handle.masked and not handle.captured and not handle.verify:
            self._measured(handle, kind, busy, gap)
        outputs = (
            out[: handle.samples].tolist() if copied else None
            for out, copied in zip(slot.host_outputs, _outputs_of(handle.features), strict=True)
        )
        prompt = (
            None if handle.prompt is None else tuple(t.tolist() for t in handle.prompt)
        )  # done: d2h waited
        return StepResult(handle.step_id, *outputs, prompt)

    def _measured(self, handle: CudaHandle, kind: str, busy_ms: float, gap_ms: float) -> None:
        """What a step cost, for the price of new rows (admission.py) and the mixed graphs' choice."""
        if kind == "mixed":
            self.step_costs.mixed(busy_ms + gap_ms)
            self.mixed.replayed(handle.bucket, busy_ms)
        elif kind == "eager":  # new prompts or their chunks
            self.step_costs.eager(handle.launch_ms, busy_ms)
            if handle.mixed:  # a token bucket's use before its capture: is it bound by the launch?
                self.mixed.ran_eager(handle.bucket, handle.launch_ms, busy_ms)
        elif handle.replayed:
            self.step_costs.graph(busy_ms + gap_ms)

    def _wait(self, work: torch.cuda.Event | torch.cuda.Stream) -> None:
        if work.query():  # done (the usual case): synchronize would give up the GIL for nothing
            return
        if self.check_alive is None:
            work.synchronize()
            return
        while not work.query():
            self.check_alive()
            time.sleep(20e-6)

    def _copy_inputs(self, slot: Slot, nbytes: int) -> None:
        """The step's packed inputs in one copy (cuda_slots.py)."""
        with torch.cuda.stream(self.h2d):
            self.h2d.wait_event(slot.compute_done)  # the last compute that read these device inputs
            slot.dev_bytes[:nbytes].copy_(slot.host_bytes[:nbytes], non_blocking=True)
            slot.h2d_done.record(self.h2d)

    def _copy_outputs(self, slot: Slot, samples: int, features: SamplingFeatures) -> None:
        with torch.cuda.stream(self.d2h):
            self.d2h.wait_event(slot.compute_done)
            for out, host, copied in zip(slot.outputs, slot.host_outputs, _outputs_of(features), strict=True):
                if copied:
                    host[:samples].copy_(out[:samples], non_blocking=True)
            slot.d2h_done.record(self.d2h)

    # --- the step body: eager or captured ---------------------------------------------------------

    def _run(
        self, part: str, slot_id: int, shape: Shape, features: SamplingFeatures, bounds: tuple[int, int, int],
        inputs: StepInputs | None = None,
    ) -> PromptScores | None:  # fmt: skip
        """A step's device work from the slot's buffers into its output buffers (no host sync). part:
        "step" (or "mixed": new prompts, padded to a token bucket) = forward + sampling; a masked step's
        "logits" = the forward into the logits buffer, then its "sample" = sampling those logits under the
        slot's token masks. An eager step's ``inputs`` may ask for prompt positions' scores: returned."""
        slot, samples = self.slots[slot_id], shape.samples
        mask = prompt = None
        if part == "sample":
            logits, mask = self._logits[:samples], slot.mask_dev[:samples]
        else:
            kept, targets = with_prompt_rows(slot.views(shape).dev["logits_indices"], inputs)
            logits = self._model_logits(slot_id, shape, bounds, kept)  # [S (+ P), V / K]
            if targets is not None:
                prompt = score_prompt(full_vocab(self.sampler)(logits[samples:]), targets)
                logits = logits[:samples]
            if part == "logits":
                if self._logits is None:  # first met outside any capture (warm-up runs come first)
                    self._logits = torch.empty((slot.max_seqs, logits.shape[1]), device=self.device)
                self._logits[:samples].copy_(logits)
                return prompt
        dev = slot.views(shape).dev
        row_tokens = self._ready_row_tokens() if features.stateful else None
        params = SamplingTensors(*(dev[n] for n in SAMPLE_FIELDS[1:]), token_mask=mask, row_tokens=row_tokens)
        for out, value in zip(slot.outputs, self.sampler(logits, params, features), strict=True):
            if value is not None:
                out[:samples].copy_(value)
        return prompt

    def _model_logits(
        self, slot_id: int, shape: Shape, bounds: tuple[int, int, int], kept: torch.Tensor
    ) -> torch.Tensor:
        slot, other = self.slots[slot_id], self.slots[(slot_id - 1) % len(self.slots)]
        dev = slot.views(shape).dev  # each field holds exactly its rows for this shape
        max_q_len, max_seq_len, decodes = bounds
        cu = dev["cu_seqlens_q"]
        ctx = PagedContext(
            self.kv_caches, dev["slot_mapping"], cu, dev["seq_lens"], dev["block_tables"], max_q_len,
            max_seq_len, self.backend, decodes, cu[decodes:] - decodes if decodes else None,
        )  # fmt: skip
        ids = apply_carry_over(dev["input_ids"], dev["carry_rows"], other.out_tokens)
        return self.forward(ids, dev["positions"], kept, ctx)


def _outputs_of(features: SamplingFeatures) -> tuple[bool, bool, bool, bool]:
    """Which of the sampler's outputs (sampler.SampleOutput) a step of ``features`` has."""
    return True, features.logprobs, features.top_logprobs, features.top_logprobs
