"""Programmatic dependent launch (Hopper and later): a kernel's programs may be scheduled while the kernel
before it on the stream is still finishing; they wait for it (``griddepcontrol.wait``) before they touch
memory. That hides the gap between the back-to-back kernels of a decode step, inside CUDA graphs too
(stream capture records the launch attribute as a programmatic edge).

Prompt steps gain from it; decode steps, since their kernels are short and few, lost time to it
(scripts/bench_step.py A/Bs, docs/results.md), so only launches of more rows than a decode step's use it
(``DECODE_ROWS``).
``BATCHGEN_PDL=0`` turns it off (read once per process and device).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from types import MappingProxyType

import torch
import triton
import triton.language as tl

try:
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

    HAVE_GDC = True
except ImportError:  # an older Triton: never launched with PDL, so these are never compiled
    HAVE_GDC = False
    gdc_wait = gdc_launch_dependents = None


@triton.jit
def wait_for_producer(PDL: tl.constexpr):
    """A kernel's first statement: with PDL nothing is read or written before the previous kernel has
    finished (and flushed its writes), so being scheduled early is safe; then the next kernel may be
    scheduled too. Waiting first also orders writes after the previous kernel's reads."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()


_ON = MappingProxyType({"PDL": True, "launch_pdl": True})
_OFF = MappingProxyType({})


@functools.cache
def enabled(device_index: int) -> bool:
    """Whether kernels on this device launch with PDL (Triton's; the CUDA attention's only where
    ``fp8_decode_cuda.LAUNCH_WITH_PDL``)."""
    if not HAVE_GDC or os.environ.get("BATCHGEN_PDL", "1") == "0" or torch.version.hip is not None:
        return False
    if os.environ.get("TRITON_INTERPRET") == "1":  # the interpreter has no griddepcontrol
        return False
    return torch.cuda.get_device_capability(device_index)[0] >= 9


# Launches of at most this many rows (decode steps) go without PDL: decode steps ran faster without it,
# while prompt steps gained from it (bench_step A/Bs, docs/results.md).
DECODE_ROWS = 256


def pdl_options(tensor: torch.Tensor) -> Mapping[str, bool]:
    """Launch keywords for a kernel that starts with ``wait_for_producer(PDL)`` over ``tensor``'s rows;
    none for decode-sized launches (``DECODE_ROWS``), off-GPU (the interpreter), on ROCm or before
    Hopper. Called at every launch, so it asks ``get_device`` (-1 off CUDA), several times cheaper than
    building ``tensor.device``."""
    if tensor.shape[0] <= DECODE_ROWS:
        return _OFF
    index = tensor.get_device()
    return _ON if index >= 0 and enabled(index) else _OFF
