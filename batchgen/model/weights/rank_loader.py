"""What every part of a rank's build reads its weights through (``Loader``): the checkpoint's tensors (a
``WeightSource``), how projections are stored (a ``WeightFormat``), and the rank's share (a
``ParallelGroup``). The model assembly (``model/assemble.py``) and the MoE layer (``model/moe_layer.py``)
both build from it."""

from __future__ import annotations

from typing import NamedTuple

import torch

from batchgen.distributed.group import ParallelGroup
from batchgen.distributed.layers import RowParallel
from batchgen.distributed.shard import Span
from batchgen.model.weights.formats import Linear, WeightFormat
from batchgen.model.weights.sources import Part, WeightSource


class Loader(NamedTuple):
    """What every part of the build reads from."""

    source: WeightSource
    fmt: WeightFormat
    group: ParallelGroup
    dtype: torch.dtype

    def span(self, span: Span) -> Span | None:
        """A slice only when sharded: unsliced parts let an in-memory model merge into views."""
        return span if self.group.is_parallel else None

    def dense(self, name: str, rows: Span | None = None) -> torch.Tensor:
        return self.tensor(Part(name, rows))

    def tensor(self, part: Part) -> torch.Tensor:
        """A part kept in the model dtype: dequantized where an FP8 checkpoint stores it quantized (an LM
        head; fused MoE expert tensors, ``weights/fp8_experts.py`` keeps per-expert ones in e4m3)."""
        if self.source.dtype(part.name) == torch.float8_e4m3fn:
            from batchgen.model.weights.fp8_checkpoint import dequantized

            return dequantized(self.source, part, self.dtype, getattr(self.fmt, "block", (128, 128)))
        return self.source.get(part).to(self.dtype)

    def row_parallel(self, name: str, cols: Span) -> Linear:
        """A projection split by input features: partial sums, all-reduced; rank 0 adds the bias."""
        local = self.fmt.linear(self.source, [Part(name, None, self.span(cols))], bias=self.group.rank == 0)
        return RowParallel(local, self.group) if self.group.is_parallel else local
