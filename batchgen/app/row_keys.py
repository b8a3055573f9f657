"""Every row's keys, checked before the model loads.

A key that is a near miss of a sampling parameter (``temprature``) or names one batchgen lacks
(``best_of``) would otherwise reach the rows that carry it hours into a run. A JSONL file is read once
through, over the rows this run (or shard) owns, before anything loads; each distinct set of keys is
checked once, so the pass costs about one read of the input. Parquet's keys are its schema's columns,
checked whole with the schema (``run.check_input``). A stream (stdin) is read once: its head is checked
before the model loads and a later row with such a key fails as its own error record. OpenAI Batch
requests are checked one by one, each failing as its own error line.
"""

from __future__ import annotations

from typing import Any

from batchgen.app.options import RunOptions
from batchgen.io.readers import Reader
from batchgen.io.stdin_reader import STDIN


def row_label(index: int, row: dict[str, Any], id_column: str | None) -> str:
    """How a refusal names a row: its number and, where it has one, its id."""
    row_id = row.get(id_column or "id")
    return f"row {index}" + ("" if row_id is None else f" (id {row_id!r})")


def check_every_row_key(reader: Reader, opts: RunOptions) -> None:
    """``UnknownKey`` for the first row, in input order, whose keys hold a parameter's near miss."""
    if opts.batch_api or opts.input == STDIN or reader.schema_columns() is not None:
        return
    checked: set[frozenset[str]] = set()
    for index, row in reader.iter_rows(opts.row_start, opts.row_stop):
        if not isinstance(row, dict):
            continue
        keys = frozenset(row)
        if keys not in checked:
            opts.spec.check_keys(row, row_label(index, row, opts.spec.id_column))
            checked.add(keys)
