"""TMA tensor maps (Hopper's bulk tensor copies) over a paged KV cache, encoded with the CUDA driver API
through ctypes: a map describes the cache as [blocks, block_size, Hkv, D] and one copy moves a box of
``rows`` tokens x D bytes of one head of one page (128-byte swizzle: row R's 16-byte column q lands at
column q ^ (R % 8), so the readers' 16-byte loads spread over the banks). Used by ``fp8_decode.cu``'s TMA
variant (``fp8_decode_cuda.LaunchShape.tma``).
"""

from __future__ import annotations

import ctypes
import functools

import torch

from batchgen.kernels.launch.driver import driver


@functools.cache
def supported(device_index: int) -> bool:
    """Whether the device has TMA (sm_90+): the CUDA attention's and the FP8 product's TMA variants."""
    return torch.cuda.get_device_capability(device_index) >= (9, 0)


MAP_BYTES = 128
# No OOB fill: a box's rows past the tensor's end land as zeros.
_UINT8, _NO_INTERLEAVE, _SWIZZLE_128B, _L2_256B, _NO_OOB_FILL = 0, 0, 3, 3, 0


def encode(dims: tuple[int, ...], strides: tuple[int, ...], box: tuple[int, ...], address: int):
    """A map of a 1-byte tensor: ``dims`` innermost first, ``strides`` in bytes of dims 1.. (multiples of
    16), ``box`` the copy's extent. Returns the 128 bytes as a ctypes array (a kernel parameter)."""
    rank = len(dims)
    raw = ctypes.create_string_buffer(MAP_BYTES + 64)  # the driver wants the map 64-byte aligned
    aligned = (ctypes.addressof(raw) + 63) & ~63
    result = driver().cuTensorMapEncodeTiled(
        ctypes.c_void_p(aligned), ctypes.c_int(_UINT8), ctypes.c_uint(rank), ctypes.c_void_p(address),
        (ctypes.c_uint64 * rank)(*dims), (ctypes.c_uint64 * (rank - 1))(*strides),
        (ctypes.c_uint32 * rank)(*box), (ctypes.c_uint32 * rank)(*([1] * rank)), ctypes.c_int(_NO_INTERLEAVE),
        ctypes.c_int(_SWIZZLE_128B), ctypes.c_int(_L2_256B), ctypes.c_int(_NO_OOB_FILL),
    )  # fmt: skip
    if result != 0:
        raise RuntimeError(f"cuTensorMapEncodeTiled failed: CUDA error {result} (dims {dims}, box {box})")
    out = (ctypes.c_uint64 * (MAP_BYTES // 8))()
    ctypes.memmove(out, aligned, MAP_BYTES)
    return out


@functools.cache  # two tensors a layer for the run: a bounded cache would cycle and re-encode
def _paged_rows(address: int, shape: tuple[int, ...], strides: tuple[int, ...], rows: int):
    blocks, block_size, kv_heads, head_dim = shape
    return encode((head_dim, kv_heads, block_size, blocks), (strides[2], strides[1], strides[0]),
                  (head_dim, 1, rows, 1), address)  # fmt: skip


def paged_rows_map(cache: torch.Tensor, rows: int):
    """The map of an e4m3 cache [blocks, block_size, Hkv, D] whose box is ``rows`` tokens of one head
    (coordinates: 0, head, offset in the page, page). Cached per tensor: the engine's caches live for
    the run, and a CUDA graph keeps the map it was captured with."""
    assert cache.element_size() == 1 and cache.stride(-1) == 1 and cache.shape[-1] <= 128
    return _paged_rows(cache.data_ptr(), tuple(cache.shape), tuple(cache.stride()), rows)
