"""``batchgen status OUTPUT``: rows done / total, errors, tokens, last rate — of one run or of its shards."""

from __future__ import annotations

import glob
import os
import re
import time
from dataclasses import asdict
from typing import Any

from batchgen.app.errors import FatalError
from batchgen.app.outcome import commonest_text
from batchgen.app.shards import shard_name_regex, shard_of_path, shard_pattern
from batchgen.io.checkpoint import RunState, is_locked, load_state, sidecar_dir

_SHARD_TAG = re.compile(r"\.shard-\d{5}-of-\d{5}")


def find_runs(output: str) -> list[tuple[str, RunState]]:
    """(output path, state) of OUTPUT itself, else of each of its shards."""
    state = load_state(output)
    if state is not None:
        return [(output, state)]
    return find_shards(output)


def find_shards(output: str) -> list[tuple[str, RunState]]:
    """(shard output path, state) of each shard run of OUTPUT, in name (= shard) order."""
    runs = []
    name = shard_name_regex(output)
    for side in sorted(glob.glob(shard_pattern(output) + ".batchgen")):
        path = side[: -len(".batchgen")]
        if not name.fullmatch(path):
            continue
        shard_state = load_state(path)
        if shard_state is not None:
            runs.append((path, shard_state))
    return runs


def run_phase(output: str, state: RunState) -> str:
    if state.complete:
        return "complete"
    if is_locked(output):
        return f"running (pid {state.pid} on {state.host})"
    return "interrupted (re-run the same command to resume)"


def status_data(output: str) -> dict[str, Any]:
    runs = _newest_shard_count(find_runs(output))
    if not runs:
        raise FatalError(f"no batchgen run found for {output} (no {sidecar_dir(output)}/state.json)")
    entries = [{"output": path, "phase": run_phase(path, st), **asdict(st)} for path, st in runs]
    for entry in entries:
        entry.pop("fingerprint")
    summed = ("rows_done", "records", "errors", "failed_rows", "completion_tokens")
    totals = {k: sum(e[k] for e in entries) for k in summed}
    known = all(e["total_rows"] is not None for e in entries)
    totals["total_rows"] = sum(e["total_rows"] for e in entries) if known else None
    totals["complete"] = all(e["complete"] for e in entries)
    return {"output": output, "runs": entries, "totals": totals}


def _newest_shard_count(runs: list[tuple[str, RunState]]) -> list[tuple[str, RunState]]:
    """Shards of one count only (leftovers of an earlier split must not add up): the latest updated."""
    counts: dict[int, list[tuple[str, RunState]]] = {}
    for path, st in runs:
        shard = shard_of_path(path)
        counts.setdefault(shard.count if shard else 0, []).append((path, st))
    return max(counts.values(), key=lambda group: max(st.updated for _, st in group)) if counts else []


def status_text(data: dict[str, Any]) -> str:
    lines = [_run_text(e) for e in data["runs"]]
    if len(data["runs"]) > 1:
        t = data["totals"]
        lines.append(
            f"all {len(data['runs'])} shards: {_rows(t['rows_done'], t['total_rows'])}, "
            f"{t['records']} records, {t['errors']} errors, {t['completion_tokens']} tokens out"
            + (" — complete" if t["complete"] else "")
        )
    return "\n".join(lines)


def _rows(done: int, total: int | None) -> str:
    return f"{done}/{total} rows ({100 * done / total:.1f}%)" if total else f"{done}/? rows"


def _run_text(e: dict[str, Any]) -> str:
    age = time.time() - e["updated"]
    updated = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(e["updated"]))
    reasons = ", ".join(f"{k} {v}" for k, v in sorted(e["finish_reasons"].items())) or "none"
    return (
        f"{os.fspath(e['output'])}: {e['phase']}\n"
        f"  rows       {_rows(e['rows_done'], e['total_rows'])}\n"
        f"  records    {e['records']} ({e['errors']} errors; finish reasons: {reasons})\n"
        f"  tokens     {e['prompt_tokens']} in, {e['completion_tokens']} out\n"
        f"{_failed_text(e)}"
        f"  rate       {e['rate_tok_s']:.1f} tok/s out in the last run, saved {updated} ({age:.0f} s ago)"
    )


def _failed_text(e: dict[str, Any]) -> str:
    """The failed rows and their commonest error, when there are any."""
    if not e["failed_rows"]:
        return ""
    return f"  failed     {e['failed_rows']} rows{commonest_text(e['error_counts'])}\n"
