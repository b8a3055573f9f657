"""The FP8 gate|up product with SiLU-and-multiply in its epilogue (the TMA kernel, decode sizes), then the
per-row quantization of its output from the rows' maxima it wrote: down_proj's FP8 input without a separate
SiLU or maxima pass.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from batchgen.kernels.fp8_format import Fp8Act
from batchgen.kernels.gemm.fp8_gemm_tma import (
    A16_BLOCK_K,
    TMA_BLOCK_K,
    TMA_BLOCK_N,
    TMA_STAGES,
    TensorDescriptor,
    act_descriptor,
    input_operand,
    scale_rowwise,
    tma_applies,
)
from batchgen.kernels.launch.device import needs_f32_dot, num_sms
from batchgen.kernels.layer_ops.activation import quantize_by_maxima, silu_times


@triton.jit
def _fp8_gate_up_silu_tma_kernel(
    a_desc,  # [M, K] e4m3, boxes [BLOCK_M, BLOCK_K]; rows past M read as zeros
    b_desc,  # [2I, K] e4m3 (gate rows, then up rows), boxes [BLOCK_H, BLOCK_K]
    h_ptr,  # [M, I] model dtype (I = inter): silu(gate) * up
    amax_ptr,  # [M, cdiv(I, BLOCK_H)] fp32: each program's max |h| per row
    as_ptr,  # [M, 1] fp32
    bs_ptr,  # [2I] fp32
    M,
    inter,
    K,
    stride_as,
    stride_hm,
    n_amax,
    BLOCK_M: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_K: tl.constexpr,
    STAGES: tl.constexpr,
    A16: tl.constexpr = False,  # a in 16 bits (W8A16): each weight tile widened to it; h alone, no maxima
    DOT_F32: tl.constexpr = False,  # interpreter only: bf16 dot operands upcast (``needs_f32_dot``)
):
    """The gate|up product with SiLU-and-multiply in its epilogue: a program takes BLOCK_H gate rows and
    the matching up rows over the whole of K (decode sizes), rounds both products to the model dtype as
    the plain product stores them, and writes h and its rows' maxima for the per-row quantization that
    follows (``activation.quantize_by_maxima``): the same bits as product, then ``silu_mul``."""
    pid = tl.program_id(0)
    acc_gate = tl.zeros([BLOCK_M, BLOCK_H], dtype=tl.float32)
    acc_up = tl.zeros([BLOCK_M, BLOCK_H], dtype=tl.float32)
    for kb in tl.range(0, tl.cdiv(K, BLOCK_K), num_stages=STAGES):
        a = a_desc.load([0, kb * BLOCK_K])
        gate = b_desc.load([pid * BLOCK_H, kb * BLOCK_K])
        up = b_desc.load([inter + pid * BLOCK_H, kb * BLOCK_K])
        if A16:
            gate = gate.to(a.dtype)
            up = up.to(a.dtype)
        if DOT_F32:
            a = a.to(tl.float32)
            gate = gate.to(tl.float32)
            up = up.to(tl.float32)
        acc_gate = tl.dot(a, gate.T, acc_gate)
        acc_up = tl.dot(a, up.T, acc_up)
    dt = h_ptr.dtype.element_ty
    rm = tl.arange(0, BLOCK_M)
    rh = pid * BLOCK_H + tl.arange(0, BLOCK_H)
    m_ok = rm < M
    h_ok = rh < inter
    if A16:
        gate = (acc_gate * tl.load(bs_ptr + rh, mask=h_ok, other=0.0)[None, :]).to(dt).to(tl.float32)
        up = (acc_up * tl.load(bs_ptr + inter + rh, mask=h_ok, other=0.0)[None, :]).to(dt).to(tl.float32)
    else:
        gate = scale_rowwise(acc_gate, as_ptr, bs_ptr, rm, rh, m_ok, h_ok, stride_as)
        up = scale_rowwise(acc_up, as_ptr, bs_ptr + inter, rm, rh, m_ok, h_ok, stride_as)
        gate, up = gate.to(dt).to(tl.float32), up.to(dt).to(tl.float32)
    h = silu_times(gate, up, dt)  # [BLOCK_M, BLOCK_H] fp32 of model-dtype values
    ok = m_ok[:, None] & h_ok[None, :]
    tl.store(h_ptr + rm.to(tl.int64)[:, None] * stride_hm + rh[None, :], h.to(dt), mask=ok)
    if not A16:
        tl.store(amax_ptr + rm * n_amax + pid, tl.max(tl.where(ok, tl.abs(h), 0.0), axis=1), mask=m_ok)


def silu_mul_product(
    act: Fp8Act | torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype,
    force: bool = False,
) -> Fp8Act | torch.Tensor | None:  # fmt: skip
    """silu(gate) * up of the gate|up product (``weight`` [2I, K]: gate rows, then up rows), quantized
    per row to e4m3, by the TMA kernel with SiLU in its epilogue and one quantizing launch from the rows'
    maxima it wrote (the plain path: the product, then a maxima pass and a quantizing pass over it). ``act``
    a 16-bit tensor: weight-only, h [M, I] in ``dtype`` as it is (down_proj's input is 16-bit too). None
    where the TMA kernel does not apply (``tma_applies``): the caller runs the plain path. ``force``: run
    it anyway (the tests, under the interpreter)."""
    data, act_scale, a16 = input_operand(act, scale)
    m, k = data.shape
    inter = weight.shape[0] // 2
    applies = force or tma_applies(data, weight, num_sms(data.device))
    if weight.shape[0] % 2 or not applies:
        return None
    block_k = A16_BLOCK_K if a16 else TMA_BLOCK_K
    a_desc, block_m = act_descriptor(data, block_k)
    block_h = TMA_BLOCK_N // 2
    b_desc = TensorDescriptor.from_tensor(weight, [block_h, block_k])
    h = torch.empty((m, inter), dtype=dtype, device=data.device)
    n_amax = triton.cdiv(inter, block_h)
    amax = h if a16 else torch.empty((m, n_amax), dtype=torch.float32, device=data.device)  # A16: unused
    _fp8_gate_up_silu_tma_kernel[(n_amax,)](
        a_desc, b_desc, h, amax, act_scale, scale, m, inter, k, act_scale.stride(0), h.stride(0), n_amax,
        BLOCK_M=block_m, BLOCK_H=block_h, BLOCK_K=block_k, STAGES=TMA_STAGES, A16=a16,
        DOT_F32=a16 and needs_f32_dot(data), num_warps=4,
    )  # fmt: skip
    return h if a16 else quantize_by_maxima(h, amax)
