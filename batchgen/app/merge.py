"""``batchgen merge OUTPUT``: check that every shard of OUTPUT is complete, then join them in input order.

Shards cover contiguous row ranges, so input order is shard order with each shard's records sorted by
(index, sample). JSONL shards are sorted through their byte offsets (memory: 16 bytes a record, never
the records themselves); a Parquet shard is sorted as one table. The merged file is written to a
temporary name, synced and renamed, and gets a complete state like an unsharded run's, so ``status``
reports it and re-running the unsharded command on it has nothing to do.

A kill at any point leaves something a re-run finishes: the shards are only read, a temporary file is
only ever renamed by the merge that just synced it (a re-run starts it afresh), and the target never
stands without a state (see ``_install``). Merging is deterministic, so the re-run writes the same bytes.
"""

from __future__ import annotations

import logging
import os
from dataclasses import replace
from functools import partial
from pathlib import Path

from batchgen.app.error_kinds import ErrorKinds
from batchgen.app.errors import FatalError, storage_failure
from batchgen.app.shards import merged_output, shard_of_path, shard_pattern
from batchgen.app.status import find_shards, run_phase
from batchgen.io.checkpoint import OutputLock, RunState, diff_fingerprints, load_state, save_state
from batchgen.io.durable import fsync_dir, naming, remove_quietly
from batchgen.io.faults import Faults
from batchgen.io.openai_output import line_order
from batchgen.io.records import sorted_spans
from batchgen.io.writers import has_records, join_parquet, output_format

log = logging.getLogger("batchgen")


def merge(output: str, into: str | None = None, count: int | None = None, overwrite: bool = False) -> str:
    """Write the merged shards of OUTPUT to ``into`` (default: OUTPUT, ``{shard}`` -> ``all``).
    ``count``: which shard count to merge when shards of several counts exist."""
    try:
        return _merge(output, into, count, overwrite)
    except OSError as exc:  # a full disk: the shards are untouched, the partial merged file removed
        raise storage_failure(exc) from exc


def _merge(output: str, into: str | None, count: int | None, overwrite: bool) -> str:
    target = into or merged_output(output)
    fmt = output_format(target)
    shards = complete_shards(output, count)
    Path(target).absolute().parent.mkdir(parents=True, exist_ok=True)
    locks = [OutputLock(p) for p in [target, *(p for p, _ in shards)]]
    try:
        for lock in locks:  # no run may write the target or a shard while they are merged
            lock.acquire()
    except RuntimeError as exc:
        for lock in locks:
            lock.release()
        raise FatalError(str(exc)) from None
    tmp = Path(f"{target}.merging")
    try:
        remove_quietly(tmp)  # a killed merge's: only a merge holding the target's lock writes it
        shards = complete_shards(output, count)  # as they are now that nothing else writes them
        paths = [p for p, s in shards if s.records or os.path.exists(p)]  # an empty shard may have no file
        if any(output_format(p) != fmt for p in paths):
            raise FatalError(f"the shards of {output} are not {fmt} files like {target}")
        state = _merged_state([s for _, s in shards])
        check_target(target, state.fingerprint, overwrite)
        faults = Faults.from_env()
        _write_merged(paths, fmt, tmp, faults)
        _install(tmp, target, state, faults)
    finally:
        for lock in locks:
            lock.release()
    log.info("merged %d shards of %s into %s", len(shards), output, target)
    return target


def _write_merged(paths: list[str], fmt: str, tmp: Path, faults: Faults) -> None:
    """The shards' records in input order, into ``tmp``, synced."""
    if fmt == "jsonl":
        _merge_jsonl(paths, tmp, faults)
    else:
        hook = partial(faults.hit, "merge-torn")
        join_parquet([Path(p) for p in paths], tmp, sort=True, opener=faults.open, after_part=hook)
    faults.hit("merge-synced")


def _install(tmp: Path, target: str, state: RunState, faults: Faults) -> None:
    """Rename the synced merged file into place. The job's state, marked incomplete, is saved first: a
    kill after the rename leaves the merged file beside a state of this job (never beside none, which
    would read as a user's file), and a re-run accepts the target as its own and merges again."""
    try:
        save_state(target, replace(state, complete=False), faults.open_small)
    except OSError:
        remove_quietly(tmp)  # on a full disk its space is what the next try lacks
        raise
    faults.hit("merge-pending")
    os.replace(tmp, target)
    fsync_dir(Path(target).absolute().parent)  # the rename is durable before the state says complete
    faults.hit("merge-renamed")
    save_state(target, state, faults.open_small)


def check_target(target: str, fingerprint: dict, overwrite: bool) -> RunState | None:
    """Replace only what a run of the same job wrote (a previous merge, finished or killed, an unsharded
    run): its state, None when there is nothing to keep; a FatalError when the target holds anything
    else."""
    if overwrite or not has_records(target):
        return None
    old = load_state(target)
    if old is None:
        raise FatalError(f"{target} exists but was not written by batchgen: pass --overwrite or --into")
    diffs = diff_fingerprints(old.fingerprint, fingerprint)
    if diffs:
        raise FatalError(f"{target} holds another job ({'; '.join(diffs)}): pass --overwrite or --into")
    return old


def complete_shards(output: str, count: int | None = None) -> list[tuple[str, RunState]]:
    """Every shard of OUTPUT, all complete, all of one count and one job; else a FatalError saying why."""
    runs = find_shards(output)
    if not runs:
        raise FatalError(f"no shards of {output} found (looked for {shard_pattern(output)})")
    tags = {path: shard_of_path(path) for path, _ in runs}
    counts = sorted({t.count for t in tags.values()})
    if count is None and len(counts) > 1:
        raise FatalError(f"{output} has shards of {counts} shards each: pick one with --count")
    count = count or counts[0]
    runs = [r for r in runs if tags[r[0]].count == count]
    have = {tags[p].index for p, _ in runs}
    missing = sorted(set(range(count)) - have)
    if missing:
        raise FatalError(f"{len(missing)} of {count} shards of {output} have not run: {_list(missing)}")
    unfinished = [f"{p} ({run_phase(p, s)})" for p, s in runs if not s.complete]
    if unfinished:
        raise FatalError(f"shards not complete: {'; '.join(unfinished[:3])}: re-run them, then merge")
    runs = sorted(runs, key=lambda r: tags[r[0]].index)
    first = _job(runs[0][1])
    for path, st in runs[1:]:
        diffs = diff_fingerprints(first, _job(st))
        if diffs:
            raise FatalError(f"{path} was run with other settings than shard 0 ({'; '.join(diffs)})")
    _check_parts(output, [st.fingerprint.get("part") for _, st in runs])
    return runs


def _check_parts(output: str, parts: list) -> None:
    """The shards' rows must follow each other from row 0 (one --limit for all), only the last open-ended."""
    expected = 0
    for i, part in enumerate(parts):
        if part is None or part[0] != expected or (part[1] is None and i < len(parts) - 1):
            shown = ", ".join(f"[{p[0]}, {'end' if p[1] is None else p[1]})" for p in parts if p)
            hint = "were they run with different --limit? re-run the odd ones with --overwrite"
            raise FatalError(f"the shards of {output} do not tile the input (rows {shown}): {hint}")
        expected = part[1]


def _job(state: RunState) -> dict:
    """A shard's fingerprint without its own rows (what every shard of one job shares)."""
    return {k: v for k, v in state.fingerprint.items() if k not in ("row_start", "part", "split")}


def _list(indices: list[int]) -> str:
    shown = ", ".join(map(str, indices[:10]))
    return shown + (f" and {len(indices) - 10} more" if len(indices) > 10 else "")


def _merge_jsonl(paths: list[str], out: Path, faults: Faults) -> None:
    try:
        with naming(out), faults.open(out, "wb") as dst:
            for path in paths:
                with open(path, "rb") as src:
                    for start, length in sorted_spans(path, line_order):
                        src.seek(start)
                        line = src.read(length)
                        dst.write(line if line.endswith(b"\n") else line + b"\n")
                dst.flush()  # so that a kill here leaves a torn temporary file, not an empty one
                faults.hit("merge-torn")
            dst.flush()
            os.fsync(dst.fileno())
    except OSError:
        remove_quietly(out)
        raise


# The counts a merged state adds up over its shards; rates too: data-parallel workers run side by side.
_SUMMED = ("rows_done", "records", "errors", "prompt_tokens", "completion_tokens", "failed_rows", "skipped",
           "rate_tok_s")  # fmt: skip


def _merged_state(states: list[RunState]) -> RunState:
    """The state an unsharded run of the same job would have left (shard 0 starts at row 0)."""
    first, last = states[0], states[-1]
    fingerprint = {**_job(first), "row_start": 0}  # what the unsharded command's fingerprint is
    merged = RunState(fingerprint, n=first.n, exhausted=last.exhausted, complete=True)
    known = all(s.total_rows is not None for s in states)
    merged.total_rows = sum(s.total_rows for s in states) if known else None
    for name in _SUMMED:
        setattr(merged, name, sum(getattr(s, name) for s in states))
    errors = ErrorKinds()
    for s in states:
        for reason, count in s.finish_reasons.items():
            merged.finish_reasons[reason] = merged.finish_reasons.get(reason, 0) + count
        for message, rows in s.error_counts.items():
            errors.add(message, rows)
    merged.error_counts = errors.as_counts()
    merged.started = min(s.started for s in states)
    return merged
