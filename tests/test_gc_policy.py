"""While a run generates, the heap built before it is frozen (gc_policy.py): collections walk only
the run's own objects, and the run's garbage is still collected."""

from __future__ import annotations

import gc
import json
import weakref

from click.testing import CliRunner

from batchgen import gc_policy
from batchgen.app import run as run_module
from batchgen.cli import cli
from tests.helpers import ROWS, write_jsonl


class _Cycle:
    def __init__(self) -> None:
        self.me = self


def _garbage_cycle() -> weakref.ref:
    return weakref.ref(_Cycle())  # unreachable at once, but only a collection frees a cycle


def test_what_exists_before_is_frozen_until_the_block_ends():
    before = _garbage_cycle()
    with gc_policy.frozen_heap():  # its first collect frees ``before``: garbage is not frozen
        assert before() is None and gc.get_freeze_count() > 0
    kept = _Cycle()
    old = weakref.ref(kept)
    with gc_policy.frozen_heap():
        del kept  # garbage now, but frozen: no collection walks it
        gc.collect()
        assert old() is not None
    assert gc.get_freeze_count() == 0
    gc.collect()  # thawed: collected again
    assert old() is None


def test_garbage_made_during_the_block_is_collected():
    with gc_policy.frozen_heap():
        made = _garbage_cycle()
        gc.collect()
        assert made() is None


def test_the_young_generation_is_collected_less_often_inside_the_block_only():
    before = gc.get_threshold()
    with gc_policy.frozen_heap():
        assert gc.get_threshold() == (max(gc_policy.YOUNG_OBJECTS, before[0]), *before[1:])
        made = _garbage_cycle()
        for _ in range(2 * gc_policy.YOUNG_OBJECTS):  # enough new objects for one young collection
            _Cycle()
        assert made() is None  # collected without an explicit gc.collect()
    assert gc.get_threshold() == before


def test_pauses_are_timed_per_generation():
    now = [0.0]
    pauses = gc_policy.GcPauses(clock=lambda: now[0])
    for gen, seconds in ((0, 0.001), (0, 0.003), (2, 0.050)):
        pauses("start", {"generation": gen})
        now[0] += seconds
        pauses("stop", {"generation": gen, "collected": 0, "uncollectable": 0})
    assert pauses.summary() == {
        "collections": 3,
        "total_ms": 54.0,
        "longest_ms": 50.0,
        "by_generation": {
            "0": {"count": 2, "total_ms": 4.0, "longest_ms": 3.0},
            "2": {"count": 1, "total_ms": 50.0, "longest_ms": 50.0},
        },
    }
    assert gc_policy.GcPauses().summary()["collections"] == 0


def test_the_blocks_collections_are_recorded_and_the_callback_removed():
    with gc_policy.frozen_heap() as pauses:
        gc.collect()
    assert pauses.summary()["by_generation"]["2"]["count"] == 1
    assert pauses not in gc.callbacks


def test_freezing_can_be_turned_off(monkeypatch):
    monkeypatch.setenv("BATCHGEN_GC_FREEZE", "0")
    with gc_policy.frozen_heap() as pauses:
        assert gc.get_freeze_count() == 0
        gc.collect()
    assert pauses.summary()["collections"] == 1


def test_batchgen_run_generates_with_the_heap_frozen(tiny_llama, tmp_path, monkeypatch):
    """While the engine runs, what existed before is frozen and the young generation is collected less
    often; the collections made then are the ones the stats file reports; afterwards both are undone."""
    monkeypatch.delenv("BATCHGEN_GC_FREEZE", raising=False)
    seen = []  # (frozen objects, generation 0's threshold) as the engine loop starts
    real = run_module._Job._drive

    def drive(self, *args):
        seen.append((gc.get_freeze_count(), gc.get_threshold()[0]))
        gc.collect()  # two full collections while generating: the run's stats must count them
        gc.collect()
        return real(self, *args)

    monkeypatch.setattr(run_module._Job, "_drive", drive)
    thresholds = gc.get_threshold()
    inp = write_jsonl(tmp_path / "in.jsonl", ROWS)
    stats = tmp_path / "stats.json"
    argv = ["run", inp, str(tmp_path / "out.jsonl"), "--model", tiny_llama, "--max-new-tokens", "3"]
    result = CliRunner().invoke(cli, [*argv, "--stats-file", str(stats)], catch_exceptions=False)
    assert result.exit_code == 0, result.stderr
    (frozen, young), *more = seen
    assert not more and frozen > 1000 and young == max(gc_policy.YOUNG_OBJECTS, thresholds[0])
    assert gc.get_freeze_count() == 0 and gc.get_threshold() == thresholds  # thawed and restored after
    pauses = json.loads(stats.read_text())["gc"]  # the collector's pauses while generating
    full = pauses["by_generation"].get("2", {"count": 0})
    assert full["count"] >= 2 and pauses["collections"] >= 2, pauses


def test_a_block_inside_a_frozen_heap_leaves_it_frozen():
    """``batchgen run`` freezes around ``LLM.stream``, which freezes too: the inner block's end must not
    thaw the outer one's heap, nor change the collector's thresholds."""
    with gc_policy.frozen_heap():
        outer = (gc.get_freeze_count(), gc.get_threshold())
        with gc_policy.frozen_heap(collect_first=False):
            assert gc.get_freeze_count() == outer[0]
        assert (gc.get_freeze_count(), gc.get_threshold()) == outer
    assert gc.get_freeze_count() == 0
