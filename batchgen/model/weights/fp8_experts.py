"""A MoE layer's routed experts as the grouped GEMMs take them: 16/32-bit stacks, or e4m3 ``Fp8Experts``
(``kernels/moe/expert_format.py``).

- ``--quantization fp8`` on a 16/32-bit checkpoint: each expert's rows quantized per output channel at
  load (a layer's 16-bit stacks are read whole, then replaced by their e4m3 copies), and the products'
  inputs quantized per token as they run (W8A8, ``act_fp8``; the dense projections are weight-only):
  e4m3 x e4m3 products run the grouped GEMMs faster than converting each e4m3 weight tile (docs/results.md).
- An FP8 checkpoint whose experts are stored in e4m3 (the fp8 method's releases, e.g. Qwen3-30B-A3B-FP8:
  per-expert ``weight`` + ``weight_scale_inv`` per 128 x 128 block): the weights and scales as published,
  block scales per part (gate's, then up's), per-channel or per-tensor ``weight_scale`` as row scales.
  Under tensor parallelism a rank's intermediate rows (gate and up rows, down columns) may start inside
  a block: it keeps the blocks covering its share and where the share starts in the first
  (``Fp8Experts.offset``); the kernels need that start on a multiple of 16 columns, else a one-line
  refusal. Their inputs stay in the model dtype (weight-only): the function of the dequantized experts.
- Anything else (a dense checkpoint, experts an FP8 checkpoint left unquantized): the 16/32-bit stacks.
"""

from __future__ import annotations

import torch

from batchgen.distributed.shard import Span
from batchgen.kernels.fp8_format import FP8
from batchgen.kernels.moe.expert_format import Fp8Experts, quantize_channels
from batchgen.model.weights.experts import (
    ExpertParts,
    checkpoint_parts,
    expert_stacks,
    stack,
    stored_per_expert,
)
from batchgen.model.weights.fp8_checkpoint import _covering_scales, _is_block_scale, _row_scales, _scale_name
from batchgen.model.weights.rank_loader import Loader
from batchgen.model.weights.sources import Part, WeightSource

Experts = torch.Tensor | Fp8Experts  # [E, N, K]


def routed_experts(
    load: Loader, layer_prefix: str, num_experts: int, inter: int, rows: Span | None
) -> tuple[Experts, Experts]:
    """(gate_up [E, 2 * I_r, H], down [E, H, I_r]) of a layer in the loader's format (see above)."""
    if load.fmt.name == "fp8-checkpoint":
        gate = stored_per_expert(load.source, layer_prefix)
        if gate is not None and load.source.dtype(gate) == FP8:
            block = getattr(load.fmt, "block", (128, 128))
            return checkpoint_experts(load.source, layer_prefix, num_experts, inter, rows, block)
    gate_up, down = expert_stacks(
        load.source, layer_prefix, num_experts, inter, rows, load.dtype, load.tensor
    )
    if load.fmt.name == "fp8":
        gate_up, down = quantize_channels(gate_up, parts=2), quantize_channels(down)
        return gate_up._replace(act_fp8=True), down._replace(act_fp8=True)
    return gate_up, down


def checkpoint_experts(
    source: WeightSource, layer_prefix: str, num_experts: int, inter: int, rows: Span | None,
    block: tuple[int, int],
) -> tuple[Fp8Experts, Fp8Experts]:  # fmt: skip
    """The e4m3 experts of an FP8 checkpoint and their scales, cut to the rank's ``rows``."""
    gate_up_parts, down_parts = checkpoint_parts(source, layer_prefix, num_experts, rows)
    first = gate_up_parts[0][0]
    blockwise = source.has(_scale_name(first, "weight_scale_inv")) or _is_block_scale(source, first, block)
    kind = block if blockwise else None
    start = 0 if rows is None or kind is None else rows.start  # a share may start inside a block
    if start % block[1] % 16:
        raise ValueError(
            f"tensor parallelism splits {layer_prefix}'s {inter} expert intermediate rows at {start}, "
            f"{start % block[1]} columns into the checkpoint's {block[1]}-wide FP8 scale blocks: the expert "
            "kernels need splits at multiples of 16 columns; choose another --tensor-parallel size"
        )
    gate_up = Fp8Experts(
        stack(source.get, gate_up_parts, FP8), _scales(source, gate_up_parts, kind), kind, 2,
        (start % block[0], 0),
    )  # fmt: skip
    down = Fp8Experts(
        stack(source.get, down_parts, FP8), _scales(source, down_parts, kind), kind, 1, (0, start % block[1])
    )
    return gate_up, down


def _scales(source: WeightSource, experts: ExpertParts, block: tuple[int, int] | None) -> torch.Tensor:
    """[E, N] row scales, or [E, parts * block rows of a part, block columns] (``block``) fp32."""
    return torch.stack([torch.cat([_part_scales(source, p, block) for p in parts]) for parts in experts])


def _part_scales(source: WeightSource, part: Part, block: tuple[int, int] | None) -> torch.Tensor:
    if block is None:
        return _row_scales(source, part).contiguous()  # [rows of the part]
    name = _scale_name(part, "weight_scale_inv")
    if not source.has(name):
        name = _scale_name(part, "weight_scale")
    return _covering_scales(source, part, name, block)[0]  # [block rows, block columns] from block 0, 0
