"""Tensor parallelism for architectures without batchgen's fused forward: transformers' own ``tp_plan``.

transformers ships a sharding plan for many architectures (``config.base_model_tp_plan`` plus the model
class's ``_tp_plan`` for the LM head). ``from_pretrained(distributed_config=DistributedConfig(tp_size=K))``
applies it as it loads: each rank reads its rows of q/k/v and gate/up (colwise), its columns of o/down
(rowwise, one all-reduce each), and the LM head's ``colwise_gather_output`` all-gathers full-vocabulary
logits on every rank. Those logits are identical bit for bit on every rank, so the one-process sampler
on every rank gives the same token (each rank keeps its own carry-over, as with the fused forward).

batchgen's paged attention sees the heads the rank's q/k/v projections produced: its local heads when the
plan shards the key projection colwise, all of them when the plan gathers q/k/v (Phi-3, OLMo-2). The KV
pool is shaped alike (``kv_shape``). The job's process group is the world group batchgen formed
(``launch.init_group``); transformers finds it initialised and builds its device mesh over it.

Checked on the CPU with gloo (transformers 5.24, torch 2.13: tests/tensor_parallel/test_tp_transformers.py);
not yet run on CUDA. Its steps run eagerly there (``engine/rank_engine.py`` turns the decode graphs off
on this path) until the capture of the plan's DTensor collectives is verified. ``transformers.distributed``
may be absent from older transformers releases: the import error then names it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import torch

from batchgen.distributed.group import ParallelGroup
from batchgen.model import kv_cache


def plan_of(skeleton: torch.nn.Module) -> dict[str, str]:
    """The model's resolved tensor-parallel plan (module name pattern -> style); {} when it has none.

    Only ``config.base_model_tp_plan`` splits the decoder layers: a plan holding nothing but the LM head
    (the class-level ``_tp_plan``) would leave every layer whole on every rank."""
    if not getattr(skeleton.config.get_text_config(), "base_model_tp_plan", None):
        return {}
    return dict(getattr(skeleton, "tp_plan", None) or {})


def local_kv_heads(plan: dict[str, str], kv_heads: int, size: int) -> int | None:
    """KV heads a rank holds under ``plan`` (None: they do not split evenly over ``size`` ranks)."""
    from transformers.distributed.tensor_parallel import get_kv_heads_per_rank

    return get_kv_heads_per_rank(plan, kv_heads, size)


def splits_heads(plan: dict[str, str]) -> bool:
    """Whether the plan hands each rank some of the attention heads (q/k/v colwise, not gathered)."""
    return local_kv_heads(plan, 1, 2) is None  # one KV head cannot split in two: the plan tries to


def plan_problem(skeleton: torch.nn.Module, size: int, device: torch.device, fused_reason: str) -> str | None:
    """Why ``size`` ranks cannot run transformers' forward of this model on ``device`` (None when they
    can). ``fused_reason`` says why batchgen's fused forward does not apply; the refusal names it."""
    text = skeleton.config.get_text_config()
    model_type = getattr(text, "model_type", type(skeleton).__name__)
    plan = plan_of(skeleton)
    if not plan:
        return (
            f"--tensor-parallel {size}: model type {model_type!r} has neither batchgen's fused forward "
            f"({fused_reason}) nor a tensor-parallel plan in transformers (config.base_model_tp_plan)"
        )
    mesh_type = _mesh_device_type()
    if device.type != mesh_type:
        return (
            f"--tensor-parallel {size} with model type {model_type!r} (transformers' tp_plan) runs on this "
            f"machine's {mesh_type} devices, not on --device {device.type}"
        )
    if not splits_heads(plan):
        return None  # every rank computes all heads; transformers splits the MLP unevenly if it must
    q_heads = text.num_attention_heads
    kv_heads = getattr(text, "num_key_value_heads", None) or q_heads
    if q_heads % size or kv_heads % size:
        return (
            f"--tensor-parallel {size} does not divide the {q_heads} attention heads and {kv_heads} "
            f"key/value heads of model type {model_type!r} (transformers' tp_plan splits both evenly)"
        )
    return None


def _mesh_device_type() -> str:
    """The device type transformers builds its mesh on and loads the shards to: the machine's
    accelerator, whatever device batchgen was asked for (``distributed/utils.py``)."""
    accelerator = torch.accelerator.current_accelerator()
    return accelerator.type if accelerator is not None else "cpu"


@contextlib.contextmanager
def _rank_environment(group: ParallelGroup) -> Iterator[None]:
    """transformers picks this rank's device from ``LOCAL_RANK`` (ranks batchgen started have none):
    set the launcher variables for the load only, then restore the process's own."""
    names = {"RANK": group.rank, "LOCAL_RANK": group.local_rank, "WORLD_SIZE": group.size}
    saved = {name: os.environ.get(name) for name in names}
    os.environ.update({name: str(value) for name, value in names.items()})
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def load_sharded(
    path: str, group: ParallelGroup, dtype: torch.dtype, attn_implementation: str, trust_remote_code: bool
) -> torch.nn.Module:
    """This rank's shard of the model, loaded through transformers' tp_plan (every rank calls it at the
    same point: the device mesh is formed collectively)."""
    from transformers import AutoModelForCausalLM
    from transformers.distributed import DistributedConfig

    with _rank_environment(group):
        model = AutoModelForCausalLM.from_pretrained(
            path,
            dtype=dtype,
            attn_implementation=attn_implementation,
            trust_remote_code=trust_remote_code,
            distributed_config=DistributedConfig(tp_size=group.size, tp_plan="auto"),
        )
    return model.eval()


def kv_shape(model: torch.nn.Module, size: int) -> kv_cache.KVShape:
    """The rank's KV pool shape: the KV heads its attention layers write."""
    full = kv_cache.kv_shape(model.config)
    heads = local_kv_heads(dict(model.tp_plan), full.num_kv_heads, size)
    if heads is None:  # refused before any process started (plan_problem); a guard, not a path
        raise ValueError(f"{full.num_kv_heads} key/value heads do not split over {size} ranks")
    return full._replace(num_kv_heads=heads)
