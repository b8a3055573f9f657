import pytest

from batchgen.io.checkpoint import (
    DoneSet,
    OutputLock,
    RunState,
    diff_fingerprints,
    is_locked,
    load_state,
    save_state,
    sidecar_dir,
    state_path,
)


def test_done_set_bits_and_growth():
    done = DoneSet(n=3)
    assert not done.has(5, 1) and done.missing(5) == (0, 1, 2)
    assert done.add(5, 1) and not done.add(5, 1)  # a duplicate is reported
    assert done.has(5, 1) and done.missing(5) == (0, 2) and done.count == 1
    done.add(5, 0)
    done.add(5, 2)
    assert done.row_done(5) and not done.row_done(4) and done.rows_done() == 1
    done.add(100_000, 0)  # grows in place
    assert done.has(100_000, 0) and done.has(5, 2)


def test_done_set_is_a_compact_bitmap():
    done = DoneSet(n=1)
    done.add(1_999_999, 0)
    assert len(done._bits) <= 2 * 2_000_000 // 8


@pytest.mark.parametrize("n", [1, 3])
def test_range_done_matches_row_by_row(n):
    done = DoneSet(n)
    for i in range(40):
        if i != 23:
            for s in range(n):
                done.add(i, s)
    for lo in range(0, 42, 5):
        for hi in range(lo, 45, 7):
            assert done.range_done(lo, hi) == all(done.row_done(i) for i in range(lo, hi)), (lo, hi)


def test_state_roundtrip_is_atomic(tmp_path):
    out = tmp_path / "o.jsonl"
    sidecar_dir(out).mkdir()
    assert load_state(out) is None
    state = RunState({"model": "m"}, n=2, total_rows=10, records=4)
    save_state(out, state)
    loaded = load_state(out)
    assert loaded.fingerprint == {"model": "m"} and loaded.records == 4 and loaded.n == 2
    assert [p.name for p in sidecar_dir(out).iterdir()] == ["state.json"]  # no tmp left behind
    state_path(out).write_text("{torn")
    with pytest.raises(RuntimeError, match="state file"):
        load_state(out)


def test_covers():
    st = RunState({}, total_rows=20, complete=True)
    assert st.covers(10) and st.covers(20) and not st.covers(21) and not st.covers(None)
    assert RunState({}, complete=True, exhausted=True).covers(None)
    assert not RunState({}, complete=False, exhausted=True).covers(None)


def test_diff_fingerprints_names_the_difference():
    old = {"model": "a", "sampling": {"temperature": None, "seed": 0}, "input": {"size": 1}}
    new = {"model": "a", "sampling": {"temperature": 0.7, "seed": 0}, "input": {"size": 2}}
    assert diff_fingerprints(old, new) == ["input size: 1 -> 2", "sampling temperature: (unset) -> 0.7"]
    assert diff_fingerprints(old, old) == []


def test_output_lock_is_exclusive(tmp_path):
    out = tmp_path / "o.jsonl"
    first = OutputLock(out)
    first.acquire()
    assert is_locked(out)
    with pytest.raises(RuntimeError, match="another batchgen run"):
        OutputLock(out).acquire()
    first.release()
    assert not is_locked(out)
    second = OutputLock(out)
    second.acquire()
    second.release()
