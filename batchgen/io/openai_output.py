"""OpenAI Batch output: the run's records -> one response line per request, in input order.

While the run goes on, records are written as for any run, one per (row, sample), to
``OUTPUT.batchgen/records.jsonl``: resume, torn-line recovery and duplicate checks are the same. When the
run completes, ``BatchOutputWriter.finish`` writes OUTPUT from them, sorted by row, all ``n`` choices of a
request in its one line (as OpenAI's batch output file, it exists once the batch is done), through a
temporary file, synced and renamed. Every field is a function of the records and the job, so a run that
was killed and resumed writes the same bytes as one that was not: ``created`` is the input file's
modification time, ids derive from the row's index.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import orjson

from batchgen.io.checkpoint import sidecar_dir
from batchgen.io.durable import fsync_dir, naming, remove_quietly
from batchgen.io.faults import Faults
from batchgen.io.records import sorted_spans
from batchgen.io.writers import JsonlWriter

_ID = re.compile(r"^batch_req_(\d+)$")


class BatchJob(NamedTuple):
    """What every response line of a run shares."""

    model: str
    created: int  # seconds since the epoch


def created_from(input_path: str) -> int:
    """The responses' ``created``: the input file's modification time, the same for every run of one
    job (so a resumed run writes the bytes an uninterrupted one would); a stream's (stdin) start."""
    try:
        return int(os.stat(input_path).st_mtime)
    except OSError:
        return int(time.time())


def records_path(output: str) -> str:
    """Where the records of a run with OpenAI Batch output are kept until it completes."""
    return str(sidecar_dir(output) / "records.jsonl")


def line_order(line: dict[str, Any]) -> tuple[int, int]:
    """(row, sample) of a record, or of a response line (its row is in its ``id``): ``merge`` sorts both."""
    if "index" in line:
        return line["index"], line["sample"]
    found = _ID.match(str(line.get("id", "")))
    if found is None:
        raise ValueError(f"not a batchgen response line (id {line.get('id')!r})")
    return int(found.group(1)), 0


class BatchOutputWriter(JsonlWriter):
    """The records' writer (``records.jsonl``) whose ``finish`` writes the response lines to OUTPUT."""

    def __init__(self, output: str, job: BatchJob, faults: Faults | None = None) -> None:
        super().__init__(records_path(output), faults)
        self.output, self.job = output, job

    def finish(self) -> None:
        super().finish()
        write_responses(self.path, self.output, self.job, lambda: self.faults.hit("finalize"))


def write_responses(records: str, output: str, job: BatchJob, before_rename=lambda: None) -> None:
    """OUTPUT from the records file, atomically (a kill midway leaves the records, and a re-run redoes it:
    the run's state is marked complete only after)."""
    tmp = Path(f"{output}.writing")
    try:
        with naming(tmp), open(tmp, "wb") as dst, open(records, "rb") as src:
            for group in _rows(src, sorted_spans(records)):
                dst.write(orjson.dumps(response_line(group, job)) + b"\n")
            dst.flush()
            os.fsync(dst.fileno())
    except OSError:
        remove_quietly(tmp)
        raise
    before_rename()
    os.replace(tmp, output)
    fsync_dir(Path(output).absolute().parent)


def _rows(src: Any, spans: Any) -> Iterator[list[dict[str, Any]]]:
    """The records of each row in turn, by sample."""
    group: list[dict[str, Any]] = []
    for start, length in spans:
        src.seek(start)
        record = orjson.loads(src.read(length))
        if group and record["index"] != group[0]["index"]:
            yield group
            group = []
        group.append(record)
    if group:
        yield group


# -- one line ------------------------------------------------------------------------------------------
def response_line(records: list[dict[str, Any]], job: BatchJob) -> dict[str, Any]:
    """The response line of one request from its records (an error line when any sample failed)."""
    first = records[0]
    index = first["index"]
    custom_id = first["id"] if isinstance(first["id"], str) else None  # a line that was no request: none
    failed = next((r for r in records if r["finish_reason"] == "error"), None)
    line: dict[str, Any] = {"id": f"batch_req_{index}", "custom_id": custom_id}
    if failed is not None:
        return line | _error(failed, index, custom_id is not None)
    body = _body(records, job)
    response = {"status_code": 200, "request_id": f"req_{index}", "body": body}
    return line | {"response": response, "error": None}


def _error(record: dict[str, Any], index: int, request: bool) -> dict[str, Any]:
    """A refused request (400, or no response at all when the line was not a request) or a failure while
    generating (500); ``error`` names the cause either way."""
    message = record.get("error") or "error"
    rejected = record.get("rejected", False)
    code = "invalid_request" if rejected else "server_error"
    if not request:  # not even a request: nothing to respond to
        return {"response": None, "error": {"code": code, "message": message}}
    kind = "invalid_request_error" if rejected else "server_error"
    error = {"message": message, "type": kind, "param": None, "code": None}
    response = {
        "status_code": 400 if rejected else 500,
        "request_id": f"req_{index}",
        "body": {"error": error},
    }
    return {"response": response, "error": {"code": code, "message": message}}


def _body(records: list[dict[str, Any]], job: BatchJob) -> dict[str, Any]:
    first = records[0]
    chat = first.get("url") != "/v1/completions"
    choices = [(_chat_choice if chat else _text_choice)(r) for r in records]
    completion = sum(r["completion_tokens"] for r in records)
    usage = {"prompt_tokens": first["prompt_tokens"], "completion_tokens": completion}
    usage["total_tokens"] = usage["prompt_tokens"] + completion
    return {
        "id": f"{'chatcmpl' if chat else 'cmpl'}-{first['index']}",
        "object": "chat.completion" if chat else "text_completion",
        "created": job.created,
        "model": job.model,
        "choices": choices,
        "usage": usage,
    }


def _chat_choice(record: dict[str, Any]) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": record["completion"]}
    if record.get("reasoning") is not None:
        message["reasoning_content"] = record["reasoning"]
    return {
        "index": record["sample"],
        "message": message,
        "logprobs": _chat_logprobs(record),
        "finish_reason": record["finish_reason"],
    }


def _text_choice(record: dict[str, Any]) -> dict[str, Any]:
    return {
        "index": record["sample"],
        "text": record["completion"],
        "logprobs": _text_logprobs(record),
        "finish_reason": record["finish_reason"],
    }


def _entry(token: str, logprob: float) -> dict[str, Any]:
    return {"token": token, "logprob": logprob, "bytes": list(token.encode())}


def _chat_logprobs(record: dict[str, Any]) -> dict[str, Any] | None:
    """Chat's shape: per token its text, log-probability, UTF-8 bytes and the ``top_logprobs`` best."""
    if record.get("logprobs") is None:
        return None
    tops = record.get("top_logprobs") or [[] for _ in record["logprobs"]]
    content = []
    for token, logprob, top in zip(record["tokens"], record["logprobs"], tops, strict=True):
        alternatives = [_entry(alt["token"], alt["logprob"]) for alt in top or []]
        content.append(_entry(token, logprob) | {"top_logprobs": alternatives})
    return {"content": content}


def _text_logprobs(record: dict[str, Any]) -> dict[str, Any] | None:
    """Completions' shape: parallel lists of tokens, their log-probabilities, the best alternatives (a
    token -> log-probability object each) and each token's offset in the text."""
    if record.get("logprobs") is None:
        return None
    tokens = record["tokens"]
    offsets, at = [], 0
    for token in tokens:
        offsets.append(at)
        at += len(token)
    tops = record.get("top_logprobs")
    return {
        "tokens": tokens,
        "token_logprobs": record["logprobs"],
        "top_logprobs": None
        if tops is None
        else [{a["token"]: a["logprob"] for a in top or []} for top in tops],
        "text_offset": offsets,
    }
