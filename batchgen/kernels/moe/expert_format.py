"""FP8 routed experts: every expert's projection stored as float8_e4m3fn with fp32 scales, the activations
left in the model dtype (weight-only), or quantized too where ``act_fp8`` (W8A8). Decode reads half the
bytes of a 16-bit stack; weight-only, each weight tile is converted to the activations' dtype before its
product (e4m3 values are exact in bf16, fp16, fp32).

Scales (``Fp8Experts.scale``):

- per output channel (``block`` None): [E, N], as ``--quantization fp8`` writes them;
- per block (``block`` = (rows, cols), 128 x 128 in the fp8 method's releases):
  [E, parts * cdiv(N / parts, rows), cdiv(K, cols)]. ``parts`` row groups of the stack are scaled
  separately, each from its own first row: gate | up (``parts`` 2) hold gate's block rows, then up's, so
  neither needs to end on a block row (an intermediate size that is no multiple of 128). A rank's share
  of the intermediate rows may start inside a block: ``offset`` says where, and the scales kept are the
  blocks that cover the share.

The torch side (``dequantize``, ``quantize_channels``) is the CPU path and the oracle of the Triton
kernels (``routed_experts.py``).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from batchgen.kernels import fp8_format as ref


class Fp8Experts(NamedTuple):
    """One projection of every expert in e4m3: ``weight * scale`` (each scale over its row or block)."""

    weight: torch.Tensor  # [E, N, K] float8_e4m3fn
    scale: torch.Tensor  # [E, N] fp32 per channel; [E, parts * cdiv(N / parts, rows), cdiv(K, cols)] blocks
    block: tuple[int, int] | None = None  # (rows, cols) of a block scale; None: per output channel
    parts: int = 1  # row groups scaled separately (2: gate | up)
    # (rows, columns) of each part's first block that lie before its first row / column: a rank's share
    # of the intermediate rows may start inside a block (gate | up rows, down columns)
    offset: tuple[int, int] = (0, 0)
    # The products' inputs quantized too (W8A8): e4m3 with a dynamic scale per row, or per ``block[1]``
    # columns from the input's first (``act_group``); False: they stay in the model dtype (W8A16).
    act_fp8: bool = False

    @property
    def shape(self) -> torch.Size:
        return self.weight.shape


def act_group(experts: Fp8Experts) -> int | None:
    """Columns of a product's input that share one dynamic scale under ``act_fp8`` (None: the whole row):
    the weight blocks' columns, so that each K tile has one scale of each."""
    return None if experts.block is None else experts.block[1]


def quantize_activations(x: torch.Tensor, experts: Fp8Experts) -> torch.Tensor:
    """x as an ``act_fp8`` product sees it: rounded to e4m3 under its dynamic scales, in fp32 (the CPU
    path's arithmetic; the kernels multiply the e4m3 values and apply the scales to the fp32 sums)."""
    group = act_group(experts)
    return ref.dequantize_act(ref.quantize_act(x, ref.ActQuant(group)), group)


def quantize_channels(stack: torch.Tensor, parts: int = 1) -> Fp8Experts:
    """[E, N, K] in 16/32 bits -> e4m3 with one scale per expert and output row ([E, N] fp32)."""
    experts, n, k = stack.shape
    weight, scale = ref.quantize_rows(stack.reshape(experts * n, k))
    return Fp8Experts(weight.view(experts, n, k), scale.view(experts, n), None, parts)


def quantize_blocks(stack: torch.Tensor, block: tuple[int, int], parts: int = 1) -> Fp8Experts:
    """[E, N, K] -> e4m3 with one scale per block of each expert's part (what an fp8 checkpoint holds)."""
    weights, scales = [], []
    for expert in stack:
        pairs = [ref.quantize_blocks(p, *block) for p in expert.chunk(parts)]  # [N / parts, K] each
        weights.append(torch.cat([w for w, _ in pairs]))
        scales.append(torch.cat([s for _, s in pairs]))
    return Fp8Experts(torch.stack(weights), torch.stack(scales), block, parts)


def dequantize(experts: Fp8Experts, dtype: torch.dtype, which: torch.Tensor | None = None) -> torch.Tensor:
    """[E, N, K] in ``dtype``: each weight times its scale in fp32, then rounded. ``which`` (expert ids):
    only those experts are computed, the others left zero (the CPU path dequantizes the experts a step
    routes to)."""
    ids = range(experts.weight.shape[0]) if which is None else which.tolist()
    out = torch.zeros(experts.weight.shape, dtype=dtype, device=experts.weight.device)
    for e in ids:
        out[e] = _dequantize_one(experts, e).to(dtype)
    return out


def _dequantize_one(experts: Fp8Experts, e: int) -> torch.Tensor:  # -> [N, K] fp32
    weight, scale = experts.weight[e], experts.scale[e]
    if experts.block is None:
        return weight.float() * scale.float()[:, None]
    rows = weight.shape[0] // experts.parts
    scale_rows = scale.shape[0] // experts.parts
    return torch.cat([
        w.float() * expand_blocks(s, experts.block, experts.offset, w.shape)
        for w, s in zip(weight.split(rows), scale.split(scale_rows), strict=True)
    ])  # fmt: skip


def expand_blocks(
    scale: torch.Tensor, block: tuple[int, int], offset: tuple[int, int], shape: torch.Size
) -> torch.Tensor:
    """[block rows, block columns] -> [rows, columns] of ``shape``: each weight's scale, the first block
    starting ``offset`` (rows, columns) before the weight."""
    full = scale.float().repeat_interleave(block[0], dim=0).repeat_interleave(block[1], dim=1)
    return full[offset[0] : offset[0] + shape[0], offset[1] : offset[1] + shape[1]]
