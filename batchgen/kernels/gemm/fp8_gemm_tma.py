"""The FP8 products' TMA kernels (sm_90+, Triton host tensor descriptors), at decode sizes (<= 64 rows):
per-token x per-channel products whose operand tiles TMA copies into a ring of shared memory (Triton's
pipeliner), with K split into fp32 partials where N alone gives too few programs. ``fp8_gemm`` chooses
between them and the pointer kernel; gate|up with SiLU-and-multiply in its epilogue is
``layer_ops/gate_up_silu.py``.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

try:
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # a Triton without host tensor descriptors: the pointer kernel only
    TensorDescriptor = None

from batchgen.kernels.fp8_format import Fp8Act
from batchgen.kernels.launch.device import needs_f32_dot
from batchgen.kernels.launch.tma import supported as device_has_tma

# Row counts up to this are decode sizes: narrow tiles with K split (pointer kernel) or TMA; above it,
# cuBLASLt where it applies (else 128 x 128 tiles).
SMALL_M = 64


def split_destination(
    m: int, n: int, k_tiles: int, split_k: int, dtype: torch.dtype, device: torch.device
) -> tuple[torch.Tensor, int, int]:
    """A product's output, its K tiles per split and its splits (at most ``split_k``, none left empty):
    [M, N] in ``dtype`` unsplit, else [splits, M, N] fp32 partial products, added in split order by a
    second kernel or by the consumer of a ``SplitSums``."""
    per_split = triton.cdiv(k_tiles, split_k)
    splits = triton.cdiv(k_tiles, per_split)
    if splits == 1:
        return torch.empty((m, n), dtype=dtype, device=device), per_split, splits
    return torch.empty((splits, m, n), dtype=torch.float32, device=device), per_split, splits


@triton.jit
def scale_rowwise(acc, as_ptr, bs_ptr, rm, rn, m_ok, n_ok, stride_as):
    """acc [BLOCK_M, BLOCK_N] times the rows' token scales and the columns' channel scales."""
    sa = tl.load(as_ptr + rm * stride_as, mask=m_ok, other=0.0)
    sb = tl.load(bs_ptr + rn, mask=n_ok, other=0.0)
    return acc * sa[:, None] * sb[None, :]


@triton.jit
def _fp8_matmul_tma_kernel(
    a_desc,  # [M, K] e4m3, boxes [BLOCK_M, BLOCK_K]; rows past M read as zeros
    b_desc,  # [N, K] e4m3, boxes [BLOCK_N, BLOCK_K]
    c_ptr,  # [M, N] model dtype, or [splits, M, N] fp32 partial products (K split over program axis 1)
    as_ptr,  # [M, 1] fp32
    bs_ptr,  # [N] fp32
    M,
    N,
    K,
    stride_as,
    stride_cm,
    stride_split,
    tiles_per_split,  # K tiles each split covers
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    STAGES: tl.constexpr,
    A16: tl.constexpr = False,  # a in 16 bits (W8A16): no token scales, each weight tile widened to it
    DOT_F32: tl.constexpr = False,  # interpreter only: bf16 dot operands upcast (``needs_f32_dot``)
):
    """Per-token x per-channel product of one row of tiles over its split of K (decode sizes: BLOCK_M >=
    M), its operand tiles copied by TMA into a STAGES-deep ring (Triton's pipeliner)."""
    pid_n = tl.program_id(0)
    split = tl.program_id(1)
    k_first = split * tiles_per_split
    k_end = tl.minimum(k_first + tiles_per_split, tl.cdiv(K, BLOCK_K))
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for kb in tl.range(k_first, k_end, num_stages=STAGES):
        a = a_desc.load([0, kb * BLOCK_K])
        b = b_desc.load([pid_n * BLOCK_N, kb * BLOCK_K])
        if A16:
            b = b.to(a.dtype)
        if DOT_F32:
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc = tl.dot(a, b.T, acc)
    rm = tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_ok = rm < M
    n_ok = rn < N
    if A16:
        acc = acc * tl.load(bs_ptr + rn, mask=n_ok, other=0.0)[None, :]
    else:
        acc = scale_rowwise(acc, as_ptr, bs_ptr, rm, rn, m_ok, n_ok, stride_as)
    c_ptrs = c_ptr + split * stride_split + rm.to(tl.int64)[:, None] * stride_cm + rn[None, :]
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


# The TMA kernel's tiles: the fastest for a wide decode product (Llama-3-8B's gate_up at M = 32, graph
# replays over weight copies), ahead of the pointer kernel's best (32-wide, 4 stages).
TMA_BLOCK_N, TMA_BLOCK_K, TMA_STAGES = 128, 256, 3
# Weight-only: each e4m3 tile is widened in shared memory, so half as deep a K tile for the same bytes.
A16_BLOCK_K = 128
# Narrower products (fewer 128-wide tiles than SMs: Llama-3-8B's qkv, o_proj, down_proj) stay with the
# pointer kernel: alone, 64-wide TMA tiles in 4 K splits read them faster (docs/kernels.md), but a whole
# decode step was no faster with them (docs/results.md).


def input_operand(act: Fp8Act | torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """(a product's input data, its token scales, whether it is 16-bit). A 16-bit input (weight-only) has
    no token scales: the weight's ``scale`` stands in for the kernels' argument, never read."""
    if isinstance(act, torch.Tensor):
        return act, scale, True
    return act.data, act.scale, False


def weight_only_tma() -> bool:
    """Whether weight-only products at decode sizes take the TMA kernels where ``tma_shape`` picks them
    (gate|up, with SiLU in the epilogue): ``BATCHGEN_A16_TMA=1``, an A/B switch until timed in a step."""
    return os.environ.get("BATCHGEN_A16_TMA", "0") == "1"


def tma_supported(a: torch.Tensor, weight: torch.Tensor) -> bool:
    """Decode sizes (<= 64 rows) on sm_90+ with a Triton that has host tensor descriptors; both operands
    row-major with 16-byte aligned rows (TMA's rule)."""
    if TensorDescriptor is None or a.device.type != "cuda" or a.shape[0] > SMALL_M:
        return False
    if not device_has_tma(a.device.index):
        return False
    return all(t.stride(1) == 1 and t.stride(0) % 16 == 0 and t.data_ptr() % 16 == 0 for t in (a, weight))


def tma_applies(a: torch.Tensor, weight: torch.Tensor, sms: int) -> bool:
    """``tma_supported`` where ``tma_shape`` takes 128-wide tiles over the whole of K (gate|up: the shape
    the SiLU epilogue kernel is built for)."""
    n, k = weight.shape
    return tma_shape(n, k, sms) == (TMA_BLOCK_N, 1) and tma_supported(a, weight)


def tma_shape(n: int, k: int, sms: int) -> tuple[int, int] | None:
    """The TMA kernel's tile width and K splits for an [N, K] weight at decode sizes, or None where the
    pointer kernel serves better: one 128-wide tile per SM or more over the whole of K (gate|up). The
    kernel also takes narrower tiles and K splits (``tma_product``), measured in ``docs/kernels.md``."""
    if triton.cdiv(n, TMA_BLOCK_N) >= sms:
        return TMA_BLOCK_N, 1
    return None


def act_descriptor(data: torch.Tensor, block_k: int = TMA_BLOCK_K) -> tuple[TensorDescriptor, int]:
    """The TMA kernels' activation operand: one box of all M rows (padded to a power of two >= 16) by
    ``block_k`` columns, and that row count (their BLOCK_M)."""
    block_m = max(16, triton.next_power_of_2(data.shape[0]))
    return TensorDescriptor.from_tensor(data, [block_m, block_k]), block_m


def tma_product(
    act: Fp8Act | torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype,
    split_k: int | None = None, block_n: int | None = None, stages: int | None = None,
    block_k: int | None = None,
) -> torch.Tensor:  # fmt: skip
    """Per-token x per-channel product by ``_fp8_matmul_tma_kernel``: one program per ``block_n`` columns
    (default 128) and K split; [M, N] in ``dtype``, or [splits, M, N] fp32 partials with 2+ splits. ``act``
    a 16-bit tensor: weight-only, as ``fp8_gemm.triton_fp8_matmul``'s. The descriptors are encoded at each
    launch (a CUDA graph keeps the launch's)."""
    data, act_scale, a16 = input_operand(act, scale)
    m, k = data.shape
    n = weight.shape[0]
    block_n, block_k = block_n or TMA_BLOCK_N, block_k or (A16_BLOCK_K if a16 else TMA_BLOCK_K)
    k_tiles = triton.cdiv(k, block_k)
    dest, per_split, splits = split_destination(m, n, k_tiles, split_k or 1, dtype, data.device)
    a_desc, block_m = act_descriptor(data, block_k)
    b_desc = TensorDescriptor.from_tensor(weight, [block_n, block_k])
    _fp8_matmul_tma_kernel[(triton.cdiv(n, block_n), splits)](
        a_desc, b_desc, dest, act_scale, scale, m, n, k, act_scale.stride(0), n, m * n, per_split,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, STAGES=stages or TMA_STAGES, A16=a16,
        DOT_F32=a16 and needs_f32_dot(data), num_warps=4,
    )  # fmt: skip
    return dest
