"""Capturing the CUDA runner's graphs (engine/cuda_runner.py): on demand after a key's eager uses, or
all decode graphs up front (tensor parallelism, the bench).

A graph's key is (slot, bucket, part, SamplingFeatures): part "step" is a decode step of
``bucket`` rows, "mixed" a step with new prompts padded to ``bucket`` tokens (mixed_graphs.py), "verify"
a speculative verify step padded to ``bucket`` tokens, each a sample, "logits" and "sample" a masked
step's two parts. Replays read whatever the slot's buffers hold, at the layout of
the key's shape, so a graph serves every step of its key.
"""

from __future__ import annotations

import bisect
import contextlib

import torch

from batchgen.engine.cuda_slots import Layout, graph_layout, reset_inputs
from batchgen.engine.step_sampling import GREEDY, SamplingFeatures

# Device bytes free below which a mid-run capture first empties the allocator's cache (a capture cannot
# reuse or release the cached blocks of the default pool): 1 GiB for a decode graph (sampling over a
# 150k vocabulary for 512 rows takes ~1 GB), and per 2048 tokens of a mixed graph (its activations).
CAPTURE_ROOM = 1 << 30
ROOM_TOKENS = 2048
VERIFY_CAPTURE_AFTER = 1  # eager uses of a verify key before its capture (see _eager_before_capture)
# A key not captured yet runs padded in a captured graph of the same part up to twice its bucket, and a
# decode step in any of up to this many rows: a decode step of that many rows costs about what one of a
# few rows does (both read every weight once), an eager one a kernel launch per op.
PADDED_DECODE_ROWS = 256


class GraphCaptures:
    """The capture half of ``CudaRunner`` (a mixin): it reads the runner's ``graphs``, ``_eager_uses``,
    ``capture_after``, ``mixed``, ``pool``, ``device``, streams, ``slots``, ``buckets``, ``max_model_len``
    and ``graph_memory``, and calls its ``_run`` and ``_wait``."""

    def _graph(
        self, slot_id: int, bucket: int, part: str, features: SamplingFeatures
    ) -> torch.cuda.CUDAGraph | None:
        """This key's graph, captured on its first use after ``capture_after`` eager ones; a token
        bucket's ("mixed") also waits until its eager runs showed a launch-bound step (None until then:
        the caller runs the part eagerly)."""
        key = _key(slot_id, bucket, part, features)
        graph = self.graphs.get(key)
        if graph is None:
            uses = self._eager_uses[key] = self._eager_uses.get(key, 0) + 1
            if uses > self._eager_before_capture(part) and (
                part != "mixed" or self.mixed.may_capture(bucket)
            ):
                self._room_for_capture(bucket if part in ("mixed", "verify") else 0)
                graph = self.graphs[key] = self._capture(slot_id, bucket, part, key[3], warm=uses == 1)
        return graph

    def _padded(
        self, slot_id: int, bucket: int, part: str, features: SamplingFeatures
    ) -> tuple[Layout, torch.cuda.CUDAGraph] | None:
        """A captured graph of a larger bucket, and its layout, for a decode or verify step whose own key
        runs eagerly still (None: none close enough). The rows or tokens past the step's are padding, as
        in any bucket; rows that pass through widths a few steps each (a batch whose rows finish apart)
        then replay graphs instead of running eagerly and capturing one per width."""
        if part not in ("step", "verify"):
            return None
        buckets = self.buckets if part == "step" else self.verify_buckets
        limit = max(2 * bucket, PADDED_DECODE_ROWS if part == "step" else 0)
        for larger in buckets[bisect.bisect_right(buckets, bucket) :]:
            if larger > limit:
                break
            graph = self.graphs.get(_key(slot_id, larger, part, features))
            if graph is not None:
                return graph_layout(larger, part, self.slots[0].max_seqs, self.max_model_len), graph
        return None

    def _eager_before_capture(self, part: str) -> int:
        """A verify key is captured after one eager use: each eager verify step is a whole model's
        launches for K+1 tokens a row, and the speculation policy probes a verify kind in a few steps,
        which eager uses would fill (and it does not time them)."""
        return min(self.capture_after, VERIFY_CAPTURE_AFTER) if part == "verify" else self.capture_after

    def _room_for_capture(self, tokens: int) -> None:
        """A capture cannot hand the allocator's cached blocks back to the driver (no cudaFree while
        capturing): mid-run, after prefills filled that cache, release it first when the device is
        nearly full, or the graph's pool could fail where an up-front capture fits. ``tokens``: a mixed
        graph's bucket (0 for a decode graph)."""
        free, _ = torch.cuda.mem_get_info(self.device)
        if free < CAPTURE_ROOM * max(1, -(-tokens // ROOM_TOKENS)):
            torch.cuda.empty_cache()

    def _capture(
        self, slot_id: int, bucket: int, part: str, features: SamplingFeatures, warm: bool = True
    ) -> torch.cuda.CUDAGraph:
        """Capture one part of a step of ``bucket`` (``cuda_slots.graph_layout``); replays read whatever
        the slot buffers hold. ``warm`` (``capture_all``, a first use): run it twice first, as if nothing
        ran this key's shape yet."""
        _, _, shape, bounds = graph_layout(bucket, part, self.slots[0].max_seqs, self.max_model_len)
        graph, run = torch.cuda.CUDAGraph(), (part, slot_id, shape, features, bounds)
        with torch.cuda.stream(self.compute):
            if not warm:
                # After the key's eager runs (kernels compiled, cuBLAS's workspace made) a capture only
                # records: no device sync, no emptied allocator cache (``torch.cuda.graph`` does both:
                # the next eager steps would pay cudaMalloc again), and the queued steps keep the GPU
                # busy meanwhile. Thread-local: only this thread's calls are checked against the capture.
                graph.capture_begin(pool=self.pool, capture_error_mode="thread_local")
                try:
                    self._run(*run)
                except BaseException:
                    with contextlib.suppress(Exception):  # the capture's own error would hide the cause
                        graph.capture_end()
                    raise
                graph.capture_end()
                return graph
            # Warm-up runs (JIT compiles, allocator settles) happen eagerly, outside the capture, on
            # all-padding inputs: stale inputs of an earlier step would rewrite its KV slots. A sampling
            # part is captured between its step's two parts: it writes no KV, and its inputs are live.
            self.compute.wait_stream(torch.cuda.current_stream(self.device))
            self.compute.wait_stream(self.h2d)
            self.compute.wait_event(self.slots[slot_id].d2h_done)  # its last tokens were copied out
            if part != "sample":
                reset_inputs(self.slots[slot_id].views(shape))
            for _ in range(2):
                self._run(*run)
            with torch.cuda.graph(graph, pool=self.pool, stream=self.compute):
                self._run(*run)
        self._wait(self.compute)  # the reset and warm-up runs are done before the step's inputs land
        return graph

    @torch.inference_mode()
    def capture_all(
        self, features: SamplingFeatures = GREEDY, progress: bool = True,
        mask_width: int | None = None,
    ) -> None:  # fmt: skip
        """Capture every (slot, bucket) decode graph of one sampling variant up front (those already
        captured are kept); with ``mask_width``, the two parts of masked steps instead. The first call
        records what the graphs cost in memory."""
        from tqdm import tqdm

        parts = ("logits", "sample") if mask_width else ("step",)
        if mask_width:
            for slot in self.slots:
                slot.mask_buffers(mask_width)
        keys = [(s, b, p) for p in parts for s in range(len(self.slots)) for b in reversed(self.buckets)]
        keys = [k for k in keys if _key(*k, features) not in self.graphs]
        first = not self.graph_memory
        # A warm capture empties the allocator's cache first (``torch.cuda.graph``): do it now, or blocks
        # freed earlier (weights replaced by merged copies, say) would vanish from the baseline and make
        # the cost negative.
        torch.cuda.empty_cache()
        base = torch.cuda.memory_reserved(self.device)
        for slot_id, bucket, part in tqdm(
            keys, desc="capturing CUDA graphs", disable=not progress, leave=False
        ):
            key = _key(slot_id, bucket, part, features)
            self.graphs[key] = self._capture(slot_id, bucket, part, key[3])
            if first and slot_id == 0 and bucket == self.buckets[0]:
                self.graph_memory["one_slot"] = torch.cuda.memory_reserved(self.device) - base
        if first:
            self.graph_memory["all_slots"] = torch.cuda.memory_reserved(self.device) - base


def _key(slot_id: int, bucket: int, part: str, features: SamplingFeatures) -> tuple:
    """A graph's key: a masked step's forward ("logits") is the same whatever its sampling variant."""
    return (slot_id, bucket, part, GREEDY if part == "logits" else features)
