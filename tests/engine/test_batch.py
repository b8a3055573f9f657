"""The batch builder on a hand-worked step: positions, slots, block tables, cumulative lengths; the
persistent rows it gathers from."""

import numpy as np

from batchgen.config import SamplingParams
from batchgen.engine.batch import build_step
from batchgen.engine.request import Request
from batchgen.engine.rows import RowState
from batchgen.engine.scheduler import ScheduledItem, ScheduledStep, decodes_of


def _req(rid: int, tokens: list[int], num_prompt: int, blocks: list[int], **kw) -> Request:
    return Request(
        rid, rid, 0, None, SamplingParams(**kw), tokens, num_prompt, 16, 1234 + rid, block_table=blocks
    )


def _rows(*reqs: Request, num_rows: int = 2) -> RowState:
    """A persistent batch holding ``reqs`` (claimed in this order; more than ``num_rows`` grows it)."""
    rows = RowState(num_rows, blocks_per_row=2)
    for req in reqs:
        rows.claim(req)
    return rows


def test_hand_worked_mixed_step():
    block_size = 4
    # A: decoding, 6 tokens known, computes position 5 (its last known token) -> samples output #1.
    a = _req(0, [11, 12, 13, 14, 15, 16], num_prompt=5, blocks=[7, 2])
    a.num_pending = 1  # the scheduler counted this step's token
    # B: second prefill chunk of a 9-token prompt: positions 4..8, samples its first token.
    b = _req(1, list(range(100, 109)), num_prompt=9, blocks=[3, 0, 5], temperature=0.7, top_k=5)
    b.num_pending = 1
    # C: first chunk of a long prompt: positions 0..2, no sampling.
    c = _req(2, list(range(200, 210)), num_prompt=10, blocks=[9])
    step = ScheduledStep(
        4, [ScheduledItem(a, 5, 1, True), ScheduledItem(b, 4, 5, True), ScheduledItem(c, 0, 3, False)]
    )

    inputs = build_step(step, block_size, _rows(c, a, b))

    np.testing.assert_array_equal(inputs.input_ids, [16, 104, 105, 106, 107, 108, 200, 201, 202])
    np.testing.assert_array_equal(inputs.positions, [5, 4, 5, 6, 7, 8, 0, 1, 2])
    # slot = block_table[pos // 4] * 4 + pos % 4
    np.testing.assert_array_equal(inputs.slot_mapping, [2 * 4 + 1, 0, 1, 2, 3, 5 * 4 + 0, 36, 37, 38])
    np.testing.assert_array_equal(inputs.cu_seqlens_q, [0, 1, 6, 9])
    np.testing.assert_array_equal(inputs.seq_lens, [6, 9, 3])
    np.testing.assert_array_equal(inputs.block_tables, [[7, 2, 0], [3, 0, 5], [9, 0, 0]])
    np.testing.assert_array_equal(inputs.logits_indices, [0, 5])
    np.testing.assert_array_equal(inputs.carry_rows, [-1] * 9)
    np.testing.assert_array_equal(inputs.rng_steps, [1, 0])
    np.testing.assert_array_equal(inputs.temperature, np.array([0.0, 0.7], np.float32))
    np.testing.assert_array_equal(inputs.top_k, [0, 5])
    assert inputs.features.sampling and not inputs.decode_only
    assert (inputs.max_q_len, inputs.max_seq_len) == (5, 9)
    assert (a.carry_step, a.carry_row, b.carry_step, b.carry_row) == (4, 0, 4, 1)


def test_carry_over_row_points_at_previous_step_output():
    a = _req(0, [1, 2, 3], num_prompt=3, blocks=[0])
    b = _req(1, [4, 5, 6, 7], num_prompt=4, blocks=[1, 6])
    a.num_pending = b.num_pending = 1
    rows = _rows(a, b)
    build_step(ScheduledStep(0, [ScheduledItem(b, 0, 4, True), ScheduledItem(a, 0, 3, True)]), 4, rows)
    # Step 1 is built before step 0's tokens are known: both inputs come from step 0's output.
    a.num_pending = b.num_pending = 2
    inputs = build_step(
        ScheduledStep(1, [ScheduledItem(a, 3, 1, True), ScheduledItem(b, 4, 1, True)]), 4, rows
    )
    np.testing.assert_array_equal(inputs.carry_rows, [1, 0])
    np.testing.assert_array_equal(inputs.positions, [3, 4])
    np.testing.assert_array_equal(inputs.slot_mapping, [3, 6 * 4 + 0])  # b's position 4: its second block


def _two_steps(as_decodes: bool, known: bool):
    """Step 0 prefills a and b; step 1 decodes both (their input tokens known, or carried over), its
    decodes given as items or as the scheduler gives them (arrays of rows and positions) beside a
    prefill chunk of c."""
    a = _req(0, [1, 2, 3], num_prompt=3, blocks=[0])
    b = _req(1, [4, 5, 6, 7], num_prompt=4, blocks=[1, 6], temperature=0.5)
    c = _req(2, list(range(200, 210)), num_prompt=10, blocks=[9])
    a.num_pending = b.num_pending = 1
    rows = _rows(a, b, c)
    build_step(ScheduledStep(0, [ScheduledItem(b, 0, 4, True), ScheduledItem(a, 0, 3, True)]), 4, rows)
    if known:  # step 0's tokens arrived before step 1 was built (the synchronous loop)
        a.add_token(30)
        b.add_token(40)
    else:
        a.num_pending = b.num_pending = 2
    chunk = ScheduledItem(c, 0, 3, False)
    if as_decodes:
        step = ScheduledStep(1, [chunk], decodes_of([a, b], [3, 4], rows))
    else:
        step = ScheduledStep(1, [ScheduledItem(a, 3, 1, True), ScheduledItem(b, 4, 1, True), chunk])
    return build_step(step, 4, rows), (a.carry_step, a.carry_row, b.carry_step, b.carry_row)


def test_decodes_as_bare_requests_build_what_items_build():
    for known in (False, True):
        (want, want_carry), (got, got_carry) = _two_steps(False, known), _two_steps(True, known)
        for name, value in want._asdict().items():
            np.testing.assert_array_equal(getattr(got, name), value, err_msg=name)
        assert got_carry == want_carry == (1, 0, 1, 1)
        np.testing.assert_array_equal(got.carry_rows, [-1] * 5 if known else [1, 0, -1, -1, -1])
        np.testing.assert_array_equal(
            got.input_ids, [30, 40, 200, 201, 202] if known else [0, 0, 200, 201, 202]
        )


def test_rows_follow_growing_tables_and_come_back_clean():
    a = _req(0, [1, 2, 3], num_prompt=3, blocks=[4])
    b = _req(1, [1, 2, 3], num_prompt=3, blocks=[5, 6, 7])  # wider than the table: it widens
    rows = _rows(a, b, num_rows=1)  # a second request: the rows double
    assert (a.row, b.row, rows.num_rows) == (0, 1, 2)
    np.testing.assert_array_equal(rows.tables[:, :3], [[4, 0, 0], [5, 6, 7]])
    a.block_table += [8, 9]  # the scheduler syncs after each grow
    rows.sync_table(a)
    np.testing.assert_array_equal(rows.tables[a.row, :3], [4, 8, 9])
    rows.free(a)
    assert a.row == -1 and not rows.tables[0].any()  # the next user's padding is 0
    c = _req(2, [1], num_prompt=1, blocks=[3], temperature=0.5, top_k=7)
    rows.claim(c)
    assert c.row == 0 and rows.tables[0, 0] == 3
    np.testing.assert_array_equal(rows.sampling[0, :3], [0.5, 1.0, 7])
