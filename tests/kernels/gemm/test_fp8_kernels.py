"""Triton FP8 kernels against the torch reference (``fp8_format``): activation quantization (alone and
fused into RMSNorm / SiLU-and-multiply), the FP8 matrix product, and the FP8 KV cache (rotary + write,
decode and prefill attention). Off-GPU under TRITON_INTERPRET=1 at tiny shapes.

Quantized values must match bit for bit (the same fp32 arithmetic, the same rounding); products and
attention match within fp32 summation order.
"""

from __future__ import annotations

import pytest
import torch

from batchgen.kernels import fp8_format as ref
from batchgen.kernels import reference
from batchgen.kernels.attention.dispatch import paged_attention_triton
from batchgen.kernels.fp8_format import ActQuant
from batchgen.kernels.gemm import fp8_gemm_tma
from batchgen.kernels.gemm.fp8_gemm import _config, choose_split_k, triton_fp8_matmul
from batchgen.kernels.gemm.fp8_quant import quantize_act
from batchgen.kernels.gemm.split_sums import SplitSums, summed
from batchgen.kernels.layer_ops.activation import silu_mul
from batchgen.kernels.layer_ops.norm import rms_norm
from batchgen.kernels.layer_ops.rope import rope_write_kv
from batchgen.kernels.reference import paged_attention_fp8
from tests.kernels.cases import llama_fp8_case, make_case, rel_error, same_fp8, to_fp8_cache

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
QUANTS = [ActQuant(None), ActQuant(128), ActQuant(32)]


def test_e4m3_rounding_matches_torch_everywhere():
    """Every e4m3 binade, both signs, ties, saturation and subnormals: the kernels' cast (the interpreter's
    with the rounding fix-up) gives torch's e4m3 bits."""
    torch.manual_seed(0)
    mags = torch.exp2(torch.empty(4096).uniform_(-12, 9.2))  # up to ~590: saturates above 448
    exact = torch.arange(256, dtype=torch.uint8).view(ref.FP8).float()
    ties = (exact[1:128] + exact[:127]) / 2  # half-way between neighbours
    x = torch.cat([mags, -mags, ties, -ties, torch.zeros(2)]).nan_to_num(0.0)
    x = x.view(1, -1).to(DEVICE)
    got = quantize_act(x, ActQuant(static_scale=torch.tensor(1.0)))  # torch ops for a static scale...
    want = ref.quantize_act(x, ActQuant(static_scale=torch.tensor(1.0)))
    same_fp8(got, want)
    # ...and through a kernel: a dynamic scale of exactly 1 (the row's maximum is 448)
    x = x.clamp(-448.0, 448.0)
    x[0, 0] = 448.0
    same_fp8(quantize_act(x, ActQuant()), ref.quantize_act(x, ActQuant()))


@pytest.mark.parametrize("quant", QUANTS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_quantize_act_matches_reference(quant, dtype):
    torch.manual_seed(1)
    x = (torch.randn(5, 200) * torch.logspace(-3, 2, 200)).to(DEVICE, dtype)  # 200: a partial group
    x[2] = 0  # an all-zero row: the minimum scale, zeros
    same_fp8(quantize_act(x, quant), ref.quantize_act(x, quant))


# The fused kernels quantize what the plain kernel computes (which agrees with the reference within fp32
# rounding, tests/kernels/layer_ops/test_fused_kernels.py): bit for bit, given the same unquantized row.


@pytest.mark.parametrize("quant", QUANTS)
@pytest.mark.parametrize("residual", [False, True])
def test_rms_norm_quantizes_its_output(quant, residual):
    torch.manual_seed(2)
    x = torch.randn(4, 160, device=DEVICE)
    weight = torch.randn(160, device=DEVICE)
    res = torch.randn(4, 160, device=DEVICE) if residual else None
    plain, plain_sum = rms_norm(x, weight, 1e-6, None if res is None else res.clone())
    got, summed = rms_norm(x, weight, 1e-6, res, quant)
    same_fp8(got, ref.quantize_act(plain, quant))
    torch.testing.assert_close(summed, plain_sum, rtol=0, atol=0)


@pytest.mark.parametrize("quant", QUANTS)
def test_silu_mul_quantizes_its_output(quant):
    torch.manual_seed(3)
    x = torch.randn(3, 2 * 2500, device=DEVICE)  # 2500: three column blocks, the last one partial
    x[1, 2400] = x[1, 2500 + 2400] = 9.0  # row 1's largest product sits in its last block
    same_fp8(silu_mul(x, quant), ref.quantize_act(silu_mul(x), quant))


@pytest.mark.parametrize("whole_rows", [False, True])
def test_silu_mul_row_scales_in_one_or_two_passes(whole_rows):
    """Per-row scales by (row, block) programs in two kernels, or one program per whole row in one pass
    (what many rows take): the same bits as quantizing the plain product."""
    from batchgen.kernels.layer_ops.activation import _silu_mul_quant

    torch.manual_seed(5)
    x = torch.randn(5, 2 * 2500, device=DEVICE)
    x[2, 2499] = x[2, 2500 + 2499] = 9.0  # row 2's largest product is its last column
    x[3] = 0.0  # an all-zero row: the minimum scale, zeros
    same_fp8(_silu_mul_quant(x, None, whole_rows), ref.quantize_act(silu_mul(x), ActQuant()))


def test_static_scale_quantizes_after_the_op():
    torch.manual_seed(4)
    x, weight = torch.randn(3, 64, device=DEVICE), torch.randn(64, device=DEVICE)
    quant = ActQuant(static_scale=torch.tensor(0.01, device=DEVICE))
    same_fp8(
        rms_norm(x, weight, 1e-6, None, quant)[0],
        ref.quantize_act(reference.rms_norm(x, weight, 1e-6)[0], quant),
    )


@pytest.mark.parametrize("m", [1, 5, 70])  # 70: the large-M tile config
def test_rowwise_matmul_matches_reference(m):
    torch.manual_seed(5)
    act = ref.quantize_act(torch.randn(m, 192, device=DEVICE), ActQuant())
    weight, scale = ref.quantize_rows(torch.randn(80, 192, device=DEVICE))
    got = triton_fp8_matmul(act, weight, scale, torch.float32)
    torch.testing.assert_close(got, ref.linear_rows(act, weight, scale, torch.float32), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("split_k", [2, 3, 9])  # 9 asks more splits than K tiles: 5 splits of one tile
@pytest.mark.parametrize("group", [None, 128])
def test_split_k_matmul_matches_reference(split_k, group):
    """K split over programs, fp32 partial products summed in split order by a second kernel: the same
    product, bit for bit from one call to the next."""
    torch.manual_seed(8)
    m, n, k = 3, 40, 1100  # 5 K tiles of 256 (rowwise) or 9 of 128 (blocks), the last one partial
    act = ref.quantize_act(torch.randn(m, k, device=DEVICE), ActQuant(group))
    if group is None:
        weight, scale = ref.quantize_rows(torch.randn(n, k, device=DEVICE))
        want = ref.linear_rows(act, weight, scale, torch.float32)
    else:
        weight = torch.randn(n, k, device=DEVICE).to(ref.FP8)
        scale = torch.rand(-(-n // 128), -(-k // 128), device=DEVICE) + 0.5
        want = ref.linear_blocks(act, 128, weight, scale, 128, torch.float32)
    kw = dict(group=group, scale_rows=128) if group else {}
    got = triton_fp8_matmul(act, weight, scale, torch.float32, split_k=split_k, **kw)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)
    assert torch.equal(got, triton_fp8_matmul(act, weight, scale, torch.float32, split_k=split_k, **kw))


@pytest.mark.parametrize("split_k", [None, 3])
@pytest.mark.parametrize(("m", "n", "k"), [(32, 256, 512), (5, 200, 784), (64, 130, 1024)])
def test_tma_matmul_matches_reference(m, n, k, split_k):
    """The TMA kernel: rows past M, columns past N (a partial last tile) and K past the last full tile
    read as zeros from the descriptors; scales in the epilogue as the pointer kernel's; K split into
    partial products (2 or 3 splits of the 2-4 K tiles), summed or left to the consumer."""
    torch.manual_seed(9)
    act = ref.quantize_act(torch.randn(m, k, device=DEVICE), ActQuant())
    weight, scale = ref.quantize_rows(torch.randn(n, k, device=DEVICE))
    got = triton_fp8_matmul(act, weight, scale, torch.float32, tma=True, split_k=split_k, block_n=64)
    torch.testing.assert_close(got, ref.linear_rows(act, weight, scale, torch.float32), rtol=1e-5, atol=1e-4)
    parts = triton_fp8_matmul(act, weight, scale, torch.float32, tma=True, split_k=split_k, summed=False)
    assert isinstance(parts, SplitSums) == (split_k is not None)
    assert torch.equal(summed(parts), triton_fp8_matmul(act, weight, scale, torch.float32, tma=True,
                                                        split_k=split_k))  # fmt: skip


def test_tma_applies_to_wide_decode_products_on_hopper_only():
    act = torch.zeros(32, 4096, dtype=ref.FP8)
    gate_up, qkv = torch.zeros(28672, 4096, dtype=ref.FP8), torch.zeros(6144, 4096, dtype=ref.FP8)
    assert not fp8_gemm_tma.tma_applies(act, gate_up, 132)  # off CUDA
    if torch.cuda.is_available() and torch.cuda.get_device_capability() >= (9, 0):
        act, gate_up, qkv = act.cuda(), gate_up.cuda(), qkv.cuda()
        assert fp8_gemm_tma.tma_applies(act, gate_up, 132)  # 224 tiles of 128 columns
        assert not fp8_gemm_tma.tma_applies(act, qkv, 132)  # 48: fewer than the SMs
        assert not fp8_gemm_tma.tma_applies(act[:, 1:], gate_up, 132)  # rows not 16-byte aligned
        assert not fp8_gemm_tma.tma_applies(torch.zeros(65, 4096, dtype=ref.FP8, device="cuda"), gate_up, 132)


def test_tma_shape_for_llama_3_8b_at_decode_sizes():
    """gate|up: 128-wide tiles over the whole of K; qkv, o_proj, down_proj (fewer 128-wide tiles than
    SMs): the pointer kernel (in B1's step it beat the TMA kernel's 64-wide tiles in 4 K splits)."""
    shapes = [(28672, 4096), (6144, 4096), (4096, 4096), (4096, 14336)]
    want = [(128, 1), None, None, None]
    assert [fp8_gemm_tma.tma_shape(n, k, 132) for n, k in shapes] == want


def test_split_k_choice_fills_the_sms_with_long_enough_splits():
    # Llama-3-8B at M = 32 on 132 SMs: 32-wide tiles where N gives enough of them, else 64-wide
    assert [_config(32, n, 132)["BLOCK_N"] for n in (6144, 28672, 4096)] == [32, 32, 64]
    assert choose_split_k(programs=896, k_tiles=16, sms=132) == 1  # gate_up: 6.8 waves
    assert choose_split_k(programs=192, k_tiles=16, sms=132) == 2  # qkv: 192 programs -> 384
    assert choose_split_k(programs=64, k_tiles=16, sms=132, block_n=64) == 2  # o_proj: 64 -> 128
    assert choose_split_k(programs=64, k_tiles=56, sms=132, block_n=64) == 2  # down_proj
    assert choose_split_k(programs=1, k_tiles=6, sms=132) == 1  # splits of >= 4 tiles only
    assert choose_split_k(programs=200, k_tiles=16, sms=132, block_n=64) == 1


@pytest.mark.parametrize("scale_rows", [1, 128])
def test_block_matmul_matches_reference(scale_rows):
    torch.manual_seed(6)
    n, k = 150, 300  # partial row and column blocks
    act = ref.quantize_act(torch.randn(6, k, device=DEVICE), ActQuant(128))
    weight = torch.randn(n, k, device=DEVICE).to(ref.FP8)
    scale = torch.rand(-(-n // scale_rows), -(-k // 128), device=DEVICE) + 0.5
    got = triton_fp8_matmul(act, weight, scale, torch.float32, group=128, scale_rows=scale_rows)
    want = ref.linear_blocks(act, 128, weight, scale, scale_rows, torch.float32)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)


def _fp8_cache_case(q_lens, seq_lens, dtype, kv_scales, **kw):
    case = make_case(q_lens, seq_lens, q_heads=8, kv_heads=2, head_dim=32, dtype=dtype, device=DEVICE, **kw)
    return to_fp8_cache(case, kv_scales)


@pytest.mark.parametrize("decode", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_attention_reads_an_fp8_cache(decode, dtype):
    """Decode (split-K) and prefill kernels over e4m3 tiles vs the reference over the dequantized cache."""
    kv_scales = (0.5, 2.0)
    q_lens = [1, 1, 1] if decode else [5, 1, 17]
    case = _fp8_cache_case(q_lens, [40, 7, 70], dtype, kv_scales, pad_rows=2)
    out = paged_attention_triton(
        *case.attn_args(), decode_only=decode, max_seq_len=70, max_q_len=max(q_lens), kv_scales=kv_scales
    )
    want = paged_attention_fp8(*case.attn_args(), kv_scales)
    assert rel_error(out, want, case.num_valid_rows) < (1e-5 if dtype == torch.float32 else 2e-2)


@pytest.mark.parametrize("decode", [True, False])
def test_fp16_tiles_saturate_a_query_past_fp16s_range(decode):
    """A bf16 query over an FP8 cache runs in fp16 tiles; entries past fp16's 65504 saturate there
    instead of becoming inf (and NaN scores): the output is the reference's for the saturated query."""
    q_lens = [1, 1, 1] if decode else [5, 1, 17]
    case = _fp8_cache_case(q_lens, [40, 7, 70], torch.bfloat16, (1.0, 1.0), pad_rows=2)
    case.query[0, 0, :4] = torch.tensor([1e5, -1e5, 7e4, 3.0])  # row 0, head 0
    out = paged_attention_triton(
        *case.attn_args(), decode_only=decode, max_seq_len=70, max_q_len=max(q_lens), kv_scales=(1.0, 1.0)
    )
    case.query = case.query.clamp(-65504, 65504)
    want = paged_attention_fp8(*case.attn_args(), (1.0, 1.0))
    assert out[: case.num_valid_rows].isfinite().all()
    assert rel_error(out, want, case.num_valid_rows) < 2e-2


def test_fp8_cache_attention_is_close_to_a_full_precision_cache():
    """What an e4m3 cache costs: attention over the rounded cache stays within a few % of fp32's."""
    case = make_case([4, 1], [50, 33], q_heads=8, kv_heads=2, head_dim=32, device=DEVICE)
    exact = reference.paged_attention(*case.attn_args())
    case.k_cache, case.v_cache = case.k_cache.to(ref.FP8), case.v_cache.to(ref.FP8)
    assert rel_error(paged_attention_fp8(*case.attn_args(), (1.0, 1.0)), exact, case.num_valid_rows) < 0.05


def test_rope_writes_an_fp8_cache():
    torch.manual_seed(7)
    tokens, q_heads, kv_heads, dim = 6, 4, 2, 32
    qkv = torch.randn(tokens, (q_heads + 2 * kv_heads) * dim, device=DEVICE) * 30  # some saturate at 1/0.1
    freqs = torch.arange(16.0)[:, None] * (1.0 / 10000 ** (torch.arange(0, dim, 2) / dim))[None, :]
    cos, sin = freqs.cos().to(DEVICE), freqs.sin().to(DEVICE)
    positions = torch.tensor([0, 3, 4, 9, 15, 2], device=DEVICE)
    slots = torch.tensor([5, 0, 11, 3, 7, -1], device=DEVICE)
    caches = [torch.zeros(4, 4, kv_heads, dim, dtype=ref.FP8, device=DEVICE) for _ in range(2)]
    want = [c.clone() for c in caches]
    args = (positions, cos, sin, None, None, 1e-6)
    q_want = reference.rope_write_kv(qkv.clone(), *args, *want, slots, q_heads, kv_heads, (0.1, 2.0))
    q = rope_write_kv(qkv, *args, *caches, slots, q_heads, kv_heads, (0.1, 2.0))
    torch.testing.assert_close(q, q_want, rtol=1e-6, atol=1e-5)
    for got, exp in zip(caches, want, strict=True):
        assert torch.equal(got.view(torch.uint8), exp.view(torch.uint8))


# ---- GPU only: cuBLASLt, real shapes, the fused forward --------------------------------------------


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("m", [1, 32, 256, 4096])
@pytest.mark.parametrize(("n", "k"), [(6144, 4096), (4096, 14336)])  # Llama-3-8B's qkv and down_proj
def test_gpu_matmuls_match_reference(m, n, k):
    """``torch._scaled_mm`` (rowwise) and the Triton kernel (rowwise, 128 x 128 blocks) in bf16 against
    the fp32 reference over the same e4m3 operands; fp16 output takes the Triton kernel."""
    from batchgen.kernels.gemm.fp8_gemm import rowwise_matmul

    torch.manual_seed(0)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
    act, (wq, ws) = quantize_act(x, ActQuant()), ref.quantize_rows(w)
    want = ref.linear_rows(act, wq, ws, torch.float32)
    for dtype in (torch.bfloat16, torch.float16):
        assert rel_error(rowwise_matmul(act, wq, ws, dtype), want, m) < 5e-3
        assert rel_error(triton_fp8_matmul(act, wq, ws, dtype), want, m) < 5e-3
    bq, bs = ref.quantize_blocks(w, 128, 128)
    group_act = quantize_act(x, ActQuant(128))
    want = ref.linear_blocks(group_act, 128, bq, bs, 128, torch.float32)
    got = triton_fp8_matmul(group_act, bq, bs, torch.bfloat16, group=128, scale_rows=128)
    assert rel_error(got, want, m) < 5e-3


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("m", [1, 17, 32, 64])
def test_gpu_tma_matmul_matches_the_pointer_kernel(m):
    """Llama-3-8B's gate_up at decode sizes: the TMA kernel (the default there on Hopper) against the
    pointer kernel and the fp32 reference over the same e4m3 operands."""
    torch.manual_seed(2)
    n, k = 28672, 4096
    act = quantize_act(torch.randn(m, k, device="cuda", dtype=torch.bfloat16), ActQuant())
    wq, ws = ref.quantize_rows(torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02)
    want = ref.linear_rows(act, wq, ws, torch.float32)
    got = triton_fp8_matmul(act, wq, ws, torch.bfloat16)
    assert rel_error(got, want, m) < 5e-3
    pointer = triton_fp8_matmul(act, wq, ws, torch.bfloat16, tma=False)
    assert rel_error(got, pointer.float(), m) < 5e-3
    assert torch.equal(got, triton_fp8_matmul(act, wq, ws, torch.bfloat16))
    # Captured in a CUDA graph (the descriptors go in by value), replayed over new activations
    graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    with torch.cuda.stream(stream), torch.cuda.graph(graph):
        captured = triton_fp8_matmul(act, wq, ws, torch.bfloat16)
    fresh = quantize_act(torch.randn(m, k, device="cuda", dtype=torch.bfloat16), ActQuant())
    act.data.copy_(fresh.data)
    act.scale.copy_(fresh.scale)
    graph.replay()
    assert torch.equal(captured, triton_fp8_matmul(fresh, wq, ws, torch.bfloat16))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("quant", QUANTS[:2])
def test_gpu_fused_quantization_matches_reference(quant):
    torch.manual_seed(1)
    x = torch.randn(300, 4096, device="cuda", dtype=torch.bfloat16)
    weight = torch.randn(4096, device="cuda", dtype=torch.bfloat16)
    plain = rms_norm(x, weight, 1e-5)[0]
    got, want = rms_norm(x, weight, 1e-5, None, quant)[0], ref.quantize_act(plain, quant)
    torch.testing.assert_close(got.scale, want.scale, rtol=1e-6, atol=0)
    # Triton's fp32 division may differ from torch's in the last bit: a few elements may flip one e4m3 step
    assert (got.data.float() != want.data.float()).float().mean() < 1e-3
    gate_up = torch.randn(300, 2 * 14336, device="cuda", dtype=torch.bfloat16)
    got, want = silu_mul(gate_up, quant), ref.quantize_act(silu_mul(gate_up), quant)
    torch.testing.assert_close(got.scale, want.scale, rtol=1e-6, atol=0)
    assert (got.data.float() != want.data.float()).float().mean() < 1e-3


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("decode", [True, False])
def test_gpu_attention_over_an_fp8_cache(decode):
    kv_scales = (0.25, 0.5)
    case = llama_fp8_case(decode, kv_scales)
    out = paged_attention_triton(
        *case.attn_args(), decode_only=decode, max_seq_len=4096, max_q_len=512, kv_scales=kv_scales
    )
    assert rel_error(out, paged_attention_fp8(*case.attn_args(), kv_scales), case.num_valid_rows) < 2e-2


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_fp8_fused_forward_stays_close_to_bf16():
    """A Qwen3-shaped random model in bf16: FP8 weights and cache on the GPU kernels vs bf16. The format
    itself costs this random model ~14 % of its logits (relative; the torch FP8 reference measures 0.135
    against the GPU's bf16 logits and 0.144 against the CPU's: random hidden states sit near the e4m3
    rounding noise, and that noise amplifies any 1-ulp difference). So the oracle is the reference FP8
    math: the GPU kernels add no error of their own beyond one more FP8 realisation (measured on the GPU:
    0.151 = 1.12x the reference's), and stay closer to the reference than the format is to bf16 (measured
    0.073 = 0.54x). A wrong scale or layout costs whole logits, far past both bounds."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from batchgen.config import EngineConfig
    from batchgen.distributed.group import ParallelGroup
    from batchgen.model.backends import TorchBackend, TritonBackend
    from batchgen.model.build import ModelFiles, build_model
    from batchgen.model.kv_cache import KVShape
    from batchgen.model.paged_sequence import sequence_logits

    config = AutoConfig.for_model(
        "qwen3", vocab_size=4096, hidden_size=1024, intermediate_size=3072, num_hidden_layers=4,
        num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=4096,
    )  # fmt: skip
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).eval()
    ids = torch.randint(0, 4096, (300,))
    chunks, shape = [128, 160] + [1] * 12, KVShape(4, 8, 128)
    fp8 = dict(quantization="fp8", kv_cache_dtype="fp8")
    runs = {"bf16": ({}, "cuda"), "fp8": (fp8, "cuda"), "fp8_reference": (fp8, "cpu")}
    logits = {}
    for name, (opts, device) in runs.items():
        model.to(device)
        bundle = build_model(EngineConfig(device=device, **opts), ModelFiles(None, model.config, model),
                             ParallelGroup.single(), torch.device(device), torch.bfloat16, 4096)  # fmt: skip
        cache, backend = (
            (ref.FP8 if opts else torch.bfloat16),
            (TritonBackend() if device == "cuda" else TorchBackend()),
        )
        with torch.inference_mode():
            out = sequence_logits(bundle.forward, ids.to(device), chunks, shape, cache, backend)
        logits[name] = out.float().cpu()
        del bundle

    def rel(a: str, b: str) -> float:
        return rel_error(logits[a], logits[b], len(ids))

    format_err, kernel_err = rel("fp8_reference", "bf16"), rel("fp8", "bf16")
    assert 0.05 < format_err < 0.3, f"the reference's own error moved: {format_err:.3f}"
    assert kernel_err <= 1.3 * format_err, f"GPU FP8 {kernel_err:.3f} vs the FP8 reference {format_err:.3f}"
    assert rel("fp8", "fp8_reference") < 0.8 * format_err
