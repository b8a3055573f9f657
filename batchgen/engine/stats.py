"""What the engine counts while it runs (``LLM.stats``, the stats file)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any


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
    # speculative decoding: steps that verified guesses, the guesses and how many were accepted
    verify_steps: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    void_rows: int = 0  # rows of a chained step that continued guesses rejected in the step before
    warm_verify_steps: int = 0  # verify steps run eagerly or captured: their graph's first uses (CUDA)
    acceptance_rate: float = 0.0  # accepted / draft tokens
    accepted_per_verify_step: float = 0.0
    speculation_rates: dict[str, Any] = field(default_factory=dict)  # tokens/s by width and kind (policy.py)
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
