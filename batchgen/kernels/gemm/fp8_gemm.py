"""FP8 (e4m3) matrix products on CUDA: activations [M, K] x weights [N, K] -> [M, N] in the model dtype.

- Per-token x per-channel scales (``--quantization fp8``, compressed-tensors channel/tensor weights):
  ``torch._scaled_mm`` (cuBLASLt, rowwise scales, fp32 accumulation) above 64 rows when it applies (bf16
  output, N and K multiples of 16); else the Triton kernel below, which applies the same scales in its
  epilogue (at decode row counts its narrow tiles read the weights faster than cuBLASLt's choice).
- Block scales (the ``fp8`` method's 128 x 128 weight blocks with 1 x 128 activation groups): only the
  Triton kernel; each K tile is one scale group, so its partial product is scaled before it is added.

At decode sizes (<= 64 rows) on sm_90+ the TMA kernels (``fp8_gemm_tma.py``) take the products where
``tma_shape`` picks them (gate|up). All are what the tests run under the interpreter (tl.dot of e4m3
tiles, fp32 sums).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from batchgen.kernels.fp8_format import Fp8Act
from batchgen.kernels.gemm.dequant import dequantized_linear
from batchgen.kernels.gemm.fp8_gemm_tma import (
    SMALL_M,
    input_operand,
    scale_rowwise,
    split_destination,
    tma_product,
    tma_shape,
    tma_supported,
    weight_only_tma,
)
from batchgen.kernels.gemm.split_sums import SplitSums
from batchgen.kernels.gemm.split_sums_triton import sum_splits
from batchgen.kernels.launch.device import needs_f32_dot, num_sms
from batchgen.kernels.launch.pdl import pdl_options, wait_for_producer


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
    BLOCKWISE: tl.constexpr,
    SCALE_ROWS: tl.constexpr,  # weight rows per block-scale row (1: expanded per row)
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PDL: tl.constexpr = False,
    A16: tl.constexpr = False,  # a in 16 bits (W8A16): no token scales, each weight tile widened to it
    DOT_F32: tl.constexpr = False,  # interpreter only: bf16 dot operands upcast (``needs_f32_dot``)
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
        if A16:
            b = b.to(a.dtype)
        if DOT_F32:
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        part = tl.dot(a, tl.trans(b))  # [BLOCK_M, BLOCK_N] fp32
        if BLOCKWISE:
            sa = tl.load(as_ptr + rm * stride_as + kb, mask=m_ok, other=0.0)
            sb = tl.load(bs_ptr + (rn // SCALE_ROWS) * stride_bs + kb, mask=n_ok, other=0.0)
            acc += part * sa[:, None] * sb[None, :]
        else:
            acc += part
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K
    if A16:
        acc = acc * tl.load(bs_ptr + rn, mask=n_ok, other=0.0)[None, :]
    elif not BLOCKWISE:
        acc = scale_rowwise(acc, as_ptr, bs_ptr, rm, rn, m_ok, n_ok, stride_as)
    c_ptrs = c_ptr + split * stride_split + rm.to(tl.int64)[:, None] * stride_cm + rn[None, :]
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


# Weight-only products of this many rows or more widen the weight for cuBLAS (``dequant.py``): widening
# costs the same whatever the rows, and cuBLAS's 16-bit products outrun the pointer kernel's widened
# tiles by enough to repay it from about here (the measured break-even: docs/results.md).
DEQUANT_ROWS = 2048


def _config(m: int, n: int, sms: int) -> dict:
    """Small M (decode): narrow tiles, so that N alone spreads the weight read over the SMs, long K tiles
    and 4 stages for the bytes in flight; where 32-wide tiles are still fewer than the SMs, 64-wide ones
    with K split (below). The choices are the fastest of a sweep at M = 32 (graph replays over weight
    copies; ``docs/kernels.md``)."""
    if m <= SMALL_M:
        block_n = 64 if triton.cdiv(n, 32) < sms else 32
        return dict(BLOCK_M=max(16, triton.next_power_of_2(m)), BLOCK_N=block_n, num_warps=4, num_stages=4)
    return dict(BLOCK_M=128, BLOCK_N=128, num_warps=8, num_stages=3)


def choose_split_k(programs: int, k_tiles: int, sms: int, block_n: int = 32) -> int:
    """K splits of a decode-sized product, each at least 4 K tiles long. 32-wide tiles: enough for 2
    programs per SM (Llama-3-8B's qkv at M = 32: 192 tiles, 2 splits). 64-wide tiles (N too narrow for the
    SMs even at 32: o_proj and down_proj, 64 tiles): about one program per SM, where more splits only add
    partial sums to merge."""
    if block_n >= 64:
        return max(1, min(sms // programs, k_tiles // 4))
    if programs >= 2 * sms:
        return 1
    return max(1, min(-(-2 * sms // programs), k_tiles // 4))


def triton_fp8_matmul(
    act: Fp8Act | torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype, *,
    group: int | None = None, scale_rows: int = 1, split_k: int | None = None, block_n: int | None = None,
    num_stages: int | None = None, tma: bool | None = None, summed: bool = True,
) -> torch.Tensor | SplitSums:  # fmt: skip
    """[M, K] x [N, K] -> [M, N]. ``group`` set: block scales (``scale`` [cdiv(N, scale_rows), cdiv(K,
    group)], activation scales per ``group`` columns); else per-token x per-channel (``scale`` [N]).
    ``act`` a 16-bit tensor instead of an ``Fp8Act``: weight-only (W8A16, per-channel scales), each e4m3
    weight tile widened to its dtype before a 16-bit MMA (bound by reading the e4m3 weights at decode
    sizes, as the FP8 product is; 64-deep K tiles above them: 16-bit operands take twice the bytes).
    ``split_k``: K splits (default: ``choose_split_k`` at decode sizes). ``tma``: the TMA kernel
    (default: where ``tma_supported`` and ``tma_shape`` picks it, with its tile width and splits; True
    also runs it under the interpreter, for the tests). ``summed`` False: a K-split product comes back
    as its partials (``SplitSums``), for a consumer that adds them."""
    data, act_scale, a16 = input_operand(act, scale)
    data = data if data.stride(-1) == 1 else data.contiguous()
    m, k = data.shape
    n = weight.shape[0]
    if m == 0:
        return torch.empty((m, n), dtype=dtype, device=data.device)
    sms = num_sms(data.device)
    explicit = group is not None or split_k is not None or block_n is not None
    chosen = explicit or (a16 and not weight_only_tma())
    shape = tma_shape(n, k, sms) if tma is None and not chosen else None
    if shape is not None and tma_supported(data, weight):
        tma, (block_n, split_k) = True, shape
    if tma:
        return _split_result(
            tma_product(act, weight, scale, dtype, split_k, block_n, num_stages), dtype, summed
        )
    if a16 and m >= DEQUANT_ROWS and not explicit and data.dtype == dtype:
        return dequantized_linear(data, weight, scale)
    block_k = group or (256 if m <= SMALL_M else 64 if a16 else 128)  # block scales: a K tile per group
    cfg = _config(m, n, sms)
    cfg.update({key: v for key, v in (("BLOCK_N", block_n), ("num_stages", num_stages)) if v})
    if block_k > 128 and cfg["BLOCK_M"] > 64:
        cfg["num_stages"] = 2
    grid = (triton.cdiv(m, cfg["BLOCK_M"]), triton.cdiv(n, cfg["BLOCK_N"]))
    k_tiles = triton.cdiv(k, block_k)
    if split_k is None:
        split_k = choose_split_k(grid[0] * grid[1], k_tiles, sms, cfg["BLOCK_N"]) if m <= SMALL_M else 1
    dest, per_split, splits = split_destination(m, n, k_tiles, split_k, dtype, data.device)
    _fp8_matmul_kernel[(*grid, splits)](
        data, weight, dest, act_scale, scale, m, n, k, data.stride(0), weight.stride(0), n,
        act_scale.stride(0), scale.stride(0) if group else 0, m * n, per_split, BLOCKWISE=group is not None,
        SCALE_ROWS=scale_rows, BLOCK_K=block_k, A16=a16, DOT_F32=a16 and needs_f32_dot(data), **cfg,
        **pdl_options(data),
    )  # fmt: skip
    return _split_result(dest, dtype, summed)


def _split_result(dest: torch.Tensor, dtype: torch.dtype, summed: bool) -> torch.Tensor | SplitSums:
    """A product as its kernel wrote it ([M, N]), or its [S, M, N] partials summed or as ``SplitSums``."""
    if dest.dim() == 2:
        return dest
    return SplitSums(dest, dtype) if not summed else sum_splits(dest, dtype)


def scaled_mm_applies(n: int, k: int, dtype: torch.dtype) -> bool:
    """cuBLASLt's rowwise FP8 product: bf16 output only, N and K multiples of 16."""
    return dtype == torch.bfloat16 and n % 16 == 0 and k % 16 == 0


def rowwise_matmul(
    act: Fp8Act,
    weight: torch.Tensor,
    scale: torch.Tensor,
    dtype: torch.dtype,
    summed: bool = True,
) -> torch.Tensor | SplitSums:
    """Per-token x per-channel FP8 product on CUDA (``scale``: [N] fp32); ``summed``: as
    ``triton_fp8_matmul``'s."""
    m, k = act[0].shape
    n = weight.shape[0]
    if m > SMALL_M and scaled_mm_applies(n, k, dtype):  # at decode sizes the Triton kernel reads faster
        # weight.t() is column-major [K, N], as cuBLASLt wants its second operand.
        return torch._scaled_mm(
            act.data, weight.t(), scale_a=act.scale, scale_b=scale.view(1, n), out_dtype=dtype
        )
    return triton_fp8_matmul(act, weight, scale, dtype, summed=summed)
