"""The output record of one (row, sample): field names and order, shared by every writer."""

from __future__ import annotations

from typing import Any, NamedTuple

import orjson


class RowKey(NamedTuple):
    """What the engine carries, opaque, from a row to its outputs."""

    id: Any
    kept: dict[str, Any]


def make_record(
    *,
    row_id: Any,
    index: int,
    sample: int,
    completion: str,
    finish_reason: str,
    prompt_tokens: int,
    completion_tokens: int,
    error: str | None = None,
    kept: dict[str, Any] | None = None,
    token_ids: list[int] | None = None,
    logprobs: list[float] | None = None,
) -> dict[str, Any]:
    """A record in the documented field order; optional fields only when asked for (or, ``error``, set)."""
    record: dict[str, Any] = {
        "id": row_id,
        "index": index,
        "sample": sample,
        "completion": completion,
        "finish_reason": finish_reason,
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
    }
    if error is not None:
        record["error"] = error
    if kept:
        record.update(kept)
    if token_ids is not None:
        record["token_ids"] = [int(t) for t in token_ids]
    if logprobs is not None:
        record["logprobs"] = [float(x) for x in logprobs]
    return record


def dumps_line(record: dict[str, Any]) -> bytes:
    """One JSONL line; values orjson cannot encode (e.g. Decimal from Parquet) become strings."""
    return orjson.dumps(record, default=str, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n"
