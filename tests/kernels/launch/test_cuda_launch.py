"""The ctypes mirror of the driver's launch structs (``cuda.h``, CUDA 12): a wrong offset would hand
``cuLaunchKernelEx`` a garbage grid or stream, so the layout is pinned here, on any machine."""

from __future__ import annotations

import ctypes

from batchgen.kernels.launch.driver import _LaunchAttribute, _LaunchConfig


def test_launch_config_matches_the_driver_layout():
    # gridDimX..Z, blockDimX..Z, sharedMemBytes: 7 x 4 bytes; then hStream, attrs (8-aligned), numAttrs
    assert [getattr(_LaunchConfig, f).offset for f in ("grid", "block", "shared_mem_bytes")] == [0, 12, 24]
    assert [getattr(_LaunchConfig, f).offset for f in ("stream", "attrs", "num_attrs")] == [32, 40, 48]
    assert ctypes.sizeof(_LaunchConfig) == 56


def test_launch_attribute_matches_the_driver_layout():
    # CUlaunchAttributeID id; char pad[4]; CUlaunchAttributeValue value (a 64-byte union)
    assert _LaunchAttribute.value.offset == 8 and ctypes.sizeof(_LaunchAttribute) == 72
