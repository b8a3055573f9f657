"""The CUDA FP8 decode attention (``fp8_decode.cu``): compiled once per process with NVRTC, which torch's
CUDA wheels ship (``torch.cuda._compile_kernel``), so no compiler needs to be installed.
``decode.decode_attention`` runs it for the shapes it covers and the Triton kernel for the rest; its splits
are merged by the Triton merge kernel (same partial layout).

``BATCHGEN_CUDA_ATTENTION=0`` turns it off (the Triton kernel runs everywhere).
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
from pathlib import Path
from typing import NamedTuple

import torch

from batchgen.kernels.launch import pdl, tma
from batchgen.kernels.launch.driver import Launcher

log = logging.getLogger("batchgen")
SOURCE = Path(__file__).with_name("fp8_decode.cu")
HEAD_DIM = 128
MAX_GROUP = 8  # q heads per KV head: the kernel's A operand uses rows 0..7 of mma's 16
CHUNK = 16  # tokens per step of a warp: pages must hold a multiple of it


class LaunchShape(NamedTuple):
    warps: int = 4
    min_blocks: int = 3  # programs per SM the register budget is cut for (168 registers at 3)
    stages: int = 3  # chunks of 4 KiB per warp in the shared-memory ring: stages - 1 in flight
    defines: str = ""  # more preprocessor lines, for experiments (e.g. -DNO_MATH)
    tma: bool = False  # chunks copied by TMA (kernels/launch/tma.py, sm_90+), not per-lane cp.async

    @property
    def ring_bytes(self) -> int:
        ring = self.warps * self.stages * 4096
        return ring + 1024 + 8 * self.warps * self.stages if self.tma else ring  # alignment, mbarriers


DEFAULT_SHAPE = LaunchShape()
# Launched without PDL: decode steps ran faster without it (launch/pdl.py says why). The kernel and its
# launcher keep the support (launch/driver.py).
LAUNCH_WITH_PDL = False
# TMA copies win when there are at most ~2 programs per SM and lose with more (graph replays,
# docs/kernels.md), so a launch takes them by its grid (fixed for a captured graph).
FEW_PROGRAMS_SHAPE = LaunchShape(tma=True)
TMA_MAX_PROGRAMS_PER_SM = 2


def default_shape(query: torch.Tensor, programs: int) -> LaunchShape:
    """The launch shape for a grid of ``programs``: TMA copies on sm_90+ when it is small enough (and
    their build compiled here)."""
    device_index = query.get_device()
    if programs > TMA_MAX_PROGRAMS_PER_SM * _sm_count(device_index) or not tma.supported(device_index):
        return DEFAULT_SHAPE
    few_compiled = _kernel(device_index, query.dtype == torch.bfloat16, FEW_PROGRAMS_SHAPE) is not None
    return FEW_PROGRAMS_SHAPE if few_compiled else DEFAULT_SHAPE


@functools.cache
def _enabled() -> bool:
    return os.environ.get("BATCHGEN_CUDA_ATTENTION", "1") != "0" and hasattr(torch.cuda, "_compile_kernel")


@functools.cache
def _has_fp8_converts(device_index: int) -> bool:
    return torch.cuda.get_device_capability(device_index) >= (8, 9)


@functools.cache
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def supports(
    query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, sliding_window: int | None
) -> bool:
    """Whether the CUDA kernel covers this decode step: an e4m3 cache on a GPU with fp8 converts (sm_89+),
    head_dim 128, up to 8 q heads per KV head, pages of a multiple of 16 tokens, no sliding window, and the
    16-byte alignment its loads assume."""
    if not (query.is_cuda and _enabled() and torch.version.hip is None and sliding_window is None):
        return False
    if k_cache.dtype != torch.float8_e4m3fn or query.dtype not in (torch.bfloat16, torch.float16):
        return False
    if not (_has_fp8_converts(query.get_device()) and _covers(query, k_cache, v_cache)):
        return False
    # None: it did not compile here (said once, in the log)
    return _kernel(query.get_device(), query.dtype == torch.bfloat16, DEFAULT_SHAPE) is not None


def _covers(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> bool:
    """The shapes and layouts the kernel reads correctly: what ``supports`` requires, and ``launch`` asserts
    for a forced launch shape (elsewhere an out-of-bounds read, with TMA an mbarrier that never completes)."""
    q_heads, head_dim = query.shape[1], query.shape[2]
    kv_heads, block_size = k_cache.shape[2], k_cache.shape[1]
    if head_dim != HEAD_DIM or q_heads % kv_heads or q_heads // kv_heads > MAX_GROUP or block_size % CHUNK:
        return False
    aligned_q = query.stride(-1) == 1 and query.stride(0) % 8 == 0 and query.stride(1) % 8 == 0
    aligned_kv = k_cache.stride() == v_cache.stride() and all(s % 16 == 0 for s in k_cache.stride()[:3])
    pointers = (query.data_ptr() | k_cache.data_ptr() | v_cache.data_ptr()) % 16 == 0
    return aligned_q and aligned_kv and pointers and k_cache.stride(-1) == 1


def prepare(device_index: int, q_bf16: bool) -> None:
    """Compile the kernel's builds (``cp.async``; TMA on sm_90+) ahead of the first step, on the warm-up
    thread beside the model's load (``kernels/warmup.py``). Best effort: a failure of the ``cp.async`` build
    is forgotten, and the first step tries again; a TMA build that fails stays failed (small grids then
    take the ``cp.async`` build)."""
    if not (_enabled() and torch.version.hip is None and _has_fp8_converts(device_index)):
        return
    # A fresh thread has no current CUDA context for the driver calls (the module load) until a runtime
    # call that needs one makes the device's primary context current.
    torch.cuda.synchronize(device_index)
    if _kernel(device_index, q_bf16, DEFAULT_SHAPE) is None:
        _kernel.cache_clear()
    elif tma.supported(device_index):
        _kernel(device_index, q_bf16, FEW_PROGRAMS_SHAPE)


# The kernel's parameters after the 9 pointers: 2 doubles (the scales), then 12 ints; with TMA, K's and
# V's tensor maps (128 bytes each, passed by value).
_ARG_TYPES = [ctypes.c_void_p] * 9 + [ctypes.c_double] * 2 + [ctypes.c_int] * 12
_MAP_TYPE = ctypes.c_uint64 * (tma.MAP_BYTES // 8)


@functools.cache
def _kernel(device_index: int, q_bf16: bool, shape: LaunchShape) -> Launcher | None:
    """The compiled kernel, or None where NVRTC or the driver refuses it (the Triton kernel runs then)."""
    values = {"WARPS": shape.warps, "MIN_BLOCKS": shape.min_blocks, "STAGES": shape.stages}
    defines = "".join(f"#define {name} {value}\n" for name, value in values.items())
    defines += "#define Q_BF16\n" if q_bf16 else ""
    assert shape.stages >= 2, "the warps' merge reuses the ring: it needs 2 slots or more"
    defines += shape.defines + ("\n#define TMA\n" if shape.tma else "\n")
    with_pdl = LAUNCH_WITH_PDL and pdl.enabled(device_index)
    defines += "#define PDL\n" if with_pdl else ""
    arg_types = _ARG_TYPES + [_MAP_TYPE] * 2 if shape.tma else _ARG_TYPES
    if shape.tma and not tma.supported(device_index):
        log.warning("FP8 decode attention: TMA copies need compute capability 9.0+")
        return None
    try:
        with torch.cuda.device(device_index):
            kernel = torch.cuda._compile_kernel(defines + SOURCE.read_text(), "fp8_paged_decode")
            kernel.set_shared_memory_config(shape.ring_bytes)  # above 48 KiB it must be asked for
            return Launcher(kernel, arg_types, "fp8_paged_decode", pdl=with_pdl)
    except Exception as e:  # noqa: BLE001 (no NVRTC, an older torch, a driver too old for the PTX)
        instead = "its cp.async build" if shape.tma else "Triton's"
        log.warning("FP8 decode attention: the CUDA kernel did not compile (%s); using %s", e, instead)
        return None


def launch(
    query: torch.Tensor,  # [T, Hq, 128]
    k_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, 128] e4m3
    v_cache: torch.Tensor,
    out: torch.Tensor,  # [T, Hq, 128], written when num_splits == 1
    part_acc: torch.Tensor,  # [B, Hq, num_splits, 128] fp32
    part_lse: torch.Tensor,  # [B, Hq, num_splits] fp32
    cu_seqlens_q: torch.Tensor,  # [B + 1] int32
    seq_lens: torch.Tensor,  # [B] int32
    block_tables: torch.Tensor,  # [B, max_blocks] int32, last dim contiguous
    qk_scale: float,  # softmax scale * log2(e) * k_scale
    v_scale: float,
    num_splits: int,
    shape: LaunchShape,
) -> None:
    """One launch on the current stream (capturable: every argument is a pointer or a Python number)."""
    batch, q_heads, kv_heads = seq_lens.shape[0], query.shape[1], k_cache.shape[2]
    assert k_cache.dtype == torch.float8_e4m3fn and _covers(query, k_cache, v_cache)  # a forced shape too
    assert out.dtype == query.dtype and out.stride(-1) == 1
    assert cu_seqlens_q.dtype == seq_lens.dtype == block_tables.dtype == torch.int32
    device = query.get_device()
    current = torch.cuda.current_device()
    if current != device:  # cuLaunchKernelEx runs in the current device's context
        raise RuntimeError(f"fp8_paged_decode: query on cuda:{device}, current device cuda:{current}")
    kernel = _kernel(device, query.dtype == torch.bfloat16, shape)
    if kernel is None:
        raise RuntimeError("the CUDA FP8 decode attention did not compile on this machine (see the log)")
    grid = (batch, kv_heads, num_splits)
    pointers = [
        t.data_ptr() for t in (query, k_cache, v_cache, out, part_acc, part_lse, cu_seqlens_q, seq_lens)
    ]
    args = [*pointers, block_tables.data_ptr(), float(qk_scale), float(v_scale), num_splits]
    args += [query.stride(0), query.stride(1), out.stride(0), out.stride(1), k_cache.stride(0)]
    args += [k_cache.stride(1), k_cache.stride(2), block_tables.stride(0), q_heads, q_heads // kv_heads]
    args.append(k_cache.shape[1])
    if shape.tma:
        args += [tma.paged_rows_map(k_cache, CHUNK), tma.paged_rows_map(v_cache, CHUNK)]
    kernel(grid, 32 * shape.warps, shape.ring_bytes, torch.cuda.current_stream(device).cuda_stream, args)
