"""Failed rows by kind of error, so that a run's end, a re-run and ``status`` can name the commonest.

Messages that differ only in their numbers (a token count, a position, a token id) are one kind; each kind
keeps the first message seen as its example. The state file holds them as ``{example: rows}``.
"""

from __future__ import annotations

import re
from collections import Counter

MAX_KINDS = 50  # kinds kept: the state file stays small; rows of later kinds still count as failed
MAX_MESSAGE = 300  # characters of an example kept (a message may quote a long row)
_NUMBER = re.compile(r"\d+")


def error_kind(message: str) -> str:
    return _NUMBER.sub("N", message[:MAX_MESSAGE])


class ErrorKinds:
    """Row counts per kind of error, each kind shown by its first message."""

    def __init__(self, counts: dict[str, int] | None = None) -> None:
        self._examples: dict[str, str] = {}  # kind -> its first message
        self._rows: Counter[str] = Counter()  # kind -> failed rows
        for message, rows in (counts or {}).items():
            self.add(message, rows)

    def add(self, message: str, rows: int = 1) -> None:
        kind = error_kind(message)
        if kind not in self._examples:
            if len(self._examples) >= MAX_KINDS:
                return
            self._examples[kind] = message[:MAX_MESSAGE]
        self._rows[kind] += rows

    def commonest(self) -> tuple[str, int] | None:
        """(example message, rows) of the kind that failed most rows (the first seen on a tie)."""
        if not self._rows:
            return None
        kind, rows = self._rows.most_common(1)[0]
        return self._examples[kind], rows

    def as_counts(self) -> dict[str, int]:
        """``{example: rows}``, as the state file holds them."""
        return {self._examples[kind]: rows for kind, rows in self._rows.items()}

    def copy(self) -> ErrorKinds:
        return ErrorKinds(self.as_counts())
