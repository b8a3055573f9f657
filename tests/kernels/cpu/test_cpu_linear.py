"""fp32 CPU projections through oneDNN (kernels/cpu/cpu_linear.py) against F.linear (MKL): the same
products, summed in another order."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from batchgen.kernels.cpu import cpu_linear
from batchgen.model.weights.formats import DenseFormat, DenseLinear
from batchgen.model.weights.sources import Part

pytestmark = pytest.mark.skipif(not cpu_linear.ONEDNN, reason="needs torch built with oneDNN")


def _operands(rows: int, with_bias: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    torch.manual_seed(rows)
    return torch.randn(rows, 96), torch.randn(200, 96), torch.randn(200) if with_bias else None


@pytest.mark.parametrize("rows", [1, 4, 8, 17, 63, 65, 78, 300, 3299])
@pytest.mark.parametrize("with_bias", [False, True])
def test_packed_and_plain_weights_match_f_linear(rows, with_bias):
    x, weight, bias = _operands(rows, with_bias)
    want = F.linear(x, weight, bias)
    torch.testing.assert_close(cpu_linear.PackedLinear(weight, bias)(x), want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(cpu_linear.linear(x, weight, bias), want, rtol=1e-5, atol=1e-5)


def test_row_pieces_cover_every_row_once_with_few_row_counts():
    """oneDNN compiles and keeps a primitive per row count: every batch size from 1 to 20 000 rows
    resolves into the same 35 row counts, each call's rows lie inside the batch (or, for a small batch,
    start at 0) and together they cover it in order."""
    seen = set()
    for rows in range(1, 20_001):
        pieces = cpu_linear.row_pieces(rows)
        seen |= {length for _, length in pieces}
        end = 0
        for start, length in pieces:
            assert 0 <= start <= end < start + length, (rows, pieces)  # no gap; overlaps only backwards
            end = start + length
        assert end == rows or (len(pieces) == 1 and end > rows), (rows, pieces)
        assert len(pieces) <= 6
    assert seen == cpu_linear.ROW_COUNTS and len(seen) == 35


def test_a_long_job_compiles_few_onednn_primitives(monkeypatch):
    """Every row count from 1 to 700 through one projection reaches oneDNN with the fixed row counts only,
    and each row of the result is that row's product (the overlapping and padded rows are dropped)."""
    shapes, real = set(), torch.ops.mkldnn._linear_pointwise

    class Spy:
        def _linear_pointwise(self, *args):
            shapes.add(args[0].shape[0])
            return real(*args)

    x, weight, bias = _operands(700, True)
    packed, want = cpu_linear.PackedLinear(weight, bias), F.linear(x, weight, bias)
    monkeypatch.setattr(cpu_linear.torch.ops, "mkldnn", Spy())
    for rows in range(1, 701):
        torch.testing.assert_close(packed(x[:rows]), want[:rows], rtol=1e-5, atol=1e-5)
    assert shapes <= cpu_linear.ROW_COUNTS and len(shapes) <= 30


def test_packed_weight_takes_any_leading_shape():
    x, weight, bias = _operands(12, True)
    packed = cpu_linear.PackedLinear(weight, bias)
    got = packed(x.view(3, 4, 96))
    assert got.shape == (3, 4, 200) and packed.out_features == 200
    assert packed(x[:0].view(0, 2, 96)).shape == (0, 2, 200)  # no rows: no oneDNN call
    torch.testing.assert_close(got, F.linear(x, weight, bias).view(3, 4, 200), rtol=1e-5, atol=1e-5)


class _Source:
    def __init__(self, tensors: dict[str, torch.Tensor], shares_storage: bool = False) -> None:
        self.tensors, self.shares_storage = tensors, shares_storage

    def has(self, name: str) -> bool:
        return name in self.tensors

    def stack_rows(self, parts) -> torch.Tensor:
        return torch.cat([self.tensors[p.name] for p in parts])


def test_the_dense_format_packs_fp32_cpu_weights_it_owns():
    source = _Source({"a.weight": torch.randn(8, 16), "b.weight": torch.randn(4, 16)})
    parts = [Part("a.weight", None), Part("b.weight", None)]
    packed = DenseFormat(torch.float32).linear(source, parts, bias=False)
    assert isinstance(packed, cpu_linear.PackedLinear) and packed.out_features == 12
    x = torch.randn(5, 16)
    want = F.linear(x, torch.cat([source.tensors["a.weight"], source.tensors["b.weight"]]))
    torch.testing.assert_close(packed(x), want, rtol=1e-5, atol=1e-5)
    assert isinstance(DenseFormat(torch.bfloat16).linear(source, parts, bias=False), DenseLinear)
    # An in-memory model's own weights stay as they are (a packed copy would add to memory): plain oneDNN.
    model_owned = _Source(source.tensors, shares_storage=True)
    shared = DenseFormat(torch.float32).linear(model_owned, parts, bias=False)
    assert isinstance(shared, DenseLinear)
    torch.testing.assert_close(shared(x), want, rtol=1e-5, atol=1e-5)


def test_plain_weights_go_through_onednn_for_fp32_2d_inputs_only(monkeypatch):
    calls = []
    real = torch.ops.mkldnn._linear_pointwise

    class Spy:
        def _linear_pointwise(self, *args):
            calls.append(args[0].shape)
            return real(*args)

    monkeypatch.setattr(cpu_linear.torch.ops, "mkldnn", Spy())
    weight = torch.randn(32, 16)
    cpu_linear.linear(torch.randn(1, 16), weight, None)  # one row too: oneDNN reads a cold weight faster
    cpu_linear.linear(torch.randn(8, 16), weight, None)
    assert calls == [torch.Size([1, 16]), torch.Size([8, 16])]
    half, x = weight.bfloat16(), torch.randn(40, 16, dtype=torch.bfloat16)
    assert torch.equal(cpu_linear.linear(x, half, None), F.linear(x, half))  # 16-bit: F.linear as is
    cpu_linear.linear(torch.randn(2, 5, 16), weight, None)  # 3-d input
    cpu_linear.linear(torch.randn(0, 16), weight, None)  # no rows
    assert len(calls) == 2
