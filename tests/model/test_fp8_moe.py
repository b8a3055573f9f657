"""FP8 routed experts at load: an FP8 MoE checkpoint (the fp8 method's layout, e.g. Qwen3-30B-A3B-FP8:
per-expert e4m3 ``weight`` + ``weight_scale_inv`` blocks) keeps its experts in e4m3 and computes what its
dequantized twin computes in transformers; a rank's slice follows the blocks or is refused in one line;
``--quantization fp8`` quantizes the experts per output channel and generates end to end."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from batchgen.config import EngineConfig
from batchgen.distributed.group import ParallelGroup
from batchgen.kernels import fp8_format as ref
from batchgen.kernels.moe.expert_format import Fp8Experts, dequantize
from batchgen.model.build import ModelFiles, build_model
from batchgen.model.paged_sequence import sequence_logits
from batchgen.model.weights.fp8 import Fp8BlockLinear, Fp8RowLinear

pytestmark = pytest.mark.usefixtures("one_torch_thread")

IDS = torch.randint(0, 97, (14,), generator=torch.Generator().manual_seed(0))
CHUNKS = [8, 3, 1, 1, 1]
INTER = 64  # the experts' intermediate size: rank 1 of 2 starts at 32


def _save_qwen3_moe(path: Path) -> None:
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(
        "qwen3_moe", vocab_size=97, hidden_size=64, intermediate_size=128, moe_intermediate_size=INTER,
        num_experts=8, num_experts_per_tok=2, norm_topk_prob=True, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
    )  # fmt: skip
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)  # decisive argmax
    model.save_pretrained(path)


def _fp8_pair(tmp_path: Path, block: tuple[int, int]) -> tuple[str, str]:
    """An FP8 checkpoint whose routed experts (only) are stored in e4m3 with ``block`` scales, and its twin
    holding the dequantized experts in fp32."""
    from safetensors.torch import load_file, save_file

    _save_qwen3_moe(tmp_path / "src")
    fp8, twin = tmp_path / "fp8", tmp_path / "twin"
    for d in (fp8, twin):
        shutil.copytree(tmp_path / "src", d)
    tensors = load_file(str(tmp_path / "src" / "model.safetensors"))
    quantized, dequantized = dict(tensors), dict(tensors)
    for name, t in tensors.items():
        if ".mlp.experts." in name:
            q, scale = ref.quantize_blocks(t, *block)
            quantized[name], quantized[name.removesuffix("weight") + "weight_scale_inv"] = q, scale
            dequantized[name] = ref.dequantize_blocks(q, scale, *block)
    assert any(t.dtype == ref.FP8 for t in quantized.values())
    save_file(quantized, str(fp8 / "model.safetensors"), metadata={"format": "pt"})
    save_file(dequantized, str(twin / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((fp8 / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                     "weight_block_size": list(block)}  # fmt: skip
    (fp8 / "config.json").write_text(json.dumps(config))
    return str(fp8), str(twin)


def _build(path: str, group: ParallelGroup | None = None, **options):
    from transformers import AutoConfig

    files = ModelFiles(path, AutoConfig.from_pretrained(path))
    config = EngineConfig(model=path, **options)
    return build_model(
        config, files, group or ParallelGroup.single(), torch.device("cpu"), torch.float32, 256
    )


def _logits(bundle) -> torch.Tensor:
    with torch.inference_mode():
        return sequence_logits(bundle.forward, IDS, CHUNKS, bundle.kv_shape, torch.float32)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


@pytest.mark.parametrize("block", [(128, 128), (16, 32)])  # Qwen3-FP8's blocks; blocks the shapes cut
def test_an_fp8_moe_checkpoint_keeps_its_experts_in_e4m3(block, tmp_path):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    fp8, twin = _fp8_pair(tmp_path, block)
    bundle = _build(fp8)
    moe = bundle.forward.layers[0].mlp
    assert isinstance(moe.gate_up, Fp8Experts) and isinstance(moe.down, Fp8Experts)
    assert moe.gate_up.weight.dtype == ref.FP8 and moe.gate_up.block == block and moe.gate_up.parts == 2
    blocks = -(-INTER // block[0]), -(-64 // block[1])  # gate's block rows (then up's), H's block columns
    assert moe.gate_up.scale.shape == (8, 2 * blocks[0], blocks[1])
    assert moe.down.scale.shape == (8, -(-64 // block[0]), -(-INTER // block[1]))
    stored = load_file(f"{fp8}/model.safetensors")
    prefix = "model.layers.0.mlp.experts.3."
    assert moe.down.weight[3].view(torch.uint8).equal(stored[prefix + "down_proj.weight"].view(torch.uint8))
    assert moe.gate_up.scale[3, blocks[0] :].equal(stored[prefix + "up_proj.weight_scale_inv"])
    got = _logits(bundle)
    twin_model = AutoModelForCausalLM.from_pretrained(twin, dtype=torch.float32).eval()
    with torch.no_grad():
        want = twin_model(IDS.unsqueeze(0)).logits[0]
    assert _rel(got, want) < 1e-5  # the dequantized experts' function, up to fp32 summation order
    assert (got.argmax(-1) == want.argmax(-1)).all()
    assert _rel(got, _logits(_build(twin))) < 1e-5


@pytest.mark.parametrize(("rank", "size"), [(1, 2), (1, 4), (3, 4)])
def test_a_rank_takes_the_blocks_covering_its_rows(rank, size, tmp_path):
    """A rank's intermediate rows (64 / size of them) with 16 x 32 blocks: ranks of 2 start on a block;
    rank 1 of 4 starts at row 16, inside down's 32-column block (offset 16): its experts dequantize to the
    whole stacks' slice."""
    fp8, _ = _fp8_pair(tmp_path, (16, 32))
    whole = _build(fp8).forward.layers[0].mlp
    mlp = _build(fp8, ParallelGroup(rank, size)).forward.layers[0].mlp
    width = INTER // size
    start, stop = rank * width, (rank + 1) * width
    gate_up, down = dequantize(whole.gate_up, torch.float32), dequantize(whole.down, torch.float32)
    want = torch.cat([gate_up[:, start:stop], gate_up[:, INTER + start : INTER + stop]], 1)
    assert torch.equal(dequantize(mlp.gate_up, torch.float32), want)
    assert torch.equal(dequantize(mlp.down, torch.float32), down[:, :, start:stop])
    assert mlp.gate_up.offset == (0, 0) and mlp.down.offset == (0, start % 32)
    assert mlp.down.scale.shape == (8, 4, -(-stop // 32) - start // 32)


def test_a_share_starting_off_the_kernels_tiles_is_refused(tmp_path):
    from batchgen.distributed.shard import Span
    from batchgen.model.weights.fp8_experts import checkpoint_experts
    from batchgen.model.weights.sources import SafetensorsSource

    fp8, _ = _fp8_pair(tmp_path, (16, 32))
    source = SafetensorsSource(fp8, torch.device("cpu"))
    with pytest.raises(ValueError) as err:  # rank 1 of 8: 8 columns into a 32-wide block
        checkpoint_experts(source, "model.layers.0.", 8, INTER, Span(8, 16), (16, 32))
    message = str(err.value)
    assert "splits model.layers.0.'s 64 expert intermediate rows at 8" in message and "\n" not in message


def test_quantization_fp8_quantizes_moe_experts_per_channel(tiny_models):
    """--quantization fp8 on a MoE model: attention, the shared expert and the routed experts in e4m3
    (the experts per output channel, their inputs per token: W8A8), close to the 16-bit logits, and
    generation runs."""
    from batchgen import LLM, SamplingParams

    path = tiny_models["qwen2_moe"]
    quantized, plain = _build(path, quantization="fp8"), _build(path)
    moe = quantized.forward.layers[1].mlp
    assert isinstance(quantized.forward.layers[1].attn.qkv, Fp8RowLinear | Fp8BlockLinear)
    for experts in (moe.gate_up, moe.down):
        assert isinstance(experts, Fp8Experts) and experts.weight.dtype == ref.FP8 and experts.block is None
        assert experts.scale.shape == experts.weight.shape[:2] and experts.act_fp8
    plain_gate_up = plain.forward.layers[1].mlp.gate_up
    assert _rel(dequantize(moe.gate_up, torch.float32), plain_gate_up) < 0.05  # e4m3's 3 mantissa bits
    got, want = _logits(quantized), _logits(plain)
    assert _rel(got, want) < 0.05
    llm = LLM(path, quantization="fp8", kv_cache_bytes=1 << 20)
    assert isinstance(llm._rank.bundle.forward.layers[1].mlp.gate_up, Fp8Experts)
    outs = llm.generate_samples(["a b c", "hello"], SamplingParams(max_new_tokens=4, ignore_eos=True))
    assert all(len(o.token_ids) == 4 for o in outs)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("block", [None, (128, 128)])
def test_fp8_triton_moe_layer_matches_the_torch_path_on_cuda(block):
    """A Qwen3-MoE layer at a moderate shape (64 experts, top-8, H 1024, I 768) in bf16 under
    --quantization fp8 (per-channel experts, e4m3 inputs), or with its experts re-quantized in 128 x 128
    blocks (weight-only): the Triton path against the torch path (dequantized experts, inputs rounded
    alike), prefill- and decode-sized batches. With e4m3 inputs the paths' bf16 activations differ by an
    ulp here and there, and an e4m3 rounding edge between them moves an input by 1/16: the looser bound."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from batchgen.kernels.moe import expert_format
    from batchgen.model.backends import TorchBackend, TritonBackend

    config = AutoConfig.for_model(
        "qwen3_moe", vocab_size=512, hidden_size=1024, intermediate_size=2048, moe_intermediate_size=768,
        num_experts=64, num_experts_per_tok=8, norm_topk_prob=True, num_hidden_layers=1,
        num_attention_heads=8, num_key_value_heads=4, head_dim=128, max_position_embeddings=1024,
    )  # fmt: skip
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).eval()
    files = ModelFiles(None, model.config, model)
    options = EngineConfig(model_impl="batchgen", quantization="fp8")
    bundle = build_model(options, files, ParallelGroup.single(), torch.device("cuda"), torch.bfloat16, 1024)
    mlp = bundle.forward.layers[0].mlp
    assert isinstance(mlp.gate_up, Fp8Experts) and mlp.gate_up.weight.is_cuda
    if block is not None:
        experts = model.model.layers[0].mlp.experts
        mlp.gate_up = expert_format.quantize_blocks(experts.gate_up_proj.data, block, parts=2)
        mlp.down = expert_format.quantize_blocks(experts.down_proj.data, block)
    for tokens in (1, 64, 1024):
        h = torch.randn(tokens, 1024, device="cuda", dtype=torch.bfloat16)
        with torch.inference_mode():
            want = mlp(h, TorchBackend()).float()
            got = mlp(h, TritonBackend()).float()
        bound = 5e-2 if mlp.gate_up.act_fp8 else 1e-2
        assert (got - want).norm() / want.norm() < bound, f"{tokens} tokens"
