"""The Python API: ``LLM(model=...)``; ``generate`` and ``chat`` return vLLM-shaped results in input
order, ``stream`` the engine's per-sample outputs in completion order."""

from __future__ import annotations

import gc
import itertools
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import fields, replace
from typing import Any

import torch

from batchgen.config import EngineConfig, SamplingParams
from batchgen.distributed.group import ParallelGroup
from batchgen.engine.block_manager import BlockManager
from batchgen.engine.completions import CompletionOutput as SampleOutput
from batchgen.engine.completions import GenerationRequest
from batchgen.engine.engine import Engine
from batchgen.engine.grammar import GrammarCompiler
from batchgen.engine.rank_engine import RankEngine, build_rank
from batchgen.engine.scheduler import Scheduler
from batchgen.engine.speculative.draft import DraftProposer, same_tokenizer
from batchgen.engine.speculative.speculator import Speculator
from batchgen.engine.stats import EngineStats
from batchgen.engine.step_sampling import features_of
from batchgen.engine.stops import StopChecker
from batchgen.gc_policy import frozen_heap
from batchgen.llm_inputs import (
    ChatOptions,
    PromptInput,
    chat_inputs,
    conversations_of,
    prompt_inputs,
    sampling_per_prompt,
)
from batchgen.llm_results import ResultBuilder, collect_samples, progress_bar
from batchgen.model import attention
from batchgen.model.build import ModelFiles
from batchgen.model.loader import DEFAULT_MODEL_NAME, local_model_dir, open_checkpoint
from batchgen.model.tokenize import Messages, encode_prompt
from batchgen.model.weights.calibration_text import calibration_ids
from batchgen.outputs import RequestOutput
from batchgen.threads import HostTurns

# One prompt or a sequence of them: text, token ids, or vLLM's dicts {"prompt"} / {"prompt_token_ids"}.
PromptsArgument = str | dict | Sequence[str | list[int] | dict]


def _engine_config(model: str | None, options: dict[str, Any]) -> EngineConfig:
    unknown = set(options) - {f.name for f in fields(EngineConfig)}
    if unknown:
        raise TypeError(f"unknown engine options: {', '.join(sorted(unknown))}")
    return EngineConfig(model=model, **options)


class LLM:
    """Offline generation engine. Options are ``EngineConfig`` fields (``model`` first).

    ``tensor_parallel=K`` splits the model over K processes (this one is rank 0; the others are started
    here and stopped by ``close()``, or when this process exits)."""

    def __init__(self, model: str | None = None, config: EngineConfig | None = None, **options: Any) -> None:
        started = time.perf_counter()
        if config is None:
            config = _engine_config(model, options)
        elif model is not None or options:
            raise TypeError("give the options as config=EngineConfig(...) or as keywords, not both")
        model = config.model
        path = local_model_dir(model)
        checkpoint = open_checkpoint(path, config)
        configs_s = round(time.perf_counter() - started, 3)
        files = ModelFiles(path, checkpoint.config)
        self._start(config, files, checkpoint.tokenizer, checkpoint.generation, model or DEFAULT_MODEL_NAME)
        self.startup = {"config_tokenizer_s": configs_s} | self.startup

    @classmethod
    def from_model(cls, model: torch.nn.Module, tokenizer, **options: Any) -> LLM:
        """Wrap an already-built transformers model (benchmarks build random 8B models in place)."""
        config = _engine_config(options.pop("name", None), options)
        if config.tensor_parallel > 1:
            raise ValueError("a model built in memory runs in one process: tensor_parallel must be 1")
        name = attention.register()
        try:
            model.set_attn_implementation(name)
        except (AttributeError, ValueError):  # older transformers: set the config field directly
            model.config._attn_implementation = name
        llm = cls.__new__(cls)
        files = ModelFiles(None, model.config, model.eval())
        dtype = next(model.parameters()).dtype
        llm._start(config, files, tokenizer, model.generation_config, config.model or "custom", dtype)
        return llm

    def _start(self, config, files: ModelFiles, tokenizer, generation_config, name: str, dtype=None) -> None:
        self.config, self.tokenizer, self.model_name = config, tokenizer, name
        if config.quantization == "fp8" and tokenizer is not None:  # its rounding calibrates on these chats
            files = files._replace(calibration=tuple(map(tuple, calibration_ids(tokenizer))))
        self.hf_config, self.generation_config = files.hf_config, generation_config
        self._workers = None
        self._tp_runner = None  # rank 0's runner of a tensor-parallel job
        self._request_counter = itertools.count()  # RequestOutput.request_id, as vLLM numbers them
        group = ParallelGroup.single()
        if config.tensor_parallel > 1:
            from batchgen.model.build import tensor_parallel_problem
            from batchgen.tensor_parallel.launch import start_workers

            problem = tensor_parallel_problem(config, files)
            if problem is not None:  # before any process starts
                raise ValueError(problem)

            self._workers = start_workers(config, files)
            group = self._workers.group
        try:
            self._rank = build_rank(config, files, group, progress=self._progress, dtype=dtype)
        except BaseException:
            self.close()
            raise
        rank = self._rank
        self.config = replace(config, max_num_seqs=rank.max_num_seqs)  # the width chosen, when left auto
        self.startup = dict(rank.startup)  # seconds per phase (prepare() adds its graphs)
        self.model, self.device, self.dtype = rank.bundle.module, rank.device, rank.dtype
        self.max_model_len, self.async_mode = rank.max_model_len, rank.async_mode
        self.default_sampling = self._default_sampling()
        self._engine = self._build_engine(rank)

    # --- construction -----------------------------------------------------------------------------

    def _default_sampling(self) -> SamplingParams:
        gen = self.generation_config
        if not getattr(gen, "do_sample", False):
            return SamplingParams()
        return SamplingParams(
            temperature=gen.temperature if gen.temperature is not None else 1.0,
            top_p=gen.top_p if gen.top_p is not None else 1.0,
            top_k=gen.top_k or 0,
        )

    def _eos_ids(self) -> set[int]:
        ids = self.generation_config.eos_token_id
        ids = set(ids if isinstance(ids, (list, tuple)) else [ids] if ids is not None else [])
        if self.tokenizer.eos_token_id is not None:
            ids.add(self.tokenizer.eos_token_id)
        return ids

    def _build_engine(self, rank: RankEngine) -> Engine:
        cfg = self.config
        blocks = BlockManager(rank.num_blocks, cfg.block_size, cfg.prefix_caching)
        scheduler = Scheduler(blocks, cfg.max_num_seqs, cfg.max_batch_tokens)
        runner = rank.runner
        if self._workers is not None:
            from batchgen.tensor_parallel.rank0_runner import TensorParallelRunner

            runner = self._tp_runner = TensorParallelRunner(runner, self._workers)
        eos = self._eos_ids()
        stops = StopChecker(self.tokenizer, eos)
        vocab = self.hf_config.get_text_config().vocab_size
        # Structured output's compiler: xgrammar is imported on the first constraint, not here.
        self.grammars = GrammarCompiler(self.tokenizer, vocab, eos)
        speculator = self._speculator(rank, vocab)
        return Engine(
            runner, blocks, scheduler, stops, self.max_model_len, self.async_mode, self.grammars, vocab,
            speculator,
        )  # fmt: skip

    def _speculator(self, rank: RankEngine, vocab: int) -> Speculator | None:
        cfg = self.config
        if not cfg.speculative:
            return None
        proposer = None
        if rank.draft is not None:
            if not same_tokenizer(self.tokenizer, rank.draft.tokenizer):
                raise ValueError(f"the draft model {cfg.draft_model} does not share the model's tokenizer")
            proposer = DraftProposer(rank.draft, vocab, cfg.max_batch_tokens)
        always = cfg.speculative_policy == "always"
        return Speculator(
            cfg.speculative, cfg.num_speculative_tokens, cfg.ngram_min, cfg.ngram_max, not always, proposer
        )

    def close(self) -> None:
        """Stop the tensor-parallel workers and leave their process group (nothing to do in one
        process); the engine cannot generate afterwards. Idempotent."""
        if self._workers is None:
            return
        # The decode graphs hold NCCL work captured on the group's communicators, and tearing the group
        # down waits for such work while its graphs live (both an orderly destroy and an abort hung with
        # the graphs alive): free the engine, and with it every graph, first.
        if getattr(self, "_engine", None) is not None:
            self._closed_stats = self._engine.stats
        self._engine = self._rank = self._tp_runner = None
        gc.collect()
        self._workers.close()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- use --------------------------------------------------------------------------------------

    @property
    def stats(self) -> EngineStats:
        return self._engine.stats if self._engine is not None else self._closed_stats

    @property
    def num_kv_blocks(self) -> int:
        return self._engine.blocks.num_blocks

    @property
    def graph_memory(self) -> Mapping[str, int]:
        """What rank 0's captured decode graphs cost in device memory, by slot count (empty: none)."""
        return self._engine.runner.graph_memory

    def rank_stats(self) -> list[dict[str, float]]:
        """Every tensor-parallel rank's device busy and host-launch seconds, rank 0 first (empty in one
        process: ``stats`` has them)."""
        return self._tp_runner.rank_stats() if self._tp_runner is not None else []

    def snapshot(self) -> dict[str, Any]:
        """What the engine holds right now: step count, queued and running requests (fault reports)."""
        return self._engine.snapshot()

    @property
    def _progress(self) -> bool:
        return self.config.extra.get("progress", True)

    def prepare(self, sampling: SamplingParams, capture_graphs: bool | None = None) -> None:
        """Ready what rows sampled like ``sampling`` need before the first step: on CUDA, the decode
        graphs of their sampling variant, and for a constrained one the two-part graphs of masked steps
        (docs/structured-output.md). ``capture_graphs`` None: as the runner captures (tensor parallelism
        up front, here; one GPU on demand, mid-run: cuda_runner.py); True: now (the benchmark keeps
        decode captures out of its timed runs; steps with new prompts are graphed on demand only)."""
        runner = self._engine.runner
        if capture_graphs is None:
            capture_graphs = not runner.capture_after
        if runner.buckets and capture_graphs:  # a CUDA runner with graphs
            started = time.perf_counter()
            width = self.grammars.mask_width if sampling.constrained else None
            runner.capture_all(features_of(sampling), progress=self._progress, mask_width=width)
            self.startup["prepare_s"] = round(time.perf_counter() - started, 3)

    def drain(self) -> None:
        """Stop admitting rows: queued rows that have not started are dropped, started ones finish."""
        self._engine.drain()
        if self._workers is not None:
            self._workers.stop_requested = True  # a rank lost from now on ends the job as interrupted

    def encode(self, prompt: str | list[dict], chat: bool | None = None, system_prompt: str | None = None):
        return encode_prompt(self.tokenizer, prompt, chat=chat, system_prompt=system_prompt)

    def host_turns(self) -> HostTurns | None:
        """Turns on the GIL for the caller's helper threads (``threads.HostTurns``), when the engine
        waits on a device that tells it when a step is done (CUDA); None otherwise (the CPU computes in
        the engine thread itself, which never waits)."""
        return HostTurns() if self._engine.tells_waits else None

    def stream(
        self, requests: Iterable[GenerationRequest], detokenize: bool = True, turns: HostTurns | None = None
    ) -> Iterator[SampleOutput]:
        """Each (row, sample) as soon as it finishes. Rows are pulled lazily from ``requests``. While it
        runs, the objects that existed before it are out of the collector's walks (``gc_policy``)."""
        # As a decorator on a generator, inference mode is on only while the engine runs a step,
        # not in the caller's loop body between outputs.
        stream = torch.inference_mode()(self._engine.stream)
        with frozen_heap(collect_first=False):
            yield from stream(requests, detokenize=detokenize, turns=turns)

    def generate(
        self,
        prompts: PromptsArgument,
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool | Callable[..., Any] = True,
    ) -> list[RequestOutput]:
        """vLLM's ``generate``: one ``RequestOutput`` per prompt, in input order, holding its ``n``
        samples. Prompts: strings (sent raw, no chat template), token-id lists, or vLLM's dicts
        ``{"prompt": text}`` / ``{"prompt_token_ids": ids}``; one prompt or a sequence of them.
        ``sampling_params``: one for all, or one per prompt; None: the model's generation config."""
        inputs = prompt_inputs(self.tokenizer, prompts)
        return self._request_outputs(inputs, sampling_params, use_tqdm)

    def chat(
        self,
        messages: Messages | Sequence[Messages],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool | Callable[..., Any] = True,
        *,
        chat_template: str | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
        add_generation_prompt: bool = True,
        tools: list[dict] | None = None,
    ) -> list[RequestOutput]:
        """vLLM's ``chat``: one conversation (a list of ``{"role", "content"}`` messages) or a list of
        them, each rendered by the chat template (``chat_template``: the template's text, else the
        tokenizer's own) and generated as ``generate`` does."""
        options = ChatOptions(chat_template, chat_template_kwargs, add_generation_prompt, tools)
        inputs = chat_inputs(self.tokenizer, conversations_of(messages), options)
        return self._request_outputs(inputs, sampling_params, use_tqdm)

    def _request_outputs(self, inputs: list[PromptInput], sampling_params, use_tqdm) -> list[RequestOutput]:
        params = sampling_per_prompt(sampling_params, len(inputs), self.default_sampling)
        request_ids = [str(next(self._request_counter)) for _ in inputs]
        requests = [
            GenerationRequest(i, p.token_ids, sp, key=i)
            for i, (p, sp) in enumerate(zip(inputs, params, strict=True))
        ]
        bar = progress_bar(use_tqdm, len(requests))
        samples = collect_samples(self.stream(requests), [sp.n for sp in params], bar)
        build = ResultBuilder(self.tokenizer)
        return [build.request_output(*result) for result in zip(request_ids, inputs, samples, strict=True)]

    def generate_samples(
        self,
        prompts: Sequence[str | list[dict] | list[int]],
        sampling: SamplingParams | Sequence[SamplingParams] | None = None,
        chat: bool | None = None,
        system_prompt: str | None = None,
    ) -> list[SampleOutput]:
        """The engine's outputs, one per (prompt, sample), flat in input order and by sample. Prompts as
        ``batchgen run`` reads them (``chat`` None: a chat template for strings when the model has one);
        token-id lists are sent as they are."""
        if sampling is None or isinstance(sampling, SamplingParams):
            sampling = [sampling or self.default_sampling] * len(prompts)
        requests = [
            GenerationRequest(i, self._ids(p, chat, system_prompt), params, key=i)
            for i, (p, params) in enumerate(zip(prompts, sampling, strict=True))
        ]
        outputs = list(self.stream(requests))
        return sorted(outputs, key=lambda o: (o.index, o.sample))

    def _ids(self, prompt, chat, system_prompt) -> list[int]:
        if isinstance(prompt, list) and (not prompt or isinstance(prompt[0], int)):
            return list(prompt)
        return self.encode(prompt, chat=chat, system_prompt=system_prompt)
