"""Host (CPU) time per engine step with no model and no device: the engine loop as ``batchgen run``
drives it (pulling rows, admission, prefill chunks, schedule + batch build, postprocess, finishing and
replacing rows), with a runner that returns made-up tokens at once. What is left is the Python/numpy
work the engine does per step: the GPU waits for it when a small model's step is shorter.

    python scripts/bench_host.py [--max-num-seqs 256] [--requests 2048] [--new-tokens 256]
        [--library-heap [--frozen]]

Prints host ms per step overall and in the decode-only steady state (every row decoding), split into
schedule + build and postprocess, and the launch-side cost of packing a step's inputs into the slot's
buffer (``cuda_slots.fill_host`` into CPU tensors: no copy to a device here). With ``--library-heap``
the heap first holds what a real run's does (transformers' modules, the embedded model's tokenizer and
meta skeleton), and the garbage collector's pauses are reported; ``--frozen`` runs the loop inside
``gc_policy.frozen_heap`` as ``batchgen run`` does.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import time

import torch

from batchgen.config import SamplingParams
from batchgen.engine.block_manager import BlockManager
from batchgen.engine.engine import Engine
from batchgen.engine.outputs import GenerationRequest
from batchgen.engine.runner_protocol import Runner, StepResult
from batchgen.engine.scheduler import Scheduler
from batchgen.engine.stops import StopChecker


class NullRunner(Runner):
    """Samples token 7 for every row at once; records each step's size and the time to pack it."""

    def __init__(self, pack=None) -> None:
        self.pack = pack
        self.pack_s = 0.0
        self.sizes: list[tuple[int, bool]] = []  # (rows, decode only) per step

    def launch(self, inputs):
        self.sizes.append((len(inputs.seq_lens), inputs.decode_only))
        if self.pack is not None:
            t0 = time.perf_counter()
            self.pack(inputs)
            self.pack_s += time.perf_counter() - t0
        return inputs.step_id, len(inputs.logits_indices)

    def fetch(self, handle) -> StepResult:
        step_id, samples = handle
        return StepResult(step_id, [7] * samples, None)

    def reset(self) -> None:
        pass


def _packer(max_seqs: int, max_tokens: int, max_blocks: int):
    """The launch path's host work: the step's views of a packed buffer (CPU tensors standing in for
    the pinned and device ones) filled from its arrays; the one copy is device work, not counted."""
    from batchgen.engine import cuda_slots

    size = cuda_slots.packed_layout(cuda_slots.Shape(max_tokens, max_seqs, max_seqs), max_blocks).nbytes
    host, dev = torch.zeros(size, dtype=torch.uint8), torch.zeros(size, dtype=torch.uint8)
    views: dict = {}  # per shape, as the runner's slots keep them

    def pack(inputs) -> None:
        shape = cuda_slots.Shape(inputs.num_tokens, len(inputs.seq_lens), len(inputs.logits_indices))
        if shape not in views:
            views[shape] = cuda_slots.packed_views(host, dev, shape, max_blocks)
        cuda_slots.fill_host(views[shape].host, inputs)

    return pack


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--max-num-seqs", type=int, default=256)
    ap.add_argument("--requests", type=int, default=2048)
    ap.add_argument("--prompt-len", type=int, default=48)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--max-batch-tokens", type=int, default=8192)
    ap.add_argument("--library-heap", action="store_true", help="load what a real run holds first")
    ap.add_argument("--frozen", action="store_true", help="the loop inside gc_policy.frozen_heap")
    args = ap.parse_args()
    keep = _library_heap() if args.library_heap else None  # noqa: F841 (held for the heap's size)
    pauses = _gc_pauses()
    block_size, max_len = 16, args.prompt_len + args.new_tokens
    blocks = BlockManager(args.max_num_seqs * (max_len // block_size + 2), block_size)
    scheduler = Scheduler(blocks, args.max_num_seqs, args.max_batch_tokens)
    runner = NullRunner(_packer(args.max_num_seqs, args.max_batch_tokens, -(-max_len // block_size)))
    engine = Engine(runner, blocks, scheduler, StopChecker(None, {2}), max_len + 1, async_mode=True)
    params = SamplingParams(max_new_tokens=args.new_tokens, ignore_eos=True, temperature=0.7, top_p=0.95)
    rows = (
        GenerationRequest(i, [(i * 7919 + t) % 30000 + 3 for t in range(args.prompt_len)], params)
        for i in range(args.requests)
    )
    from batchgen.app.gc_policy import frozen_heap

    with frozen_heap() if args.frozen else contextlib.nullcontext():
        t0 = time.perf_counter()
        pauses.clear()  # frozen_heap's own collection came before the loop
        done = sum(1 for _ in engine.stream(rows, detokenize=False))
        wall = time.perf_counter() - t0
    _report(args, engine.stats, runner, done, wall)
    print(f"gc in the loop: {len(pauses)} collections, {1e3 * sum(pauses):.1f} ms in all, the longest "
          f"{1e3 * max(pauses, default=0.0):.1f} ms ({len(gc.get_objects())} objects tracked)")  # fmt: skip


def _library_heap() -> tuple:
    from batchgen.model.build import meta_skeleton
    from batchgen.model.loader import default_model_dir, load_config, load_tokenizer

    path = str(default_model_dir())
    return load_tokenizer(path), meta_skeleton(load_config(path))


def _gc_pauses() -> list[float]:
    """Seconds of each collection from now on (``gc.callbacks``)."""
    pauses: list[float] = []
    started = [0.0]

    def on_gc(phase: str, info: dict) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            pauses.append(time.perf_counter() - started[0])

    gc.callbacks.append(on_gc)
    return pauses


def _report(args, stats, runner: NullRunner, done: int, wall: float) -> None:
    steps = stats.steps
    full = sum(1 for rows, decode in runner.sizes if decode and rows == args.max_num_seqs)
    sched, post = 1e3 * stats.schedule_s / steps, 1e3 * stats.postprocess_s / steps
    print(
        f"{done} rows x {args.new_tokens} tokens, max {args.max_num_seqs} rows: {steps} steps "
        f"({full} decode-only at {args.max_num_seqs} rows), {1e3 * wall / steps:.3f} ms/step in all: "
        f"schedule + build {sched:.3f}, postprocess {post:.3f}, pack inputs "
        f"{1e3 * runner.pack_s / steps:.3f}, the rest of the loop "
        f"{1e3 * wall / steps - sched - post - 1e3 * runner.pack_s / steps:.3f}; "
        f"{done * args.new_tokens / wall / 1e3:.0f}k tok/s host-bound"
    )
    assert stats.output_tokens == done * args.new_tokens, "tokens lost"


if __name__ == "__main__":
    main()
