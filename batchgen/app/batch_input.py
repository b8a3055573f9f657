"""``--input-format``: OpenAI Batch requests or rows, and what each needs of the other options.

``auto`` reads the input's first line: a request (``custom_id``, ``url``, ``body``) makes the whole file
one of requests. Their output is OpenAI's response lines, so it is JSONL, and the options that pick a
prompt or copy columns out of a row have nothing to act on: they are refused (a usage error).
"""

from __future__ import annotations

from dataclasses import replace
from itertools import islice

from batchgen.app.options import RunOptions
from batchgen.io.openai_batch import is_batch_request
from batchgen.io.readers import InputError, Reader
from batchgen.io.writers import OutputError, output_format

INPUT_FORMATS = ("auto", "openai", "rows")
# Row options with no meaning for requests, by their flags.
_ROW_ONLY = {"prompt_column": "--prompt-column", "template": "--template", "id_column": "--id-column",
             "keep_columns": "--keep-columns"}  # fmt: skip


def resolve_input_format(opts: RunOptions, reader: Reader) -> RunOptions:
    """``opts`` with ``input_format`` openai or rows; InputError or OutputError (usage errors) for a
    combination that cannot run."""
    chosen = opts.input_format
    if chosen == "auto":
        chosen = "openai" if _first_is_request(reader) else "rows"
    if chosen == "openai":
        _check_batch_options(opts, reader)
    return replace(opts, input_format=chosen)


def _first_is_request(reader: Reader) -> bool:
    if reader.schema_columns() is not None:  # Parquet: a table of rows
        return False
    first = next(islice(reader.iter_rows(0), 1), None)
    return first is not None and is_batch_request(first[1])


def _check_batch_options(opts: RunOptions, reader: Reader) -> None:
    if reader.schema_columns() is not None:
        raise InputError("--input-format openai reads JSONL request files, not Parquet")
    if output_format(opts.output) != "jsonl":
        raise OutputError(f"OpenAI Batch input writes JSONL response lines: {opts.output!r} is not .jsonl")
    given = [flag for name, flag in _ROW_ONLY.items() if getattr(opts.spec, name)]
    if given:
        flags = ", ".join(given)
        raise InputError(f"{flags}: not for OpenAI Batch input (each request's body holds its prompt)")
