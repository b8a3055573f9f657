"""The engine loop: requests in -> scheduler -> batch builder -> runner -> postprocess -> outputs out.

In asynchronous mode the loop keeps one step in flight: it schedules and launches step N+1 before it
postprocesses step N, so the host's work overlaps the device's. Postprocessing therefore runs one step
late: a request that finished in step N may sit in step N+1 too; that extra token is discarded and the
request's blocks are released only once step N+1 is done with them. An iteration postprocesses step N,
launches step N+2 and only then hands the finished rows to the caller and pulls new ones, so that work
(writing outputs, tokenized rows becoming requests: ~15 ms when 256 rows finish together) runs with two
steps queued on the device rather than one (B7: +5-15 %, docs/results.md).

Structured output: a step with constrained rows is launched in two parts (runner.py). Its logits are
computed at once; its token masks depend on the tokens of the step before, so they are filled, and the
step sampled, as soon as that step is postprocessed (``_sample_pending``), while the device computes
the logits. Unconstrained rows never wait; docs/structured-output.md has the design.
"""

from __future__ import annotations

import itertools
import time
from collections import defaultdict, deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from batchgen.engine.batch import build_step
from batchgen.engine.block_manager import BlockManager
from batchgen.engine.grammar import GrammarCompiler, GrammarError
from batchgen.engine.outputs import CompletionOutput, GenerationRequest
from batchgen.engine.request import Request, Status
from batchgen.engine.runner import StepResult
from batchgen.engine.sampler import rng_key
from batchgen.engine.scheduler import ScheduledStep, Scheduler
from batchgen.engine.stops import StopChecker


@dataclass
class EngineStats:
    steps: int = 0
    prompt_tokens: int = 0
    output_tokens: int = 0
    finished: int = 0
    errors: int = 0
    preemptions: int = 0
    partial_prefills: int = 0  # prefill chunks cut short by the token budget: a prompt spread over steps
    max_step_tokens: int = 0  # the most tokens one step computed (bounded by max_batch_tokens)
    overlapped_steps: int = 0  # steps launched before the previous step was postprocessed (async)
    discarded_tokens: int = 0  # tokens sampled for a request that had finished a step earlier (async)
    dropped: int = 0  # (row, sample) requests a drain dropped before they started: not yielded
    prefix_hit_rate: float = 0.0
    schedule_s: float = 0.0  # host time: scheduling + batch building
    prep_s: float = 0.0  # host time: filling step buffers and launching (CUDA runner)
    replay_s: float = 0.0  # of prep_s: launching decode graphs (graph.replay)
    postprocess_s: float = 0.0
    mask_s: float = 0.0  # host time advancing grammars and filling token masks (structured output)
    gpu_busy_s: float = 0.0  # compute-stream busy time, from CUDA events (0 on the CPU)
    gpu_idle: dict[str, Any] = field(default_factory=dict)  # the gaps between steps (CUDA: idle_gaps.py)
    wall_s: float = 0.0  # time inside stream() with work in the engine
    first_token_time: float = 0.0  # time.time() when the first step's tokens reached the host (start-up)
    finish_reasons: dict[str, int] = field(default_factory=lambda: defaultdict(int))


class Engine:
    def __init__(
        self,
        runner,  # EagerRunner or CudaRunner: launch(inputs) -> handle, fetch(handle) -> StepResult
        blocks: BlockManager,
        scheduler: Scheduler,
        stops: StopChecker,
        max_model_len: int,
        async_mode: bool,
        grammars: GrammarCompiler | None = None,
    ) -> None:
        self.runner = runner
        self.blocks = blocks
        self.scheduler = scheduler
        self.stops = stops
        self.max_model_len = max_model_len
        self.grammars = grammars
        self.lag = 1 if async_mode else 0
        self.stats = EngineStats()
        self._ids = itertools.count()
        self._deferred: dict[int, list[Request]] = defaultdict(list)  # step id -> blocks to release after it
        self._done: list[CompletionOutput] = []
        self._detokenize = True
        self._draining = False
        self._inflight: deque = deque()  # (step, runner handle) launched, not yet postprocessed
        self._unsampled: tuple | None = None  # the newest step when it is masked and not yet sampled
        self._masked: set[int] = set()  # ids of in-flight masked steps (their tokens advance grammars)

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

    def stream(
        self, requests: Iterable[GenerationRequest], detokenize: bool = True
    ) -> Iterator[CompletionOutput]:
        """Yield each (row, sample) as it finishes; pull rows lazily, only when there is room.

        A stream closed early (break, close(), an exception) abandons its rows and leaves the engine
        clean for the next call: in-flight steps are waited for and every block is released.
        """
        self._detokenize = detokenize
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
            self.stats.gpu_busy_s = getattr(self.runner, "gpu_busy_s", 0.0)
            self.stats.prep_s = getattr(self.runner, "prep_s", 0.0)
            self.stats.replay_s = getattr(self.runner, "replay_s", 0.0)
            idle = getattr(self.runner, "idle", None)
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
        samples = row.samples if row.samples is not None else tuple(range(row.params.n))
        error = self._validate(row)
        grammar = None
        if not error and row.params.constrained:
            grammar, error = self._grammar(row)
        parent = None
        for sample in samples:
            if error:
                self._emit_error(row, sample, error)
                continue
            req = self._make_request(row, sample, parent, grammar)
            parent = parent or req
            self.scheduler.add(req)

    def _validate(self, row: GenerationRequest) -> str | None:
        n = len(row.prompt_ids)
        if n == 0:
            return "empty prompt"
        if n >= self.max_model_len:
            return f"prompt has {n} tokens; the model allows at most {self.max_model_len - 1}"
        need = self.blocks.blocks_for(min(n + row.params.max_new_tokens, self.max_model_len))
        if need > self.blocks.num_blocks:
            return (
                f"prompt + max_new_tokens need {need} KV blocks, the cache holds {self.blocks.num_blocks}: "
                "lower max_new_tokens or give the KV cache more memory"
            )
        return None

    def _grammar(self, row: GenerationRequest) -> tuple[object | None, str | None]:
        """The row's compiled constraint (``batchgen run`` compiles it on the prompt thread), or why not."""
        if row.grammar is not None:
            return row.grammar, None
        if self.grammars is None:
            return None, "structured output needs a tokenizer"
        try:
            return self.grammars.compile(row.params), None
        except GrammarError as exc:
            return None, str(exc)

    def _make_request(
        self, row: GenerationRequest, sample: int, parent: Request | None, grammar: object | None
    ) -> Request:
        n = len(row.prompt_ids)
        self.stats.prompt_tokens += n
        return Request(
            request_id=next(self._ids),
            index=row.index,
            sample=sample,
            key=row.key,
            params=row.params,
            tokens=list(row.prompt_ids),
            num_prompt=n,
            max_tokens=min(row.params.max_new_tokens, self.max_model_len - n),
            rng_key=rng_key(row.params.seed, row.index, sample),
            parent=parent,
            logprobs=[] if row.params.logprobs else None,
            guide=self.grammars.guide(grammar) if grammar is not None else None,
        )

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

    def _postprocess(self, step: ScheduledStep, handle) -> None:
        result: StepResult = self.runner.fetch(handle)
        if not self.stats.first_token_time:
            self.stats.first_token_time = time.time()
        if step.step_id in self._masked:
            t0 = time.perf_counter()
            self._masked.discard(step.step_id)
            self._advance_guides(step, result.tokens)
            self.stats.mask_s += time.perf_counter() - t0
        self._sample_pending()  # the next step waited for these tokens: start its sampling first
        t0 = time.perf_counter()
        sampled = step.sampled()
        check, finished = self.stops.check, Status.FINISHED
        for row, (req, token) in enumerate(zip(sampled, result.tokens, strict=True)):
            req.num_pending -= 1
            if req.status is finished:
                self.stats.discarded_tokens += 1  # finished one step earlier: this token is past its end
                continue
            req.tokens.append(token)
            if req.logprobs is not None:
                req.logprobs.append(result.logprobs[row])
            reason = "error" if req.error else check(req)
            if not reason and req.guide is not None and req.guide.done:
                reason = "stop"  # the grammar ended (on a stop token, which --ignore-eos cannot skip)
            if reason:
                self._finish(req, reason, step.step_id)
        for req in self._deferred.pop(step.step_id, ()):
            self.blocks.release(req)
        self.stats.preemptions = self.scheduler.num_preemptions
        self.stats.partial_prefills = self.scheduler.num_partial_prefills
        self.stats.prefix_hit_rate = self.blocks.hit_rate
        self.stats.postprocess_s += time.perf_counter() - t0

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
            text = self.stops.decode(req.output_ids)
        self._done.append(
            CompletionOutput(
                req.index,
                req.sample,
                req.key,
                req.output_ids,
                text,
                reason,
                req.num_prompt,
                req.logprobs,
                req.error,
            )  # fmt: skip
        )
        self.stats.errors += reason == "error"

    def _drain_done(self) -> Iterator[CompletionOutput]:
        while self._done:
            yield self._done.pop(0)
