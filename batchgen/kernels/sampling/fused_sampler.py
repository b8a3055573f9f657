"""The sampler's per-token work in two reads of the logits: vLLM's penalties, temperature, min-p, the
Gumbel-max draw, the greedy pick and the raw distribution's log-normaliser, for every row of a step.

In torch the same steps are a dozen passes over [S, V] float32 tensors (the penalized logits, the
counts gathered by row, the prompt marks, the noise's int64 hashing, the log-softmax). Here:

1. (row, column block) programs read the logits, the row's counts and prompt marks, apply the
   penalties, and keep the block's best penalized logit and its first column, and the raw logits'
   block maximum and sum of exponentials.
2. Only when some row samples: the same programs again, with the row's maximum from pass 1, drop the
   tokens under min-p, add the noise and keep the block's best noisy logit.
3. One program a row picks the first best block (greedy rows from pass 1, sampling rows from pass 2)
   and combines the log-normaliser.

The arithmetic is the torch sampler's (engine/sampler.py), operation for operation in float32 with
round-to-nearest divisions, so a greedy pick is the same; the noise is the same hash of (row key, step,
token id).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from batchgen.kernels.sampling.argmax import first_max_combine

_BLOCK = 4096  # columns per program: 32 programs per row of a 128K vocabulary


class Penalties(NamedTuple):
    counts: torch.Tensor  # [R, V] int32: each state row's output token counts
    prompt: torch.Tensor  # [R, V] bool: the tokens of each state row's prompt
    rows: torch.Tensor  # [S] int64: each sample's state row
    repetition: torch.Tensor  # [S] float32, 1 = off
    frequency: torch.Tensor  # [S] float32
    presence: torch.Tensor  # [S] float32


class Draws(NamedTuple):
    temperature: torch.Tensor  # [S] float32, 0 = a greedy row
    min_p: torch.Tensor  # [S] float32, 0 = off
    row_hash: torch.Tensor  # [S] int64 in [0, 2**32): the noise's per-(row, step) hash


class Picks(NamedTuple):
    tokens: torch.Tensor  # [S] int64
    logprobs: torch.Tensor | None  # [S] float32: each picked token's raw log-probability
    log_norm: torch.Tensor | None  # [S] float32: logsumexp of each row's raw logits


@triton.jit
def _mix32(x):
    """The sampler's 32-bit finaliser (lowbias32) on uint32 values: products wrap modulo 2**32."""
    x = x ^ (x >> 16)
    x = x * 0x21F0AAAD
    x = x ^ (x >> 15)
    x = x * 0x735A2D97
    return x ^ (x >> 15)


@triton.jit
def _penalized(x, counts_ptr, prompt_ptr, state_row, cols, ok, rep, freq, pres, n_cols):
    """The penalties on one block of a row's logits x (float32): repetition over prompt and output
    tokens, frequency per earlier output, presence once."""
    base = state_row * n_cols
    c = tl.load(counts_ptr + base + cols, mask=ok, other=0)
    seen = (tl.load(prompt_ptr + base + cols, mask=ok, other=0) != 0) | (c > 0)
    x = tl.where(seen, tl.where(x > 0, tl.math.div_rn(x, rep), x * rep), x)
    x = x - freq * c.to(tl.float32)
    return x - pres * (c > 0).to(tl.float32)


@triton.jit
def _gumbel(row_hash, cols):
    """Gumbel(0, 1) noise of (row hash, token id), as engine/sampler.gumbel_noise draws it."""
    token = _mix32(cols.to(tl.uint32) * 0x27D4EB2F + 0x165667B1)
    bits = _mix32(row_hash ^ token)
    uniform = ((bits >> 9).to(tl.float32) + 0.5) * (1.0 / 8388608.0)
    return -tl.log(-tl.log(uniform))


@triton.jit
def _blocks_kernel(
    logits_ptr, raw_ptr, counts_ptr, prompt_ptr, rows_ptr, rep_ptr, freq_ptr, pres_ptr,
    temp_ptr, min_p_ptr, hash_ptr,
    best_ptr, best_col_ptr, raw_max_ptr, raw_sum_ptr, draw_ptr, draw_col_ptr,
    stride_logits, stride_raw, n_cols, n_blocks,
    PENALTIES: tl.constexpr, LOG_NORM: tl.constexpr, SAME_RAW: tl.constexpr, DRAW: tl.constexpr,
    BLOCKS_PAD: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """One (row, column block): pass 1 (DRAW off) or pass 2 (DRAW on) of the module's docstring."""
    row = tl.program_id(0).to(tl.int64)
    blk = tl.program_id(1)
    cols = blk * BLOCK + tl.arange(0, BLOCK)
    ok = cols < n_cols
    out = row * n_blocks + blk
    x = tl.load(logits_ptr + row * stride_logits + cols, mask=ok, other=float("-inf")).to(tl.float32)
    if LOG_NORM and not DRAW:
        if SAME_RAW:
            raw = x
        else:
            raw = tl.load(raw_ptr + row * stride_raw + cols, mask=ok, other=float("-inf")).to(tl.float32)
        top = tl.max(raw, 0)
        tl.store(raw_max_ptr + out, top)
        tl.store(raw_sum_ptr + out, tl.sum(tl.exp(raw - top), 0))
    if PENALTIES:
        state_row = tl.load(rows_ptr + row)
        rep, freq, pres = tl.load(rep_ptr + row), tl.load(freq_ptr + row), tl.load(pres_ptr + row)
        x = _penalized(x, counts_ptr, prompt_ptr, state_row, cols, ok, rep, freq, pres, n_cols)
    if not DRAW:
        best, at = tl.reduce((x, cols), 0, first_max_combine)
        tl.store(best_ptr + out, best)
        tl.store(best_col_ptr + out, at)
    else:
        temperature = tl.load(temp_ptr + row)
        if temperature > 0:  # greedy rows take pass 1's pick
            blocks = tl.arange(0, BLOCKS_PAD)
            peaks = tl.load(best_ptr + row * n_blocks + blocks, mask=blocks < n_blocks, other=float("-inf"))
            scaled = tl.math.div_rn(x, temperature)
            kept = tl.exp(scaled - tl.math.div_rn(tl.max(peaks, 0), temperature)) >= tl.load(min_p_ptr + row)
            noise = _gumbel(tl.load(hash_ptr + row).to(tl.uint32), cols)
            noisy = tl.where(kept & ok, scaled + noise, float("-inf"))
            best, at = tl.reduce((noisy, cols), 0, first_max_combine)
            tl.store(draw_ptr + out, best)
            tl.store(draw_col_ptr + out, at)


@triton.jit
def _pick_kernel(
    best_ptr, best_col_ptr, raw_max_ptr, raw_sum_ptr, draw_ptr, draw_col_ptr, temp_ptr, raw_ptr,
    tokens_ptr, logprobs_ptr, log_norm_ptr, stride_raw, n_blocks, n_cols,
    LOG_NORM: tl.constexpr, DRAW: tl.constexpr, BLOCKS_PAD: tl.constexpr,
):  # fmt: skip
    """One row: the first best block's column, and the raw distribution's log-normaliser."""
    row = tl.program_id(0).to(tl.int64)
    blocks = tl.arange(0, BLOCKS_PAD)
    ok = blocks < n_blocks
    at = row * n_blocks + blocks
    vals = tl.load(best_ptr + at, mask=ok, other=float("-inf"))
    cols = tl.load(best_col_ptr + at, mask=ok, other=n_cols)  # past every real column
    _, token = tl.reduce((vals, cols), 0, first_max_combine)
    if DRAW:  # noqa: SIM102 (a compile-time branch around a run-time one)
        if tl.load(temp_ptr + row) > 0:
            vals = tl.load(draw_ptr + at, mask=ok, other=float("-inf"))
            cols = tl.load(draw_col_ptr + at, mask=ok, other=n_cols)
            _, token = tl.reduce((vals, cols), 0, first_max_combine)
    tl.store(tokens_ptr + row, token.to(tl.int64))
    if LOG_NORM:
        peaks = tl.load(raw_max_ptr + at, mask=ok, other=float("-inf"))
        top = tl.max(peaks, 0)
        sums = tl.load(raw_sum_ptr + at, mask=ok, other=0.0)
        log_norm = top + tl.log(tl.sum(sums * tl.exp(peaks - top), 0))
        tl.store(log_norm_ptr + row, log_norm)
        picked = tl.load(raw_ptr + row * stride_raw + token).to(tl.float32)
        tl.store(logprobs_ptr + row, picked - log_norm)


def pick_tokens(
    logits: torch.Tensor,  # [S, V]: the logits to pick from (masks and logit bias applied)
    raw: torch.Tensor,  # [S, V]: the model's logits, for the log-probabilities
    penalties: Penalties | None,
    draws: Draws | None,
    log_norm: bool,
    block: int | None = None,
) -> Picks:
    """Each row's token: the argmax of its penalized logits, or for rows with temperature > 0 a draw
    under temperature and min-p; with ``log_norm``, the raw log-probability of the token and the raw
    logits' logsumexp. Both [S, V] tensors need a unit column stride; ``block``: columns a program."""
    block = block or _BLOCK
    rows, cols = logits.shape
    device = logits.device
    n_blocks = triton.cdiv(cols, block)
    pad = max(2, triton.next_power_of_2(n_blocks))
    f32 = dict(dtype=torch.float32, device=device)
    best, raw_max, raw_sum, draw = (torch.empty(rows, n_blocks, **f32) for _ in range(4))
    best_col, draw_col = (torch.empty(rows, n_blocks, dtype=torch.int32, device=device) for _ in range(2))
    tokens = torch.empty(rows, dtype=torch.int64, device=device)
    logprobs, norm = torch.empty(rows, **f32), torch.empty(rows, **f32)
    if rows == 0:
        return Picks(tokens, logprobs if log_norm else None, norm if log_norm else None)
    p = penalties or Penalties(logits, logits, tokens, logprobs, logprobs, logprobs)  # unread stand-ins
    d = draws or Draws(logprobs, logprobs, tokens)
    prompt = p.prompt.view(torch.uint8) if p.prompt.dtype == torch.bool else p.prompt
    inputs = (logits, raw, p.counts, prompt, p.rows, p.repetition, p.frequency, p.presence, *d)
    outputs = (best, best_col, raw_max, raw_sum, draw, draw_col)
    flags = dict(PENALTIES=penalties is not None, LOG_NORM=log_norm, SAME_RAW=raw is logits)
    for drawing in (False, True) if draws is not None else (False,):
        _blocks_kernel[(rows, n_blocks)](
            *inputs, *outputs, logits.stride(0), raw.stride(0), cols, n_blocks,
            DRAW=drawing, BLOCKS_PAD=pad, BLOCK=block, **flags,
        )  # fmt: skip
    _pick_kernel[(rows,)](
        best, best_col, raw_max, raw_sum, draw, draw_col, d.temperature, raw, tokens, logprobs, norm,
        raw.stride(0), n_blocks, cols, LOG_NORM=log_norm, DRAW=draws is not None, BLOCKS_PAD=pad,
    )  # fmt: skip
    return Picks(tokens, logprobs if log_norm else None, norm if log_norm else None)
