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

from batchgen.engine.batch import build_step
from batchgen.engine.block_manager import BlockManager
from batchgen.engine.completions import CompletionOutput, GenerationRequest
from batchgen.engine.grammar import GrammarCompiler
from batchgen.engine.intake import Intake
from batchgen.engine.request import Request, Status
from batchgen.engine.runner_protocol import Runner, StepResult
from batchgen.engine.scheduler import ScheduledStep, Scheduler
from batchgen.engine.speculative.accept import VerifiedRows
from batchgen.engine.speculative.policy import PLAIN
from batchgen.engine.speculative.speculator import Speculator
from batchgen.engine.stats import EngineStats
from batchgen.engine.step_results import advance_decodes, record_prompt_scores, rows_to_check, top_of
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
        speculator: Speculator | None = None,  # speculative decoding (engine/speculative)
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
        self.speculator = speculator
        if speculator is not None:
            speculator.run_async(async_mode)
        self._verified = VerifiedRows(blocks, scheduler.rows, self._eos_ids)
        self._done_at = 0.0  # when the last step's tokens were taken (the speculation policy's clock)
        self._speculated: dict[int, int] = {}  # step id -> the policy's kind of step (policy.py), not plain
        # step id -> rows of the step after it whose guesses wait for its tokens (speculative/accept.py)
        self._waiting: dict[int, list[Request]] = {}

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
        self._done_at = 0.0
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
            self._speculation_stats()

    def _speculation_stats(self) -> None:
        stats = self.stats
        if self.speculator is not None:
            stats.acceptance_rate = round(stats.accepted_tokens / max(1, stats.draft_tokens), 4)
            stats.accepted_per_verify_step = round(stats.accepted_tokens / max(1, stats.verify_steps), 3)
            stats.void_rows = self._verified.voided
            stats.speculation_rates = self.speculator.policy.summary()

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
        self._speculated.clear()
        self._waiting.clear()
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
            kind = self.speculator.wants(self.scheduler.running) if self.speculator is not None else PLAIN
            while len(inflight) > self._lag(kind):  # every slot busy: the oldest step's tokens first
                self._postprocess(*inflight.popleft())
            if not self._launch_next(inflight, kind):
                if inflight:
                    self._postprocess(*inflight.popleft())  # nothing to run until its tokens are known
                elif self.scheduler.has_work():
                    raise RuntimeError("scheduler made no progress: a request cannot fit in the KV cache")
            elif self.speculator is not None and len(inflight) > 1 and inflight[-1][0].decodes.drafts is None:
                # a plain step queued behind another: proposals' one-time work, meanwhile
                self.speculator.prepare(self.scheduler.running)
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

    def _lag(self, kind: int) -> int:
        """Steps left in flight when the next launches. Verify steps chain like plain ones (accept.py),
        unless they wait (the policy's choice, or a proposer that cannot guess past a step in flight):
        then none before or after such a verify step."""
        if self.speculator is None:
            return self.lag
        newest = self._inflight[-1][0] if self._inflight else None
        waited = (
            newest is not None
            and newest.decodes.drafts is not None
            and (self.speculator.waits(self._speculated.get(newest.step_id, PLAIN)))
        )
        return 0 if self.speculator.waits(kind) or waited else self.lag

    def _launch_next(self, inflight: deque, kind: int = PLAIN) -> bool:
        t0 = time.perf_counter()
        # (a verify step that waits finds nothing in flight: ``_lag`` drained it)
        drafts = self.speculator.drafts(self.scheduler.running) if kind else None
        step = self.scheduler.schedule(drafts)
        if not step.num_seqs:
            return False
        if kind:
            self._speculated[step.step_id] = kind
        self.stats.verify_steps += step.decodes.drafts is not None
        inputs = build_step(step, self.blocks.block_size, self.scheduler.rows)
        if step.decodes.drafts is not None:  # held from now on (the batch builder read the rows first)
            waiting = self._verified.hold(step.decodes)
            if waiting:
                self._waiting[step.step_id - 1] = waiting
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
            record_prompt_scores(step, result.prompt)
        sampled, num_decodes = step.sampled(), len(step.decodes.requests)
        if step.decodes.drafts is None:
            held, ends = advance_decodes(self.scheduler.rows, step, result, self._eos_ids)
            look = [
                (sampled[r], r, r < len(held) and held[r]) for r in rows_to_check(held, ends, len(sampled))
            ]
            made = len(held)
        else:
            made, at = self._verified.take(
                step.step_id, step.decodes, result, lambda req, row: self._take(req, result, row),
                lambda req: self._check(req, step.step_id),
                lambda req, proposed, kept: self.speculator.accepted(req, proposed, kept, self.stats),
            )  # fmt: skip
            look = [(req, at + i, False) for i, req in enumerate(sampled[num_decodes:])]
        for req, row, advanced in look:
            if req.void_step == step.step_id:  # it continued rejected guesses (speculative/accept.py)
                continue
            if not advanced:  # not advanced with the held rows
                req.num_pending -= 1
                if req.status is Status.FINISHED:
                    self.stats.discarded_tokens += 1  # finished a step earlier: past its end
                    continue
                self._take(req, result, row)
            self._check(req, step.step_id)
        for req in self._waiting.pop(step.step_id, ()):
            self._verified.hold_waiting(req)
        if self.speculator is not None:
            self._time_step(step, made, self.runner.warming(handle))
        for req in self._deferred.pop(step.step_id, ()):
            self.blocks.release(req)
        self.stats.preemptions = self.scheduler.num_preemptions
        self.stats.partial_prefills = self.scheduler.num_partial_prefills
        self.stats.prefix_hit_rate = self.blocks.hit_rate
        self.stats.postprocess_s += time.perf_counter() - t0

    def _take(self, req: Request, result: StepResult, row: int) -> None:
        """Append the token of sampled row ``row`` to ``req``, with its log-probabilities if asked."""
        req.add_token(result.tokens[row])
        if req.logprobs is not None:
            req.logprobs.append(result.logprobs[row])
        if req.top_logprobs is not None:
            req.top_logprobs.append(top_of(result, row, req.params.logprobs))

    def _time_step(self, step: ScheduledStep, made: int, warming: bool) -> None:
        """The speculation policy's measure: a decode step's tokens and the time since the last step's
        (not a step that warmed up or captured a graph: a one-time cost)."""
        now, kind = time.perf_counter(), self._speculated.pop(step.step_id, PLAIN)
        self.stats.warm_verify_steps += warming and step.decodes.drafts is not None
        if not step.items and not warming and self._done_at:
            self.speculator.policy.timed(len(step.decodes.requests), kind, made, now - self._done_at)
        self._done_at = now

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
