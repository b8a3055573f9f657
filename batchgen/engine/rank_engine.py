"""One rank's share of an engine: the model (``model/build.py``), its paged KV pool, and the runner.

Rank 0's ``LLM`` and every tensor-parallel worker process call the same functions with the same
options, in the same order: the collectives inside (the KV pool size agreed over ranks, the warm-up runs
before graph capture) pair up across processes.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import NamedTuple

import torch

from batchgen.allocator import keep_freed_memory
from batchgen.config import EngineConfig
from batchgen.distributed.group import ParallelGroup
from batchgen.engine.batch_width import ROW_TOKENS, pool_width, rows_in_budget, width_for
from batchgen.engine.runner import Sampler
from batchgen.engine.sampler import sample
from batchgen.engine.sharded_sampler import ShardedSampler
from batchgen.engine.speculative.draft import DraftModel
from batchgen.model import kv_cache
from batchgen.model.backends import TorchBackend, TritonBackend
from batchgen.model.build import ModelBundle, ModelFiles, build_model
from batchgen.model.forward import TransformersForward
from batchgen.model.loader import local_model_dir, open_checkpoint, resolve_device, resolve_dtype
from batchgen.threads import ThreadGovernor, set_cpu_threads

ACTIVATION_RESERVE = 2 << 30  # CUDA: room for a step's activations beside the KV pool
# and per decoded row, room for its logits: fp32 logits and the sampler's two temporaries of their size
LOGIT_BYTES = 12
# A graph is captured on its key's 5th use (graph_capture.py): keys a run meets a few times only (a short
# job) stay eager. Rent or buy: on B7 (a small model) many more eager uses first made the whole command
# slower, when a capture still paid its own warm-up runs and a device sync; after eager uses it now only
# records, and the eager uses measure a mixed key's bucket (mixed_graphs.MIN_RUNS).
CAPTURE_AFTER = 4
DEFAULT_MAX_MODEL_LEN = 4096


class RankEngine(NamedTuple):
    bundle: ModelBundle
    runner: object  # EagerRunner or CudaRunner
    num_blocks: int
    device: torch.device
    dtype: torch.dtype
    max_model_len: int
    async_mode: bool
    max_num_seqs: int  # the width chosen (batch_width.py) when the options leave it to the engine
    startup: dict[str, float]  # seconds: loading the model, allocating the KV pool, the runner (graphs)
    draft: DraftModel | None = None  # --speculative draft: the draft model and its own KV pool


def max_model_len(options: EngineConfig, hf_config) -> int:
    text = hf_config.get_text_config()
    limit = getattr(text, "max_position_embeddings", None) or DEFAULT_MAX_MODEL_LEN
    return min(options.max_model_len or limit, limit)


def rank_device(options: EngineConfig, group: ParallelGroup) -> torch.device:
    """Rank r of a tensor-parallel CUDA job runs on the r-th visible GPU."""
    device = resolve_device(options.device)
    if group.is_parallel and device.type == "cuda":
        return torch.device("cuda", group.local_rank)
    return device


def build_rank(
    options: EngineConfig, files: ModelFiles, group: ParallelGroup, progress: bool = True,
    dtype: torch.dtype | None = None,
) -> RankEngine:  # fmt: skip
    device = rank_device(options, group)
    if device.type == "cuda" and device.index is not None:
        torch.cuda.set_device(device)
    dtype = dtype or resolve_dtype(options.dtype, device)
    warmup = _triton_warmup(options, device, dtype)
    governor = set_cpu_threads(options.threads, device, group.size)  # before loading: it computes
    if device.type == "cpu":
        keep_freed_memory()  # allocator.py: no page faults per op on the CPU path
    limit = max_model_len(options, files.hf_config)
    clock = _Clock(device)
    bundle = build_model(options, files, group, device, dtype, limit)
    draft = _load_draft(options, group, device, dtype)
    clock.mark("model_s")
    cache_dtype = kv_cache.cache_dtype(options.kv_cache_dtype, dtype)
    vocab = files.hf_config.get_text_config().vocab_size  # the logits' width
    draft_bytes = 0 if draft is None else draft.bundle.kv_shape.bytes_per_block(1, dtype)
    blocks, rows = _num_blocks(
        options, bundle.kv_shape, device, cache_dtype, limit, vocab, draft_bytes, bundle.workspace_bytes
    )
    num_blocks = group.min_int(blocks, device)
    caches = kv_cache.allocate(bundle.kv_shape, num_blocks, options.block_size, cache_dtype, device)
    draft_model = None if draft is None else _draft_model(draft, num_blocks, options, device, dtype, governor)
    clock.mark("kv_cache_s")
    kv_tokens = num_blocks * options.block_size  # the same on every rank: the pool size is agreed
    width = width_for(options.max_num_seqs, kv_tokens, options.max_num_seqs_cap, device.type == "cuda")
    width = min(width, group.min_int(rows, device))  # no more rows than the logits' room was left for
    options = replace(options, max_num_seqs=width)
    async_mode = options.async_mode if options.async_mode is not None else device.type == "cuda"
    # transformers' tp_plan (model/hf_plan.py) runs DTensor code whose capture in CUDA graphs is not
    # verified yet: eager steps there; batchgen's own sharded forward is captured (tests/tensor_parallel).
    graphs = options.cuda_graphs is not False and not (
        group.is_parallel and isinstance(bundle.forward, TransformersForward)
    )
    if warmup is not None:
        warmup.join()  # before any launch (tensor parallelism captures its graphs in ``_runner``)
    runner = _runner(
        options, bundle, caches, device, limit, async_mode, progress, governor, graphs, group, vocab
    )
    clock.mark("graphs_s" if device.type == "cuda" else "runner_s")
    return RankEngine(
        bundle, runner, num_blocks, device, dtype, limit, async_mode, width, clock.phases, draft_model
    )


class _Draft(NamedTuple):
    bundle: ModelBundle
    max_model_len: int
    tokenizer: object


def _load_draft(options: EngineConfig, group: ParallelGroup, device, dtype) -> _Draft | None:
    """--speculative draft: the draft model, unquantized, in the target's dtype on its device."""
    if options.speculative != "draft":
        return None
    draft_options = replace(
        options, model=options.draft_model, speculative=None, draft_model=None, quantization=None,
        kv_cache_dtype="auto", max_model_len=None,
    )  # fmt: skip
    path = local_model_dir(options.draft_model)
    checkpoint = open_checkpoint(path, draft_options)
    limit = max_model_len(draft_options, checkpoint.config)
    bundle = build_model(draft_options, ModelFiles(path, checkpoint.config), group, device, dtype, limit)
    return _Draft(bundle, limit, checkpoint.tokenizer)


def _draft_model(
    draft: _Draft, num_blocks: int, options: EngineConfig, device, dtype, governor
) -> DraftModel:  # fmt: skip
    """The draft's KV pool holds as many blocks as the target's (each row the target holds fits)."""
    caches = kv_cache.allocate(draft.bundle.kv_shape, num_blocks, options.block_size, dtype, device)
    cuda_triton = device.type == "cuda" and options.attention_backend != "torch"
    backend = TritonBackend() if cuda_triton else TorchBackend(governor)
    return DraftModel(
        draft.bundle.forward, caches, backend, device, options.block_size, draft.max_model_len,
        draft.tokenizer,
    )  # fmt: skip


def _triton_warmup(options: EngineConfig, device: torch.device, dtype: torch.dtype = torch.bfloat16):
    """Triton's per-process start, and an FP8 cache's CUDA attention, on a thread while the model loads
    (kernels/warmup.py)."""
    if device.type != "cuda" or options.attention_backend == "torch":
        return None
    from batchgen.kernels import warmup

    fp8 = options.kv_cache_dtype == "fp8" and dtype in (torch.bfloat16, torch.float16)
    index = device.index if device.index is not None else torch.cuda.current_device()
    return warmup.start((index, dtype == torch.bfloat16) if fp8 else None)


class _Clock:
    """Seconds each start-up phase took, the device's queued work included, so a slow start says where."""

    def __init__(self, device: torch.device) -> None:
        self.device, self.phases = device, {}
        self._last = time.perf_counter()

    def mark(self, name: str) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        now = time.perf_counter()
        self.phases[name] = round(now - self._last, 3)
        self._last = now


def _num_blocks(
    options: EngineConfig, shape: kv_cache.KVShape, device, dtype, limit: int, vocab: int,
    draft_bytes: int = 0, workspace_bytes: int = 0,
) -> tuple[int, int]:  # fmt: skip
    """The pool's blocks, and the most rows the memory beside it was left for (their logits).
    ``draft_bytes``: a draft model's KV bytes a token, whose pool gets as many blocks from the same budget.
    ``workspace_bytes``: what a step takes beside the activation reserve (``ModelBundle``'s)."""
    rows = pool_width(options.max_num_seqs, options.max_num_seqs_cap, device.type == "cuda")
    token_bytes = shape.bytes_per_block(1, dtype)
    if options.kv_cache_bytes is not None:
        budget = options.kv_cache_bytes
    elif device.type == "cuda":
        reserve = ACTIVATION_RESERVE + workspace_bytes
        budget = kv_cache.cuda_budget(device, options.gpu_memory_utilization, reserve)
        logit_row = vocab * LOGIT_BYTES
        if options.max_num_seqs is None:  # each row takes a row's KV and its logits' room
            rows = rows_in_budget(budget, ROW_TOKENS * (token_bytes + draft_bytes), logit_row, rows)
        budget -= rows * logit_row
    else:
        budget = kv_cache.default_cpu_budget()
    budget = budget * token_bytes // (token_bytes + draft_bytes)  # the target's share
    useful = rows * limit + options.max_batch_tokens
    return kv_cache.num_blocks_for(shape, options.block_size, dtype, budget, useful), rows


def _sampler(bundle: ModelBundle, group: ParallelGroup) -> Sampler:
    """One process's sampler, or the one that combines the ranks' shares of a split vocabulary."""
    if bundle.split_vocab is None:
        return sample
    vocab, vocab_size = bundle.split_vocab
    return ShardedSampler(group, vocab, vocab_size)


def _runner(
    options: EngineConfig, bundle: ModelBundle, caches, device, limit: int, async_mode: bool, progress,
    governor: ThreadGovernor | None, graphs: bool, group: ParallelGroup, vocab: int,
):  # fmt: skip
    from batchgen.engine.runner import EagerRunner

    sampler = _sampler(bundle, group)
    if device.type != "cuda":
        return EagerRunner(bundle.forward, caches, TorchBackend(governor), device, sampler, vocab)
    from batchgen.engine.cuda_runner import CudaRunner

    triton = options.attention_backend != "torch"
    runner = CudaRunner(
        bundle.forward, caches, TritonBackend() if triton else TorchBackend(), device,
        max_num_seqs=options.max_num_seqs, max_batch_tokens=options.max_batch_tokens,
        max_model_len=limit, block_size=options.block_size, num_slots=2 if async_mode else 1,
        cuda_graphs=graphs and triton,  # the torch reference syncs: not capturable
        sampler=sampler,
        # Tensor parallelism captures every graph up front: each rank's capture runs collectives that
        # must pair up across ranks, and up-front capture is what the two-GPU tests verified.
        capture_after=0 if group.is_parallel else CAPTURE_AFTER,
        # Steps with new prompts: graphs where measured launch-bound; ranks could measure apart.
        mixed_graphs=False if group.is_parallel else None,
        vocab_size=vocab,
        max_samples=options.max_num_seqs * (1 + options.num_speculative_tokens) if options.speculative else 0,
    )  # fmt: skip
    if group.is_parallel:
        runner.capture_all(progress=progress)
    return runner
