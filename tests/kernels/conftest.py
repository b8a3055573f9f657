"""Kernel tests run Triton's interpreter on machines without a GPU.

Triton reads TRITON_INTERPRET when a @triton.jit function is defined, and triton.language defines some
at import: the variable has to be set before triton is imported. It changes nothing for code that does
not use Triton, so other test directories are unaffected.
"""

import os
import sys

import torch


def _reimport_interpreted() -> None:
    """Fallback when an earlier test dir imported triton in compiled mode: drop its pure-Python modules
    (and ours) so the test modules re-import them interpreted. The C extension stays loaded."""
    import triton.language as tl

    if type(tl.zeros).__name__ == "InterpretedFunction":
        return
    stale = [n for n in sys.modules if n.split(".")[0] == "triton" and not n.startswith("triton._C")]
    stale += [n for n in sys.modules if n.startswith("batchgen.kernels.") and not n.endswith(".reference")]
    for name in stale:
        del sys.modules[name]


if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"
    if "triton" in sys.modules:
        _reimport_interpreted()
