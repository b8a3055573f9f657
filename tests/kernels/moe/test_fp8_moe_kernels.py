"""FP8 routed experts (weight-only e4m3, per-channel or block scales): the Triton grouped GEMMs and the
CPU path (``TorchBackend.moe_experts``) against a plain loop over each token's experts on the dequantized
weights. Off-GPU under TRITON_INTERPRET=1 at tiny shapes; the GPU test at Qwen3-30B-A3B's expert shapes."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from batchgen.kernels.moe import expert_format
from batchgen.kernels.moe.expert_format import Fp8Experts, dequantize
from batchgen.kernels.moe.routed_experts import kernel_tiles, moe_experts, tile_config
from batchgen.model.backends import TorchBackend

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SCALES = [None, (16, 32), (128, 128)]  # per channel; blocks smaller than the shapes; Qwen3-FP8's blocks


def _stack(experts: int, n: int, k: int, gen: torch.Generator) -> torch.Tensor:
    """[E, N, K] whose magnitudes vary over rows, columns and experts by 100x: scales that differ."""
    rows = torch.logspace(-1, 1, n)[torch.randperm(n, generator=gen)]
    cols = torch.logspace(-1, 1, k)[torch.randperm(k, generator=gen)]
    per_expert = torch.logspace(-0.5, 0.5, experts)
    return torch.randn(experts, n, k, generator=gen) * 0.05 * rows[:, None] * cols * per_expert[:, None, None]


def _quantize(stack: torch.Tensor, block: tuple[int, int] | None, parts: int) -> Fp8Experts:
    if block is None:
        fp8 = expert_format.quantize_channels(stack, parts)
    else:
        fp8 = expert_format.quantize_blocks(stack, block, parts)
    return Fp8Experts(fp8.weight.to(DEVICE), fp8.scale.to(DEVICE), fp8.block, fp8.parts)


def _case(tokens, hidden, inter, experts, top_k, dtype, block, seed=0, skew=False):
    gen = torch.Generator().manual_seed(seed)
    h = torch.randn(tokens, hidden, generator=gen).to(DEVICE, dtype)
    gate_up = _quantize(_stack(experts, 2 * inter, hidden, gen), block, parts=2)
    down = _quantize(_stack(experts, hidden, inter, gen), block, parts=1)
    logits = torch.randn(tokens, experts, generator=gen)
    logits[:, -1] = -float("inf")  # the last expert gets no tokens
    if skew:  # most pairs on expert 0: several row tiles for one expert, others get none
        logits[:, 0] += 4.0
    weights, ids = torch.topk(logits.softmax(-1), top_k, dim=-1)
    return h, weights.to(DEVICE, dtype), ids.to(DEVICE), gate_up, down


def _loop(h, weights, ids, gate_up: torch.Tensor, down: torch.Tensor) -> torch.Tensor:  # [T, H] fp32
    """Each token, each of its experts, one after the other in fp32 on fp32 weights."""
    out = torch.zeros(h.shape, dtype=torch.float32, device=h.device)
    for t in range(h.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            gate, up = (gate_up[e] @ h[t].float()).chunk(2)  # [2I] -> [I], [I]
            out[t] += weights[t, j].float() * (down[e] @ (F.silu(gate) * up))
    return out


def _dequantized_loop(h, weights, ids, gate_up: Fp8Experts, down: Fp8Experts) -> torch.Tensor:
    return _loop(h, weights, ids, dequantize(gate_up, torch.float32), dequantize(down, torch.float32))


def _share(gate_up: Fp8Experts, down: Fp8Experts, start: int, stop: int) -> tuple[Fp8Experts, Fp8Experts]:
    """A rank's share (intermediate rows ``start``-``stop``) of block-quantized stacks, as the loader cuts
    it: the scale blocks that cover it, and where it starts in the first."""
    (rows, cols), inter = gate_up.block, down.shape[2]
    gate_blocks, first, last = -(-inter // rows), start // rows, -(-stop // rows)
    weight = torch.cat([gate_up.weight[:, start:stop], gate_up.weight[:, inter + start : inter + stop]], 1)
    scale = torch.cat(
        [gate_up.scale[:, first:last], gate_up.scale[:, gate_blocks + first : gate_blocks + last]], 1
    )
    down_scale = down.scale[:, :, start // cols : -(-stop // cols)].contiguous()
    return (
        Fp8Experts(weight, scale, (rows, cols), 2, (start % rows, 0)),
        Fp8Experts(
            down.weight[:, :, start:stop].contiguous(), down_scale, (rows, cols), 1, (0, start % cols)
        ),
    )


def _check(got: torch.Tensor, want: torch.Tensor) -> None:
    """fp32: the loop's function up to fp32 rounding. bf16: the layer's five roundings to bf16 (and the
    interpreter's truncating casts, see test_moe_kernels) against a loop that never rounds."""
    err = float((got.float() - want).norm() / want.norm())
    assert err < (1e-5 if got.dtype == torch.float32 else 3e-2), err


@pytest.mark.parametrize("block", SCALES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    ("tokens", "hidden", "inter", "experts", "top_k", "skew"),
    [(1, 64, 32, 8, 2, False), (5, 64, 40, 8, 2, False), (24, 96, 48, 4, 2, True)],
)  # one token; 40 / 48: gate's last block row partial, up's blocks start on their own; 24 tokens on
# expert 0 mostly: several 16-row tiles for it, none for others
def test_fp8_moe_experts_match_a_loop(block, dtype, tokens, hidden, inter, experts, top_k, skew):
    case = _case(tokens, hidden, inter, experts, top_k, dtype, block, skew=skew)
    want = _dequantized_loop(*case)
    _check(moe_experts(*case), want)
    _check(TorchBackend.moe_experts(*case), want)


@pytest.mark.parametrize("block", [None, (16, 32)])
@pytest.mark.parametrize("tokens", [4, 300])  # 4 x 2 pairs on 4 experts: decode-sized; 600: prefill-sized
def test_the_down_gemm_takes_its_own_tiles(block, tokens):
    """e4m3 experts at decode and prefill sizes: the down GEMM launches with the config's ``"down"`` tiles
    (another BLOCK_M, BLOCK_N or stage count than gate|up's), and the layer still matches the loop."""
    case = _case(tokens, 64, 32, 4, 2, torch.float32, block, seed=5)
    cfg = tile_config(case[0], case[2], case[3], case[4])
    gate_up_tiles, down_tiles = kernel_tiles(cfg, "gate_up"), kernel_tiles(cfg, "down")
    assert "down" in cfg and "down" not in gate_up_tiles and down_tiles != gate_up_tiles
    assert down_tiles == {**gate_up_tiles, **cfg["down"]}
    if block is not None:  # each kernel's K tiles inside a 32-column scale block
        assert gate_up_tiles["BLOCK_K"] <= 32 and down_tiles["BLOCK_K"] <= 32
    _check(moe_experts(*case), _dequantized_loop(*case))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    ("block", "inter", "start", "stop"), [((24, 32), 96, 16, 64), ((128, 128), 192, 64, 128)]
)  # 16 rows into a 24-row block (gate's 48 rows: 3 block rows) and 16 columns into a 32-wide one;
# Qwen3-30B-A3B-FP8's rank 1 of 4 (I 768: rows 192-384) starts 64 rows into a block, as here
def test_a_rank_share_starting_inside_blocks(dtype, block, inter, start, stop):
    h, weights, ids, gate_up, down = _case(5, 64, inter, 4, 2, dtype, block, seed=4)
    gu, dn = dequantize(gate_up, torch.float32), dequantize(down, torch.float32)
    want = _loop(h, weights, ids, torch.cat([gu[:, start:stop], gu[:, inter + start : inter + stop]], 1),
                 dn[:, :, start:stop])  # fmt: skip
    share = _share(gate_up, down, start, stop)
    _check(moe_experts(h, weights, ids, *share), want)
    _check(TorchBackend.moe_experts(h, weights, ids, *share), want)


def test_the_cpu_path_dequantizes_to_the_model_dtype():
    """The CPU path is the 16-bit layer on the dequantized stacks: bit for bit."""
    from batchgen.kernels import reference

    h, weights, ids, gate_up, down = _case(6, 64, 32, 8, 2, torch.bfloat16, (16, 32), seed=3)
    want = reference.moe_experts(
        h, weights, ids, dequantize(gate_up, torch.bfloat16), dequantize(down, torch.bfloat16)
    )
    assert torch.equal(TorchBackend.moe_experts(h, weights, ids, gate_up, down), want)


def test_block_scales_need_k_tiles_inside_a_block():
    case = _case(2, 64, 32, 4, 2, torch.float32, (16, 24))  # 24 columns: no power-of-two K tile fits
    with pytest.raises(AssertionError, match="24-column blocks"):
        moe_experts(*case)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("act_fp8", [False, True])
@pytest.mark.parametrize("block", [None, (128, 128)])
# decode sizes and prefill chunks: every tile config (4096 tokens: the prompt-sized tiles and their order)
@pytest.mark.parametrize("tokens", [1, 64, 2048, 4096])
def test_fp8_moe_experts_on_cuda(block, tokens, act_fp8):
    """Qwen3-30B-A3B's expert shapes (128 experts, top-8, H 2048, I 768) with e4m3 experts in bf16: the
    Triton path against the CPU path's arithmetic (dequantized bf16 weights; with ``act_fp8`` e4m3
    inputs, where an ulp of bf16 between the paths' activations moves some across an e4m3 rounding edge:
    1/16 of an input, not averaged out in a one-token step) and a graph replay."""
    h, weights, ids, gate_up, down = _case(tokens, 2048, 768, 128, 8, torch.bfloat16, block, seed=2)
    if act_fp8:
        gate_up, down = _act_fp8((gate_up, down))
    bound = 5e-2 if act_fp8 else 1e-2
    want = TorchBackend.moe_experts(h, weights, ids, gate_up, down).float()
    loop = _quantized_inputs_loop if act_fp8 else _dequantized_loop
    exact = loop(h[:4], weights[:4], ids[:4], gate_up, down)
    got = moe_experts(h, weights, ids, gate_up, down).float()
    assert (got - want).norm() / want.norm() < bound
    assert (got[:4] - exact).norm() / exact.norm() < bound
    graph = torch.cuda.CUDAGraph()
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        out = moe_experts(h, weights, ids, gate_up, down)
    ids.copy_(torch.roll(ids, 1, dims=0))
    weights.copy_(torch.roll(weights, 1, dims=0))
    graph.replay()
    want = TorchBackend.moe_experts(h, weights, ids, gate_up, down).float()
    assert (out.float() - want).norm() / want.norm() < bound


def _act_fp8(stacks: tuple[Fp8Experts, Fp8Experts]) -> tuple[Fp8Experts, Fp8Experts]:
    return tuple(w._replace(act_fp8=True) for w in stacks)


def _quantized_inputs_loop(h, weights, ids, gate_up: Fp8Experts, down: Fp8Experts) -> torch.Tensor:
    """The loop with each product's input rounded to e4m3 under its dynamic scales (per token, or per
    block columns): h once, each (token, expert)'s activations on their own row."""
    gu, dn = dequantize(gate_up, torch.float32), dequantize(down, torch.float32)
    x = expert_format.quantize_activations(h.float(), gate_up)
    out = torch.zeros(h.shape, dtype=torch.float32, device=h.device)
    for t in range(h.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            gate, up = (gu[e] @ x[t]).chunk(2)
            act = (F.silu(gate.to(h.dtype).float()) * up.to(h.dtype).float()).to(h.dtype).float()
            act = expert_format.quantize_activations(act[None], down)[0]
            out[t] += weights[t, j].float() * (dn[e] @ act)
    return out


@pytest.mark.parametrize("block", SCALES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    ("tokens", "hidden", "inter", "experts", "top_k", "skew"),
    [(1, 64, 32, 8, 2, False), (5, 64, 40, 8, 2, False), (24, 96, 64, 4, 2, True)],
)
def test_fp8_activations_match_a_loop(block, dtype, tokens, hidden, inter, experts, top_k, skew):
    """``act_fp8`` (W8A8): the grouped GEMMs take e4m3 activations with per-token or per-block-column
    scales; the kernels and the CPU path against the loop on e4m3-rounded inputs, and both away from the
    unrounded loop by about e4m3's rounding (so the activations were quantized). fp32 is the exact check;
    in bf16 the interpreter's truncating casts move some activations across an e4m3 rounding edge, so
    the bound is that of a few such flips (the GPU test below checks bf16 where casts round)."""
    h, weights, ids, gate_up, down = _case(tokens, hidden, inter, experts, top_k, dtype, block, skew=skew)
    stacks = _act_fp8((gate_up, down))
    want = _quantized_inputs_loop(h, weights, ids, *stacks)
    unrounded = _dequantized_loop(h, weights, ids, gate_up, down)
    for got in (moe_experts(h, weights, ids, *stacks), TorchBackend.moe_experts(h, weights, ids, *stacks)):
        err = float((got.float() - want).norm() / want.norm())
        assert err < (1e-4 if dtype == torch.float32 else 8e-2), err
        if dtype == torch.float32:
            assert float((got - unrounded).norm() / unrounded.norm()) > 1e-3  # e4m3 inputs: ~2 % apart


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fp8_activations_in_a_rank_share_starting_inside_blocks(dtype):
    """A rank's share of I starting 16 columns into a 32-wide block: down's activation groups start at
    the share's first column, its weight blocks 16 columns before; each K tile lies in one of each."""
    h, weights, ids, gate_up, down = _case(5, 64, 96, 4, 2, dtype, (24, 32), seed=4)
    share = _act_fp8(_share(gate_up, down, 16, 64))
    want = _quantized_inputs_loop(h, weights, ids, *share)
    for got in (moe_experts(h, weights, ids, *share), TorchBackend.moe_experts(h, weights, ids, *share)):
        err = float((got.float() - want).norm() / want.norm())
        assert err < (1e-4 if dtype == torch.float32 else 8e-2), err
