"""A MoE layer's expert weights as one stacked tensor per projection, read from either layout.

- transformers 5 in memory (``ModuleSource``, ``RandomSource``): fused 3D parameters
  ``mlp.experts.gate_up_proj`` [E, 2I, H] (gate rows, then up rows) and ``mlp.experts.down_proj``
  [E, H, I]. Unsharded they are returned as they are: views of the model's own parameters, no copy.
- checkpoints (what ``save_pretrained`` writes and the hub holds): one matrix per expert and projection,
  ``mlp.experts.{e}.gate_proj.weight`` / ``up_proj`` / ``down_proj`` (Qwen2/3-MoE, OLMoE) or Mixtral's
  ``block_sparse_moe.experts.{e}.w1.weight`` (gate) / ``w3`` (up) / ``w2`` (down), its router at
  ``block_sparse_moe.gate.weight``. Each is read once, straight into this rank's stack.

Under tensor parallelism a rank holds the intermediate rows ``rows`` of every expert: those rows of gate
and of up (stacked gate | up, as unsharded) and those columns of down.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from batchgen.distributed.shard import Span
from batchgen.model.weights.sources import Part, WeightSource

_CHECKPOINT_NAMES = (  # (experts' prefix relative to the layer, gate, up, down)
    ("mlp.experts.{e}.", "gate_proj.weight", "up_proj.weight", "down_proj.weight"),
    ("block_sparse_moe.experts.{e}.", "w1.weight", "w3.weight", "w2.weight"),  # Mixtral
)


def router_name(source: WeightSource, layer_prefix: str) -> str:
    for name in (layer_prefix + "mlp.gate.weight", layer_prefix + "block_sparse_moe.gate.weight"):
        if source.has(name):
            return name
    raise KeyError(f"no MoE router weight under {layer_prefix!r}")


Reader = Callable[[Part], torch.Tensor]  # a part in the stack's dtype (FP8 checkpoints: dequantized)


def expert_stacks(
    source: WeightSource, layer_prefix: str, num_experts: int, inter: int, rows: Span | None,
    dtype: torch.dtype, read: Reader | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """(gate_up [E, 2 * I_r, H], down [E, H, I_r]) of layer ``layer_prefix`` (``model.layers.{i}.``),
    I_r = ``rows.size`` (all ``inter`` rows when None). ``read``: how a checkpoint's part is read
    (default: as stored, cast to ``dtype``)."""
    gate_up, down = _read(source, layer_prefix, num_experts, inter, rows, dtype, read or source.get)
    width = inter if rows is None else rows.size
    expected = (num_experts, 2 * width, num_experts, width)
    if (*gate_up.shape[:2], down.shape[0], down.shape[2]) != expected:  # e.g. a transposed fused layout
        raise ValueError(
            f"{layer_prefix}: expert weights of shapes {tuple(gate_up.shape)} and {tuple(down.shape)}, "
            f"expected [{num_experts}, {2 * width}, H] and [{num_experts}, H, {width}]"
        )
    return gate_up, down


def _read(
    source: WeightSource, layer_prefix: str, num_experts: int, inter: int, rows: Span | None,
    dtype: torch.dtype, read: Reader,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    fused = layer_prefix + "mlp.experts.gate_up_proj"
    fused_down = layer_prefix + "mlp.experts.down_proj"
    if source.has(fused):
        if rows is None:  # the parameters themselves (views for an in-memory model)
            return source.get(Part(fused)).to(dtype), source.get(Part(fused_down)).to(dtype)
        up_rows = Span(inter + rows.start, inter + rows.stop)
        gate_up = [[Part(fused, rows, None, e), Part(fused, up_rows, None, e)] for e in range(num_experts)]
        down = [[Part(fused_down, None, rows, e)] for e in range(num_experts)]
    else:
        gate_up, down = checkpoint_parts(source, layer_prefix, num_experts, rows)
    return stack(read, gate_up, dtype), stack(read, down, dtype)


ExpertParts = list[list[Part]]  # per expert, the parts its matrix stacks by rows


def checkpoint_parts(
    source: WeightSource, layer_prefix: str, num_experts: int, rows: Span | None
) -> tuple[ExpertParts, ExpertParts]:
    """(gate_up: [gate rows, up rows] of each expert, down: [down columns] of each) of a checkpoint that
    stores one matrix per expert."""
    experts, gate, up, down_leaf = _checkpoint_names(source, layer_prefix)
    gate_up, down = [], []
    for e in range(num_experts):
        base = layer_prefix + experts.format(e=e)
        gate_up.append([Part(base + gate, rows), Part(base + up, rows)])
        down.append([Part(base + down_leaf, None, rows)])
    return gate_up, down


def stored_per_expert(source: WeightSource, layer_prefix: str) -> str | None:
    """Expert 0's gate weight name where the checkpoint stores one matrix per expert, else None."""
    if source.has(layer_prefix + "mlp.experts.gate_up_proj"):
        return None
    experts, gate, _, _ = _checkpoint_names(source, layer_prefix)
    return layer_prefix + experts.format(e=0) + gate


def _checkpoint_names(source: WeightSource, layer_prefix: str) -> tuple[str, str, str, str]:
    for names in _CHECKPOINT_NAMES:
        if source.has(layer_prefix + names[0].format(e=0) + names[1]):
            return names
    raise KeyError(f"no expert weights under {layer_prefix!r} (neither fused nor per expert)")


def stack(read: Reader, experts: Sequence[Sequence[Part]], dtype: torch.dtype) -> torch.Tensor:
    """[E, rows, cols]: expert e's parts stacked by rows, each read once and copied into place (memory
    holds the stack and one part at a time)."""
    out = None
    for e, parts in enumerate(experts):
        row = 0
        for part in parts:
            tensor = read(part)
            if out is None:
                rows = tensor.shape[0] * len(parts)  # the parts of one expert have the same shape
                out = torch.empty((len(experts), rows, tensor.shape[1]), dtype=dtype, device=tensor.device)
            out[e, row : row + tensor.shape[0]].copy_(tensor)
            row += tensor.shape[0]
    assert out is not None
    return out
