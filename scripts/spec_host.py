"""The host's share of a verify step (engine/speculative): the engine over a runner that computes nothing.

The runner's "model" walks cycles of 64 token ids (each prompt is such a walk, so prompt lookup follows
it; every 97th position, counted from a point of the row's own, skips ahead in the cycle, so some guesses
are rejected; ``--preamble N``: in each row's first N tokens every other position skips, so prompt lookup
guesses there and fails, as in an answer's opening, which copies little of its prompt), so what is timed
is the engine's own work a step: postprocessing the verified rows, proposing, scheduling, building the
step.
``--device-ms`` adds a simulated device's time a step: the asynchronous loop then overlaps the host's work
with it, verify steps included (they chain: engine/speculative/accept.py).

    python scripts/spec_host.py --rows 32 --new-tokens 512 [--k 4] [--profile]
    python scripts/spec_host.py --device-ms 1.0 1.3 0.0005   (plain, always and the adaptive policy)
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import time

import numpy as np

from batchgen.config import SamplingParams
from batchgen.engine.block_manager import BlockManager
from batchgen.engine.completions import GenerationRequest
from batchgen.engine.engine import Engine
from batchgen.engine.runner_protocol import Runner, StepResult
from batchgen.engine.scheduler import Scheduler
from batchgen.engine.speculative.speculator import Speculator
from batchgen.engine.stops import StopChecker

VOCAB, EOS, CYCLE, PROMPT = 4096, 2, 64, 200


def _next(token: np.ndarray, step: int | np.ndarray = 1) -> np.ndarray:
    """The token ``step`` after ``token`` in its cycle of CYCLE ids."""
    return token - token % CYCLE + (token + step) % CYCLE


class CycleRunner(Runner):
    """Next token = the next one in the input token's cycle; at every ``break_every``-th position the fifth.
    ``device_ms`` (decode, verify, a prompt token): a simulated device that runs the steps one after another,
    each taking that long, so ``fetch`` waits as it would for a GPU and the asynchronous loop overlaps the
    host's work with the step in flight (what the speculation policy meets on a GPU)."""

    def __init__(
        self, device_ms: tuple[float, float, float] | None = None, break_every: int = 97, preamble: int = 0
    ) -> None:
        self.break_every = break_every
        self.preamble = PROMPT + preamble  # every other position before it skips: an answer's opening
        self._prev: np.ndarray | None = None
        self.device_ms = device_ms
        self._free_at = 0.0  # when the simulated device finishes its last queued step
        self.tells_waits = device_ms is not None

    def _queue(self, inputs) -> float:
        """When the step ends on the simulated device (0: no device)."""
        if self.device_ms is None:
            return 0.0
        decode, verify, per_prompt_token = self.device_ms
        rows = len(inputs.seq_lens)
        cost = verify if len(inputs.logits_indices) > rows else decode
        cost += per_prompt_token * max(0, inputs.num_tokens - len(inputs.logits_indices))
        self._free_at = max(time.perf_counter(), self._free_at) + cost / 1000
        return self._free_at

    def launch(self, inputs):
        ids = inputs.input_ids.copy()
        carried = inputs.carry_rows >= 0
        if carried.any():
            ids[carried] = self._prev[inputs.carry_rows[carried]]
        rows = inputs.logits_indices
        token, pos = ids[rows], inputs.positions[rows]
        phase = token // CYCLE  # each row's walk stays in its own cycle: rows break at different steps
        if not self.break_every:  # text that copies nothing: prompt lookup finds no guess
            self._prev = (token * 7919 + pos * 104729) % (VOCAB - 3) + 3
        else:
            skip = ((pos + phase) % self.break_every == 0) | ((pos < self.preamble) & (pos % 2 == 1))
            self._prev = _next(token, np.where(skip, 5, 1))
        return inputs.step_id, self._prev.tolist(), None, self._queue(inputs)

    def ready(self, handle) -> bool:
        return time.perf_counter() >= handle[3]

    def fetch(self, handle) -> StepResult:
        while (left := handle[3] - time.perf_counter()) > 0:
            time.sleep(left)
        return StepResult(*handle[:3])

    def reset(self) -> None:
        self._prev = None


class _Tokens:
    """Detokenizing is not timed: the engine's stop checks need only ``decode``."""

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return ""


def run(
    rows: int, new_tokens: int, k: int | None, adaptive: bool = False, device_ms=None,
    staggered: bool = False, break_every: int = 97, preamble: int = 0,
) -> dict:  # fmt: skip
    blocks = BlockManager(rows * (new_tokens + 256) // 16 + 64, block_size=16)
    scheduler = Scheduler(blocks, rows, 8192)
    speculator = Speculator("ngram", k, 2, 4, adaptive=adaptive) if k else None
    runner = CycleRunner(device_ms, break_every, preamble)
    engine = Engine(runner, blocks, scheduler, StopChecker(_Tokens(), {EOS}), 1 << 16, True,
                    speculator=speculator)  # fmt: skip
    rng = np.random.default_rng(1)
    requests = []
    for i in range(rows):  # staggered: row i stops after (i + 1) / rows of the tokens, as EOS would
        length = new_tokens * (i + 1) // rows if staggered else new_tokens
        params = SamplingParams(max_new_tokens=length, ignore_eos=True)
        walk = [int(rng.integers(3, VOCAB))]
        while len(walk) < PROMPT:
            walk.append(int(_next(np.int64(walk[-1]))))
        requests.append(GenerationRequest(i, walk, params))
    t0 = time.perf_counter()
    for _ in engine.stream(requests):
        pass
    wall = time.perf_counter() - t0
    s = engine.stats
    return {
        "kind": ("adaptive " if adaptive else "") + (f"k={k}" if k else "plain"),
        "tok_per_s": round(s.output_tokens / wall),
        "steps": s.steps,
        "output_tokens": s.output_tokens,
        "host_ms_per_step": round(1000 * wall / s.steps, 3),
        "host_us_per_token": round(1e6 * wall / s.output_tokens, 2),
        "acceptance_rate": s.acceptance_rate,
        # of a step: proposing + scheduling + building it, and taking its tokens
        "schedule_ms": round(1000 * s.schedule_s / s.steps, 3),
        "postprocess_ms": round(1000 * s.postprocess_s / s.steps, 3),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=512)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--staggered", action="store_true", help="rows end one by one (the width shrinks)")
    ap.add_argument(
        "--break-every",
        type=int,
        default=97,
        help="positions where the cycle skips: guesses fail (0: random text, no guess at all, as B2's)",
    )
    ap.add_argument(
        "--preamble",
        type=int,
        default=0,
        help="each row's first tokens: every other one skips (guesses fail)",
    )
    ap.add_argument(
        "--device-ms",
        type=float,
        nargs=3,
        metavar=("DECODE", "VERIFY", "PROMPT_TOKEN"),
        help="a simulated device's time a step (e.g. 1.0 1.3 0.0005): the policy's view of a GPU",
    )
    args = ap.parse_args()
    kinds = [(None, False), (args.k, False)] + [(args.k, True)] * (args.device_ms is not None)
    device = (args.device_ms, args.staggered, args.break_every, args.preamble)  # what the stand-in does
    for k, adaptive in kinds:
        runs = [run(args.rows, args.new_tokens, k, adaptive, *device) for _ in range(args.repeats)]
        print(json.dumps(min(runs, key=lambda r: r["host_ms_per_step"])), flush=True)
    if args.profile:
        cProfile.runctx(
            "run(args.rows, args.new_tokens, args.k)", globals(), {"args": args}, "/tmp/spec_host.prof"
        )
        pstats.Stats("/tmp/spec_host.prof").sort_stats("tottime").print_stats(20)


if __name__ == "__main__":
    main()
