"""Host (CPU) cost of one decode step at N running requests: schedule + batch build + postprocess.

No model and no device: the sampled tokens are made up, so this isolates the Python/numpy work the
engine does per step. Usage: python scripts/bench_host.py [--requests 256] [--steps 200]
"""

from __future__ import annotations

import argparse
import time

from batchgen.config import SamplingParams
from batchgen.engine.batch import build_step
from batchgen.engine.block_manager import BlockManager
from batchgen.engine.request import Request
from batchgen.engine.scheduler import Scheduler
from batchgen.engine.stops import StopChecker


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--prompt-len", type=int, default=512)
    args = parser.parse_args()
    block_size = 16
    blocks = BlockManager(args.requests * (args.prompt_len + args.steps + 32) // block_size, block_size)
    scheduler = Scheduler(blocks, max_num_seqs=args.requests, max_batch_tokens=1 << 20)
    params = SamplingParams(max_new_tokens=10_000, temperature=0.7, top_p=0.9)
    stops = StopChecker(tokenizer=None, eos_ids={2})
    for i in range(args.requests):
        prompt = [(i * 7919 + t) % 30000 + 3 for t in range(args.prompt_len)]
        scheduler.add(Request(i, i, 0, None, params, prompt, args.prompt_len, 10_000, i))
    _one_step(scheduler, stops, block_size)  # the prefill step
    timings = {"schedule": 0.0, "build": 0.0, "postprocess": 0.0}
    for _ in range(args.steps):
        for name, seconds in _one_step(scheduler, stops, block_size).items():
            timings[name] += seconds
    total = sum(timings.values())
    parts = ", ".join(f"{k} {1e3 * v / args.steps:.3f} ms" for k, v in timings.items())
    print(f"{args.requests} decoding requests: {1e3 * total / args.steps:.3f} ms/step host time ({parts})")


def _one_step(scheduler: Scheduler, stops: StopChecker, block_size: int) -> dict[str, float]:
    t0 = time.perf_counter()
    step = scheduler.schedule()
    t1 = time.perf_counter()
    build_step(step, block_size)
    t2 = time.perf_counter()
    for item in step.items:  # what Engine._postprocess does per sampled row, with a made-up token
        req = item.request
        req.num_pending -= 1
        req.tokens.append(5)
        stops.check(req)
    t3 = time.perf_counter()
    return {"schedule": t1 - t0, "build": t2 - t1, "postprocess": t3 - t2}


if __name__ == "__main__":
    main()
