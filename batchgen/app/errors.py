"""Failures the CLI reports as one clear line with exit 1 (no traceback unless -v)."""

from __future__ import annotations


class FatalError(RuntimeError):
    """An expected failure with a message meant for the user."""


class RowFailed(FatalError):
    """--on-error fail: the first bad row stops the run."""
