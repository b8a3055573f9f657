"""FP8 (e4m3) matrix products on CUDA: activations [M, K] x weights [N, K] -> [M, N] in the model dtype.

- Per-token x per-channel scales (``--quantization fp8``, compressed-tensors channel/tensor weights):
  ``torch._scaled_mm`` (cuBLASLt, rowwise scales, fp32 accumulation) above 64 rows when it applies (bf16
  output, N and K multiples of 16); else the Triton kernel below, which applies the same scales in its
  epilogue (at decode row counts its narrow tiles read the weights faster than cuBLASLt's choice).
- Block scales (the ``fp8`` method's 128 x 128 weight blocks with 1 x 128 activation groups): only the
  Triton kernel; each K tile is one scale group, so its partial product is scaled before it is added.

The Triton kernel is also what the tests run under the interpreter (tl.dot of e4m3 tiles, fp32 sums).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from batchgen.kernels.decode import num_sms
from batchgen.kernels.fp8_reference import Fp8Act
from batchgen.kernels.pdl import pdl_options, wait_for_producer


@triton.jit
def _fp8_matmul_kernel(
    a_ptr,  # [M, K] e4m3
    b_ptr,  # [N, K] e4m3
    c_ptr,  # [M, N] model dtype
    as_ptr,  # [M, 1] per token, or [M, cdiv(K, BLOCK_K)] per group (BLOCKWISE), fp32
    bs_ptr,  # [N] per channel, or [cdiv(N, SCALE_ROWS), cdiv(K, BLOCK_K)] per block (BLOCKWISE), fp32
    M,
    N,
    K,
    stride_am,
    stride_bn,
    stride_cm,
    stride_as,
    stride_bs,
    stride_split,  # K split over program axis 2: c is [splits, M, N] fp32 partial sums, one per split
    tiles_per_split,  # K tiles each split covers
    out_ptr,  # FUSED_SUM: [M, N] model dtype, the sum of the splits, by the last split of each tile
    stride_om,
    arrivals_ptr,  # FUSED_SUM: int32 [tiles], zero before and after the launch
    BLOCKWISE: tl.constexpr,
    SCALE_ROWS: tl.constexpr,  # weight rows per block-scale row (1: expanded per row)
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    FUSED_SUM: tl.constexpr = False,
    PDL: tl.constexpr = False,
):
    wait_for_producer(PDL)
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    split = tl.program_id(2)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    k_first = split * tiles_per_split
    rk = tl.arange(0, BLOCK_K)
    m_ok = rm < M
    n_ok = rn < N
    a_ptrs = a_ptr + rm.to(tl.int64)[:, None] * stride_am + (k_first * BLOCK_K + rk)[None, :]
    b_ptrs = b_ptr + rn.to(tl.int64)[:, None] * stride_bn + (k_first * BLOCK_K + rk)[None, :]
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for kb in range(k_first, tl.minimum(k_first + tiles_per_split, tl.cdiv(K, BLOCK_K))):
        k_ok = rk[None, :] < K - kb * BLOCK_K
        a = tl.load(a_ptrs, mask=m_ok[:, None] & k_ok, other=0.0)
        b = tl.load(b_ptrs, mask=n_ok[:, None] & k_ok, other=0.0)
        part = tl.dot(a, tl.trans(b))  # [BLOCK_M, BLOCK_N] fp32
        if BLOCKWISE:
            sa = tl.load(as_ptr + rm * stride_as + kb, mask=m_ok, other=0.0)
            sb = tl.load(bs_ptr + (rn // SCALE_ROWS) * stride_bs + kb, mask=n_ok, other=0.0)
            acc += part * sa[:, None] * sb[None, :]
        else:
            acc += part
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K
    if not BLOCKWISE:
        sa = tl.load(as_ptr + rm * stride_as, mask=m_ok, other=0.0)
        sb = tl.load(bs_ptr + rn, mask=n_ok, other=0.0)
        acc = acc * sa[:, None] * sb[None, :]
    c_ptrs = c_ptr + split * stride_split + rm.to(tl.int64)[:, None] * stride_cm + rn[None, :]
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])
    if FUSED_SUM:
        out_ptrs = out_ptr + rm.to(tl.int64)[:, None] * stride_om + rn[None, :]
        tile = pid_m * tl.num_programs(1) + pid_n
        _last_split_sums(c_ptrs - split * stride_split, out_ptrs, arrivals_ptr + tile,
                         m_ok[:, None] & n_ok[None, :], stride_split)  # fmt: skip


@triton.jit
def _last_split_sums(part_ptrs, out_ptrs, arrival_ptr, mask, stride_split):
    """The last split of a tile to finish sums the tile's partial products in split order (deterministic:
    every split's is read back from memory, whichever finished last) and re-arms the tile's counter. The
    barrier orders every thread's partial store before the arrival (a release at GPU scope); the loads
    after the acquire read L2 (``.cg``), where the other splits' partials are."""
    tl.debug_barrier()
    arrived = tl.atomic_add(arrival_ptr, 1, sem="acq_rel", scope="gpu")
    splits = tl.num_programs(2)
    if arrived == splits - 1:
        tl.debug_barrier()
        total = tl.zeros(part_ptrs.shape, dtype=tl.float32)
        for s in range(splits):
            total += tl.load(part_ptrs + s * stride_split, mask=mask, other=0.0, cache_modifier=".cg")
        tl.store(out_ptrs, total.to(out_ptrs.dtype.element_ty), mask=mask)
        tl.store(arrival_ptr, 0)


@triton.jit
def _sum_splits_kernel(
    p_ptr, c_ptr, numel, SPLIT_K: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr = False
):
    """c = the sum of the SPLIT_K partial products [SPLIT_K, M, N], in split order (deterministic)."""
    wait_for_producer(PDL)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < numel
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for s in range(SPLIT_K):
        acc += tl.load(p_ptr + s * numel + offs, mask=ok, other=0.0)
    tl.store(c_ptr + offs, acc.to(c_ptr.dtype.element_ty), mask=ok)


def _config(m: int, n: int, sms: int) -> dict:
    """Small M (decode): narrow tiles, so that N alone spreads the weight read over the SMs, long K tiles
    and 4 stages for the bytes in flight; where 32-wide tiles are still fewer than the SMs, 64-wide ones
    with K split (below). H200, M = 32, graph replays over weight copies (``scripts/tune_fp8.py``): qkv
    11.3 us, o_proj 8.5 (32-wide, 3 splits: 8.9), gate_up 39.2, down 19.8 (32-wide, 6 stages: 24.3)."""
    if m <= 64:
        block_n = 64 if triton.cdiv(n, 32) < sms else 32
        return dict(BLOCK_M=max(16, triton.next_power_of_2(m)), BLOCK_N=block_n, num_warps=4, num_stages=4)
    return dict(BLOCK_M=128, BLOCK_N=128, num_warps=8, num_stages=3)


def choose_split_k(programs: int, k_tiles: int, sms: int, block_n: int = 32) -> int:
    """K splits of a decode-sized product, each at least 4 K tiles long. 32-wide tiles: enough for 2
    programs per SM (Llama-3-8B's qkv at M = 32: 192 tiles, 2 splits). 64-wide tiles (N too narrow for the
    SMs even at 32: o_proj and down_proj, 64 tiles): about one program per SM (2 splits: 8.5 / 19.8 us, vs
    9.2 / 21.5 with 3)."""
    if block_n >= 64:
        return max(1, min(sms // programs, k_tiles // 4))
    if programs >= 2 * sms:
        return 1
    return max(1, min(-(-2 * sms // programs), k_tiles // 4))


# Built in session 33, not yet measured on a GPU (scripts/tune_fp8.py sweeps it): the split sums in the
# product's own last program instead of a second kernel (B1's FP8 step launches 3 of them a layer).
FUSE_SPLIT_SUMS = False
_MAX_TILES = 1 << 16
_arrival_counters: dict[torch.device, torch.Tensor] = {}  # per device, for the process


def _arrivals(device: torch.device, tiles: int) -> torch.Tensor | None:
    """The tiles' arrival counters (int32, zero between launches: each launch re-arms its tiles), or None
    (the second kernel sums): too many tiles, or no buffer yet while a graph is being captured (it would
    live in the graph's memory pool). Launches on one stream at a time, as the engine's are."""
    counters = _arrival_counters.get(device)
    if counters is None:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            return None
        counters = _arrival_counters[device] = torch.zeros(_MAX_TILES, dtype=torch.int32, device=device)
    return counters if tiles <= _MAX_TILES else None


def triton_fp8_matmul(
    act: Fp8Act, weight: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype, *,
    group: int | None = None, scale_rows: int = 1, split_k: int | None = None, block_n: int | None = None,
    num_stages: int | None = None, fuse_sums: bool | None = None,
) -> torch.Tensor:  # fmt: skip
    """[M, K] x [N, K] -> [M, N]. ``group`` set: block scales (``scale`` [cdiv(N, scale_rows), cdiv(K,
    group)], activation scales per ``group`` columns); else per-token x per-channel (``scale`` [N]).
    ``split_k``: K splits (default: ``choose_split_k`` at decode sizes); ``fuse_sums``: the last split of
    each tile sums them (default ``FUSE_SPLIT_SUMS``), where a counter buffer is at hand (not first made
    inside a graph capture)."""
    m, k = act.data.shape
    n = weight.shape[0]
    out = torch.empty((m, n), dtype=dtype, device=act.data.device)
    if m == 0:
        return out
    block_k = group or (256 if m <= 64 else 128)  # block scales: one K tile per scale group
    sms = num_sms(out.device)
    cfg = _config(m, n, sms)
    cfg.update({key: v for key, v in (("BLOCK_N", block_n), ("num_stages", num_stages)) if v})
    if block_k > 128 and cfg["BLOCK_M"] > 64:
        cfg["num_stages"] = 2
    grid = (triton.cdiv(m, cfg["BLOCK_M"]), triton.cdiv(n, cfg["BLOCK_N"]))
    k_tiles = triton.cdiv(k, block_k)
    if split_k is None:
        split_k = choose_split_k(grid[0] * grid[1], k_tiles, sms, cfg["BLOCK_N"]) if m <= 64 else 1
    per_split = triton.cdiv(k_tiles, split_k)
    split_k = triton.cdiv(k_tiles, per_split)  # no empty split
    # fp32 partial products, one [M, N] slice per split, summed in split order by the last split of each
    # tile (``fuse_sums``) or by a second kernel
    dest = out if split_k == 1 else torch.empty((split_k, m, n), dtype=torch.float32, device=out.device)
    fuse_sums = FUSE_SPLIT_SUMS if fuse_sums is None else fuse_sums
    arrivals = _arrivals(out.device, grid[0] * grid[1]) if split_k > 1 and fuse_sums else None
    # No PDL at decode sizes: B1's FP8 step (H200, bench_step) ran 5.82 ms without it here vs 6.33 with it,
    # since the 64-wide tiles (5.90 vs 6.33 with the 32-wide ones; why is not established).
    pdl = pdl_options(act.data) if m > 64 else {}
    _fp8_matmul_kernel[(*grid, split_k)](
        act.data, weight, dest, act.scale, scale, m, n, k,
        act.data.stride(0), weight.stride(0), n if split_k > 1 else out.stride(0), act.scale.stride(0),
        scale.stride(0) if group else 0, m * n, per_split, out, out.stride(0),
        arrivals if arrivals is not None else dest, BLOCKWISE=group is not None, SCALE_ROWS=scale_rows,
        BLOCK_K=block_k, FUSED_SUM=arrivals is not None, **cfg, **pdl
    )  # fmt: skip
    if split_k > 1 and arrivals is None:
        block = 1024
        _sum_splits_kernel[(triton.cdiv(m * n, block),)](
            dest, out, m * n, SPLIT_K=split_k, BLOCK=block, **pdl
        )
    return out


def scaled_mm_applies(n: int, k: int, dtype: torch.dtype) -> bool:
    """cuBLASLt's rowwise FP8 product: bf16 output only, N and K multiples of 16."""
    return dtype == torch.bfloat16 and n % 16 == 0 and k % 16 == 0


def rowwise_matmul(
    act: Fp8Act, weight: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """Per-token x per-channel FP8 product on CUDA (``scale``: [N] fp32)."""
    m, k = act.data.shape
    n = weight.shape[0]
    if m > 64 and scaled_mm_applies(n, k, dtype):  # at decode sizes the Triton kernel reads faster
        # weight.t() is column-major [K, N], as cuBLASLt wants its second operand.
        return torch._scaled_mm(
            act.data, weight.t(), scale_a=act.scale, scale_b=scale.view(1, n), out_dtype=dtype
        )
    return triton_fp8_matmul(act, weight, scale, dtype)
