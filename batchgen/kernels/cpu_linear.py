"""fp32 projections on the CPU through oneDNN.

torch's ``F.linear`` on an fp32 CPU tensor calls MKL's sgemm. oneDNN's inner product
(``torch.ops.mkldnn._linear_pointwise``, what torch's inductor emits for CPU linears) is faster at every
row count a CPU batch has, most with the weight packed once into oneDNN's blocked layout. On the 2-core
Zen 4 VM, embedded model's shapes, GFLOP/s (``docs/results.md``):

    rows   q|k|v 576 -> 1728    gate|up 576 -> 3072    down 1536 -> 576
           MKL  plain packed    MKL  plain packed      MKL  plain packed
    1       25    26    27       24    30    37         28    27    38
    78      95   140   191      111   168   202        141   172   191
    3299   184   189   207      152   163   174        183   185   217

That table repeats one weight, so it stays in cache. In a forward every weight comes from memory, and
there oneDNN is ahead at every row count too: at 1 row, plain weights, each of 30 read once in turn,
MKL / oneDNN took 230 / 118 us (q|k|v), 744 / 394 (gate|up), 256 / 221 (down), and 11.6 / 6.3 ms for the
LM head (49152 x 576: 113 MB, ~17 GB/s of the VM's ~27). So every fp32 projection goes through oneDNN.

``PackedLinear`` holds the packed copy instead of the plain weight (no extra memory); the LM head, whose
weight is often the embedding table as well, multiplies the plain weight (``linear``). The products are
exact fp32 either way; only the summation order differs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _available() -> bool:
    ops = torch.ops.mkldnn
    return (
        torch.backends.mkldnn.is_available()
        and hasattr(ops, "_linear_pointwise")
        and hasattr(ops, "_reorder_linear_weight")
    )


ONEDNN = _available()


def packable(weight: torch.Tensor) -> bool:
    return ONEDNN and weight.is_cpu and weight.dtype == torch.float32 and weight.dim() == 2


class PackedLinear:
    """An fp32 projection on the CPU with its weight in oneDNN's layout ([T, in] -> [T, out])."""

    act_quant = None

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        self.out_features, self.in_features = weight.shape  # weight: [out, in]
        self.weight = torch.ops.mkldnn._reorder_linear_weight(weight, None)  # opaque, packed
        self.bias = bias

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features)
        out = torch.ops.mkldnn._linear_pointwise(flat, self.weight, self.bias, "none", [], "")
        return out.view(*x.shape[:-1], self.out_features)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``F.linear`` with a plain weight; fp32 on the CPU through oneDNN."""
    if ONEDNN and x.is_cpu and x.dtype == torch.float32 and x.dim() == 2 and x.shape[0] > 0:
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
    return F.linear(x, weight, bias)
