"""Engine options + a model (a checkpoint directory or a module in memory) -> what a runner executes.

batchgen's fused forward when the architecture allows it (``--model-impl auto``), built straight from
the checkpoint's safetensors on the target device, each rank reading only its shard; its structure comes
from the config read off the files (``files/checkpoint_config.py``: no transformers import) or from a meta
skeleton of transformers' modules. Else transformers' modelling code on a model it loads itself.
"""

from __future__ import annotations

import logging
from typing import Any, NamedTuple

import torch

from batchgen.config import EngineConfig
from batchgen.distributed.group import ParallelGroup
from batchgen.distributed.shard import Span
from batchgen.model import attention, kv_cache
from batchgen.model.assemble import assemble
from batchgen.model.files.checkpoint_config import FileConfig, model_spec
from batchgen.model.forward import ModelForward, TransformersForward
from batchgen.model.loader import has_safetensors, resolve_device
from batchgen.model.spec import ModelStructure, skeleton_structure, unsupported_reason
from batchgen.model.weights.choose_format import weight_format
from batchgen.model.weights.sources import ModuleSource, RandomSource, SafetensorsSource, WeightSource

log = logging.getLogger(__name__)

LOAD_FORMATS = ("auto", "random")
_FUSED_ONLY = (
    "--quantization fp8 and --kv-cache-dtype fp8 need batchgen's own forward (--model-impl auto or "
    "batchgen, Llama, Mistral, Qwen2 and Qwen3 models)"
)


class ModelBundle(NamedTuple):
    forward: ModelForward
    kv_shape: kv_cache.KVShape  # this rank's
    module: torch.nn.Module | None  # the transformers model, when one was built or given
    # The rank's range of a vocabulary split over ranks, and the whole vocabulary's size (None: every
    # rank's logits cover the whole vocabulary); the engine picks its sampler from it.
    split_vocab: tuple[Span, int] | None = None
    # Bytes a prompt step takes beside its activations: the largest weight-only FP8 projection widened
    # to the model dtype (``kernels/gemm/dequant.py``), which the KV pool must leave room for.
    workspace_bytes: int = 0


class ModelFiles(NamedTuple):
    path: str | None  # a local directory (None: the model exists only in memory)
    hf_config: Any
    module: torch.nn.Module | None = None
    calibration: tuple[tuple[int, ...], ...] = ()  # token ids that --quantization fp8 calibrates on


def meta_skeleton(hf_config, trust_remote_code: bool = False) -> torch.nn.Module:
    """The model's modules on the meta device: structure and constants, no memory."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(hf_config, trust_remote_code=trust_remote_code)


def load_transformers_model(path: str, options: EngineConfig, device: torch.device, dtype: torch.dtype):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        path,
        dtype=dtype,
        attn_implementation=attention.register(),
        trust_remote_code=options.trust_remote_code,
    )
    return model.to(device).eval()


def transformers_reason(options: EngineConfig, skeleton: torch.nn.Module) -> str | None:
    """Why ``build_model`` runs transformers' forward for this model (None: batchgen's fused one)."""
    reason = unsupported_reason(skeleton)
    if options.model_impl == "transformers":
        return reason or "--model-impl transformers"
    if reason is not None and options.model_impl != "auto":
        raise ValueError(f"--model-impl batchgen does not support this model: {reason}")
    return reason


class ForwardChoice(NamedTuple):
    """Which forward runs a model: batchgen's fused one (``structure``) or, for ``reason``,
    transformers'. ``skeleton``: the model's modules on the meta device (None when its config was read
    from the files alone, ``model/files/checkpoint_config.py``)."""

    structure: ModelStructure | None
    reason: str | None
    skeleton: torch.nn.Module | None


def choose_forward(options: EngineConfig, files: ModelFiles) -> ForwardChoice:
    config = files.hf_config
    if isinstance(config, FileConfig):  # read only for architectures the fused forward runs
        return ForwardChoice(ModelStructure(model_spec(config), config, config.moe_layouts), None, None)
    skeleton = files.module if files.module is not None else meta_skeleton(config, options.trust_remote_code)
    reason = transformers_reason(options, skeleton)
    return ForwardChoice(None if reason else skeleton_structure(skeleton), reason, skeleton)


def tensor_parallel_problem(options: EngineConfig, files: ModelFiles) -> str | None:
    """Why ``options.tensor_parallel`` ranks cannot split this model with the forward ``build_model``
    will pick (None when they can); read off the config (and a meta skeleton), before any process starts."""
    from batchgen.distributed.shard import config_problem
    from batchgen.model import hf_plan

    choice = choose_forward(options, files)
    size = options.tensor_parallel
    if choice.reason is None:
        return config_problem(files.hf_config, size)
    if options.quantization is not None or options.kv_cache_dtype != "auto":
        return _FUSED_ONLY
    return hf_plan.plan_problem(choice.skeleton, size, resolve_device(options.device), choice.reason)


def build_model(
    options: EngineConfig, files: ModelFiles, group: ParallelGroup, device: torch.device, dtype: torch.dtype,
    max_positions: int,
) -> ModelBundle:  # fmt: skip
    choice = choose_forward(options, files)
    if choice.reason is not None:
        log.info("running transformers' forward, not batchgen's fused one: %s", choice.reason)
        return _transformers_bundle(options, files, group, device, dtype)
    source = _source(options, files, choice.skeleton, group, device, dtype)
    fmt = weight_format(files.hf_config, dtype, options.quantization)
    fp8_cache = options.kv_cache_dtype == "fp8"
    # Random weights have no quality to keep: their FP8 codes round to nearest (the same kernels and bytes).
    calibration = () if options.load_format == "random" else files.calibration
    built = assemble(choice.structure, source, fmt, group, dtype, max_positions, fp8_cache, calibration)
    if fmt.name != "dense" and device.type == "cuda":
        # Quantizing at load left 16-bit parts in the allocator's cache: give them back before the KV
        # pool is sized from the device's free memory.
        torch.cuda.empty_cache()
    spec = built.spec
    split_vocab = (built.vocab, spec.vocab) if group.is_parallel else None
    shape = kv_cache.KVShape(spec.num_layers, built.heads.kv.size, spec.head_dim)
    return ModelBundle(built.forward, shape, files.module, split_vocab, widened_bytes(built.forward, dtype))


def widened_bytes(forward, dtype: torch.dtype) -> int:
    """The largest weight-only FP8 projection of ``forward``'s layers in ``dtype`` (0: none)."""
    from batchgen.model.weights.fp8 import Fp8RowLinear

    sizes = [
        linear.weight.numel()
        for layer in getattr(forward, "layers", ())
        for linear in (
            layer.attn.qkv,
            layer.attn.o_proj,
            getattr(layer.mlp, "gate_up", None),
            getattr(layer.mlp, "down", None),
        )  # fmt: skip
        if isinstance(linear, Fp8RowLinear) and linear.act_quant is None
    ]
    return max(sizes, default=0) * dtype.itemsize


def _transformers_bundle(options, files: ModelFiles, group, device, dtype) -> ModelBundle:
    if options.quantization is not None or options.kv_cache_dtype != "auto":
        raise ValueError(_FUSED_ONLY)
    if group.is_parallel:  # transformers' tp_plan (model/hf_plan.py): full-vocab logits on every rank
        from batchgen.model import hf_plan

        module = hf_plan.load_sharded(
            files.path, group, dtype, attention.register(), options.trust_remote_code
        )
        return ModelBundle(TransformersForward(module), hf_plan.kv_shape(module, group.size), module)
    module = (
        files.module
        if files.module is not None
        else load_transformers_model(files.path, options, device, dtype)
    )
    return ModelBundle(TransformersForward(module), kv_cache.kv_shape(module.config), module)


def _source(options, files: ModelFiles, skeleton, group, device, dtype) -> WeightSource:
    if files.module is not None:
        return ModuleSource(files.module)
    if options.load_format == "random":  # the loader reads such a model's config through transformers
        return RandomSource.for_model(skeleton, device, dtype)
    if has_safetensors(files.path):
        return SafetensorsSource(files.path, device)
    if group.is_parallel:
        raise ValueError(f"--tensor-parallel reads safetensors checkpoints; {files.path} has none")
    return ModuleSource(load_transformers_model(files.path, options, device, dtype))
