"""Calibration of ``--quantization fp8``'s rounding while a model is assembled, one decoder layer at a time.

The calibration chats (``weights/calibration_text.py``, tokenized above this floor) run through the model
as it is built: layer i is first built in the model dtype, the chats' hidden states go through it with
its projections' inputs recorded (``gptq.InputRecorder``), and then it is built again in e4m3 with those
inputs' Hessians, so that GPTQ picks its codes (``weights/gptq.py``). The hidden states move on through
the unquantized layer, so only one layer is ever held in 16 bits beside the e4m3 ones. A mixture-of-experts
layer calibrates its attention; its experts round to nearest.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch

from batchgen.model.backends import PagedContext, TorchBackend
from batchgen.model.fused import DenseMLP, FusedForward, Layer
from batchgen.model.kv_cache import KVShape
from batchgen.model.paged_sequence import context, paged_caches
from batchgen.model.weights.gptq import InputRecorder

BLOCK_SIZE = 16


class _Run(NamedTuple):
    """One calibration sequence between two layers."""

    x: torch.Tensor  # [T, H] the next layer's input
    residual: torch.Tensor | None  # [T, H] the residual stream before it (None before the first layer)
    positions: torch.Tensor  # [T]
    ctx: PagedContext  # one sequence, one layer's cache (each layer writes it before it reads it)


class Calibration:
    """The calibration sequences' hidden states as the layers built so far left them."""

    def __init__(self, forward: FusedForward, sequences: Sequence[Sequence[int]], kv: KVShape,
                 dtype: torch.dtype, device: torch.device) -> None:  # fmt: skip
        self.forward = forward
        self.runs = [self._start(ids, kv, dtype, device) for ids in sequences]

    def _start(self, ids: Sequence[int], kv: KVShape, dtype, device) -> _Run:
        tokens = torch.tensor(list(ids), dtype=torch.long, device=device)
        one_layer = KVShape(1, kv.num_kv_heads, kv.head_dim)
        caches = paged_caches(one_layer, len(ids), BLOCK_SIZE, dtype, device) * kv.num_layers
        ctx = context(0, len(ids), caches, TorchBackend())
        positions = torch.arange(len(ids), device=device)
        return _Run(self.forward.embed(tokens), None, positions, ctx)

    @torch.inference_mode()
    def record(self, i: int, layer: Layer, prefix: str) -> dict[str, torch.Tensor]:
        """Run every sequence through layer ``i`` (unquantized) and move them past it; the Hessians of its
        projections' inputs, by the name of the first checkpoint part each projection is built from."""
        recording, recorders = _recording(layer, prefix)
        for n, run in enumerate(self.runs):
            x, residual = self.forward.layer_step(i, recording, run.x, run.residual, run.positions, run.ctx)
            self.runs[n] = run._replace(x=x, residual=residual)
        return {name: rec.hessian for name, rec in recorders.items() if rec.hessian is not None}


def _recording(layer: Layer, prefix: str) -> tuple[Layer, dict[str, InputRecorder]]:
    """``layer`` with recorders around its attention's projections and a dense MLP's."""
    attn, mlp = prefix + "self_attn.", prefix + "mlp."
    recorders = {attn + "q_proj.weight": InputRecorder(layer.attn.qkv),
                 attn + "o_proj.weight": InputRecorder(layer.attn.o_proj)}  # fmt: skip
    qkv, o_proj = recorders[attn + "q_proj.weight"], recorders[attn + "o_proj.weight"]
    recording = layer._replace(attn=layer.attn._replace(qkv=qkv, o_proj=o_proj))
    if isinstance(layer.mlp, DenseMLP):
        recorders[mlp + "gate_proj.weight"] = InputRecorder(layer.mlp.gate_up)
        recorders[mlp + "down_proj.weight"] = InputRecorder(layer.mlp.down)
        dense = DenseMLP(recorders[mlp + "gate_proj.weight"], recorders[mlp + "down_proj.weight"])
        recording = recording._replace(mlp=dense)
    return recording, recorders
