"""Pre-quantized FP8 checkpoints, recognised from ``config.json``'s ``quantization_config``:

- ``quant_method: fp8`` (transformers' FineGrainedFP8 / the Qwen3 FP8 releases): e4m3 weights with
  ``weight_scale_inv`` per ``weight_block_size`` block (128 x 128), activations quantized per token per 128
  columns at run time; without a block size (AutoFP8), per-tensor ``weight_scale`` and, for the static
  activation scheme, ``input_scale``.
- ``quant_method: compressed-tensors`` with float 8-bit weights (llm-compressor): ``weight_scale`` per
  tensor, per channel or per block; activations dynamic per token, or static with ``input_scale``.
  Weight-only FP8 groups run with dynamic per-token activations too.

Which projections are quantized is read off the tensors (an e4m3 ``.weight``), so ignore lists
(``modules_to_not_convert``, ``ignore``) need no parsing: the rest load dense. Scales follow the weight
slices of tensor parallelism; a block-quantized weight split inside a block of input columns is refused.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from batchgen.distributed.shard import Span
from batchgen.kernels.fp8_format import FP8
from batchgen.model.weights.formats import DenseFormat, Linear, stacked_bias
from batchgen.model.weights.fp8 import Fp8BlockLinear, Fp8RowLinear
from batchgen.model.weights.sources import Part, WeightSource

SUPPORTED = "fp8, compressed-tensors with float8 weights"


def _unsupported(what: str) -> ValueError:
    return ValueError(f"{what} is not supported (batchgen loads FP8 checkpoints: {SUPPORTED})")


def checkpoint_format(qc: dict[str, Any], dtype: torch.dtype) -> Fp8CheckpointFormat:
    """The format of a checkpoint quantized as ``qc`` describes; ValueError naming what is not FP8."""
    method = str(qc.get("quant_method"))
    if method == "fp8":
        if qc.get("fmt", "e4m3") != "e4m3":
            raise _unsupported(f"fp8 format {qc['fmt']!r}")
        block = qc.get("weight_block_size")
        return Fp8CheckpointFormat(dtype, tuple(block) if block else None)
    if method == "compressed-tensors":
        return Fp8CheckpointFormat(dtype, _compressed_tensors_block(qc))
    raise _unsupported(f"quantization method {method!r}")


def _compressed_tensors_block(qc: dict[str, Any]) -> tuple[int, int] | None:
    """The weight block shape of a compressed-tensors float8 config (None: per tensor / channel)."""
    block = None
    for name, group in (qc.get("config_groups") or {}).items():
        fmt = group.get("format") or qc.get("format")
        if fmt not in ("float-quantized", "naive-quantized"):
            raise _unsupported(f"compressed-tensors format {fmt!r} (group {name})")
        w = group.get("weights") or {}
        if w.get("type") != "float" or w.get("num_bits") != 8:
            raise _unsupported(
                f"compressed-tensors {w.get('type')} {w.get('num_bits')}-bit weights (group {name})"
            )
        if w.get("strategy") not in ("tensor", "channel", "block"):
            raise _unsupported(f"compressed-tensors weight strategy {w.get('strategy')!r} (group {name})")
        a = group.get("input_activations")
        if a and (a.get("type") != "float" or a.get("num_bits") != 8):
            raise _unsupported(f"compressed-tensors {a.get('type')} {a.get('num_bits')}-bit activations")
        if w.get("strategy") == "block":
            block = tuple(w.get("block_structure") or (128, 128))
    return block


class Fp8CheckpointFormat:
    name = "fp8-checkpoint"

    def __init__(self, dtype: torch.dtype, block: tuple[int, int] | None) -> None:
        self.dtype, self.block = dtype, block or (128, 128)
        rows, cols = self.block
        if rows < 1 or cols < 32 or cols & (cols - 1):
            raise _unsupported(f"FP8 weight blocks of {rows} x {cols}")

    def linear(self, source: WeightSource, parts: Sequence[Part], bias: bool) -> Linear:
        fp8 = [source.dtype(p.name) == FP8 for p in parts]
        if not any(fp8):  # a projection the checkpoint left unquantized
            return DenseFormat(self.dtype).linear(source, parts, bias)
        if not all(fp8):
            names = ", ".join(p.name for p, q in zip(parts, fp8, strict=True) if not q)
            raise ValueError(f"this FP8 checkpoint stores {names} unquantized but not the rest of its group")
        weight = source.stack_rows(parts)
        b = stacked_bias(source, parts, self.dtype) if bias else None
        if all(source.has(_scale_name(p, "weight_scale_inv")) for p in parts):
            return self._block(source, parts, weight, b, "weight_scale_inv")
        if all(_is_block_scale(source, p, self.block) for p in parts):
            return self._block(source, parts, weight, b, "weight_scale")
        scale = torch.cat([_row_scales(source, p) for p in parts])
        inputs = [_scale_name(p, "input_scale") for p in parts]
        static = None
        if all(source.has(n) for n in inputs):  # one scale for the stacked input: the largest is safe for all
            static = torch.stack([source.get(Part(n)).float().reshape(()) for n in inputs]).max()
        return Fp8RowLinear(weight, scale, b, self.dtype, static)

    def _block(self, source, parts: Sequence[Part], weight, bias, suffix: str) -> Fp8BlockLinear:
        rows, cols = self.block
        scales = [_block_scales(source, p, _scale_name(p, suffix), self.block) for p in parts]
        if not _compact(source, parts, rows):
            # Parts that do not start and end on block rows: one scale row per weight row instead.
            scales = [_expand_rows(s, source, p, rows) for s, p in zip(scales, parts, strict=True)]
            rows = 1
        return Fp8BlockLinear(weight, torch.cat(scales), rows, cols, bias, self.dtype)


def dequantized(
    source: WeightSource, part: Part, dtype: torch.dtype, block: tuple[int, int] = (128, 128)
) -> torch.Tensor:
    """A part of an FP8-stored tensor that batchgen keeps in the model dtype (an LM head some checkpoints
    quantize; fused MoE expert tensors), its scales applied: ``weight_scale_inv`` or
    block ``weight_scale`` (``block`` rows x cols), else per-channel or per-tensor ``weight_scale``."""
    weight = source.get(part).float()
    name = _scale_name(part, "weight_scale_inv")
    if not source.has(name):
        name = _scale_name(part, "weight_scale")
        if not source.has(name):
            raise ValueError(f"{part.name} is stored in FP8 without a weight_scale: batchgen cannot load it")
        if not _is_block_scale(source, part, block):
            return (weight * _row_scales(source, part)[:, None]).to(dtype)
    return (weight * _expanded_block_scales(source, part, name, block)).to(dtype)


def _expanded_block_scales(
    source: WeightSource, part: Part, name: str, block: tuple[int, int]
) -> torch.Tensor:
    """[rows, cols] of the part: each weight's block scale (a slice may start inside a block)."""
    scale, rows, cols = _covering_scales(source, part, name, block)
    full = scale.repeat_interleave(block[0], dim=0).repeat_interleave(block[1], dim=1)
    r0, c0 = rows.start % block[0], cols.start % block[1]
    return full[r0 : r0 + rows.size, c0 : c0 + cols.size]


def _covering_scales(
    source: WeightSource, part: Part, name: str, block: tuple[int, int]
) -> tuple[torch.Tensor, Span, Span]:
    """(the block scales covering the part's slice of the weight, the slice's rows, its columns)."""
    n, k = source.shape(part.name)
    rows, cols = part.rows or Span(0, n), part.cols or Span(0, k)
    scale_rows = Span(rows.start // block[0], -(-rows.stop // block[0]))
    scale_cols = Span(cols.start // block[1], -(-cols.stop // block[1]))
    return source.get(Part(name, scale_rows, scale_cols)).float(), rows, cols


def _scale_name(part: Part, suffix: str) -> str:
    return part.name.removesuffix("weight") + suffix


def _is_block_scale(source: WeightSource, part: Part, block: tuple[int, int]) -> bool:
    name = _scale_name(part, "weight_scale")
    if not source.has(name):
        raise ValueError(f"the FP8 checkpoint has no scale for {part.name}")
    n, k = source.shape(part.name)
    shape = source.shape(name)
    # [N, 1] is a per-channel scale even where it is also the block grid's shape (N = 1)
    return shape == (-(-n // block[0]), -(-k // block[1])) and shape != (n, 1)


def _row_scales(source: WeightSource, part: Part) -> torch.Tensor:
    """[rows of the part] fp32: a per-channel scale sliced like the weight, a per-tensor one repeated."""
    name = _scale_name(part, "weight_scale")
    n = source.shape(part.name)[0]
    rows = part.rows.size if part.rows is not None else n
    numel = torch.Size(source.shape(name)).numel()
    if numel == 1:
        return source.get(Part(name)).float().reshape(1).expand(rows)
    if numel != n:
        raise ValueError(f"{name} has shape {source.shape(name)}: not a per-tensor or per-channel scale")
    return source.get(Part(name, part.rows)).float().reshape(rows)


def _block_scales(source: WeightSource, part: Part, name: str, block: tuple[int, int]) -> torch.Tensor:
    """The block-scale rows and columns covering the part's slice of the weight, for an FP8 product:
    its columns must start and end on scale blocks."""
    k = source.shape(part.name)[1]
    cols = part.cols or Span(0, k)
    if cols.start % block[1] or (cols.stop % block[1] and cols.stop != k):
        raise ValueError(
            f"tensor parallelism splits {part.name}'s {k} input features at {cols.start}-{cols.stop}, inside "
            f"the checkpoint's {block[1]}-wide FP8 scale blocks: choose a --tensor-parallel size that splits "
            f"at multiples of {block[1]}"
        )
    return _covering_scales(source, part, name, block)[0]


def _compact(source: WeightSource, parts: Sequence[Part], rows: int) -> bool:
    """Whether the parts' block-scale rows stack into the stacked weight's: every part starts on a block
    row and spans whole blocks (the last one may end with the tensor, in a partial block)."""
    for i, part in enumerate(parts):
        n = source.shape(part.name)[0]
        span = part.rows or Span(0, n)
        if span.start % rows or (span.size % rows and not (i == len(parts) - 1 and span.stop == n)):
            return False
    return True


def _expand_rows(scale: torch.Tensor, source: WeightSource, part: Part, rows: int) -> torch.Tensor:
    """[block rows, K blocks] -> [weight rows of the part, K blocks]."""
    span = part.rows or Span(0, source.shape(part.name)[0])
    first = span.start - span.start // rows * rows
    return scale.repeat_interleave(rows, dim=0)[first : first + span.size]
