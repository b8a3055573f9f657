"""The engine loop: requests in -> scheduler -> batch builder -> runner -> postprocess -> outputs out.

In asynchronous mode the loop keeps one step in flight: it schedules and launches step N+1 before it
postprocesses step N, so the host's work overlaps the device's. Postprocessing therefore runs one step
late: a request that finished in step N may sit in step N+1 too; that extra token is discarded and the
request's blocks are released only once step N+1 is done with them. An iteration postprocesses step N,
launches step N+2 and only then hands the finished rows to the caller and pulls new ones, so that work
(writing outputs, tokenized rows becoming requests: longer than a small model's step when a whole batch
finishes together) runs with two steps queued on the device rather than one (docs/results.md, B7).

Structured output: a step with constrained rows is launched in two parts (runner.py). Its logits are
computed at once; its token masks depend on the tokens of the step before, so they are filled, and the
step sampled, as soon as that step is postprocessed (``_sample_pending``), while the device computes
the logits. Unconstrained rows never wait; docs/structured-output.md has the design.
"""

from __future__ import annotations

import time
from collections import defaultdict, deque
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from batchgen.engine.batch import build_step, prompt_spans
from batchgen.engine.block_manager import BlockManager
from batchgen.engine.completions import CompletionOutput, GenerationRequest
from batchgen.engine.grammar import GrammarCompiler
from batchgen.engine.intake import Intake
from batchgen.engine.request import Request, Status
from batchgen.engine.rows import COLUMN
from batchgen.engine.runner_protocol import Runner, StepResult
from batchgen.engine.scheduler import Decodes, ScheduledStep, Scheduler
from batchgen.engine.stats import EngineStats
from batchgen.engine.stops import StopChecker

if TYPE_CHECKING:
    from batchgen.threads import HostTurns


class Engine:
    def __init__(
        self,
        runner: Runner,
        blocks: BlockManager,
        scheduler: Scheduler,
        stops: StopChecker,
        max_model_len: int,
        async_mode: bool,
        grammars: GrammarCompiler | None = None,
        vocab_size: int | None = None,  # token ids a row may name (logit_bias, stop_token_ids)
    ) -> None:
        self.runner = runner
        self.blocks = blocks
        self.scheduler = scheduler
        self.stops = stops
        self._eos_ids = sorted(stops.eos_ids)
        self.grammars = grammars
        self.intake = Intake(blocks, max_model_len, vocab_size, self._eos_ids, grammars)
        self.lag = 1 if async_mode else 0
        self.stats = EngineStats()
        self._deferred: dict[int, list[Request]] = defaultdict(list)  # step id -> blocks to release after it
        self._done: list[CompletionOutput] = []
        self._detokenize = True
        self._turns: HostTurns | None = None
        self._draining = False
        self._inflight: deque = deque()  # (step, runner handle) launched, not yet postprocessed
        self._unsampled: tuple | None = None  # the newest step when it is masked and not yet sampled
        self._masked: set[int] = set()  # ids of in-flight masked steps (their tokens advance grammars)
        self._costs = runner.step_costs  # CUDA: what admitting new rows costs

    def drain(self) -> None:
        """Stop admitting: rows not yet started are dropped (never yielded), started ones finish.

        Safe to call from a signal handler: it only sets a flag the loop reads between steps.
        """
        self._draining = True

    def snapshot(self) -> dict[str, Any]:
        """What the engine holds now (the crash tests' fault reports). Call it on the engine's thread."""
        running = [
            {"index": r.index, "prompt": r.num_prompt, "computed": r.num_computed, "output": r.num_output}
            for r in self.scheduler.running
        ]
        return {
            "steps": self.stats.steps,
            "finished": self.stats.finished,
            "waiting": len(self.scheduler.waiting),
            "inflight_steps": len(self._inflight),
            "running": running,
        }

    # --- public -----------------------------------------------------------------------------------

    @property
    def tells_waits(self) -> bool:
        """Whether the runner tells a running step from a done one (``ready``): helpers' turns need it."""
        return self.runner.tells_waits

    def stream(
        self, requests: Iterable[GenerationRequest], detokenize: bool = True, turns: HostTurns | None = None
    ) -> Iterator[CompletionOutput]:
        """Yield each (row, sample) as it finishes; pull rows lazily, only when there is room.

        A stream closed early (break, close(), an exception) abandons its rows and leaves the engine
        clean for the next call: in-flight steps are waited for and every block is released. ``turns``:
        the caller's helper threads work while this thread waits for a step (``threads.HostTurns``).
        """
        self._detokenize = detokenize
        self._turns = turns if self.tells_waits else None
        started = time.perf_counter()
        finished = False
        try:
            yield from self._loop(iter(requests))
            finished = True
        finally:
            if not finished:
                self._abandon()
            self._draining = False  # a drain ends with its stream
            self.stats.wall_s += time.perf_counter() - started
            self.stats.gpu_busy_s = self.runner.gpu_busy_s
            self.stats.prep_s = self.runner.prep_s
            self.stats.replay_s = self.runner.replay_s
            idle = self.runner.idle
            self.stats.gpu_idle = idle.summary() if idle is not None else {}

    def _abandon(self) -> None:
        self._sample_pending(fill=False)  # its tokens are never used, but fetch needs it sampled
        while self._inflight:  # their device work must end before their blocks are handed out again
            self.runner.fetch(self._inflight.popleft()[1])
        for req in [*self.scheduler.running, *(r for reqs in self._deferred.values() for r in reqs)]:
            if req.block_table:
                self.blocks.release(req)
        self.scheduler.clear()
        self._deferred.clear()
        self._masked.clear()
        self._done.clear()
        self.runner.reset()

    def _loop(self, source: Iterator[GenerationRequest]) -> Iterator[CompletionOutput]:
        inflight = self._inflight
        exhausted = False
        while True:
            if self._draining:
                self._drop_unstarted()
                exhausted = True
            exhausted = exhausted or self._pull(source)
            yield from self._drain_done()
            if not self.scheduler.has_work() and not inflight:
                if exhausted:
                    return
                continue
            if len(inflight) > self.lag:  # every slot busy: the oldest step's tokens first
                self._postprocess(*inflight.popleft())
            if not self._launch_next(inflight):
                if inflight:
                    self._postprocess(*inflight.popleft())  # nothing to run until its tokens are known
                elif self.scheduler.has_work():
                    raise RuntimeError("scheduler made no progress: a request cannot fit in the KV cache")
            # The caller's work on finished rows, and pulling new ones, happen with the next step queued.
            yield from self._drain_done()

    # --- admission --------------------------------------------------------------------------------

    def _pull(self, source: Iterator[GenerationRequest]) -> bool:
        """Queue rows until enough wait; True once the source is exhausted."""
        want = 2 * self.scheduler.max_num_seqs
        while len(self.scheduler.waiting) < want:
            try:
                self._add(next(source))
            except StopIteration:
                return True
        return False

    def _drop_unstarted(self) -> None:
        waiting = self.scheduler.waiting
        keep = [r for r in waiting if r.admitted]  # preempted: started rows finish
        self.stats.dropped += len(waiting) - len(keep)
        waiting.clear()
        waiting.extend(keep)

    def _add(self, row: GenerationRequest) -> None:
        made = self.intake.requests(row)
        if isinstance(made, str):  # the row cannot run: an error record per sample
            for sample in self.intake.samples(row):
                self._emit_error(row, sample, made)
            return
        for req in made:
            self.stats.prompt_tokens += req.num_prompt
            self.scheduler.add(req)

    def _emit_error(self, row: GenerationRequest, sample: int, error: str) -> None:
        self.stats.errors += 1
        self.stats.finish_reasons["error"] += 1
        self._done.append(
            CompletionOutput(row.index, sample, row.key, [], "", "error", len(row.prompt_ids), None, error)
        )

    # --- stepping ---------------------------------------------------------------------------------

    def _launch_next(self, inflight: deque) -> bool:
        t0 = time.perf_counter()
        step = self.scheduler.schedule()
        if not step.num_seqs:
            return False
        inputs = build_step(step, self.blocks.block_size, self.scheduler.rows)
        self.stats.schedule_s += time.perf_counter() - t0
        if inflight:
            self.stats.overlapped_steps += 1
        handle = self.runner.launch(inputs)
        inflight.append((step, handle))
        if inputs.masked:
            self._masked.add(step.step_id)
            self._unsampled = (step, handle)
            if len(inflight) == 1:  # nothing in flight before it: its masks can be filled now
                self._sample_pending()
        self.stats.steps += 1
        self.stats.max_step_tokens = max(self.stats.max_step_tokens, inputs.num_tokens)
        return True

    def _sample_pending(self, fill: bool = True) -> None:
        """Fill the masked newest step's token masks and sample it: called once every step before it
        was postprocessed, so every token its constrained rows' grammars depend on is known."""
        if self._unsampled is None:
            return
        step, handle = self._unsampled
        self._unsampled = None
        t0 = time.perf_counter()
        out = self.runner.mask_buffer(handle, self.grammars.mask_width)
        if fill:
            self.grammars.fill_masks([req.guide for req in step.sampled()], out)
        else:
            out.fill_(-1)
        self.stats.mask_s += time.perf_counter() - t0
        self.runner.sample(handle)

    def _advance_guides(self, step: ScheduledStep, tokens: list[int]) -> None:
        for row, req in enumerate(step.sampled()):
            if req.guide is not None and not req.finished and not req.guide.accept(tokens[row]):
                # A masked sampler never picks a refused token unless the logits were not finite: fail
                # the row, not the run.
                req.guide, req.text = None, ""
                req.error = f"the grammar refused sampled token {tokens[row]} (non-finite logits?)"

    def _fetch(self, handle) -> StepResult:
        """The step's tokens; a wait for the device is the helper threads' turn."""
        if self._turns is None or self.runner.ready(handle):
            return self.runner.fetch(handle)
        with self._turns.engine_waits():
            return self.runner.fetch(handle)

    def _postprocess(self, step: ScheduledStep, handle) -> None:
        result = self._fetch(handle)
        if not self.stats.first_token_time:
            self.stats.first_token_time = time.time()
        if self._costs is not None:  # the price of a step with new prompts, in row-steps (admission.py)
            self.scheduler.rent.price = self.scheduler.max_num_seqs * self._costs.decode_steps_per_join
        if step.step_id in self._masked:
            t0 = time.perf_counter()
            self._masked.discard(step.step_id)
            self._advance_guides(step, result.tokens)
            self.stats.mask_s += time.perf_counter() - t0
        self._sample_pending()  # the next step waited for these tokens: start its sampling first
        t0 = time.perf_counter()
        if result.prompt is not None:
            self._record_prompt_scores(step, result.prompt)
        sampled, tokens, logprobs = step.sampled(), result.tokens, result.logprobs
        held, ends = self._advance_decodes(step.decodes, result)
        for row in self._rows_to_check(held, ends, len(sampled)):
            req = sampled[row]
            if row >= len(held) or not held[row]:  # not advanced with the held rows
                req.num_pending -= 1
                if req.status is Status.FINISHED:
                    self.stats.discarded_tokens += 1  # finished a step earlier: past its end
                    continue
                req.add_token(tokens[row])
                if req.logprobs is not None:
                    req.logprobs.append(logprobs[row])
                if req.top_logprobs is not None:
                    req.top_logprobs.append(_top(result, row, req.params.logprobs))
            self._check(req, step.step_id)
        for req in self._deferred.pop(step.step_id, ()):
            self.blocks.release(req)
        self.stats.preemptions = self.scheduler.num_preemptions
        self.stats.partial_prefills = self.scheduler.num_partial_prefills
        self.stats.prefix_hit_rate = self.blocks.hit_rate
        self.stats.postprocess_s += time.perf_counter() - t0

    @staticmethod
    def _record_prompt_scores(step: ScheduledStep, scores: tuple[list, list, list]) -> None:
        """The step's scored prompt positions (batch.prompt_spans, in order): each scored token's
        log-probability, and its N most likely alternatives when the row asked for them."""
        logprobs, top_ids, top_logprobs = scores
        at = 0
        for span in prompt_spans(step):
            req, count = span.request, span.stop - span.start
            n = req.params.prompt_logprobs
            for k in range(at, at + count):
                position = span.start + 1 + k - at  # the scored token's
                req.prompt_logprobs[position] = logprobs[k]
                if n:
                    req.prompt_top_logprobs[position] = tuple(
                        zip(top_ids[k][:n], top_logprobs[k][:n], strict=True)
                    )
            at += count

    def _advance_decodes(self, decodes: Decodes, result: StepResult) -> tuple[np.ndarray, np.ndarray]:
        """Give the decodes that still hold their rows (not finished or preempted since they were
        scheduled: the common case) their tokens at once. Returns that mask [D] and which of them may
        have ended (EOS, length, a watched row: checked one by one)."""
        rs, rows, n = self.scheduler.rows, decodes.rows, len(decodes.rows)
        held = rs.owner[rows] == decodes.ids  # [D]
        every = bool(held.all())
        at = np.arange(n) if every else np.flatnonzero(held)
        rows = rows if every else rows[at]
        tokens = np.array(result.tokens[:n], np.int64)[at]  # [H]
        rs.num_pending[rows] -= 1
        rs.known[rows] += 1
        reqs = decodes.requests if every else [decodes.requests[i] for i in at.tolist()]
        for req, token in zip(reqs, tokens.tolist(), strict=True):
            req.tokens.append(token)
        if result.logprobs is not None:
            for i in at[rs.sampling[rows, COLUMN["logprobs"]] > 0].tolist():
                req = decodes.requests[i]
                req.logprobs.append(result.logprobs[i])
                if req.top_logprobs is not None:
                    req.top_logprobs.append(_top(result, i, req.params.logprobs))
        ends = (rs.known[rows] >= rs.limit[rows]) | rs.watched[rows]
        for eos in self._eos_ids:  # one or a few ids: cheaper than np.isin's sort
            ends |= rs.check_eos[rows] & (tokens == eos)
        return held, at[ends]

    @staticmethod
    def _rows_to_check(held: np.ndarray, ends: np.ndarray, num_sampled: int) -> list[int]:
        """Sampled rows to look at one by one, in order: decodes that may have ended or were not
        advanced at once, then the prefill chunks'."""
        look = np.union1d(ends, np.flatnonzero(~held))
        return [*look.tolist(), *range(len(held), num_sampled)]

    def _check(self, req: Request, step_id: int) -> None:
        reason = "error" if req.error else self.stops.check(req)
        if not reason and req.guide is not None and req.guide.done:
            reason = "stop"  # the grammar ended (on a stop token, which --ignore-eos cannot skip)
        if reason:
            self._finish(req, reason, step_id)

    def _finish(self, req: Request, reason: str, step_id: int) -> None:
        was_running = req.status is Status.RUNNING
        self.scheduler.finish(req)
        if was_running and req.last_step > step_id:
            self._deferred[req.last_step].append(req)  # a later in-flight step still reads its blocks
        elif was_running:
            self.blocks.release(req)
        self.stats.finished += 1
        self.stats.output_tokens += req.num_output
        self.stats.finish_reasons[reason] += 1
        text = req.text
        if text is None and self._detokenize:
            text = self.stops.decode(req.output_ids, req.params.skip_special_tokens)
        self._done.append(CompletionOutput(
            req.index, req.sample, req.key, req.output_ids, text, reason, req.num_prompt, req.logprobs,
            req.error, req.top_logprobs, req.prompt_logprobs, req.prompt_top_logprobs,
            req.params.skip_special_tokens, req.thinking,
        ))  # fmt: skip
        self.stats.errors += reason == "error"

    def _drain_done(self) -> Iterator[CompletionOutput]:
        while self._done:
            yield self._done.pop(0)


def _top(result: StepResult, row: int, n: int) -> tuple[tuple[int, float], ...]:
    """Sampled row ``row``'s ``n`` most likely tokens and their log-probabilities, the best first. A
    tuple of tuples of numbers, which the garbage collector stops tracking: a run that keeps these for
    every token of every row in flight would otherwise make each full collection a long stall."""
    return tuple(zip(result.top_ids[row][:n], result.top_logprobs[row][:n], strict=True))
