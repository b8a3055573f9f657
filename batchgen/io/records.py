"""The output record of one (row, sample): field names and order, shared by every writer."""

from __future__ import annotations

from array import array
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
import orjson


class RowKey(NamedTuple):
    """What the engine carries, opaque, from a row to its outputs."""

    id: Any
    kept: dict[str, Any]
    n: int | None = None  # the row's samples when it asks for another number than the run's


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
    top_logprobs: list[list[dict[str, Any]]] | None = None,
    prompt_logprobs: list[float | None] | None = None,
    prompt_top_logprobs: list[list[dict[str, Any]] | None] | None = None,
    reasoning: str | None = None,
    with_reasoning: bool = False,  # a reasoning parser is active: ``reasoning`` is a field (null: no block)
) -> dict[str, Any]:
    """A record in the documented field order; optional fields only when asked for (or, ``error``, set)."""
    record: dict[str, Any] = {"id": row_id, "index": index, "sample": sample, "completion": completion}
    if with_reasoning:
        record["reasoning"] = reasoning
    record["finish_reason"] = finish_reason
    record["prompt_tokens"], record["completion_tokens"] = prompt_tokens, completion_tokens
    if error is not None:
        record["error"] = error
    if kept:
        record.update(kept)
    if token_ids is not None:
        record["token_ids"] = [int(t) for t in token_ids]
    if logprobs is not None:
        record["logprobs"] = [float(x) for x in logprobs]
    optional = {"top_logprobs": top_logprobs, "prompt_logprobs": prompt_logprobs}
    optional["prompt_top_logprobs"] = prompt_top_logprobs
    record.update((name, value) for name, value in optional.items() if value is not None)
    return record


def alternatives(entries: list[tuple[int, float]], texts: list[str]) -> list[dict[str, Any]]:
    """One position's most likely tokens as records hold them: ``{"token_id", "token", "logprob"}``."""
    return [
        {"token_id": int(token), "token": text, "logprob": float(logprob)}
        for (token, logprob), text in zip(entries, texts, strict=True)
    ]


def dumps_line(record: dict[str, Any]) -> bytes:
    """One JSONL line; values orjson cannot encode (e.g. Decimal from Parquet) become strings."""
    return orjson.dumps(record, default=str, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n"


def record_order(record: dict[str, Any]) -> tuple[int, int]:
    return record["index"], record["sample"]


def sorted_spans(path: str, order: Callable[[dict[str, Any]], tuple[int, int]] = record_order) -> np.ndarray:
    """[lines, 2] (byte offset, length) of a JSONL file's lines sorted by ``order`` (default: (index,
    sample)); memory holds 32 bytes a line, never the records themselves."""
    index, sample, start, length = (array("q") for _ in range(4))
    pos = 0
    with open(path, "rb") as f:
        for line in f:
            if line.strip():
                first, second = order(orjson.loads(line))
                index.append(first)
                sample.append(second)
                start.append(pos)
                length.append(len(line))
            pos += len(line)
    keys = np.frombuffer(sample, np.int64), np.frombuffer(index, np.int64)
    spans = np.stack([np.frombuffer(start, np.int64), np.frombuffer(length, np.int64)], axis=1)
    return spans[np.lexsort(keys)]
