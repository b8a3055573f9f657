"""The Python API: ``LLM(model=...)``, ``generate`` in input order, ``stream`` in completion order."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import fields
from typing import Any

import torch

from batchgen.config import EngineConfig, SamplingParams
from batchgen.engine import kv_cache
from batchgen.engine.block_manager import BlockManager
from batchgen.engine.engine import Engine, EngineStats
from batchgen.engine.outputs import CompletionOutput, GenerationRequest
from batchgen.engine.runner import EagerRunner
from batchgen.engine.scheduler import Scheduler
from batchgen.engine.stops import StopChecker
from batchgen.model import attention
from batchgen.model.backends import TorchBackend, TritonBackend
from batchgen.model.forward import build_forward
from batchgen.model.loader import LoadedModel, load_model
from batchgen.model.tokenize import encode_prompt
from batchgen.threads import set_cpu_threads

_ACTIVATION_RESERVE = 2 << 30  # CUDA: room for activations and logits beside the KV pool


def _engine_config(model: str | None, options: dict[str, Any]) -> EngineConfig:
    unknown = set(options) - {f.name for f in fields(EngineConfig)}
    if unknown:
        raise TypeError(f"unknown engine options: {', '.join(sorted(unknown))}")
    return EngineConfig(model=model, **options)


class LLM:
    """Offline generation engine. Options are ``EngineConfig`` fields (``model`` first)."""

    def __init__(self, model: str | None = None, **options: Any) -> None:
        config = _engine_config(model, options)
        attention.register()
        loaded = load_model(
            model,
            device=config.device,
            dtype=config.dtype,
            attn_implementation=attention.ATTN_IMPLEMENTATION,
            trust_remote_code=config.trust_remote_code,
        )
        self._setup(config, loaded)

    @classmethod
    def from_model(cls, model: torch.nn.Module, tokenizer, **options: Any) -> LLM:
        """Wrap an already-built transformers model (benchmarks build random 8B models in place)."""
        config = _engine_config(options.pop("name", None), options)
        name = attention.register()
        try:
            model.set_attn_implementation(name)
        except (AttributeError, ValueError):  # older transformers: set the config field directly
            model.config._attn_implementation = name
        device = next(model.parameters()).device
        loaded = LoadedModel(
            model.eval(), tokenizer, device, next(model.parameters()).dtype, config.model or "custom"
        )
        llm = cls.__new__(cls)
        llm._setup(config, loaded)
        return llm

    def _setup(self, config: EngineConfig, loaded: LoadedModel) -> None:
        self.config = config
        self.model, self.tokenizer, self.device, self.dtype = (
            loaded.model,
            loaded.tokenizer,
            loaded.device,
            loaded.dtype,
        )
        self.model_name = loaded.name
        self._threads = set_cpu_threads(config.threads, self.device)  # the governor of automatic CPU threads
        self.max_model_len = self._max_model_len()
        self.default_sampling = self._default_sampling()
        self.async_mode = config.async_mode if config.async_mode is not None else self.device.type == "cuda"
        self._engine = self._build_engine()

    # --- construction -----------------------------------------------------------------------------

    def _max_model_len(self) -> int:
        text = self.model.config.get_text_config()
        limit = getattr(text, "max_position_embeddings", None) or 4096
        return min(self.config.max_model_len or limit, limit)

    def _default_sampling(self) -> SamplingParams:
        gen = self.model.generation_config
        if not getattr(gen, "do_sample", False):
            return SamplingParams()
        return SamplingParams(
            temperature=gen.temperature if gen.temperature is not None else 1.0,
            top_p=gen.top_p if gen.top_p is not None else 1.0,
            top_k=gen.top_k or 0,
        )

    def _eos_ids(self) -> set[int]:
        ids = self.model.generation_config.eos_token_id
        ids = set(ids if isinstance(ids, (list, tuple)) else [ids] if ids is not None else [])
        if self.tokenizer.eos_token_id is not None:
            ids.add(self.tokenizer.eos_token_id)
        return ids

    def _num_blocks(self, shape: kv_cache.KVShape) -> int:
        cfg = self.config
        if cfg.kv_cache_bytes is not None:
            budget = cfg.kv_cache_bytes
        elif self.device.type == "cuda":
            budget = kv_cache.cuda_budget(self.device, cfg.gpu_memory_utilization, _ACTIVATION_RESERVE)
        else:
            budget = kv_cache.default_cpu_budget()
        useful = cfg.max_num_seqs * self.max_model_len + cfg.max_batch_tokens
        return kv_cache.num_blocks_for(shape, cfg.block_size, self.dtype, budget, useful)

    def _build_engine(self) -> Engine:
        cfg = self.config
        shape = kv_cache.kv_shape(self.model.config)
        num_blocks = self._num_blocks(shape)
        caches = kv_cache.allocate(shape, num_blocks, cfg.block_size, self.dtype, self.device)
        blocks = BlockManager(num_blocks, cfg.block_size, cfg.prefix_caching)
        scheduler = Scheduler(blocks, cfg.max_num_seqs, cfg.max_batch_tokens)
        runner = self._runner(caches)
        stops = StopChecker(self.tokenizer, self._eos_ids())
        return Engine(runner, blocks, scheduler, stops, self.max_model_len, self.async_mode)

    def _runner(self, caches):
        cfg = self.config
        forward = build_forward(self.model, cfg.model_impl, self.max_model_len)
        if self.device.type != "cuda":
            return EagerRunner(forward, caches, TorchBackend(self._threads), self.device)
        from batchgen.engine.cuda_runner import CudaRunner

        triton = cfg.attention_backend != "torch"
        backend = TritonBackend() if triton else TorchBackend()
        runner = CudaRunner(
            forward, caches, backend, self.device,
            max_num_seqs=cfg.max_num_seqs, max_batch_tokens=cfg.max_batch_tokens,
            max_model_len=self.max_model_len, block_size=cfg.block_size,
            num_slots=2 if self.async_mode else 1,
            cuda_graphs=cfg.cuda_graphs is not False and triton,  # the torch reference syncs: not capturable
        )  # fmt: skip
        runner.capture_all(progress=self._progress)
        return runner

    # --- use --------------------------------------------------------------------------------------

    @property
    def stats(self) -> EngineStats:
        return self._engine.stats

    @property
    def num_kv_blocks(self) -> int:
        return self._engine.blocks.num_blocks

    @property
    def _progress(self) -> bool:
        return self.config.extra.get("progress", True)

    def prepare(self, sampling: SamplingParams) -> None:
        """Ready what rows sampled like ``sampling`` need before the first step: on CUDA, the decode
        graphs of their sampling variant (otherwise captured on first use, mid-run)."""
        capture = getattr(self._engine.runner, "capture_all", None)
        if capture is not None and self._engine.runner.buckets:
            capture(not sampling.greedy, sampling.logprobs, progress=self._progress)

    def drain(self) -> None:
        """Stop admitting rows: queued rows that have not started are dropped, started ones finish."""
        self._engine.drain()

    def encode(self, prompt: str | list[dict], chat: bool | None = None, system_prompt: str | None = None):
        return encode_prompt(self.tokenizer, prompt, chat=chat, system_prompt=system_prompt)

    def stream(
        self, requests: Iterable[GenerationRequest], detokenize: bool = True
    ) -> Iterator[CompletionOutput]:
        """Each (row, sample) as soon as it finishes. Rows are pulled lazily from ``requests``."""
        # As a decorator on a generator, inference mode is on only while the engine runs a step,
        # not in the caller's loop body between outputs.
        yield from torch.inference_mode()(self._engine.stream)(requests, detokenize=detokenize)

    def generate(
        self,
        prompts: Sequence[str | list[dict] | list[int]],
        sampling: SamplingParams | Sequence[SamplingParams] | None = None,
        chat: bool | None = None,
        system_prompt: str | None = None,
    ) -> list[CompletionOutput]:
        """Outputs in input order (``n`` per prompt, by sample). Token-id lists are sent as they are."""
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
