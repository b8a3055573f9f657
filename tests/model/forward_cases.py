"""The model tests' way to run a forward: built as ``LLM.from_model`` builds it, and fed one sequence in
chunks on a paged cache."""

from __future__ import annotations

import torch

from batchgen.config import EngineConfig
from batchgen.distributed.group import ParallelGroup
from batchgen.model.build import ModelFiles, build_model
from batchgen.model.kv_cache import kv_shape
from batchgen.model.paged_sequence import sequence_logits

BLOCK = 4


def build_forward(model: torch.nn.Module, impl: str, max_positions: int):
    """The forward ``LLM.from_model`` would run on ``model`` with ``--model-impl impl``."""
    param = next(model.parameters())
    files = ModelFiles(None, model.config, model)
    options = EngineConfig(model_impl=impl)
    return build_model(
        options, files, ParallelGroup.single(), param.device, param.dtype, max_positions
    ).forward


def fused_logits(forward, model, ids, chunks: list[int], dtype, backend=None) -> torch.Tensor:
    """All positions' logits, the sequence fed in ``chunks`` (chunked prefill, then decodes)."""
    return sequence_logits(forward, ids, chunks, kv_shape(model.config), dtype, backend, BLOCK)
