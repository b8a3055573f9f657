"""batchgen's MoE layer against transformers' (Qwen3-MoE, Qwen2-MoE, Mixtral, OLMoE): the layer on random
inputs, the whole forward on the paged cache, weights read from checkpoints of both layouts."""

from __future__ import annotations

import pytest
import torch

from batchgen.config import EngineConfig
from batchgen.distributed.group import ParallelGroup
from batchgen.distributed.shard import Span
from batchgen.kernels.cpu import cpu_linear
from batchgen.model import attention
from batchgen.model.backends import TorchBackend
from batchgen.model.build import ModelFiles, build_model
from batchgen.model.files.checkpoint_config import FileConfig, read_config
from batchgen.model.forward import TransformersForward
from batchgen.model.moe_layer import MoEMLP
from batchgen.model.spec import unsupported_reason
from batchgen.model.weights.experts import expert_stacks
from batchgen.model.weights.sources import ModuleSource, SafetensorsSource
from tests.model.forward_cases import build_forward, fused_logits
from tests.support.models import MOE_ARCHS, TINY_CONFIGS, build_tiny_model

DTYPES = [torch.float32, torch.bfloat16]


def _model(arch: str, dtype=torch.float32) -> torch.nn.Module:
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = {**TINY_CONFIGS[arch], "vocab_size": 97, "eos_token_id": 2}
    config = AutoConfig.for_model(fields.pop("model_type"), **fields)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    with torch.no_grad():  # zero-initialised biases and unit norms would hide mistakes: make them count
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.normal_(mean=1.0 if "norm" in name else 0.0, std=0.2)
    return model.eval()


def _moe_layers(model) -> list[int]:
    return [i for i, layer in enumerate(model.model.layers) if hasattr(layer.mlp, "experts")]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("arch", MOE_ARCHS)
def test_moe_layer_equals_transformers_layer(arch, dtype):
    """Same routing, same grouped GEMMs, same rounding: bit-identical in fp32 and bf16. Dense layers of
    the same model (mlp_only_layers, decoder_sparse_step) stay dense."""
    model = _model(arch, dtype)
    forward = build_forward(model, "batchgen", 64)
    for i in range(len(model.model.layers)):
        assert isinstance(forward.layers[i].mlp, MoEMLP) == (i in _moe_layers(model))
    for i in _moe_layers(model):
        h = torch.randn(37, 64, generator=torch.Generator().manual_seed(i)).to(dtype)
        with torch.inference_mode():
            expected = model.model.layers[i].mlp(h.unsqueeze(0))[0]
            got = forward.layers[i].mlp(h, TorchBackend())
        assert torch.equal(got, expected), (got.float() - expected.float()).abs().max()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("arch", MOE_ARCHS)
def test_moe_forward_equals_transformers_forward(arch, dtype, monkeypatch):
    """The whole forward (OLMoE's full-width q/k norms included) over a chunked prefill and decodes, both
    forwards on the same paged cache: bit-identical logits. fp32 projections multiply through torch's
    own GEMM here, as transformers' do: the CPU path's oneDNN (``cpu_linear``) sums in another order."""
    monkeypatch.setattr(cpu_linear, "ONEDNN", False)
    model = _model(arch, dtype)
    model.set_attn_implementation(attention.register())
    ids = torch.randint(0, 97, (15,), generator=torch.Generator().manual_seed(1))
    chunks = [7, 4, 1, 1, 1, 1]
    with torch.inference_mode():
        expected = fused_logits(TransformersForward(model), model, ids, chunks, dtype)
        got = fused_logits(build_forward(model, "auto", 256), model, ids, chunks, dtype)
    assert torch.equal(got, expected), (got.float() - expected.float()).abs().max()


def test_expert_weights_are_the_models_own():
    """In memory the stacks are transformers' fused parameters themselves: nothing is copied."""
    model = _model("qwen2_moe")
    params_before = sum(p.numel() for p in model.parameters())
    mlp = build_forward(model, "batchgen", 64).layers[1].mlp
    experts = model.model.layers[1].mlp.experts
    assert mlp.gate_up.data_ptr() == experts.gate_up_proj.data_ptr()
    assert mlp.down.data_ptr() == experts.down_proj.data_ptr()
    shared = model.model.layers[1].mlp.shared_expert
    assert mlp.shared.gate_up.weight.data_ptr() == shared.gate_proj.weight.data_ptr()
    assert sum(p.numel() for p in model.parameters()) == params_before


@pytest.mark.parametrize("arch", ["qwen3_moe", "mixtral"])  # per-expert names, and Mixtral's w1/w2/w3
def test_checkpoint_layouts_load_like_the_model(arch, tmp_path):
    """A saved checkpoint holds one matrix per expert: read into stacks, they equal the in-memory fused
    parameters, whole and cut to a rank's intermediate rows (gate and up rows, down columns)."""
    from transformers import AutoModelForCausalLM

    path = build_tiny_model(arch, tmp_path / arch)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    checkpoint, memory = SafetensorsSource(path, torch.device("cpu")), ModuleSource(model)
    inter = TINY_CONFIGS[arch].get("moe_intermediate_size") or TINY_CONFIGS[arch]["intermediate_size"]
    experts = model.model.layers[0].mlp.experts.num_experts
    rows = Span(inter // 2, inter)  # rank 1 of 2
    for source in (checkpoint, memory):
        gate_up, down = expert_stacks(source, "model.layers.0.", experts, inter, None, torch.float32)
        assert torch.equal(gate_up, model.model.layers[0].mlp.experts.gate_up_proj)
        assert torch.equal(down, model.model.layers[0].mlp.experts.down_proj)
        gate_up_r, down_r = expert_stacks(source, "model.layers.0.", experts, inter, rows, torch.float32)
        assert torch.equal(
            gate_up_r, torch.cat([gate_up[:, rows.start : rows.stop], gate_up[:, inter + rows.start :]], 1)
        )
        assert torch.equal(down_r, down[:, :, rows.start : rows.stop])
    options = EngineConfig(model_impl="batchgen")
    ids = torch.randint(0, 100, (9,), generator=torch.Generator().manual_seed(4))
    with torch.inference_mode():
        expected = fused_logits(build_forward(model, "batchgen", 64), model, ids, [9], torch.float32)
    file_config = read_config(str(path))
    assert isinstance(file_config, FileConfig)
    for config in (model.config, file_config):  # the structure read off the skeleton, then off config.json
        files = ModelFiles(str(path), config)
        loaded = build_model(options, files, ParallelGroup.single(), torch.device("cpu"), torch.float32, 64)
        with torch.inference_mode():
            got = fused_logits(loaded.forward, model, ids, [9], torch.float32)
        assert torch.equal(got, expected)


def test_expert_parts_of_a_fused_tensor(tmp_path):
    """``Part(name, rows, cols, expert)`` addresses one expert's matrix of a fused [E, rows, cols] tensor,
    in a checkpoint file and in random weights alike (a rank's share of a fused checkpoint)."""
    from safetensors.torch import save_file

    from batchgen.model.weights.sources import Part, RandomSource

    fused = torch.arange(2 * 6 * 4, dtype=torch.float32).view(2, 6, 4)
    save_file({"model.layers.0.mlp.experts.gate_up_proj": fused}, tmp_path / "model.safetensors")
    source = SafetensorsSource(tmp_path, torch.device("cpu"))
    part = Part("model.layers.0.mlp.experts.gate_up_proj", Span(2, 5), Span(1, 3), expert=1)
    assert torch.equal(source.get(part), fused[1, 2:5, 1:3])
    random = RandomSource({part.name: (2, 6, 4)}, torch.device("cpu"), torch.float32)
    assert random.get(part).shape == (3, 2)
    assert not torch.equal(random.get(part), random.get(part._replace(expert=0)))


def test_clip_qkv_is_refused():
    model = _model("olmoe")
    assert unsupported_reason(model) is None
    model.config.clip_qkv = 8.0
    assert unsupported_reason(model).startswith("clip_qkv")
    assert isinstance(build_forward(model, "auto", 64), TransformersForward)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("arch", MOE_ARCHS)
def test_bf16_triton_moe_layer_matches_reference_on_cuda(arch):
    """Each architecture's MoE layer at a moderate shape in bf16: the Triton path against the torch
    reference (transformers' arithmetic), prefill- and decode-sized batches."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from batchgen.model.backends import TritonBackend

    fields = {**TINY_CONFIGS[arch], "hidden_size": 1024, "num_attention_heads": 8, "vocab_size": 512}
    for key in ("intermediate_size", "moe_intermediate_size", "shared_expert_intermediate_size"):
        if key in fields:
            fields[key] = 512
    for key in ("num_experts", "num_local_experts"):
        if key in fields:
            fields[key] = 64 if arch != "mixtral" else 8
    config = AutoConfig.for_model(fields.pop("model_type"), **fields)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).eval()
    forward = build_forward(model, "batchgen", 64)
    i = _moe_layers(model)[0]
    for tokens in (1, 64, 1024):
        h = torch.randn(tokens, 1024, device="cuda", dtype=torch.bfloat16)
        with torch.inference_mode():
            want = forward.layers[i].mlp(h, TorchBackend()).float()
            got = forward.layers[i].mlp(h, TritonBackend()).float()
        assert (got - want).norm() / want.norm() < 1e-2, f"{tokens} tokens"
        assert (got != want).float().mean() < 0.05  # bf16 products bit-identical; fp32 sum orders differ


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_triton_moe_forward_matches_transformers_on_cuda():
    """A Qwen3-MoE-shaped model (128 experts, top-8, head_dim 128) in bf16: the fused forward on Triton
    kernels against transformers' forward over a chunked prefill and decodes."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from batchgen.model.backends import TritonBackend

    config = AutoConfig.for_model(
        "qwen3_moe", vocab_size=4096, hidden_size=1024, intermediate_size=3072, moe_intermediate_size=384,
        num_experts=128, num_experts_per_tok=8, norm_topk_prob=True, num_hidden_layers=4,
        num_attention_heads=16, num_key_value_heads=4, head_dim=128, max_position_embeddings=4096,
    )  # fmt: skip
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).eval()
    model.set_attn_implementation(attention.register())
    ids = torch.randint(0, 4096, (300,), device="cuda")
    chunks = [128, 160] + [1] * 12
    with torch.inference_mode():
        expected = fused_logits(TransformersForward(model), model, ids, chunks, torch.bfloat16).float()
        forward = build_forward(model, "batchgen", 4096)
        got = fused_logits(forward, model, ids, chunks, torch.bfloat16, TritonBackend()).float()
    err = (got - expected).norm() / expected.norm()
    assert err < 2e-2, f"relative error {err:.2e}"
    assert (got.argmax(-1) == expected.argmax(-1)).float().mean() > 0.95
