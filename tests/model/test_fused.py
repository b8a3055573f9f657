"""batchgen's fused forward against transformers' own forward, on tiny random models of each family."""

from __future__ import annotations

import pytest
import torch

from batchgen.config import EngineConfig
from batchgen.distributed.group import ParallelGroup
from batchgen.model import attention
from batchgen.model.build import ModelFiles, build_model
from batchgen.model.forward import TransformersForward
from batchgen.model.fused import FusedForward
from batchgen.model.kv_cache import kv_shape
from batchgen.model.spec import unsupported_reason
from batchgen.testing.paged import sequence_logits

BASE = dict(
    vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=256,
)  # fmt: skip
VARIANTS = {
    "llama": dict(model_type="llama"),
    # llama3 rope scaling, biases everywhere, tied embeddings
    "llama_scaled_bias_tied": dict(
        model_type="llama",
        attention_bias=True,
        mlp_bias=True,
        tie_word_embeddings=True,
        rope_parameters=dict(
            rope_type="llama3",
            rope_theta=500000.0,
            factor=8.0,
            low_freq_factor=1.0,
            high_freq_factor=4.0,
            original_max_position_embeddings=32,
        ),
    ),  # fmt: skip
    "qwen2_sliding": dict(model_type="qwen2", use_sliding_window=True, sliding_window=5, max_window_layers=1),
    "qwen3": dict(model_type="qwen3", head_dim=32),
    "mistral_sliding": dict(model_type="mistral", sliding_window=6, head_dim=16),
}
BLOCK = 4


def _model(variant: str, dtype=torch.float32) -> torch.nn.Module:
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = {**BASE, **VARIANTS[variant]}
    config = AutoConfig.for_model(fields.pop("model_type"), **fields)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="eager")
    with torch.no_grad():  # random biases are zero-initialised: make them count
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.normal_(mean=1.0 if "norm" in name else 0.0, std=0.2)
    return model.eval()


def build_forward(model: torch.nn.Module, impl: str, max_positions: int):
    """The forward ``LLM.from_model`` would run on ``model`` with ``--model-impl impl``."""
    param = next(model.parameters())
    files = ModelFiles(None, model.config, model)
    options = EngineConfig(model_impl=impl)
    return build_model(
        options, files, ParallelGroup.single(), param.device, param.dtype, max_positions
    ).forward


def _fused_logits(forward, model, ids, chunks: list[int], dtype, backend=None) -> torch.Tensor:
    """All positions' logits, the sequence fed in ``chunks`` (chunked prefill, then decodes)."""
    return sequence_logits(forward, ids, chunks, kv_shape(model.config), dtype, backend, BLOCK)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_fused_forward_matches_transformers(variant):
    model = _model(variant)
    ids = torch.randint(0, 97, (15,), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = model(ids.unsqueeze(0)).logits[0]  # [15, V], transformers' eager attention
    forward = build_forward(model, "auto", max_positions=256)
    assert isinstance(forward, FusedForward)
    with torch.inference_mode():
        got = _fused_logits(forward, model, ids, [7, 4, 1, 1, 1, 1], torch.float32)
        after = model(ids.unsqueeze(0)).logits[0]
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    # The model's own projections became views of the merged weights: transformers' forward is unchanged.
    torch.testing.assert_close(after, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("variant", ["qwen3", "llama_scaled_bias_tied", "qwen2_sliding"])
def test_bf16_fused_forward_rounds_like_transformers(variant):
    """In bf16 the fused ops round as transformers does: on the CPU (torch ops, same paged cache) the
    logits are bit-identical to transformers' forward."""
    model = _model(variant, torch.bfloat16)
    model.set_attn_implementation(attention.register())  # transformers' forward on the paged cache
    ids = torch.randint(0, 97, (12,), generator=torch.Generator().manual_seed(2))
    with torch.inference_mode():
        expected = _fused_logits(TransformersForward(model), model, ids, [9, 1, 1, 1], torch.bfloat16)
        got = _fused_logits(build_forward(model, "batchgen", 256), model, ids, [9, 1, 1, 1], torch.bfloat16)
    assert torch.equal(got, expected), (got.float() - expected.float()).abs().max()


def test_weights_are_merged_once_and_shared():
    model = _model("llama")
    attn = model.model.layers[0].self_attn
    params_before = sum(p.numel() for p in model.parameters())
    first = build_forward(model, "batchgen", 64)
    second = build_forward(model, "batchgen", 64)  # a second engine on the same model copies nothing
    qkv = [f.layers[0].attn.qkv.weight.data_ptr() for f in (first, second)]
    assert qkv[0] == qkv[1] == attn.q_proj.weight.data_ptr()
    assert attn.k_proj.weight.data_ptr() == attn.q_proj.weight.data_ptr() + attn.q_proj.weight.nbytes
    assert first.layers[0].mlp.gate_up.weight.shape == (2 * 96, 64)
    assert sum(p.numel() for p in model.parameters()) == params_before


def test_unsupported_models_run_transformers_forward():
    from transformers import AutoConfig, AutoModelForCausalLM

    gpt2 = AutoModelForCausalLM.from_config(AutoConfig.for_model("gpt2", n_layer=1, n_embd=32, n_head=2))
    assert "gpt2" in unsupported_reason(gpt2)
    assert isinstance(build_forward(gpt2, "auto", 64), TransformersForward)
    with pytest.raises(ValueError, match="does not support this model: model type 'gpt2'"):
        build_forward(gpt2, "batchgen", 64)
    quantized = _model("qwen3")
    quantized.config.quantization_config = {"quant_method": "fp8"}
    assert unsupported_reason(quantized) == "quantized weights"
    mapped = _model("qwen3")
    mapped.hf_device_map = {"model.layers.0": 0, "model.layers.1": "cpu"}
    assert "device_map" in unsupported_reason(mapped)
    dynamic = _model("llama")
    dynamic.model.rotary_emb.rope_type = "dynamic"  # frequencies that change with the length
    assert unsupported_reason(dynamic) == "rope type 'dynamic'"
    with pytest.raises(ValueError, match="unknown model implementation"):
        EngineConfig(model_impl="fast")


def _bf16_against_transformers(device: str, backend) -> dict[str, float]:
    """A Qwen3-shaped model (qk-norm, GQA, head_dim 128), 300 tokens: batchgen's fused forward in bf16
    over a chunked prefill and decodes on the paged cache, against transformers' own forward (sdpa
    attention, the whole sequence at once) in bf16 and in fp32 (the truth, for the bf16 noise)."""
    import copy

    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(
        "qwen3", vocab_size=4096, hidden_size=1024, intermediate_size=3072, num_hidden_layers=4,
        num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=4096,
    )  # fmt: skip
    torch.manual_seed(0)
    with torch.device(device):
        fp32 = AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation="sdpa")
    model = copy.deepcopy(fp32).to(torch.bfloat16).eval()
    ids = torch.randint(0, 4096, (300,), device=device)
    with torch.inference_mode():
        truth = fp32.eval()(ids.unsqueeze(0)).logits[0].float()
        expected = model(ids.unsqueeze(0)).logits[0].float()  # transformers' bf16, sdpa
        model.set_attn_implementation(attention.register())
        forward = build_forward(model, "batchgen", 4096)
        got = _fused_logits(forward, model, ids, [128, 160] + [1] * 12, torch.bfloat16, backend).float()

    def rel(a: torch.Tensor, b: torch.Tensor, dim=None) -> torch.Tensor:
        return (a - b).norm(dim=dim) / b.norm(dim=dim)

    # The largest logit error transformers' own bf16 forward makes: below it, a top-2 gap is a tie.
    noise = (expected - truth).abs().max()
    chosen = truth.gather(-1, got.argmax(-1, keepdim=True))[:, 0]
    return dict(
        bf16_noise=rel(expected, truth).item(), got_vs_truth=rel(got, truth).item(),
        # per position: how far batchgen is from transformers' bf16, in units of how far that is from fp32
        worst_row=(rel(got, expected, -1) / rel(expected, truth, -1)).max().item(),
        worst_pick=((truth.max(-1).values - chosen).max() / noise).item(),
    )  # fmt: skip


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_triton_fused_forward_matches_transformers_on_cuda():
    """bf16 on the GPU: the fused forward on Triton kernels vs transformers' forward with its own (sdpa)
    attention. bf16 keeps 8 significant bits, so each rounding costs up to 2**-8 relative; over four
    random layers transformers' bf16 logits end ~2.5 % (relative norm; 1.5 % to 5 % a position, growing
    with the context) from its fp32 ones. Both forwards round at the same points (see
    test_bf16_fused_forward_rounds_like_transformers) and differ only in kernels and accumulation order,
    so at every position batchgen's bf16 must be closer to transformers' bf16 than that is to fp32
    (1.5x: room for the GPU's other kernels), and over all as close to fp32 (1.25x). Random logits have
    near-ties (top-2 gaps down to 1e-3), so argmax agreement is no measure: each picked token must
    instead be within twice transformers' own largest bf16 logit error of the best.
    Measured on the CPU (torch kernels): noise 0.025, vs fp32 0.025, worst row 0.90, worst pick 0.33;
    with decode tokens not attending to themselves: worst row 2.16."""
    from batchgen.model.backends import TritonBackend

    m = _bf16_against_transformers("cuda", TritonBackend())
    assert m["bf16_noise"] < 5e-2, m  # the reference itself is sane: a few bf16 roundings deep
    assert m["got_vs_truth"] <= 1.25 * m["bf16_noise"], m
    assert m["worst_row"] <= 1.5, m
    assert m["worst_pick"] <= 2, m
