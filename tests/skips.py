"""When a test may skip: only for a thing this machine lacks, named in the skip's reason. Every skip reason
must match one pattern below, and the check beside it must find the thing missing here; any other skip fails
its test (``tests/conftest.py``), so that an oracle test cannot go quiet on a machine that has everything
it needs (``tests/test_skips.py``)."""

from __future__ import annotations

import importlib.util
import os
import re
from collections.abc import Callable


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _gpus() -> int:
    import torch

    return torch.cuda.device_count()


def _capability() -> tuple[int, int]:
    import torch

    return torch.cuda.get_device_capability() if _cuda() else (0, 0)


def _tma_gate_up_applies(most_sms: int) -> bool:
    """A GPU where the FP8 gate|up TMA kernel runs, with at most ``most_sms`` SMs (the test's width)."""
    if not _cuda():
        return False
    import torch

    from batchgen.kernels.gemm import fp8_gemm_tma
    from batchgen.kernels.launch.device import num_sms

    device = torch.cuda.current_device()
    return fp8_gemm_tma.device_has_tma(device) and num_sms(torch.device("cuda", device)) <= most_sms


def _onednn() -> bool:
    from batchgen.kernels.cpu import cpu_linear

    return cpu_linear.ONEDNN


# (a reason's pattern, whether this machine lacks what the match names)
MISSING_THINGS: tuple[tuple[str, Callable[[re.Match], bool]], ...] = (
    (r"needs CUDA", lambda _: not _cuda()),
    (r"needs (\d+) GPUs", lambda m: _gpus() < int(m[1])),
    (r"needs a Hopper GPU", lambda _: _capability() < (9, 0)),
    (r"needs a GPU with TMA and at most (\d+) SMs", lambda m: not _tma_gate_up_applies(int(m[1]))),
    (r"needs a machine without CUDA", lambda _: _cuda()),
    (r"needs torch built with oneDNN", lambda _: not _onednn()),
    (r"needs /proc", lambda _: not os.path.exists("/proc/self/stat")),
    # pytest.importorskip's reason
    (r"could not import '([\w.]+)'", lambda m: importlib.util.find_spec(m[1]) is None),
)


def unexplained(reason: str) -> str | None:
    """Why a skip for ``reason`` is not allowed on this machine; None where it names a thing missing here."""
    for pattern, lacks in MISSING_THINGS:
        found = re.search(pattern, reason)
        if found:
            return None if lacks(found) else f"this machine has what the skip says it lacks ({reason!r})"
    return f"the skip names nothing this machine lacks ({reason!r}; tests/skips.py lists what may be missing)"
