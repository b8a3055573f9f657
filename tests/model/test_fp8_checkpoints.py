"""FP8 checkpoints load and compute what they mean; ``--quantization fp8`` and the FP8 KV cache stay close
to full precision; unsupported methods are refused in one line.

Each tiny checkpoint is written by the test in a released layout (``tests/support/fp8.py``). Its
dequantized twin (the same model with the dequantized weights, rounding each projection's input to e4m3
the way the FP8 forward does) must give the same logits up to fp32 summation order; without the input
rounding it stays within FP8 rounding.
"""

from __future__ import annotations

import json

import pytest
import torch

from batchgen.config import EngineConfig
from batchgen.distributed.group import ParallelGroup
from batchgen.kernels import fp8_format as ref
from batchgen.model.build import ModelFiles, build_model
from batchgen.model.kv_cache import KVShape
from batchgen.model.paged_sequence import sequence_logits
from batchgen.model.weights.fp8 import Fp8BlockLinear, Fp8RowLinear
from tests.support.fp8 import LAYOUTS, simulated_activations, write_checkpoint

pytestmark = pytest.mark.usefixtures("one_torch_thread")

# hidden 128 and head_dim 32: k/v parts of 64 rows, so stacked block scales are kept per row; Qwen3 with
# head_dim 64 and intermediate 384: every part spans whole 128-row blocks (compact scales).
CONFIGS = {
    "llama": dict(model_type="llama", hidden_size=128, intermediate_size=256, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=32, attention_bias=True),
    "qwen3": dict(model_type="qwen3", hidden_size=128, intermediate_size=384, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=64, tie_word_embeddings=True),
}  # fmt: skip
IDS = torch.randint(0, 97, (20,), generator=torch.Generator().manual_seed(0))
CHUNKS = [9, 5, 1, 1, 1, 1, 1, 1]


def _model(arch: str) -> torch.nn.Module:
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = dict(CONFIGS[arch])
    config = AutoConfig.for_model(
        fields.pop("model_type"), vocab_size=97, num_hidden_layers=2, max_position_embeddings=256, **fields
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation="eager")
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0.0, 0.2)
        model.lm_head.weight.mul_(8.0)  # decisive argmax
    return model.eval()


def _forward(path: str, **options):
    from transformers import AutoConfig

    config = EngineConfig(model=path, **options)
    files = ModelFiles(path, AutoConfig.from_pretrained(path))
    bundle = build_model(config, files, ParallelGroup.single(), torch.device("cpu"), torch.float32, 256)
    return bundle.forward, bundle.kv_shape


def _logits(forward, shape: KVShape, cache_dtype=torch.float32) -> torch.Tensor:
    with torch.inference_mode():
        return sequence_logits(forward, IDS, CHUNKS, shape, cache_dtype)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def _transformers_logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model(IDS.unsqueeze(0)).logits[0]


@pytest.mark.parametrize(("layout", "arch"), [
    ("fp8-block", "llama"), ("fp8-block", "qwen3"), ("fp8-tensor-static", "qwen3"), ("ct-channel", "llama"),
    ("ct-tensor-static-kv", "llama"), ("ct-block", "qwen3"),
])  # fmt: skip
def test_checkpoint_matches_its_dequantized_model(layout, arch, tmp_path):
    ignore = ("model.layers.1.mlp.gate_proj", "model.layers.1.mlp.up_proj")  # a group left in full precision
    twin = write_checkpoint(_model(arch), tmp_path, layout, IDS, ignore=ignore)
    forward, shape = _forward(str(tmp_path))
    layer = forward.layers[0]
    kind = Fp8BlockLinear if LAYOUTS[layout]["weights"] == "block" else Fp8RowLinear
    assert isinstance(layer.attn.qkv, kind) and isinstance(layer.mlp.down, kind)
    assert layer.attn.qkv.weight.dtype == ref.FP8
    assert forward.layers[1].mlp.gate_up.act_quant is None  # the ignored group loads dense
    got = _logits(forward, shape)
    with simulated_activations(twin, layout, tmp_path):
        same_function = _transformers_logits(twin)
    assert _rel(got, same_function) < 1e-5  # measured ~2e-7: fp32 summation order
    assert _rel(got, _transformers_logits(twin)) < 0.05  # the inputs' e4m3 rounding (~1e-2), no more
    assert (got.argmax(-1) == same_function.argmax(-1)).all()


def test_block_scales_stay_compact_when_parts_span_whole_blocks(tmp_path):
    write_checkpoint(_model("qwen3"), tmp_path / "q", "fp8-block", IDS)
    write_checkpoint(_model("llama"), tmp_path / "l", "fp8-block", IDS)
    qkv = _forward(str(tmp_path / "q"))[0].layers[0].attn.qkv  # q 256 | k 128 | v 128 rows
    assert (qkv.scale_rows, tuple(qkv.scale.shape)) == (128, (4, 1))
    qkv = _forward(str(tmp_path / "l"))[0].layers[0].attn.qkv  # q 128 | k 64 | v 64: per-row scales
    assert (qkv.scale_rows, tuple(qkv.scale.shape)) == (1, (256, 1))


def test_kv_scales_come_from_the_checkpoint(tmp_path):
    write_checkpoint(_model("llama"), tmp_path, "ct-tensor-static-kv", IDS)
    forward, shape = _forward(str(tmp_path), kv_cache_dtype="fp8")
    scales = [s for layer in forward.layers for s in layer.attn.kv_scales]
    assert scales == pytest.approx([0.05, 0.02, 0.1, 0.04])
    full = _logits(_forward(str(tmp_path))[0], shape)
    assert _forward(str(tmp_path))[0].layers[0].attn.kv_scales == (1.0, 1.0)  # a 16/32-bit cache: unused
    assert _rel(_logits(forward, shape, ref.FP8), full) < 0.03


def test_quantization_fp8_at_load_stays_close(tmp_path):
    model = _model("llama")
    model.save_pretrained(tmp_path)
    forward, shape = _forward(str(tmp_path), quantization="fp8")
    qkv = forward.layers[0].attn.qkv
    assert isinstance(qkv, Fp8RowLinear) and qkv.scale.shape == (256,)
    assert qkv.act_quant is None  # weight-only: the input stays in the model dtype
    assert forward.lm_head.weight.dtype == torch.float32  # lm_head and embeddings stay in the model dtype
    expected = _transformers_logits(model)
    fp8 = _logits(forward, shape)
    assert _rel(fp8, expected) < 0.05
    assert _rel(_logits(forward, shape, ref.FP8), expected) < 0.06  # + an e4m3 KV cache
    assert (fp8.argmax(-1) == expected.argmax(-1)).float().mean() >= 0.9


@pytest.mark.parametrize(("qc", "message"), [
    ({"quant_method": "awq", "bits": 4}, "quantization method 'awq' is not supported"),
    ({"quant_method": "fp8", "fmt": "e5m2"}, "fp8 format 'e5m2' is not supported"),
    ({"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": {"group_0": {
        "weights": {"num_bits": 4, "type": "int", "strategy": "group"}}}},
     "compressed-tensors format 'pack-quantized' (group group_0) is not supported"),
    ({"quant_method": "compressed-tensors", "format": "float-quantized", "config_groups": {"g": {
        "weights": {"num_bits": 8, "type": "float", "strategy": "tensor_group"}}}},
     "weight strategy 'tensor_group' (group g) is not supported"),
])  # fmt: skip
def test_other_quantization_methods_are_refused(tmp_path, qc, message):
    _model("llama").save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(config | {"quantization_config": qc}))
    with pytest.raises(ValueError) as err:
        _forward(str(tmp_path))
    assert message in str(err.value) and "\n" not in str(err.value)


def test_mixed_groups_and_misaligned_shards_are_refused(tmp_path):
    from batchgen.distributed.shard import Span
    from batchgen.model.weights.fp8_checkpoint import Fp8CheckpointFormat
    from batchgen.model.weights.sources import Part, SafetensorsSource

    write_checkpoint(_model("llama"), tmp_path, "fp8-block", IDS, ignore=("model.layers.0.self_attn.k_proj",))
    source = SafetensorsSource(tmp_path, torch.device("cpu"))
    fmt = Fp8CheckpointFormat(torch.float32, (128, 128))
    qkv = [Part(f"model.layers.0.self_attn.{p}_proj.weight") for p in "qkv"]
    with pytest.raises(ValueError, match="stores model.layers.0.self_attn.k_proj.weight unquantized"):
        fmt.linear(source, qkv, bias=False)
    down = Part("model.layers.0.mlp.down_proj.weight", None, Span(64, 128))  # rank 1 of 4: inside a block
    with pytest.raises(
        ValueError, match="splits model.layers.0.mlp.down_proj.weight's 256 input features at 64"
    ):
        fmt.linear(source, [down], bias=False)


def test_an_fp8_lm_head_loads_dequantized(tmp_path):
    """Some releases quantize lm_head too: it loads in the model dtype (the LM head stays dense)."""
    from safetensors.torch import load_file, save_file

    write_checkpoint(_model("llama"), tmp_path, "ct-channel", IDS)
    tensors = load_file(str(tmp_path / "model.safetensors"))
    q, s = ref.quantize_rows(tensors["lm_head.weight"])
    tensors["lm_head.weight"], tensors["lm_head.weight_scale"] = q, s.view(-1, 1)
    save_file(tensors, str(tmp_path / "model.safetensors"))
    head = _forward(str(tmp_path))[0].lm_head.weight
    assert head.dtype == torch.float32
    torch.testing.assert_close(head, q.float() * s[:, None], rtol=0, atol=0)
