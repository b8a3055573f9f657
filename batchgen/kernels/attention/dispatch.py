"""Entry points the engine calls on CUDA: Triton KV write and paged attention.

Every choice here is made from Python values fixed per CUDA-graph bucket (``decode_only``, the
``max_seq_len`` / ``max_q_len`` bounds, tensor shapes and dtypes), never from tensor contents, so both
calls are graph capturable: no ``.item()``, ``.tolist()`` or device-dependent branching. The one value
that changes per step, ``decode_rows``, is 0 in every graph (``cuda_slots.graph_layout``) and refused
during a capture.
"""

from __future__ import annotations

import torch

from batchgen.kernels.attention.decode import decode_attention
from batchgen.kernels.attention.kv_write import write_kv
from batchgen.kernels.attention.prefill import prefill_attention

__all__ = ["paged_attention_triton", "write_kv"]


def paged_attention_triton(
    query: torch.Tensor,  # [T, q_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, kv_heads, head_dim]
    v_cache: torch.Tensor,
    cu_seqlens_q: torch.Tensor,  # [B + 1] int32
    seq_lens: torch.Tensor,  # [B] int32, context length after this step's KV write
    block_tables: torch.Tensor,  # [B, max_blocks] int32
    scale: float,
    sliding_window: int | None = None,
    *,
    decode_only: bool,
    max_seq_len: int,
    max_q_len: int,
    out: torch.Tensor | None = None,
    kv_scales: tuple[float, float] = (1.0, 1.0),
    decode_rows: int = 0,
    prompt_cu_seqlens_q: torch.Tensor | None = None,
) -> torch.Tensor:  # [T, q_heads, head_dim]
    """Same result as ``reference.paged_attention`` for the rows that belong to a sequence.

    ``decode_only``: every sequence has exactly one query row (split-K decode kernel); otherwise the
    varlen kernel runs (prefill chunks, decodes as chunks of 1, or a mix). ``max_seq_len`` is an upper
    bound on ``seq_lens`` that sets the decode split count (a low bound costs speed, not correctness);
    ``max_q_len`` bounds the chunk length. Padding rows (past ``cu_seqlens_q[-1]``) are not written:
    they hold whatever ``out`` held (uninitialised memory when ``out`` is None). An FP8 (e4m3) cache holds
    ``k / k_scale`` and ``v / v_scale`` (``kv_scales``); its tiles are converted to the query's dtype as
    they are loaded, k_scale folds into the softmax scale and v_scale into the output.

    ``decode_rows`` (a step with prompts): its first sequences have one query row each (rows
    ``[0, decode_rows)``); they run the decode kernel, and the prompts' chunks the varlen kernel on
    ``prompt_cu_seqlens_q`` (``cu_seqlens_q[decode_rows:] - decode_rows``). In the varlen kernel each
    decode row would take a whole 64- or 128-row tile over its context, wasting all but one of its rows.
    """
    if decode_only:
        return decode_attention(
            query, k_cache, v_cache, cu_seqlens_q, seq_lens, block_tables, scale, sliding_window,
            max_seq_len=max_seq_len, out=out, kv_scales=kv_scales,
        )  # fmt: skip
    # Short chunks (mostly decodes) waste most of a 128-row tile; 64 rows halve that waste.
    group = query.shape[1] // k_cache.shape[2]
    block_m = 64 if max_q_len * group <= 64 else None
    if not decode_rows:
        return prefill_attention(
            query, k_cache, v_cache, cu_seqlens_q, seq_lens, block_tables, scale, sliding_window,
            block_m=block_m, out=out, kv_scales=kv_scales,
        )  # fmt: skip
    assert prompt_cu_seqlens_q is not None
    capturing = query.is_cuda and torch.cuda.is_current_stream_capturing()
    assert not capturing, "decode_rows change per step: never in a graph"
    out = torch.empty(query.shape, dtype=query.dtype, device=query.device) if out is None else out
    d = decode_rows
    decode_attention(
        query[:d], k_cache, v_cache, cu_seqlens_q[: d + 1], seq_lens[:d], block_tables[:d], scale,
        sliding_window, max_seq_len=max_seq_len, out=out[:d], kv_scales=kv_scales,
    )  # fmt: skip
    prefill_attention(
        query[d:], k_cache, v_cache, prompt_cu_seqlens_q, seq_lens[d:], block_tables[d:], scale,
        sliding_window, block_m=block_m, out=out[d:], kv_scales=kv_scales,
    )  # fmt: skip
    return out
