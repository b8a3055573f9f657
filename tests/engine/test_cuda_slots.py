"""The packed step buffer of the CUDA runner, on CPU tensors: a step's fields laid out in one byte
buffer, moved by one copy, read back through the same layout (cuda_slots.py). The copy itself and the
graphs that read the device views run in make gpu-check (tests/engine/test_cuda_runner.py)."""

import numpy as np
import torch

from batchgen.config import SamplingParams
from batchgen.engine import cuda_slots
from batchgen.engine.batch import build_step
from batchgen.engine.request import Request
from batchgen.engine.rows import RowState
from batchgen.engine.scheduler import ScheduledItem, ScheduledStep

MAX_TOKENS, MAX_SEQS, MAX_BLOCKS = 64, 8, 6


def _step():
    """A decode (carried over), a sampled prefill chunk and an unsampled one, block size 4."""
    rows = RowState(4)
    a = Request(0, 0, 0, None, SamplingParams(), [11, 12, 13], 2, 16, 5, block_table=[7])
    b = Request(1, 1, 0, None, SamplingParams(temperature=0.5, top_p=0.9), list(range(9)), 9, 16, 6,
                block_table=[3, 0, 5])  # fmt: skip
    c = Request(2, 2, 0, None, SamplingParams(), list(range(10)), 10, 16, 7, block_table=[9])
    for req in (a, b, c):
        rows.claim(req)
    a.num_pending, a.carry_step, a.carry_row = 2, 3, 1  # its input is step 3's token
    b.num_pending = 1
    items = [ScheduledItem(a, 3, 1, True), ScheduledItem(b, 4, 5, True), ScheduledItem(c, 0, 3, False)]
    return build_step(ScheduledStep(4, items), 4, rows)


def _buffers(shape: cuda_slots.Shape):
    size = cuda_slots.packed_layout(cuda_slots.Shape(MAX_TOKENS, MAX_SEQS, MAX_SEQS), MAX_BLOCKS).nbytes
    host, dev = (torch.full((size,), 0xAB, dtype=torch.uint8) for _ in range(2))  # stale bytes
    return host, dev, cuda_slots.packed_views(host, dev, shape, MAX_BLOCKS)


def test_one_copy_moves_every_field_and_pads_to_the_shape():
    inputs = _step()
    shape = cuda_slots.Shape(16, 4, 4)  # padded beyond the step's 9 tokens, 3 sequences, 2 samples
    host, dev, views = _buffers(shape)
    cuda_slots.fill_host(views.host, inputs)
    dev[: views.nbytes].copy_(host[: views.nbytes])  # the runner's one H2D copy
    out = {name: t.numpy() for name, t in views.dev.items()}
    for name in cuda_slots.TOKEN_FIELDS + cuda_slots.SAMPLE_FIELDS + ("seq_lens",):
        src = getattr(inputs, name)
        np.testing.assert_array_equal(out[name][: len(src)], src, err_msg=name)
        pad = cuda_slots.PAD.get(name, 0)
        assert (out[name][len(src) :] == pad).all(), name  # inert rows: no KV write, no carry-over
    np.testing.assert_array_equal(out["cu_seqlens_q"], [0, 1, 6, 9, 9])  # an empty padding sequence
    np.testing.assert_array_equal(out["block_tables"][:3, :3], inputs.block_tables)
    assert (out["block_tables"][3] == 0).all()  # a padding sequence's row: zeros, not 0xAB
    assert (
        out["block_tables"][:3, 3:] == np.frombuffer(b"\xab" * 4, np.int32)[0]
    ).all()  # past W: the buffer's 0xAB bytes
    assert out["carry_rows"][0] == 1 and out["input_ids"][0] == 0  # carried over from step 3's row 1
    np.testing.assert_allclose(out["temperature"][:2], [0.0, 0.5])


def test_fields_are_aligned_and_disjoint_and_within_the_slot():
    biggest = cuda_slots.packed_layout(cuda_slots.Shape(MAX_TOKENS, MAX_SEQS, MAX_SEQS), MAX_BLOCKS)
    for shape in (cuda_slots.Shape(1, 1, 1), cuda_slots.Shape(9, 3, 2), cuda_slots.Shape(64, 8, 8)):
        layout = cuda_slots.packed_layout(shape, MAX_BLOCKS)
        spans = sorted(
            (off, off + int(np.prod(dims)) * dtype.itemsize) for off, dims, dtype in layout.fields.values()
        )
        assert all(start % 64 == 0 for start, _ in spans)
        assert all(end <= nxt for (_, end), (nxt, _) in zip(spans, spans[1:], strict=False))
        assert spans[-1][1] <= layout.nbytes <= biggest.nbytes
        rows = layout.fields["block_tables"][1]
        assert rows == (shape.seqs, MAX_BLOCKS)  # full width: a graph reads it with that stride


def test_reset_makes_every_row_inert():
    shape = cuda_slots.Shape(8, 4, 4)
    _, _, views = _buffers(shape)
    cuda_slots.reset_inputs(views)
    assert (views.dev["slot_mapping"].numpy() == -1).all() and (views.dev["carry_rows"].numpy() == -1).all()
    assert (views.dev["top_p"].numpy() == 1.0).all() and (views.dev["seq_lens"].numpy() == 0).all()


def test_an_eager_step_bounds_its_leading_decode_rows():
    """The decode rows the engine puts ahead of a step's prompt chunks are the attention's decode-kernel
    rows (``Layout.bounds[2]``); a chunk of one token after a longer chunk is not among them, and graphed
    layouts (decodes, token buckets) carry none."""
    inputs = _step()  # q lengths 1, 5, 3: one leading decode
    no_mixed_graphs = lambda tokens: 0  # noqa: E731
    layout = cuda_slots.step_layout(inputs, [1, 2, 4, 8], no_mixed_graphs, MAX_SEQS, 16)
    assert (layout.bucket, layout.bounds) == (0, (5, inputs.max_seq_len, 1))
    cu = np.array([0, 1, 2, 7, 8], np.int32)  # decode, decode, chunk of 5, chunk of 1
    assert cuda_slots.leading_decodes(inputs._replace(cu_seqlens_q=cu, max_q_len=5)) == 2
    assert cuda_slots.leading_decodes(inputs._replace(cu_seqlens_q=np.array([0, 4, 5], np.int32))) == 0
    decode = inputs._replace(cu_seqlens_q=np.array([0, 1, 2], np.int32), max_q_len=1)
    assert cuda_slots.leading_decodes(decode) == 0  # decode-only: the decode kernel runs it whole
    assert cuda_slots.graph_layout(8, "mixed", MAX_SEQS, 16).bounds[2] == 0
    assert cuda_slots.step_layout(inputs, [1, 2, 4, 8], lambda tokens: 16, MAX_SEQS, 16).bounds[2] == 0


def test_a_verify_step_pads_to_a_token_bucket_with_a_sample_per_token():
    """A verify step (more samples than sequences) takes the verify bucket, not a mixed graph's layout
    (whose sample rows stop at its sequence rows); with none it runs at its own shape."""
    inputs = _step()  # 9 tokens, 3 sequences
    verify = inputs._replace(logits_indices=np.arange(7, dtype=np.int64))  # 7 samples
    never = lambda tokens: 0  # noqa: E731
    layout = cuda_slots.step_layout(verify, [1, 2, 4, 8], lambda tokens: 16, MAX_SEQS, 16, lambda tokens: 16)
    assert (layout.bucket, layout.part, layout.shape) == (16, "verify", cuda_slots.Shape(16, MAX_SEQS, 16))
    eager = cuda_slots.step_layout(verify, [1, 2, 4, 8], lambda tokens: 16, MAX_SEQS, 16, never)
    assert (eager.bucket, eager.shape) == (0, cuda_slots.Shape(9, 3, 7))
    assert cuda_slots.verify_buckets(8192, 160) == [16, 24, 32, 48, 64, 96, 128, 192]
    assert cuda_slots.verify_buckets(128, 4096)[-1] == 128  # never past the token budget
