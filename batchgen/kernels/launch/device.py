"""What a kernel launch asks of the device: its multiprocessor count, and whether tl.dot needs fp32
operands (Triton's interpreter, off-GPU).
"""

from __future__ import annotations

import functools

import torch


@functools.cache
def _num_sms(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def num_sms(device: torch.device) -> int:
    """Multiprocessor count (off-GPU, where only the interpreter runs, a large Hopper part's 132)."""
    if device.type != "cuda":
        return 132
    return _num_sms(device.index if device.index is not None else torch.cuda.current_device())


def needs_f32_dot(tensor: torch.Tensor) -> bool:
    """Triton 3.9's interpreter multiplies bf16 operands of tl.dot as their raw uint16 bits: off-GPU,
    upcast bf16 tiles (already rounded to bf16, so only the summation order differs from the GPU)."""
    return tensor.device.type != "cuda" and tensor.dtype == torch.bfloat16
