"""The greedy pick's Triton kernels (kernels/sampling/argmax.py) against torch.argmax, exactly: ties to the
first maximum, NaN above everything (the first NaN), -inf rows, a partial last column block. Off-GPU under
TRITON_INTERPRET=1, with 64-column blocks (the default 4096 on the GPU)."""

from __future__ import annotations

import pytest
import torch

from batchgen.kernels.sampling.argmax import row_argmax

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
BLOCK = 4096 if DEVICE == "cuda" else 64


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("blocks", [0.1, 1, 2.2])  # one partial block, one full, three with a partial last
def test_matches_torch_argmax_with_ties(dtype, blocks):
    torch.manual_seed(0)
    cols = max(7, int(blocks * BLOCK))
    logits = torch.randint(-3, 4, (6, cols), device=DEVICE).to(dtype)  # many tied maxima in every row
    logits[1, cols // 2 :] = 9  # the row's best first appears mid-row (in a later block)
    logits[2, -1] = 9  # ... in the last column
    assert torch.equal(row_argmax(logits, BLOCK), torch.argmax(logits, dim=-1))


def test_nan_and_infinities_pick_as_torch_does():
    b = BLOCK
    cols = 2 * b + b // 4
    logits = torch.zeros(6, cols, device=DEVICE)
    logits[0, [3, b + 5]] = float("nan")  # the first NaN, over larger values elsewhere
    logits[0, b + 1] = float("inf")
    logits[1, 2 * b + 1] = float("nan")  # NaN in a later block than +inf
    logits[1, 3] = float("inf")
    logits[2] = float("-inf")  # nothing but -inf: the first column
    logits[3, [b + 7, cols - 1]] = float("inf")  # tied +inf in two blocks
    logits[4, :] = float("-inf")
    logits[4, cols - 1] = -1.0
    logits[5, b - 1 : b + 1] = 2.0  # a tie straddling two blocks
    assert torch.equal(row_argmax(logits, BLOCK), torch.argmax(logits, dim=-1))


def test_strided_rows_and_no_rows():
    logits = torch.randn(10, 300, device=DEVICE)[::3, :250]  # a row stride past the row's width
    assert torch.equal(row_argmax(logits, BLOCK), torch.argmax(logits, dim=-1))
    assert row_argmax(torch.zeros(0, 5, device=DEVICE)).shape == (0,)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize(("rows", "vocab"), [(32, 128256), (256, 151936), (1024, 49152)])  # B1, B3, B7w
def test_gpu_real_vocabularies(rows, vocab):
    torch.manual_seed(1)
    logits = (torch.randn(rows, vocab, device="cuda") * 4).to(torch.bfloat16)  # bf16: ties are common
    assert torch.equal(row_argmax(logits), torch.argmax(logits, dim=-1))
