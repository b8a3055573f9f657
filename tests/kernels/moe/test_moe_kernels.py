"""The Triton MoE kernels (grouping, grouped gate|up + SiLU-mul, down, weighted combine) against the
torch reference (transformers' grouped-GEMM arithmetic). Off-GPU under TRITON_INTERPRET=1, tiny shapes."""

from __future__ import annotations

import pytest
import torch

from batchgen.kernels import reference
from batchgen.kernels.moe.grouping import group_by_expert
from batchgen.kernels.moe.routed_experts import moe_experts

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _assert_close(got: torch.Tensor, want: torch.Tensor) -> None:
    """fp32: within 1e-5. bf16: the interpreter truncates fp32 -> bf16 where torch rounds to nearest, at
    each of the layer's five roundings: a bias of ~2 % against the reference's 0.4 % from exact fp32
    (measured), so compare as a whole here; the GPU test holds the kernels to the real rounding."""
    if got.dtype == torch.float32:
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        return
    got, want = got.float(), want.float()
    assert (got - want).norm() / want.norm() < 3e-2
    assert (got - want).abs().max() <= 8 * 2.0**-8 * want.abs().max()  # 8 ulps of the largest value


def _case(tokens, hidden, inter, experts, top_k, dtype, fp32_weights=False, seed=0, skew=False):
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen) * scale).to(DEVICE, dtype)

    h = rand(tokens, hidden)
    gate_up, down = rand(experts, 2 * inter, hidden, scale=0.2), rand(experts, hidden, inter, scale=0.2)
    logits = torch.randn(tokens, experts, generator=gen)
    if skew:  # most tokens on expert 0: groups of very different sizes, several row tiles for one expert
        logits[:, 0] += 4.0
    weights, ids = torch.topk(logits.softmax(-1), top_k, dim=-1)
    weights = weights.to(DEVICE, torch.float32 if fp32_weights else dtype)
    return h, weights, ids.to(DEVICE), gate_up, down


def test_grouping_sorts_pairs_by_expert():
    ids = torch.tensor([[3, 0], [0, 2], [3, 1], [0, 3]], device=DEVICE)
    counts, order = group_by_expert(ids, 5)
    assert counts.tolist() == [3, 1, 1, 3, 0]
    flat = ids.reshape(-1)[order.long()]
    assert flat.tolist() == [0, 0, 0, 1, 2, 3, 3, 3]  # grouped by expert
    assert sorted(order.tolist()) == list(range(8))  # every pair once


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    ("tokens", "hidden", "inter", "experts", "top_k", "skew"),
    [(1, 64, 32, 8, 2, False), (5, 64, 32, 8, 2, False), (40, 48, 40, 4, 2, True), (3, 64, 96, 16, 4, False)],
)  # one token (6 of its 8 experts get none); 48 / 40 / 96: masked K and N tails; 40 tokens on 4 experts:
# several 16-row tiles per expert
def test_moe_experts_match_reference(dtype, tokens, hidden, inter, experts, top_k, skew):
    case = _case(tokens, hidden, inter, experts, top_k, dtype, skew=skew)
    _assert_close(moe_experts(*case), reference.moe_experts(*case))


@pytest.mark.parametrize("group_m", [0, 1, 5, 64])
def test_every_program_order_computes_every_tile_once(group_m):
    """The grouped GEMMs' programs in each order (grouping.program_tiles): row tiles fastest (0), each row
    tile across every column tile (1), groups of 5 (the grid's 9 row tiles: the last group cut short) and
    one group larger than the grid. 40 tokens on 4 experts, skewed: several 16-row tiles per expert; 3 and
    6 column tiles."""
    case = _case(40, 96, 40, 4, 2, torch.float32, skew=True, seed=2)
    cfg = dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, num_warps=4, num_stages=1, GROUP_M=group_m)
    _assert_close(moe_experts(*case, config=cfg), reference.moe_experts(*case))


def test_fp32_routing_weights_and_an_empty_batch():
    """Mixtral's fp32 weights (the product is not rounded to bf16), and zero tokens (a graph bucket can
    hold none of a kind)."""
    case = _case(6, 64, 32, 4, 2, torch.bfloat16, fp32_weights=True, seed=1)
    _assert_close(moe_experts(*case), reference.moe_experts(*case))
    empty = _case(0, 64, 32, 4, 2, torch.float32)
    assert moe_experts(*empty).shape == (0, 64)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
# decode sizes and prefill chunks: every tile config (4096 tokens: 256 pairs an expert, the prompt-sized tiles
# and their program order)
@pytest.mark.parametrize("tokens", [1, 256, 2048, 4096])
def test_bf16_moe_experts_on_cuda(tokens):
    """Qwen3-30B-A3B's expert shapes (128 experts, top-8, H 2048, I 768) in bf16 against the torch
    reference, and a CUDA-graph replay after the routing changed in place."""
    h, weights, ids, gate_up, down = _case(tokens, 2048, 768, 128, 8, torch.bfloat16, seed=2)
    ref = reference.moe_experts(h, weights, ids, gate_up, down).float()
    got = moe_experts(h, weights, ids, gate_up, down).float()
    assert (got - ref).norm() / ref.norm() < 1e-2
    assert (got != ref).float().mean() < 0.05  # bit-identical products; only fp32 sum orders differ
    graph = torch.cuda.CUDAGraph()
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        out = moe_experts(h, weights, ids, gate_up, down)
    ids.copy_(torch.roll(ids, 1, dims=0))
    weights.copy_(torch.roll(weights, 1, dims=0))
    graph.replay()
    ref = reference.moe_experts(h, weights, ids, gate_up, down).float()
    assert (out.float() - ref).norm() / ref.norm() < 1e-2
