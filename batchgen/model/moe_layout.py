"""What one decoder layer's mixture-of-experts MLP looks like: its routing and sizes (``MoELayout``), all
the MoE layer (``moe_layer.py``) needs besides the weights. Read off transformers' modules here
(``layout_of``), or off config.json (``files/moe_config.py``)."""

from __future__ import annotations

from typing import NamedTuple

import torch


class Routing(NamedTuple):
    num_experts: int
    top_k: int
    renormalize: bool  # top-k probabilities divided by their sum (norm_topk_prob; always for Mixtral)
    fp32_weights: bool  # Mixtral keeps the routing weights in fp32; the others round them to the model dtype


class MoELayout(NamedTuple):
    """One decoder layer's sparse MLP, all ``moe_mlp`` needs besides the weights: whether it was read off
    transformers' modules or off config.json, the build is the same."""

    routing: Routing
    intermediate: int  # each routed expert's intermediate size
    shared_intermediate: int | None  # Qwen2-MoE's shared expert (None: the layer has none)


def layout_of(model_type: str, layer: torch.nn.Module) -> MoELayout | None:
    """A decoder layer's MoE MLP as transformers built it (meta skeleton or real module); None for a
    dense MLP."""
    mlp = layer.mlp
    if not hasattr(mlp, "experts"):
        return None
    shared = mlp.shared_expert.intermediate_size if hasattr(mlp, "shared_expert") else None
    return MoELayout(_routing_of(model_type, mlp.gate), mlp.experts.intermediate_dim, shared)


def _routing_of(model_type: str, gate: torch.nn.Module) -> Routing:
    """The routing of transformers' TopKRouter module."""
    renormalize = bool(getattr(gate, "norm_topk_prob", True))  # Mixtral's router always renormalises
    return Routing(gate.num_experts, gate.top_k, renormalize, fp32_weights=model_type == "mixtral")
