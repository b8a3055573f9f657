"""The scheduler tests' engine harness: random rows, a model stand-in that records every step's arrays, and
the cases (cache size, row limit, token budget) that one engine run is driven through."""

from __future__ import annotations

import numpy as np

from batchgen.config import SamplingParams
from batchgen.engine.block_manager import BlockManager
from batchgen.engine.completions import GenerationRequest
from batchgen.engine.engine import Engine
from batchgen.engine.runner_protocol import Runner, StepResult
from batchgen.engine.scheduler import Scheduler
from batchgen.engine.stops import StopChecker

VOCAB, EOS = 50, 2


class Letters:
    """A tokenizer stand-in for stop strings: token t decodes to one letter."""

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(chr(97 + t % 26) for t in ids)


class Recorder(Runner):
    """Samples a token from the step's inputs (carry-over applied as the device does), records every
    step's arrays, and checks that the persistent batch agrees with its running requests."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        self.steps: list[dict[str, np.ndarray]] = []
        self._prev: np.ndarray | None = None

    def launch(self, inputs):
        rows = self.scheduler.rows
        for req in self.scheduler.running:
            row, table = req.row, req.block_table
            assert (rows.owner[row], rows.known[row]) == (req.request_id, len(req.tokens))
            assert rows.synced[row] == len(table) and rows.tables[row, : len(table)].tolist() == table
        ids = inputs.input_ids.copy()
        carried = inputs.carry_rows >= 0
        if carried.any():
            ids[carried] = self._prev[inputs.carry_rows[carried]]
        self.steps.append(
            {k: v.copy() if isinstance(v, np.ndarray) else v for k, v in inputs._asdict().items()}
        )
        tokens = self.tokens(inputs, ids)
        self._prev = tokens
        logprobs = (-tokens / VOCAB).tolist() if inputs.features.logprobs else None
        return inputs.step_id, tokens.tolist(), logprobs

    def tokens(self, inputs, ids: np.ndarray) -> np.ndarray:
        """[S] the step's sampled tokens, from its input ids (carry-over applied) and sampling rows."""
        rows = inputs.logits_indices
        mix = ids[rows] * 31 + inputs.positions[rows] * 7
        mix = mix + inputs.rng_keys % 97 + inputs.rng_steps * 13 + (inputs.temperature * 10).astype(np.int64)
        return mix % VOCAB

    def fetch(self, handle) -> StepResult:
        return StepResult(*handle)

    def reset(self) -> None:
        self._prev = None


def random_rows(count: int, seed: int, twins: bool) -> list[GenerationRequest]:
    """Random rows; with ``twins`` rows come in greedy pairs of one prompt, whose outputs fill blocks
    of the same content (one registered, one found in the prefix cache)."""
    rng = np.random.default_rng(seed)
    shared = rng.integers(3, VOCAB, 20).tolist()  # a system prompt: prefix-cache hits
    rows, own = [], []
    for i in range(count):
        if not (twins and i % 2):
            own = rng.integers(3, VOCAB, int(rng.integers(1, 40))).tolist()
        params = SamplingParams(
            max_new_tokens=int(rng.integers(1, 30)),
            temperature=0.0 if twins else float(rng.choice([0.0, 0.8])),
            ignore_eos=bool(rng.random() < 0.5),
            stop=("qk", "z") if rng.random() < 0.3 else (),
            n=int(rng.choice([1, 1, 2])),
            logprobs=bool(rng.random() < 0.3),
            seed=i // 2 if twins else i,
        )
        rows.append(GenerationRequest(i, (shared if i % 3 else []) + own, params))
    return rows


def run_case(one_by_one: bool, async_mode: bool, case: tuple[int, int, int, bool], price: float = 0.0):
    """``price``: row-steps new rows wait for before they join a step that decodes (engine/admission.py)."""
    num_blocks, max_num_seqs, max_batch_tokens, twins = case
    blocks = BlockManager(num_blocks, block_size=4)
    scheduler = Scheduler(blocks, max_num_seqs, max_batch_tokens)
    scheduler.one_by_one = one_by_one
    scheduler.rent.price = price
    runner = Recorder(scheduler)
    engine = Engine(runner, blocks, scheduler, StopChecker(Letters(), {EOS}), 128, async_mode=async_mode)
    outs = [tuple(o) for o in engine.stream(random_rows(60, max_num_seqs, twins), detokenize=True)]
    assert blocks.num_free == num_blocks, "every block is released"
    return outs, runner.steps, engine.stats


# (num_blocks, max_num_seqs, max_batch_tokens, twins): roomy; preempting; row limit and tiny budget;
# greedy twins in a small cache: decodes fill blocks whose content the twin registered.
CASES = [(400, 16, 64, False), (40, 12, 48, False), (400, 5, 9, False), (48, 10, 40, True)]
