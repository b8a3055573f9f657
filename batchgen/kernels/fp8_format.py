"""Torch reference of batchgen's FP8 arithmetic (float8_e4m3fn): the oracle of the Triton FP8 kernels, and
the CPU path (which dequantizes and computes in fp32, so that it is the GPU's function up to the order of
accumulation).

- Activations: a dynamic scale per token row (``group=None``) or per ``group`` columns (128 for
  block-quantized checkpoints), or one static scale from the checkpoint; the value is ``q * scale``.
- Weights: one scale per output row (``quantize_rows``), or per 128 x 128 block (``dequantize_blocks``).
- KV cache: a layer's keys are stored as ``k / k_scale`` (the checkpoint's scale, else 1.0) and read back
  as ``q * k_scale``; values alike.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
# The smallest dynamic scale: an all-zero row then quantizes to zeros (a zero scale would divide by 0).
MIN_SCALE = 1.0 / (FP8_MAX * 512.0)


class ActQuant(NamedTuple):
    """How a projection wants its input quantized."""

    group: int | None = None  # columns that share a dynamic scale; None: the whole row (per token)
    static_scale: torch.Tensor | None = None  # [] fp32, fixed at calibration (then ``group`` is unused)


class Fp8Act(NamedTuple):
    """A quantized activation: ``data * scale`` (each scale over its row or its group of columns)."""

    data: torch.Tensor  # [T, K] float8_e4m3fn
    scale: torch.Tensor  # [T, 1] fp32 per token; [T, cdiv(K, group)] per group


def is_fp8(t: torch.Tensor) -> bool:
    return t.dtype == FP8


def cast(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x / scale rounded to e4m3, saturated (a plain cast would not saturate on every torch version)."""
    return (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8)


def _groups(x: torch.Tensor, group: int) -> torch.Tensor:
    """[T, K] -> [T, G, group], zero-padded to whole groups."""
    pad = -x.shape[-1] % group
    return F.pad(x, (0, pad)).view(x.shape[0], -1, group)


def expand_groups(scale: torch.Tensor, group: int | None, cols: int) -> torch.Tensor:
    """[T, G] group scales -> [T, cols], one per column (per-token scales [T, 1] broadcast as they are)."""
    if group is None:
        return scale
    return scale.repeat_interleave(group, dim=-1)[..., :cols]


def quantize_act(x: torch.Tensor, quant: ActQuant) -> Fp8Act:
    """[T, K] in the model dtype -> e4m3 with its scales (see ``ActQuant``)."""
    if quant.static_scale is not None:
        scale = quant.static_scale.float().reshape(1, 1).expand(x.shape[0], 1)
        return Fp8Act(cast(x, scale), scale.contiguous())
    if quant.group is None:
        amax = x.abs().amax(dim=-1, keepdim=True).float()  # [T, 1]
    else:
        amax = _groups(x, quant.group).abs().amax(dim=-1).float()  # [T, G]
    scale = (amax / FP8_MAX).clamp(min=MIN_SCALE)
    return Fp8Act(cast(x, expand_groups(scale, quant.group, x.shape[-1])), scale)


def dequantize_act(act: Fp8Act, group: int | None) -> torch.Tensor:  # -> [T, K] fp32
    return act.data.float() * expand_groups(act.scale, group, act.data.shape[-1])


def quantize_rows(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[N, K] -> (e4m3 [N, K], fp32 scales [N]): one scale per output row (per channel)."""
    act = quantize_act(weight, ActQuant())
    return act.data, act.scale.view(-1)


def quantize_blocks(weight: torch.Tensor, rows: int, cols: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[N, K] -> (e4m3 [N, K], fp32 scales [cdiv(N, rows), cdiv(K, cols)]): one scale per block, as the
    ``fp8`` method's checkpoints store them (``weight_scale_inv``)."""
    n, k = weight.shape
    nb, kb = -(-n // rows), -(-k // cols)
    padded = F.pad(weight.float(), (0, kb * cols - k, 0, nb * rows - n))
    amax = padded.view(nb, rows, kb, cols).abs().amax(dim=(1, 3))
    scale = (amax / FP8_MAX).clamp(min=MIN_SCALE)  # [nb, kb]
    full = scale.repeat_interleave(rows, dim=0)[:n].repeat_interleave(cols, dim=1)[:, :k]
    return cast(weight, full), scale


def dequantize_blocks(weight: torch.Tensor, scale: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """e4m3 [N, K] with one scale per ``rows`` x ``cols`` block ([cdiv(N, rows), cdiv(K, cols)]) -> fp32."""
    n, k = weight.shape
    full = scale.float().repeat_interleave(rows, dim=0)[:n].repeat_interleave(cols, dim=1)[:, :k]
    return weight.float() * full


def linear_rows(
    act: Fp8Act, weight: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:  # [T, K] x [N, K] (scales [N]) -> [T, N] in ``dtype``
    """Products of e4m3 values are exact in fp32; the scales multiply the fp32 sums, as cuBLASLt does."""
    return (F.linear(act.data.float(), weight.float()) * act.scale * scale).to(dtype)


def linear_weight_only(
    x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:  # [T, K] in the model dtype x [N, K] e4m3 (scales [N]) -> [T, N] in ``dtype``
    """W8A16: the input unquantized, each weight ``q * scale``; fp32 sums scaled per output row."""
    return (F.linear(x.float(), weight.float()) * scale).to(dtype)


def linear_blocks(
    act: Fp8Act, group: int, weight: torch.Tensor, scale: torch.Tensor, rows: int, dtype: torch.dtype
) -> torch.Tensor:  # [T, K] x [N, K] (scales per ``rows`` x ``group`` block) -> [T, N] in ``dtype``
    return F.linear(dequantize_act(act, group), dequantize_blocks(weight, scale, rows, group)).to(dtype)


# --- the KV cache --------------------------------------------------------------------------------------


def to_cache(x: torch.Tensor, scale: float) -> torch.Tensor:
    """What an FP8 cache stores for ``x`` (in fp32, saturated; the cache's assignment rounds it)."""
    return (x.float() / scale).clamp(-FP8_MAX, FP8_MAX)
