"""batchgen's mixture-of-experts MLP: Qwen3-MoE, Qwen2-MoE (with its gated shared expert), Mixtral, OLMoE.

A MoE layer is a router (a replicated [E, H] projection), each architecture's routing exactly as
transformers computes it, the routed experts (``ops.moe_experts``: a torch grouped-GEMM reference on the
CPU, Triton kernels on CUDA, ``kernels/moe/``; in the model dtype or e4m3, weight-only), and for
Qwen2-MoE a shared expert scaled by a sigmoid gate. Under tensor parallelism each rank holds the
intermediate rows ``I / K`` of every expert (gate and up rows, down columns) and of the shared expert, so
its output is a partial sum: one all-reduce of the layer's output combines them. Dense layers between
MoE ones (``mlp_only_layers``, ``decoder_sparse_step``) stay ``DenseMLP``: each decoder layer's
``MoELayout`` (None for a dense MLP, ``moe_layout.py``) comes from its module on a meta skeleton
(``layout_of``) or from the config file (``files/moe_config.py``).

Routing stays in torch ops on both backends: bf16 router logits often tie (8 mantissa bits, 128
experts), and only ``torch.topk`` itself breaks ties the way transformers' ``torch.topk`` does.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from batchgen.distributed.group import ParallelGroup
from batchgen.distributed.shard import even_span
from batchgen.model.backends import KernelBackend
from batchgen.model.moe_layout import MoELayout, Routing
from batchgen.model.weights.experts import router_name
from batchgen.model.weights.formats import Linear
from batchgen.model.weights.fp8_experts import Experts, routed_experts
from batchgen.model.weights.rank_loader import Loader
from batchgen.model.weights.sources import Part


def route(logits: torch.Tensor, routing: Routing) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights [T, K], expert ids [T, K]) from router logits [T, E], transformers' TopKRouter step for
    step: softmax in fp32, top-k, optional renormalisation in fp32, then the weights' dtype."""
    probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
    top, ids = torch.topk(probs, routing.top_k, dim=-1)
    if routing.renormalize:
        top /= top.sum(dim=-1, keepdim=True)
    return (top if routing.fp32_weights else top.to(logits.dtype)), ids


class SharedExpert:
    """Qwen2-MoE's shared expert, ``sigmoid(h @ gate^T) * down(silu_mul(gate_up(h)))``; under tensor
    parallelism gate_up holds the rank's rows and down its columns (a partial sum, reduced with the
    routed experts' output)."""

    def __init__(self, gate_up: Linear, down: Linear, gate: torch.Tensor) -> None:
        self.gate_up, self.down, self.gate = gate_up, down, gate  # gate: [1, H], replicated

    def __call__(self, h: torch.Tensor, ops: KernelBackend) -> torch.Tensor:  # [T, H] -> [T, H]
        out = self.down(ops.silu_mul(self.gate_up(h)))
        return torch.sigmoid(F.linear(h, self.gate)) * out  # [T, 1] * [T, H], rounded as transformers


class MoEMLP:
    """Router -> routed experts (+ shared expert) -> one all-reduce. ``mlp(h [T, H], ops) -> [T, H]``."""

    def __init__(
        self, router: torch.Tensor, routing: Routing, gate_up: Experts, down: Experts,
        shared: SharedExpert | None, group: ParallelGroup,
    ) -> None:  # fmt: skip
        self.router, self.routing = router, routing  # router: [E, H]
        self.gate_up, self.down = gate_up, down  # [E, 2 * I_r, H], [E, H, I_r]: this rank's rows (or e4m3)
        self.shared, self.group = shared, group

    def route(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return route(F.linear(h, self.router), self.routing)

    def __call__(self, h: torch.Tensor, ops: KernelBackend) -> torch.Tensor:
        weights, ids = self.route(h)
        out = ops.moe_experts(h, weights, ids, self.gate_up, self.down)  # [T, H]
        if self.shared is not None:
            out = out + self.shared(h, ops)
        return self.group.all_reduce(out)


def moe_mlp(load: Loader, layout: MoELayout, layer_prefix: str) -> MoEMLP:
    """The MoE MLP of one decoder layer (``layout``: its routing and sizes).

    The routed experts follow the weight format (``weights/fp8_experts.py``): 16/32-bit stacks; under
    ``--quantization fp8`` e4m3 quantized per output channel at load; from an FP8 checkpoint its e4m3
    weights and block scales as published. The FP8 grouped GEMMs are weight-only: the activations stay in
    the model dtype. The shared expert and attention take the format's projections."""
    routing, inter, group = layout.routing, layout.intermediate, load.group
    rows = load.span(even_span(inter, group.rank, group.size))
    gate_up, down = routed_experts(load, layer_prefix, routing.num_experts, inter, rows)
    router = load.dense(router_name(load.source, layer_prefix))
    shared = layout.shared_intermediate
    shared = None if shared is None else _shared_expert(load, shared, layer_prefix + "mlp.")
    return MoEMLP(router, routing, gate_up, down, shared, group)


def _shared_expert(load: Loader, intermediate: int, prefix: str) -> SharedExpert:
    group = load.group
    rows = even_span(intermediate, group.rank, group.size)
    base = prefix + "shared_expert."
    parts = [Part(base + "gate_proj.weight", load.span(rows)), Part(base + "up_proj.weight", load.span(rows))]
    gate_up = load.fmt.linear(load.source, parts, bias=True)
    # No all-reduce of its own: the rank's partial sum joins the routed experts' before the layer's one.
    down_part = Part(base + "down_proj.weight", None, load.span(rows))
    down = load.fmt.linear(load.source, [down_part], bias=group.rank == 0)
    return SharedExpert(gate_up, down, load.dense(prefix + "shared_expert_gate.weight"))
