import pytest

from batchgen.config import SamplingParams
from batchgen.engine.block_manager import BlockManager
from batchgen.engine.request import Request


def _req(rid, tokens, index=None):
    return Request(
        rid, rid if index is None else index, 0, None, SamplingParams(), list(tokens), len(tokens), 8, 0
    )


def test_grow_release_and_double_free():
    bm = BlockManager(num_blocks=4, block_size=4)
    r = _req(0, range(6))
    assert bm.can_grow(r, 6)
    bm.grow(r, 6)
    assert len(r.block_table) == 2 and bm.num_free == 2
    assert not bm.can_grow(r, 17)
    table = list(r.block_table)
    bm.release(r)
    assert bm.num_free == 4 and r.block_table == []
    r.block_table = table
    with pytest.raises(RuntimeError, match="freed twice"):
        bm.release(r)


def test_prefix_blocks_are_shared_and_survive_release():
    bm = BlockManager(num_blocks=8, block_size=4)
    a = _req(0, range(10))
    bm.grow(a, 10)
    bm.register_full_blocks(a, 10)  # two full blocks findable
    b = _req(1, [*range(8), 99, 98, 97])
    bm.match_prefix(b)
    assert b.block_table == a.block_table[:2] and b.num_computed == 8
    bm.release(a)
    c = _req(2, [*range(8), 5])
    bm.match_prefix(c)  # still cached while b holds them
    assert c.block_table == b.block_table
    bm.release(b)
    bm.release(c)
    d = _req(3, [*range(8), 7])
    bm.match_prefix(d)  # freed blocks keep their content until handed out again
    assert d.num_computed == 8


def test_match_leaves_one_token_to_compute():
    bm = BlockManager(num_blocks=8, block_size=4)
    a = _req(0, range(8))
    bm.grow(a, 8)
    bm.register_full_blocks(a, 8)
    same = _req(1, range(8))
    bm.match_prefix(same)
    assert same.num_computed == 4  # the last block is recomputed so the prefill ends with logits


def test_evicted_block_is_no_longer_matched():
    bm = BlockManager(num_blocks=2, block_size=4)
    a = _req(0, range(5))
    bm.grow(a, 5)
    bm.register_full_blocks(a, 5)
    bm.release(a)
    other = _req(1, range(50, 58))
    bm.grow(other, 8)  # takes both blocks, evicting a's cached one
    b = _req(2, range(5))
    bm.match_prefix(b)
    assert b.num_computed == 0


def test_no_prefix_caching_still_shares_within_a_row():
    bm = BlockManager(num_blocks=8, block_size=4, prefix_caching=False)
    a = _req(0, range(9), index=5)
    bm.grow(a, 9)
    bm.register_full_blocks(a, 9)
    sibling = _req(1, range(9), index=5)
    bm.match_prefix(sibling)
    stranger = _req(2, range(9), index=6)
    bm.match_prefix(stranger)
    assert sibling.num_computed == 8 and stranger.num_computed == 0
