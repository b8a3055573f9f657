"""One input row -> its prompt, id, per-row sampling overrides and kept columns (or the reason it is bad)."""

from __future__ import annotations

import math
import string
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any, NamedTuple

from batchgen.config import PARAM_NAMES, coerce
from batchgen.io.chat_inputs import normalize_messages, template_kwargs, tool_list
from batchgen.io.param_keys import key_problem

# Output fields a kept column must not shadow.
OUTPUT_FIELDS = (
    "id",
    "index",
    "sample",
    "completion",
    "reasoning",
    "finish_reason",
    "prompt_tokens",
    "completion_tokens",
    "error",
    "token_ids",
    "logprobs",
    "top_logprobs",
    "prompt_logprobs",
    "prompt_top_logprobs",
)
# Columns holding a row's chat messages, in order of preference (ShareGPT's read as OpenAI's).
MESSAGE_COLUMNS = ("messages", "conversations")
# Per-row chat template inputs: data, passed to the template (never sampling keys).
CHAT_COLUMNS = ("chat_template_kwargs", "tools")


class ParsedRow(NamedTuple):
    index: int
    id: Any
    prompt: str | list[dict[str, Any]]
    overrides: dict[str, Any]
    kept: dict[str, Any]
    chat_template_kwargs: dict[str, Any] | None = None  # the row's own template variables
    tools: list[dict[str, Any]] | None = None
    chat: bool | None = None  # the row's own chat mode (None: the run's; an OpenAI completions request: raw)


class RowError(NamedTuple):
    """A row that cannot be generated; it becomes an ``error`` record (or is skipped, or fails the run)."""

    index: int
    id: Any
    error: str
    kept: dict[str, Any]


class SchemaError(ValueError):
    """The input as a whole has no usable prompt: fail before loading the model."""


class MissingColumn(ValueError):
    """A column an option names (``--keep-columns``) that the input lacks: a usage error (exit 2)."""


class UnknownKey(ValueError):
    """A row key that looks like a sampling parameter batchgen lacks, or a near miss of one: a usage error
    (exit 2) in the input's first rows, checked before the model loads; a row error later on."""


def unescape_template(text: str) -> str:
    r"""Shells pass ``"Q: {q}\nA:"`` with a literal backslash-n; users mean a newline."""
    out, i = [], 0
    while i < len(text):
        if text[i] == "\\" and i + 1 < len(text) and text[i + 1] in "nt\\":
            out.append({"n": "\n", "t": "\t", "\\": "\\"}[text[i + 1]])
            i += 2
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def template_fields(template: str) -> list[str]:
    """Top-level column names a format template reads (``{a.b}`` and ``{a[0]}`` read column ``a``)."""
    names = []
    for _, field, _, _ in string.Formatter().parse(template):
        if field is None:
            continue
        root = field.split(".", 1)[0].split("[", 1)[0]
        if not root or root.isdigit():
            raise ValueError(f"template field {{{field}}} must name a column")
        if root not in names:
            names.append(root)
    return names


class _StrictRow(Mapping):
    """format_map view that reports missing and null columns instead of formatting them as 'None'."""

    def __init__(self, row: Mapping[str, Any]) -> None:
        self._row = row

    def __getitem__(self, key: str) -> Any:
        value = self._row[key]
        if value is None:
            raise KeyError(key)
        return value

    def __iter__(self):
        return iter(self._row)

    def __len__(self) -> int:
        return len(self._row)


@dataclass(frozen=True)
class RowSpec:
    """How rows become prompts, from the command-line options."""

    prompt_column: str | None = None
    template: str | None = None
    id_column: str | None = None  # None = "id" when present, else the index
    keep_columns: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.prompt_column and self.template:
            raise ValueError("--prompt-column and --template exclude each other")
        clash = sorted(set(self.keep_columns) & set(OUTPUT_FIELDS))
        if clash:
            raise ValueError(f"--keep-columns {', '.join(clash)}: would overwrite output fields")
        if self.template is not None:
            template_fields(self.template)  # raises on a malformed template

    def needed_columns(self, available: Iterable[str]) -> list[str]:
        """The columns worth reading (Parquet projection): everything else is never decoded."""
        available = list(available)
        wanted = set(PARAM_NAMES) | set(self.keep_columns) | {self.id_column or "id"}
        if self.prompt_column:
            wanted.add(self.prompt_column)
        elif self.template is not None:
            wanted.update(template_fields(self.template))
        else:
            wanted.update((*MESSAGE_COLUMNS, "prompt"))
        wanted.update(CHAT_COLUMNS)
        return [c for c in available if c in wanted]

    # -- per-row parsing -------------------------------------------------------------------------------
    def parse(self, index: int, row: Any) -> ParsedRow | RowError:
        if not isinstance(row, dict):
            return RowError(index, index, f"row is a JSON {type(row).__name__}, not an object", {})
        kept = {c: row.get(c) for c in self.keep_columns}
        row_id = self._row_id(index, row)
        if isinstance(row_id, RowError):
            return row_id._replace(kept=kept)
        try:
            prompt = self._prompt(row)
            overrides = parse_overrides(row, self.data_columns)
            kwargs = template_kwargs(row.get("chat_template_kwargs"))
            tools = tool_list(row.get("tools"))
        except ValueError as exc:
            return RowError(index, row_id, str(exc), kept)
        return ParsedRow(index, row_id, prompt, overrides, kept, kwargs or None, tools)

    def _row_id(self, index: int, row: dict) -> Any:
        name = self.id_column or "id"
        value = row.get(name)
        if value is None:
            if self.id_column:
                return RowError(index, index, f"id column {name!r} is missing or null", {})
            return index
        if isinstance(value, float) and value.is_integer():
            return int(value)  # Parquet int columns with nulls come back as float
        return value

    def _prompt(self, row: dict) -> str | list[dict[str, Any]]:
        if self.template is not None:
            try:
                return self.template.format_map(_StrictRow(row))
            except KeyError as exc:
                raise ValueError(f"template field {exc.args[0]!r} is missing or null") from None
            except (IndexError, AttributeError, TypeError, ValueError) as exc:
                raise ValueError(f"template failed on this row: {exc}") from None
        if self.prompt_column:
            if row.get(self.prompt_column) is None:
                raise ValueError(f"prompt column {self.prompt_column!r} is missing or null")
            return check_prompt(self.prompt_column, row[self.prompt_column])
        for name in (*MESSAGE_COLUMNS, "prompt"):
            if row.get(name) is not None:
                return check_prompt(name, row[name])
        found = ", ".join(sorted(row)) or "none"
        raise ValueError(
            f"no prompt: the row has no 'messages', 'conversations' or 'prompt' column (found: {found})"
        )

    @cached_property
    def data_columns(self) -> frozenset[str]:
        """Columns read as data (the prompt, the id, kept ones, a template's fields): never refused."""
        names = {*self.keep_columns, self.id_column or "id", self.prompt_column or "prompt"}
        names.update(MESSAGE_COLUMNS, CHAT_COLUMNS)
        return frozenset(names | set(template_fields(self.template) if self.template else ()))

    def check_keys(self, keys: Iterable[str], where: str) -> None:
        """An ``UnknownKey`` for the first key of ``keys`` that only looks like a sampling parameter."""
        data = self.data_columns
        for key in keys:
            problem = None if key in data else key_problem(key)
            if problem:
                raise UnknownKey(f"{where}: {problem}")

    # -- whole-input check -----------------------------------------------------------------------------
    def check_kept(self, columns: Iterable[str], where: str) -> None:
        """A ``MissingColumn`` for the first --keep-columns name not among ``columns`` (a typo would
        otherwise copy nulls into every record)."""
        columns = list(columns)
        for name in self.keep_columns:
            if name not in columns:
                found = _names(columns)
                raise MissingColumn(f"--keep-columns {name!r} not found; columns in {where}: {found}")

    def check_columns(self, columns: Iterable[str], where: str) -> None:
        """Fail at once when ``columns`` (a schema, or the union of the first rows' keys) cannot prompt."""
        columns = list(columns)
        found = ", ".join(columns) if columns else "none"
        if self.template is not None:
            missing = [f for f in template_fields(self.template) if f not in columns]
            if missing:
                raise SchemaError(f"--template needs column(s) {', '.join(missing)}, {where} has: {found}")
        elif self.prompt_column:
            if self.prompt_column not in columns:
                raise SchemaError(f"--prompt-column {self.prompt_column!r} not found, {where} has: {found}")
        elif not {*MESSAGE_COLUMNS, "prompt"} & set(columns):
            raise SchemaError(
                f"no usable prompt column: {where} has {found}; expected 'messages', 'conversations' or "
                "'prompt' (or pass --prompt-column or --template)"
            )
        if self.id_column and self.id_column not in columns:
            raise SchemaError(f"--id-column {self.id_column!r} not found, {where} has: {found}")


def _names(columns: list[str], most: int = 30) -> str:
    """Column names for a one-line message (a wide table's are cut)."""
    shown = ", ".join(columns[:most]) or "none"
    return shown + (f" ... ({len(columns) - most} more)" if len(columns) > most else "")


def check_prompt(name: str, value: Any) -> str | list[dict[str, Any]]:
    """A prompt is a string, or a list of chat messages (OpenAI's {role, content} or ShareGPT's
    {from, value}: ``chat_inputs.normalize_messages``)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return normalize_messages(value, name)
    raise ValueError(f"column {name!r} must be a string or a list of messages, not {type(value).__name__}")


def parse_overrides(row: dict, data_columns: frozenset[str] = frozenset()) -> dict[str, Any]:
    """Per-row sampling parameters present in the row, by field name (nulls and NaNs mean "not set"). A
    ValueError names a wrong value, an ``UnknownKey`` a key that only looks like a parameter
    (``data_columns``, read as data, are never refused)."""
    out: dict[str, Any] = {}
    for key, value in row.items():
        name = PARAM_NAMES.get(key)
        if name is None:
            problem = None if key in data_columns else key_problem(key)
            if problem:
                raise UnknownKey(problem)
            continue
        if value is None or (isinstance(value, float) and math.isnan(value)):
            continue
        value = coerce(name, value)
        if name in out and out[name] != value:
            raise ValueError(f"{key} and {name} differ ({value!r} vs {out[name]!r}): give one")
        out[name] = value
    return out
