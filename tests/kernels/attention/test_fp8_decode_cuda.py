"""The CUDA FP8 decode attention (``fp8_decode.cu``) against the torch reference over the dequantized cache,
and beside the Triton kernel it replaces. GPU only: the kernel is CUDA C compiled with NVRTC."""

from __future__ import annotations

import pytest
import torch

from batchgen.kernels import reference
from batchgen.kernels.attention import fp8_decode_cuda
from batchgen.kernels.attention.decode import decode_attention
from tests.kernels.cases import make_case, rel_error, to_fp8_cache

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

# Contexts around chunk (16) and page edges, one token, and a long one that every split shares.
LENS = [1, 15, 16, 17, 31, 33, 100, 257, 1000, 2049]


def _case(group: int, block_size: int, dtype: torch.dtype, kv_scales, lens=LENS, seed: int = 0):
    kv_heads = 8 if group <= 4 else 4
    case = make_case([1] * len(lens), lens, q_heads=group * kv_heads, kv_heads=kv_heads, head_dim=128,
                     block_size=block_size, dtype=dtype, pad_rows=3, device="cuda", seed=seed)  # fmt: skip
    return to_fp8_cache(case, kv_scales)


def _cuda(case, kv_scales, splits: int, shape=None, out=None):
    """``shape`` None: decode_attention's own pick (the engine's), by the grid's size."""
    return decode_attention(*case.attn_args(), max_seq_len=4096, num_splits=splits, kv_scales=kv_scales,
                            cuda_shape=shape, out=out)  # fmt: skip


@pytest.mark.parametrize("group", [1, 3, 4, 8])
@pytest.mark.parametrize("splits", [1, 2, 3, 5])
@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("build", ["default pick", "cp.async", "tma"])
def test_cuda_decode_matches_reference(group, splits, block_size, build):
    if build == "tma" and torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("needs a Hopper GPU (TMA copies)")
    kv_scales = (0.5, 2.0)
    case = _case(group, block_size, torch.bfloat16, kv_scales)
    assert fp8_decode_cuda.supports(case.query, case.k_cache, case.v_cache, None)
    builds = {"cp.async": fp8_decode_cuda.DEFAULT_SHAPE, "tma": fp8_decode_cuda.FEW_PROGRAMS_SHAPE}
    out = _cuda(case, kv_scales, splits, builds.get(build))
    want = reference.paged_attention_fp8(*case.attn_args(), kv_scales)
    assert rel_error(out, want, case.num_valid_rows) < 1e-2
    # Row by row too: one wrong sequence must not hide in the norm of ten.
    for b in range(len(LENS)):
        assert rel_error(out[b : b + 1], want[b : b + 1], 1) < 2e-2, b


@pytest.mark.parametrize(
    "shape",
    [
        (4, 2, 6),
        (8, 1, 4),
        (4, 4, 3),
        (2, 3, 2),
        (4, 3, 3, "", True),
        (8, 1, 4, "", True),
        (4, 3, 4, "", True),
    ],
)
@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_cuda_decode_launch_shapes_agree(shape, splits, dtype):
    if len(shape) > 4 and torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("needs a Hopper GPU (TMA copies)")
    kv_scales = (0.5, 2.0)
    case = _case(4, 16, dtype, kv_scales)
    want = reference.paged_attention_fp8(*case.attn_args(), kv_scales)
    out = _cuda(case, kv_scales, splits, fp8_decode_cuda.LaunchShape(*shape))
    assert rel_error(out, want, case.num_valid_rows) < 1e-2


def test_the_default_shape_copies_by_tma_on_small_grids_only():
    query = torch.empty(1, 32, 128, device="cuda", dtype=torch.bfloat16)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    hopper = torch.cuda.get_device_capability() >= (9, 0)
    assert fp8_decode_cuda.default_shape(query, 2 * sms).tma == hopper
    assert fp8_decode_cuda.default_shape(query, 2 * sms + 1) == fp8_decode_cuda.DEFAULT_SHAPE


def test_cuda_decode_is_close_to_the_triton_kernel():
    kv_scales = (0.25, 0.5)
    case = _case(4, 16, torch.bfloat16, kv_scales, lens=[4096] * 8 + [513] * 8)
    triton_out = decode_attention(*case.attn_args(), max_seq_len=4096, kv_scales=kv_scales,
                                  num_stages=5)  # fmt: skip
    cuda_out = decode_attention(*case.attn_args(), max_seq_len=4096, kv_scales=kv_scales)
    # Both take fp16 tiles and fp32 sums; only the order of the sums differs.
    assert rel_error(cuda_out, triton_out, case.num_valid_rows) < 2e-3


@pytest.mark.parametrize("tma", [False, True])
def test_cuda_decode_ignores_nan_bytes_past_the_context(tma):
    """Unwritten slots of a sequence's last page may hold anything, NaN patterns (0x7f) included."""
    kv_scales = (1.0, 1.0)
    case = _case(4, 16, torch.bfloat16, kv_scales)
    want = reference.paged_attention_fp8(*case.attn_args(), kv_scales)
    for cache in (case.k_cache, case.v_cache):
        raw = cache.view(torch.uint8)
        for b, n in enumerate(LENS):
            if n % 16:
                raw[case.block_tables[b, n // 16], n % 16 :] = 0x7F
    out = _cuda(case, kv_scales, 2, fp8_decode_cuda.LaunchShape(tma=tma))
    assert out[: case.num_valid_rows].isfinite().all()
    assert rel_error(out, want, case.num_valid_rows) < 1e-2


@pytest.mark.parametrize("tma", [False, True])
@pytest.mark.parametrize("block_size", [32, 64])
def test_cuda_decode_reads_a_strided_query_and_larger_pages(tma, block_size):
    """q as a view into a fused qkv projection (the engine's case); pages of 32 / 64 tokens put chunks at
    offsets 16, 32, 48 inside a page (the TMA copy's page-offset coordinate)."""
    if tma and torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("needs a Hopper GPU (TMA copies)")
    kv_scales = (0.5, 2.0)
    case = _case(4, block_size, torch.bfloat16, kv_scales)
    fused = torch.randn(case.query.shape[0], 48 * 128, device="cuda", dtype=torch.bfloat16)
    fused[:, : 32 * 128] = case.query.reshape(case.query.shape[0], -1)
    case.query = fused[:, : 32 * 128].view(-1, 32, 128)  # row stride 6144, not 4096
    assert case.query.stride(0) == 48 * 128
    out = _cuda(case, kv_scales, 2, fp8_decode_cuda.LaunchShape(tma=tma))
    want = reference.paged_attention_fp8(*case.attn_args(), kv_scales)
    assert rel_error(out, want, case.num_valid_rows) < 1e-2


def test_cuda_decode_leaves_padding_rows_and_sequences_alone():
    kv_scales = (1.0, 1.0)
    case = _case(4, 16, torch.bfloat16, kv_scales, lens=[50, 70, 90])
    case.cu_seqlens_q[2:] -= 1  # sequence 1 becomes a padding sequence (no query row)
    out = torch.full_like(case.query, 7.0)
    _cuda(case, kv_scales, 1, out=out)
    want = reference.paged_attention_fp8(*case.attn_args(), kv_scales)
    assert rel_error(out, want, 2) < 1e-2
    assert (out[2:] == 7.0).all()  # the padding sequence's row and the padding rows


@pytest.mark.parametrize("tma", [False, True])
def test_cuda_decode_in_a_cuda_graph(tma):
    """Captured once, replayed after the inputs change in place: the launch reads them, not copies."""
    kv_scales = (1.0, 1.0)
    case = _case(4, 16, torch.bfloat16, kv_scales, lens=[300, 600, 40, 1000])
    out = torch.zeros_like(case.query)
    shape = fp8_decode_cuda.LaunchShape(tma=tma)
    _cuda(case, kv_scales, 2, shape, out=out)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        _cuda(case, kv_scales, 2, shape, out=out)
    case.query.normal_()
    case.seq_lens.sub_(torch.tensor([0, 50, 0, 100], dtype=torch.int32, device="cuda"))
    graph.replay()
    torch.cuda.synchronize()
    assert (
        rel_error(out, reference.paged_attention_fp8(*case.attn_args(), kv_scales), case.num_valid_rows)
        < 1e-2
    )


def test_unsupported_shapes_go_to_triton():
    case = _case(4, 16, torch.bfloat16, (1.0, 1.0))
    assert not fp8_decode_cuda.supports(case.query, case.k_cache, case.v_cache, 128)  # sliding window
    wide = make_case([1], [40], q_heads=16, kv_heads=1, head_dim=128, device="cuda", dtype=torch.bfloat16)
    wide = to_fp8_cache(wide, (1.0, 1.0))
    assert not fp8_decode_cuda.supports(wide.query, wide.k_cache, wide.v_cache, None)  # group of 16
