"""While a run generates, the heap built before it is frozen (app/gc_policy.py): collections walk only
the run's own objects, and the run's garbage is still collected."""

from __future__ import annotations

import gc
import weakref

from click.testing import CliRunner

from batchgen.app import gc_policy
from batchgen.cli import cli
from tests.test_cli import ROWS, write_jsonl


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


def test_batchgen_run_generates_with_the_heap_frozen(tiny_llama, tmp_path, monkeypatch):
    entered = []
    real = gc_policy.frozen_heap

    def spy():
        entered.append(gc.get_freeze_count())
        return real()

    monkeypatch.setattr("batchgen.app.run.frozen_heap", spy)
    inp = write_jsonl(tmp_path / "in.jsonl", ROWS)
    argv = ["run", inp, str(tmp_path / "out.jsonl"), "--model", tiny_llama, "--max-new-tokens", "3"]
    result = CliRunner().invoke(cli, argv, catch_exceptions=False)
    assert result.exit_code == 0, result.stderr
    assert entered == [0] and gc.get_freeze_count() == 0  # entered once, thawed after
