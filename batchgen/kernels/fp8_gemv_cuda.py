"""The CUDA FP8 product at decode row counts (``fp8_gemv.cu``): [M <= 32, K] e4m3 activations x [N, K] e4m3
weights, per-token x per-channel scales, on sm_90 (TMA and wgmma). Compiled once per process with NVRTC,
like the decode attention (``fp8_decode_cuda``); ``fp8_gemm.rowwise_matmul`` runs it where ``supports``
says, the Triton kernel elsewhere. ``BATCHGEN_CUDA_GEMM=0`` turns it off.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
from pathlib import Path
from typing import NamedTuple

import torch

from batchgen.kernels import pdl, tma
from batchgen.kernels.cuda_launch import Launcher
from batchgen.kernels.decode import num_sms
from batchgen.kernels.fp8_reference import FP8, Fp8Act

log = logging.getLogger("batchgen")
SOURCE = Path(__file__).with_name("fp8_gemv.cu")
MAX_ROWS = 32  # activation rows (tokens)
ROWS = 32  # weight rows a program
_SLOT_BYTES = (
    64 * 128 + ROWS * 128
)  # a chunk of 128 K bytes: 64 activation rows (zero past M), 32 weight rows


class GemvShape(NamedTuple):
    stages: int = 8  # slots of 12 KiB in the ring: chunks in flight
    min_blocks: int = 2  # programs (one warpgroup each) per SM

    @property
    def smem_bytes(self) -> int:  # the ring, 1 KiB of alignment, the mbarriers
        return self.stages * _SLOT_BYTES + 1024 + 8 * self.stages


# Fewer programs than 2 per SM (Llama-3-8B's o_proj and down_proj: N / 32 = 128): one an SM, a deeper ring.
FEW_PROGRAMS_SHAPE = GemvShape(stages=16, min_blocks=1)
DEFAULT_SHAPE = GemvShape()


@functools.cache
def _enabled(device_index: int) -> bool:
    on = os.environ.get("BATCHGEN_CUDA_GEMM", "1") != "0" and hasattr(torch.cuda, "_compile_kernel")
    return on and torch.version.hip is None and torch.cuda.get_device_capability(device_index) == (9, 0)


def supports(act: Fp8Act, weight: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> bool:
    """Per-token x per-channel scales, up to 32 rows, an even N, rows 16-byte aligned, bf16 / fp16 out."""
    data = act.data
    if not (data.is_cuda and data.dtype == weight.dtype == FP8 and dtype in (torch.bfloat16, torch.float16)):
        return False
    (m, k), n = data.shape, weight.shape[0]
    if not (
        0 < m <= MAX_ROWS and act.scale.shape == (m, 1) and scale.shape == (n,) and scale.is_contiguous()
    ):
        return False
    aligned = all(
        t.stride(-1) == 1 and t.stride(0) % 16 == 0 and t.data_ptr() % 16 == 0 for t in (data, weight)
    )
    # n even: the output is stored two columns at a time
    if not (aligned and k % 16 == 0 and n % 2 == 0 and _enabled(data.get_device())):
        return False
    return _kernel(data.get_device(), dtype == torch.bfloat16, DEFAULT_SHAPE) is not None


def prepare(device_index: int, bf16: bool) -> None:
    """Compile both launch shapes ahead of the first step (the warm-up thread); best effort."""
    if not _enabled(device_index):
        return
    torch.cuda.synchronize(device_index)  # a current context for the module load on a fresh thread
    if any(_kernel(device_index, bf16, shape) is None for shape in (DEFAULT_SHAPE, FEW_PROGRAMS_SHAPE)):
        _kernel.cache_clear()


# out, a_scale, w_scale; M, N, K, stride_om, stride_as; the weights' and the activations' maps
_MAP_TYPE = ctypes.c_uint64 * (tma.MAP_BYTES // 8)
_ARG_TYPES = [ctypes.c_void_p] * 3 + [ctypes.c_int] * 5 + [_MAP_TYPE] * 2


@functools.cache
def _kernel(device_index: int, bf16: bool, shape: GemvShape) -> Launcher | None:
    defines = f"#define STAGES {shape.stages}\n#define MIN_BLOCKS {shape.min_blocks}\n"
    with_pdl = pdl.enabled(device_index)
    defines += ("#define Q_BF16\n" if bf16 else "") + ("#define PDL\n" if with_pdl else "")
    try:
        with torch.cuda.device(device_index):  # sm_90a: wgmma is an architecture-specific feature
            kernel = torch.cuda._compile_kernel(
                defines + SOURCE.read_text(), "fp8_gemv", compute_capability="90a"
            )
            kernel.set_shared_memory_config(shape.smem_bytes)
            return Launcher(kernel, _ARG_TYPES, "fp8_gemv", pdl=with_pdl)
    except Exception as e:  # noqa: BLE001 (no NVRTC, an older torch or driver)
        log.warning("FP8 matmul: the CUDA kernel did not compile (%s); using Triton's", e)
        return None


@functools.cache  # the weights live for the run
def _weight_map(address: int, n: int, k: int, stride: int):
    return tma.encode((k, n), (stride,), (128, ROWS), address)


@functools.lru_cache(maxsize=1024)  # activation buffers: a graph's are fixed, eager steps reuse a few
def _act_map(address: int, m: int, k: int, stride: int):
    return tma.encode((k, m), (stride,), (128, 64), address)  # 64 rows (wgmma's M): zeros past m


def matmul(
    act: Fp8Act, weight: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype, shape: GemvShape | None = None
) -> torch.Tensor:
    """[M, K] x [N, K] -> [M, N] in ``dtype`` on the current stream (capturable). ``shape``: forces a launch
    shape (else by the grid's size)."""
    data = act.data
    (m, k), n = data.shape, weight.shape[0]
    device = data.get_device()
    if torch.cuda.current_device() != device:  # cuLaunchKernelEx runs in the current device's context
        raise RuntimeError(
            f"fp8_gemv: data on cuda:{device}, current device cuda:{torch.cuda.current_device()}"
        )
    programs = -(-n // ROWS)
    if shape is None:
        shape = FEW_PROGRAMS_SHAPE if programs < 2 * num_sms(data.device) else DEFAULT_SHAPE
    kernel = _kernel(device, dtype == torch.bfloat16, shape)
    if kernel is None:
        raise RuntimeError("the CUDA FP8 matmul did not compile on this machine (see the log)")
    out = torch.empty((m, n), dtype=dtype, device=data.device)
    args = [
        out.data_ptr(),
        act.scale.data_ptr(),
        scale.data_ptr(),
        m,
        n,
        k,
        out.stride(0),
        act.scale.stride(0),
    ]
    args += [
        _weight_map(weight.data_ptr(), n, k, weight.stride(0)),
        _act_map(data.data_ptr(), m, k, data.stride(0)),
    ]
    kernel((programs, 1, 1), 128, shape.smem_bytes, torch.cuda.current_stream(device).cuda_stream, args)
    return out
