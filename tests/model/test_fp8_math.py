"""FP8 (e4m3) quantize / dequantize round trips and scale layouts (``kernels/fp8_format.py``), and block
scales that follow tensor-parallel weight slices (``model/weights/fp8_checkpoint.py``)."""

from __future__ import annotations

import pytest
import torch

from batchgen.kernels import fp8_format as ref
from batchgen.kernels.fp8_format import ActQuant

HALF_STEP = 2.0**-4  # e4m3 keeps 3 mantissa bits: rounding moves a normal value by at most 1/16 of it


def _bound(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The largest rounding error: half a step for normal values, half the subnormal step (2^-10) else."""
    return torch.maximum(x.abs().float() * HALF_STEP, scale * 2.0**-10) * (1 + 1e-6)


def test_weight_rows_round_trip():
    torch.manual_seed(0)
    w = torch.randn(48, 80) * torch.logspace(-2, 2, 48)[:, None]  # rows of very different magnitudes
    w[5] = 0
    q, scale = ref.quantize_rows(w)
    assert q.dtype == ref.FP8 and scale.dtype == torch.float32 and scale.shape == (48,)
    assert scale[5] == ref.MIN_SCALE and not q[5].float().any()  # a zero row: no NaN, zeros
    assert (q.float().abs().amax(1)[torch.arange(48) != 5] == ref.FP8_MAX).all()  # each row's max -> 448
    err = (q.float() * scale[:, None] - w).abs()
    assert (err <= _bound(w, scale[:, None])).all()


@pytest.mark.parametrize(("group", "scales"), [(None, 1), (128, 3), (64, 5)])
def test_activation_scales_per_token_or_group(group, scales):
    torch.manual_seed(1)
    x = torch.randn(7, 300) * 10
    act = ref.quantize_act(x, ActQuant(group))
    assert act.scale.shape == (7, scales)  # 300 columns: the last group is partial
    full = ref.expand_groups(act.scale, group, 300)
    assert ((ref.dequantize_act(act, group) - x).abs() <= _bound(x, full)).all()


def test_static_scale_saturates():
    x = torch.tensor([[1.0, -3.0, 500.0, -1000.0]])
    act = ref.quantize_act(x, ActQuant(static_scale=torch.tensor(2.0)))
    assert act.data.float().tolist() == [[0.5, -1.5, 256.0, -448.0]] and act.scale.tolist() == [[2.0]]


def test_weight_blocks_round_trip():
    torch.manual_seed(2)
    w = torch.randn(300, 200)
    w[:128, :128] *= 1e-3  # one block much smaller than the rest keeps its own precision
    q, scale = ref.quantize_blocks(w, 128, 128)
    assert scale.shape == (3, 2)
    deq = ref.dequantize_blocks(q, scale, 128, 128)
    full = scale.repeat_interleave(128, 0)[:300].repeat_interleave(128, 1)[:, :200]
    assert ((deq - w).abs() <= _bound(w, full)).all()


def test_kv_cache_values_saturate():
    x = torch.tensor([10.0, -10.0, 0.3])
    stored = ref.to_cache(x, 0.01).to(ref.FP8)
    assert stored.float().tolist() == [448.0, -448.0, 30.0]


def test_block_scales_follow_tensor_parallel_slices(tmp_path):
    """A rank's slice of a block-quantized projection (rows inside blocks, or whole column blocks) holds the
    same weights, dequantized, as that slice of the whole projection."""
    from safetensors.torch import save_file

    from batchgen.distributed.shard import Span
    from batchgen.model.weights.fp8_checkpoint import Fp8CheckpointFormat
    from batchgen.model.weights.sources import Part, SafetensorsSource

    torch.manual_seed(3)
    tensors = {}
    for name, shape in (("a", (320, 256)), ("b", (96, 256)), ("o", (64, 512))):
        q, s = ref.quantize_blocks(torch.randn(*shape), 128, 128)
        tensors[f"{name}.weight"], tensors[f"{name}.weight_scale_inv"] = q, s
    save_file(tensors, str(tmp_path / "model.safetensors"))
    source = SafetensorsSource(tmp_path, torch.device("cpu"))
    fmt = Fp8CheckpointFormat(torch.float32, (128, 128))

    def dequantized(parts):
        lin = fmt.linear(source, parts, bias=False)
        return ref.dequantize_blocks(lin.weight, lin.scale, lin.scale_rows, lin.group)

    whole = dequantized([Part("a.weight"), Part("b.weight")])  # [416, 256]
    rank = dequantized([Part("a.weight", Span(160, 320)), Part("b.weight", Span(48, 96))])  # rows in blocks
    torch.testing.assert_close(rank, torch.cat([whole[160:320], whole[320 + 48 :]]), rtol=0, atol=0)
    cols = dequantized([Part("o.weight", None, Span(256, 512))])  # rank 1 of 2: whole column blocks
    torch.testing.assert_close(cols, dequantized([Part("o.weight")])[:, 256:], rtol=0, atol=0)
