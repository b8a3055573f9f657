"""Tiny FP8 checkpoints for tests, written the way the published ones are, and their dequantized twins.

``write_checkpoint(model, dir, layout)`` saves ``model`` (a transformers Llama-family model) with its
projections quantized as one released layout stores them, and returns the model with its projection
weights replaced by the dequantized ones: what the checkpoint means, in full precision.
``simulated_activations(model, layout)`` makes that model also round each projection's input as the FP8
forward does, so the two compute the same function up to the order of summation.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator
from pathlib import Path

import torch

from batchgen.kernels import fp8_format as ref
from batchgen.kernels.fp8_format import ActQuant

PROJ = re.compile(r"model\.layers\.(\d+)\.(self_attn|mlp)\.(\w+_proj)\.weight$")
# Static activation scales are shared by a stacked projection's parts (they see the same input).
_INPUT_OF = {"q_proj": "qkv", "k_proj": "qkv", "v_proj": "qkv", "gate_proj": "gate_up", "up_proj": "gate_up"}

LAYOUTS = {
    # quant_method fp8 (Qwen3 FP8 releases): 128 x 128 blocks, weight_scale_inv, dynamic activations
    "fp8-block": dict(weights="block", scale_name="weight_scale_inv", acts="group"),
    # AutoFP8: per-tensor weights, static activations
    "fp8-tensor-static": dict(weights="tensor", scale_name="weight_scale", acts="static"),
    # llm-compressor FP8_DYNAMIC: per-channel weights (bf16 scales), dynamic per-token activations
    "ct-channel": dict(weights="channel", scale_name="weight_scale", acts="token"),
    # llm-compressor FP8 with calibration: per-tensor weights, static activations, KV-cache scales
    "ct-tensor-static-kv": dict(weights="tensor", scale_name="weight_scale", acts="static", kv=True),
    # llm-compressor FP8_BLOCK
    "ct-block": dict(weights="block", scale_name="weight_scale", acts="group"),
}


def _quantize(weight: torch.Tensor, kind: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(e4m3 weight, the scale as stored, the dequantized weight)."""
    if kind == "block":
        q, scale = ref.quantize_blocks(weight, 128, 128)
        return q, scale, ref.dequantize_blocks(q, scale, 128, 128)
    if kind == "channel":
        q, scale = ref.quantize_rows(weight)
        scale = scale.to(torch.bfloat16).float()  # llm-compressor stores bf16 scales
        q = (weight.float() / scale[:, None]).clamp(-ref.FP8_MAX, ref.FP8_MAX).to(ref.FP8)
        return q, scale.to(torch.bfloat16).view(-1, 1), q.float() * scale[:, None]
    scale = (weight.abs().max().float() / ref.FP8_MAX).reshape(1)
    q = (weight.float() / scale).clamp(-ref.FP8_MAX, ref.FP8_MAX).to(ref.FP8)
    return q, scale, q.float() * scale


def _config(layout: str, ignore: list[str]) -> dict:
    spec = LAYOUTS[layout]
    if layout.startswith("fp8-"):
        qc = {"quant_method": "fp8", "fmt": "e4m3", "modules_to_not_convert": ignore}
        if spec["weights"] == "block":
            return qc | {"activation_scheme": "dynamic", "weight_block_size": [128, 128]}
        return qc | {"activation_scheme": "static"}
    weights = {"num_bits": 8, "type": "float", "symmetric": True, "dynamic": False}
    weights["strategy"] = spec["weights"]
    if spec["weights"] == "block":
        weights["block_structure"] = [128, 128]
    acts = {"num_bits": 8, "type": "float", "symmetric": True, "dynamic": spec["acts"] != "static",
            "strategy": {"static": "tensor", "token": "token", "group": "group"}[spec["acts"]]}  # fmt: skip
    if spec["acts"] == "group":
        acts["group_size"] = 128
    group = {"targets": ["Linear"], "weights": weights, "input_activations": acts}
    qc = {
        "quant_method": "compressed-tensors", "format": "float-quantized",
        "quantization_status": "compressed", "config_groups": {"group_0": group},
        "ignore": ["lm_head", *ignore],
    }  # fmt: skip
    if spec.get("kv"):
        qc["kv_cache_scheme"] = {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False}
    return qc


def _input_amax(model: torch.nn.Module, ids: torch.Tensor) -> dict[str, float]:
    """Calibration: the largest absolute input of each projection over ``ids`` (layer.input -> amax)."""
    amax: dict[str, float] = {}
    hooks = []
    for name, module in model.named_modules():
        if name.endswith("_proj"):
            key = name.rsplit(".", 1)[0] + "." + _INPUT_OF.get(name.rsplit(".", 1)[1], name.rsplit(".", 1)[1])

            def hook(_m, args, key=key):
                amax[key] = max(amax.get(key, 0.0), float(args[0].abs().max()))

            hooks.append(module.register_forward_pre_hook(hook))
    with torch.no_grad():
        model(ids.unsqueeze(0))
    for h in hooks:
        h.remove()
    return amax


def write_checkpoint(
    model: torch.nn.Module, out_dir: str | Path, layout: str, calibration: torch.Tensor,
    ignore: tuple[str, ...] = (),
) -> torch.nn.Module:  # fmt: skip
    """Save ``model`` quantized as ``layout`` into ``out_dir``; return it with dequantized projections.
    ``ignore``: module names left unquantized (listed in the config, as releases do)."""
    from safetensors.torch import save_file

    spec = LAYOUTS[layout]
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    amax = _input_amax(model, calibration) if spec["acts"] == "static" else {}
    tensors, state = {}, model.state_dict()
    for name, tensor in state.items():
        match = PROJ.match(name)
        module = name.removesuffix(".weight")
        if match is None or module in ignore:
            tensors[name] = tensor.contiguous()
            continue
        q, scale, deq = _quantize(tensor, spec["weights"])
        tensors[name], tensors[f"{module}.{spec['scale_name']}"] = q, scale.contiguous()
        if spec["acts"] == "static":
            key = module.rsplit(".", 1)[0] + "." + _INPUT_OF.get(match.group(3), match.group(3))
            tensors[f"{module}.input_scale"] = torch.tensor([amax[key] / ref.FP8_MAX])
        with torch.no_grad():
            model.get_parameter(name).copy_(deq.to(tensor.dtype))
    if spec.get("kv"):
        for i in range(model.config.num_hidden_layers):
            tensors[f"model.layers.{i}.self_attn.k_scale"] = torch.tensor(0.05 * (i + 1))
            tensors[f"model.layers.{i}.self_attn.v_scale"] = torch.tensor(0.02 * (i + 1))
    if model.config.tie_word_embeddings:
        tensors.pop("lm_head.weight", None)
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads(model.config.to_json_string())
    config["quantization_config"] = _config(layout, list(ignore))
    (out_dir / "config.json").write_text(json.dumps(config))
    return model


@contextlib.contextmanager
def simulated_activations(model: torch.nn.Module, layout: str, out_dir: str | Path) -> Iterator[None]:
    """While inside, each quantized projection of ``model`` rounds its input to e4m3 as the FP8 forward
    does (static scales read back from ``out_dir``'s checkpoint)."""
    from safetensors.torch import load_file

    spec = LAYOUTS[layout]
    tensors = load_file(str(Path(out_dir) / "model.safetensors"))
    hooks = []
    for name, module in model.named_modules():
        if f"{name}.{spec['scale_name']}" not in tensors:
            continue
        group = 128 if spec["acts"] == "group" else None
        static = tensors.get(f"{name}.input_scale")
        if static is not None and name.endswith(("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")):
            parts = ("q_proj", "k_proj", "v_proj") if "attn" in name else ("gate_proj", "up_proj")
            parent = name.rsplit(".", 1)[0]
            static = torch.stack([tensors[f"{parent}.{p}.input_scale"].reshape(()) for p in parts]).max()
        quant = ActQuant(group, static)

        def hook(_m, args, quant=quant, group=group):
            x = args[0]
            flat = x.reshape(-1, x.shape[-1])
            return (ref.dequantize_act(ref.quantize_act(flat, quant), group).to(x.dtype).view(x.shape),)

        hooks.append(module.register_forward_pre_hook(hook))
    try:
        yield
    finally:
        for h in hooks:
            h.remove()
