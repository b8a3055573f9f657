"""Incremental, crash-safe output writers.

JSONL: records are appended; ``flush`` makes them durable (fsync). A crash, or a write that fails (a
full disk), can leave a torn last line, which ``recover`` cuts off. Parquet: each ``flush`` writes the
buffered records as one durable part file under ``OUTPUT.batchgen/parts/`` (tmp + fsync + rename);
``finish`` joins the parts into one readable ``OUTPUT`` at the end. Both ``recover`` what a previous run
left: the records already there. A failed write raises an OSError naming its file; what was durable
stays so, a failed temporary file is removed, and nothing is retried (``close`` drops what was not
flushed: after a failed fsync, a retry could report success for data the kernel already discarded).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

import orjson

from batchgen.io.checkpoint import sidecar_dir
from batchgen.io.durable import Opener, fsync_dir, naming, remove_quietly
from batchgen.io.faults import Faults
from batchgen.io.records import dumps_line

OUTPUT_SUFFIXES = (".jsonl", ".parquet")
_SPILL = 1 << 20  # JSONL bytes buffered before they are written out (flush writes the rest)
# What recovery reads back of each existing record.
# What a resume reads back of each record (the error: a finished run names its commonest, app/outcome.py)
SCAN_FIELDS = ("index", "sample", "finish_reason", "prompt_tokens", "completion_tokens", "error")


class OutputError(ValueError):
    """The OUTPUT argument is unusable: a usage error."""


class Writer(Protocol):
    path: str

    def recover(self) -> Iterator[dict[str, Any]]: ...

    def write(self, record: dict[str, Any]) -> None: ...

    def flush(self) -> None: ...

    def finish(self) -> None: ...

    def close(self) -> None: ...


def output_format(path: str) -> str:
    for suffix in OUTPUT_SUFFIXES:
        if path.lower().endswith(suffix):
            return suffix[1:]
    raise OutputError(f"unknown output format {path!r}: expected .jsonl or .parquet")


def open_output(path: str, faults: Faults | None = None) -> Writer:
    fmt = output_format(path)
    return JsonlWriter(path, faults) if fmt == "jsonl" else ParquetWriter(path, faults)


def has_records(path: str) -> bool:
    """Whether a previous run left anything (the output, Parquet parts, or an OpenAI Batch run's records)."""
    side = sidecar_dir(path)
    parts = side / "parts"
    return (
        os.path.exists(path)
        or (side / "records.jsonl").exists()
        or (parts.is_dir() and any(parts.glob("part-*.parquet")))
    )


def remove_output(path: str) -> None:
    """--overwrite: the output and everything in its sidecar except the lock we hold."""
    if os.path.exists(path):
        os.remove(path)
    side = sidecar_dir(path)
    if side.is_dir():
        for entry in side.iterdir():
            if entry.name != "lock":
                shutil.rmtree(entry) if entry.is_dir() else entry.unlink()


# -- JSONL -----------------------------------------------------------------------------------------------
class JsonlWriter:
    def __init__(self, path: str, faults: Faults | None = None) -> None:
        self.path = path
        self.faults = faults or Faults()
        self._f = None  # unbuffered: the buffer is ours, so a failed write leaves nothing to retry at close
        self._pending = bytearray()
        self._unsynced = False  # records written since the last fsync
        self.synced_bytes = 0  # the file's size at the last fsync: what a power loss cannot take
        self.dropped_bytes = 0  # torn tail cut off by recover()

    def recover(self) -> Iterator[dict[str, Any]]:
        """Yield the existing records' scan fields; cut the file after the last whole record."""
        if not os.path.exists(self.path):
            return
        good_end = 0
        with naming(self.path), open(self.path, "r+b") as f:
            for line in f:
                record = whole_record(line)
                if record is None:
                    break
                good_end += len(line)
                yield {k: record.get(k) for k in SCAN_FIELDS}
            size = f.seek(0, os.SEEK_END)
            if size > good_end:
                self.dropped_bytes = size - good_end
                f.truncate(good_end)
                f.flush()
                os.fsync(f.fileno())

    def write(self, record: dict[str, Any]) -> None:
        line = dumps_line(record)
        if self.faults.due("torn"):
            self._pending += line[: len(line) // 2]
            self._write_out()
            self.faults.kill()
        self._pending += line
        self._unsynced = True
        if len(self._pending) >= _SPILL:
            self._write_out()

    def _write_out(self) -> None:
        with naming(self.path):
            if self._f is None:
                self._f = self.faults.open(self.path, "ab", buffering=0)
                self.synced_bytes = self._f.tell()  # what an earlier run left counts as durable
            while self._pending:  # a write may take only part of it (a disk filling up)
                del self._pending[: self._f.write(self._pending)]

    def flush(self) -> None:
        if not self._unsynced:  # nothing new: no fsync (and no 'flush' fault point)
            return
        self._write_out()
        self.faults.hit("flush", lambda: {"synced_bytes": self.synced_bytes})
        with naming(self.path):
            os.fsync(self._f.fileno())
        self._unsynced = False
        self.synced_bytes = self._f.tell()

    def finish(self) -> None:
        self.flush()
        if not os.path.exists(self.path):  # a run with nothing to write still leaves a (valid) file
            Path(self.path).touch()

    def close(self) -> None:
        """Close the file; records not flushed are dropped (they are redone on resume)."""
        self._pending.clear()
        if self._f is not None:
            self._f.close()
            self._f = None


def whole_record(line: bytes) -> dict[str, Any] | None:
    """A complete, parseable record line, else None (torn or garbage: the tail from here is dropped)."""
    if not line.endswith(b"\n"):
        return None
    try:
        record = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(record, dict) or not isinstance(record.get("index"), int):
        return None
    return record


# -- Parquet ---------------------------------------------------------------------------------------------
class ParquetWriter:
    def __init__(self, path: str, faults: Faults | None = None) -> None:
        self.path = path
        self.faults = faults or Faults()
        self.parts = sidecar_dir(path) / "parts"
        self._buffer: list[dict[str, Any]] = []
        self._next = 0

    def part_files(self) -> list[Path]:
        return sorted(self.parts.glob("part-*.parquet")) if self.parts.is_dir() else []

    def recover(self) -> Iterator[dict[str, Any]]:
        self._settle_final()
        for tmp in self.parts.glob("*.tmp"):
            tmp.unlink()  # a part whose write was cut short: its records are redone
        files = self.part_files()
        self._next = int(files[-1].stem.split("-")[1]) + 1 if files else 0
        for part in files:
            yield from _scan_parquet(part)

    def _settle_final(self) -> None:
        """Make the parts directory the single place records live while a run goes on."""
        final = Path(self.path)
        if final.exists() and self.parts.is_dir():
            shutil.rmtree(self.parts)  # finish() renamed the final file in but died before this cleanup
        self.parts.mkdir(parents=True, exist_ok=True)
        if final.exists():  # a finished run asked for more rows: its file becomes the first part
            os.replace(final, self.parts / "part-000000.parquet")
            fsync_dir(self.parts)
            fsync_dir(final.parent)

    def write(self, record: dict[str, Any]) -> None:
        self._buffer.append(record)

    def flush(self) -> None:
        if not self._buffer:
            return
        import pyarrow.parquet as pq

        self.parts.mkdir(parents=True, exist_ok=True)
        table = records_to_table(self._buffer)
        part = self.parts / f"part-{self._next:06d}.parquet"
        tmp = part.with_name(part.name + ".tmp")
        try:
            with naming(tmp), self.faults.open(tmp, "wb") as f:
                pq.write_table(table, f)
                f.flush()
                os.fsync(f.fileno())
        except OSError:
            remove_quietly(tmp)
            raise
        self.faults.hit("part")
        os.replace(tmp, part)
        fsync_dir(self.parts)
        self._next += 1
        self._buffer.clear()

    def finish(self) -> None:
        """Join the parts, in completion order, into OUTPUT (tmp + rename), then drop the parts."""
        self.flush()
        tmp = Path(self.path + ".tmp")
        join_parquet(self.part_files(), tmp, opener=self.faults.open)
        os.replace(tmp, self.path)
        fsync_dir(Path(self.path).absolute().parent)
        self.faults.hit("finalize")
        shutil.rmtree(self.parts, ignore_errors=True)

    def close(self) -> None:
        self._buffer.clear()


def _scan_parquet(path: Path) -> Iterator[dict[str, Any]]:
    import pyarrow.parquet as pq

    with pq.ParquetFile(path) as pf:
        for batch in pf.iter_batches(columns=list(SCAN_FIELDS)):
            yield from batch.to_pylist()


# Standard fields get fixed types so that every part agrees; ids and kept columns are inferred.
def _fixed_types() -> dict[str, Any]:
    import pyarrow as pa

    alternative = pa.struct([("token_id", pa.int64()), ("token", pa.string()), ("logprob", pa.float64())])
    return {
        "index": pa.int64(),
        "sample": pa.int64(),
        "completion": pa.string(),
        "reasoning": pa.string(),  # null where an output had no thinking block (a whole null column too)
        "finish_reason": pa.string(),
        "prompt_tokens": pa.int64(),
        "completion_tokens": pa.int64(),
        "error": pa.string(),
        "token_ids": pa.list_(pa.int64()),
        "logprobs": pa.list_(pa.float64()),
        "top_logprobs": pa.list_(pa.list_(alternative)),
        "prompt_logprobs": pa.list_(pa.float64()),
        "prompt_top_logprobs": pa.list_(pa.list_(alternative)),
    }


def records_to_table(records: list[dict[str, Any]]):
    import pyarrow as pa

    # ``error`` is always a column (null when fine): a Parquet schema should not depend on luck
    names = dict.fromkeys(("id", "index", "sample", "completion"))
    if any("reasoning" in r for r in records):  # a run with a reasoning parser: every record has it
        names["reasoning"] = None
    names.update(dict.fromkeys(("finish_reason", "prompt_tokens", "completion_tokens", "error")))
    for r in records:
        names.update(dict.fromkeys(r))
    fixed = _fixed_types()
    arrays = []
    for name in names:
        values = [r.get(name) for r in records]
        try:
            arrays.append(pa.array(values, type=fixed.get(name)))
        except (pa.ArrowInvalid, pa.ArrowTypeError):  # mixed types in one column: keep them as text
            arrays.append(pa.array([None if v is None else _as_text(v) for v in values], type=pa.string()))
    return pa.Table.from_arrays(arrays, names=list(names))


def _as_text(value: Any) -> str:
    return value if isinstance(value, str) else orjson.dumps(value, default=str).decode()


def join_parquet(
    parts: list[Path],
    out: Path,
    sort: bool = False,
    opener: Opener = open,
    after_part: Callable[[], None] | None = None,
) -> None:
    """Stream the parts into one file under their unified schema (memory: one row group at a time).
    ``sort``: each part is sorted by (index, sample) on the way (memory: one part at a time). A failed
    write removes ``out``. ``after_part``: called once each part is written (a fault point's hook)."""
    import pyarrow.parquet as pq

    schemas = [pq.read_schema(p) for p in parts]
    schema = _unify(schemas) if schemas else records_to_table([]).schema
    try:
        with naming(out), opener(out, "wb") as f:
            _write_joined(f, parts, schema, sort, after_part)
            f.flush()
            os.fsync(f.fileno())
    except OSError:
        remove_quietly(out)
        raise


def _write_joined(
    f: Any, parts: list[Path], schema: Any, sort: bool, after_part: Callable[[], None] | None
) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    with pq.ParquetWriter(f, schema) as writer:
        for part in parts:
            for table in _part_tables(part, sort):
                writer.write_table(_conform(table, schema))
            if after_part is not None:
                after_part()
        if not parts:
            writer.write_table(pa.Table.from_pylist([], schema=schema))


def _part_tables(part: Path, sort: bool) -> Iterator[Any]:
    import pyarrow.parquet as pq

    if sort:
        yield pq.read_table(part).sort_by([("index", "ascending"), ("sample", "ascending")])
        return
    with pq.ParquetFile(part) as pf:
        for group in range(pf.num_row_groups):
            yield pf.read_row_group(group)


def _unify(schemas: list[Any]):
    import pyarrow as pa

    try:
        return pa.unify_schemas(schemas, promote_options="permissive")
    except (pa.ArrowInvalid, pa.ArrowTypeError):  # e.g. ids that are ints in one part, text in another
        merged = pa.unify_schemas([_loosen(s) for s in schemas], promote_options="permissive")
        return merged


def _loosen(schema):
    import pyarrow as pa

    fixed = _fixed_types()
    return pa.schema([f if f.name in fixed else pa.field(f.name, pa.string()) for f in schema])


def _conform(table, schema):
    """``table`` with ``schema``'s columns, in its order, missing ones null, types cast."""
    import pyarrow as pa
    import pyarrow.compute as pc

    columns = []
    for field in schema:
        if field.name not in table.column_names:
            columns.append(pa.nulls(table.num_rows, type=field.type))
            continue
        col = table.column(field.name)
        if col.type != field.type:
            col = pc.cast(col, field.type) if not pa.types.is_string(field.type) else _text_column(col)
        columns.append(col)
    return pa.Table.from_arrays(columns, schema=schema)


def _text_column(col):
    import pyarrow as pa

    return pa.array([None if v is None else _as_text(v) for v in col.to_pylist()], type=pa.string())
