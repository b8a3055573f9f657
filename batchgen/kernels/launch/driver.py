"""Launching NVRTC-compiled kernels (``torch.cuda._compile_kernel``) through the CUDA driver with ctypes,
with the parameter block built once: torch's ``_CudaKernel.__call__`` reopens libcuda and wraps every
argument on each call, which takes longer than a decode step's attention. With ``pdl`` the launch carries
programmatic stream serialization (``pdl.py``): the kernel must start with ``griddepcontrol.wait``.
"""

from __future__ import annotations

import ctypes
import functools
import threading

_PROGRAMMATIC_STREAM_SERIALIZATION = 6  # CUlaunchAttributeID


@functools.cache
def driver() -> ctypes.CDLL:
    return ctypes.CDLL("libcuda.so.1")


class _LaunchAttribute(ctypes.Structure):  # CUlaunchAttribute: an id, then a 64-byte value union
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_uint64 * 8)]


class _LaunchConfig(ctypes.Structure):  # CUlaunchConfig
    _fields_ = [
        ("grid", ctypes.c_uint * 3),
        ("block", ctypes.c_uint * 3),
        ("shared_mem_bytes", ctypes.c_uint),
        ("stream", ctypes.c_void_p),
        ("attrs", ctypes.POINTER(_LaunchAttribute)),
        ("num_attrs", ctypes.c_uint),
    ]


class Launcher:
    """One compiled kernel's launches. ``arg_types``: ctypes types of its parameters, in order (a ctypes
    array for a by-value struct such as a TMA map)."""

    def __init__(self, kernel, arg_types: list, name: str, pdl: bool = False) -> None:
        self._kernel = kernel  # keeps the module loaded
        self._func = kernel.func
        self._launch = driver().cuLaunchKernelEx  # here: a driver without it fails the build, not a step
        self._name = name
        self._values = [t() for t in arg_types]
        self._params = (ctypes.c_void_p * len(self._values))(*(ctypes.addressof(v) for v in self._values))
        self._attr = _LaunchAttribute(id=_PROGRAMMATIC_STREAM_SERIALIZATION)
        self._attr.value[0] = 1  # programmaticStreamSerializationAllowed
        self._config = _LaunchConfig(attrs=ctypes.pointer(self._attr), num_attrs=1 if pdl else 0)
        self._lock = threading.Lock()

    def __call__(self, grid: tuple[int, int, int], threads: int, smem: int, stream: int, args: list) -> None:
        with self._lock:
            for slot, value in zip(self._values, args, strict=True):
                if isinstance(slot, ctypes.Array):
                    ctypes.memmove(slot, value, ctypes.sizeof(slot))
                else:
                    slot.value = value
            self._config.grid[:] = grid
            self._config.block[:] = (threads, 1, 1)
            self._config.shared_mem_bytes = smem
            self._config.stream = stream
            result = self._launch(ctypes.byref(self._config), self._func, self._params, None)
        if result != 0:
            raise RuntimeError(f"{self._name} launch failed: CUDA error {result}")
