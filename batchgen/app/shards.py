"""Sharding: which contiguous rows a shard covers, where it writes, and where a Slurm array task sits.

Plain JSONL: shard I of N covers the rows whose lines start in bytes ``[I * S // N, (I + 1) * S // N)``
of the file's S bytes, so it reads only its part (its first row's index comes from counting the newlines
before it, never parsing them). Otherwise (Parquet, compressed JSONL, or --limit) shard I covers rows
``[I * R // N, (I + 1) * R // N)`` of the input's R rows, capped by --limit. The last shard runs to the
input's end. Every shard computes the same bounds from the same input, with no coordination.
"""

from __future__ import annotations

import glob
import logging
import os
import re
from collections.abc import Mapping
from typing import NamedTuple

from batchgen.io.readers import Reader

log = logging.getLogger("batchgen")

SHARD_PLACEHOLDER = "{shard}"
_TAG = re.compile(r"(\d{5,})-of-(\d{5,})")


class Shard(NamedTuple):
    index: int  # 0-based
    count: int

    @property
    def tag(self) -> str:
        return f"{self.index:05d}-of-{self.count:05d}"


def parse_shard(text: str) -> Shard:
    """``I/N`` with 0 <= I < N; ValueError naming the problem."""
    match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text)
    if not match:
        raise ValueError(f"--shard takes I/N (shard I, 0-based, of N), got {text!r}")
    shard = Shard(int(match[1]), int(match[2]))
    if shard.count < 1 or shard.index >= shard.count:
        raise ValueError(f"--shard {text}: need 0 <= I < N")
    return shard


def slurm_shard(env: Mapping[str, str] = os.environ) -> Shard | None:
    """The shard of a Slurm array task (SLURM_ARRAY_TASK_ID - MIN of COUNT), None outside an array."""
    if "SLURM_ARRAY_TASK_ID" not in env or "SLURM_ARRAY_TASK_COUNT" not in env:
        return None
    try:
        task = int(env["SLURM_ARRAY_TASK_ID"]) - int(env.get("SLURM_ARRAY_TASK_MIN", "0"))
        count = int(env["SLURM_ARRAY_TASK_COUNT"])
    except ValueError:
        raise ValueError("SLURM_ARRAY_TASK_ID / _MIN / _COUNT are not integers") from None
    if not 0 <= task < count:
        raise ValueError(
            f"Slurm array task {env['SLURM_ARRAY_TASK_ID']} is outside MIN..MIN+COUNT-1: "
            "use a contiguous array (--array=0-N) or pass --shard I/N"
        )
    return Shard(task, count)


def shard_output(output: str, shard: Shard) -> str:
    """OUTPUT (or a stats file) with ``{shard}`` replaced, else with ``.shard-IIIII-of-NNNNN`` before its
    extension."""
    if SHARD_PLACEHOLDER in output:
        return output.replace(SHARD_PLACEHOLDER, shard.tag)
    stem, ext = os.path.splitext(output)
    return f"{stem}.shard-{shard.tag}{ext}"


def shard_pattern(output: str) -> str:
    """The glob of OUTPUT's shard files (``shard_output``'s names, any shard)."""
    if SHARD_PLACEHOLDER in output:
        return glob.escape(output).replace(glob.escape(SHARD_PLACEHOLDER), "*")
    stem, ext = os.path.splitext(output)
    return f"{glob.escape(stem)}.shard-[0-9]*-of-[0-9]*{glob.escape(ext)}"


def shard_name_regex(output: str) -> re.Pattern:
    """What OUTPUT's shard files are called, exactly (so ``{shard}`` never matches a merged ``all``)."""
    tag = r"(\d{5,})-of-(\d{5,})"
    if SHARD_PLACEHOLDER in output:
        return re.compile(re.escape(output).replace(re.escape(SHARD_PLACEHOLDER), tag))
    stem, ext = os.path.splitext(output)
    return re.compile(re.escape(stem) + r"\.shard-" + tag + re.escape(ext))


def merged_output(output: str) -> str:
    """Where ``merge`` writes: OUTPUT itself, or with ``{shard}`` replaced by ``all``."""
    return output.replace(SHARD_PLACEHOLDER, "all")


def shard_of_path(path: str) -> Shard | None:
    """The shard a shard file's name says it holds (its last ``IIIII-of-NNNNN``)."""
    tags = _TAG.findall(path)
    return Shard(int(tags[-1][0]), int(tags[-1][1])) if tags else None


def shard_rows(total: int, shard: Shard, limit: int | None) -> tuple[int, int | None]:
    """(first row, stop or None = to the end) of ``shard`` over ``total`` rows (``limit`` caps them)."""
    rows = total if limit is None else min(total, limit)
    start = shard.index * rows // shard.count
    stop = (shard.index + 1) * rows // shard.count
    last = shard.index == shard.count - 1
    return start, (None if last and limit is None else stop)


class ShardPart(NamedTuple):
    start: int  # first row (global index)
    stop: int | None  # row after the last; None: to the input's end (the last shard)
    split: str | None  # "bytes": a byte range of plain JSONL; None: rows


def plan_shard(reader: Reader, shard: Shard, limit: int | None) -> ShardPart:
    """The rows ``shard`` covers (see the module's docstring)."""
    last = shard.index == shard.count - 1
    if limit is None and (rows := reader.split_bytes(shard.index, shard.count)) is not None:
        return ShardPart(rows[0], None if last else rows[1], "bytes")
    return ShardPart(*shard_rows(count_input_rows(reader, limit), shard, limit), None)


def count_input_rows(reader: Reader, limit: int | None = None) -> int:
    """Rows of the input, or ``limit`` when it has more: Parquet from its footers; plain JSONL by its
    newlines; compressed JSONL in one streaming pass (which every shard makes alike)."""
    count = reader.count_rows(at_most=limit)
    if count is None:
        log.info("counting the rows of %s to find this shard's part (one pass over the file)", reader.path)
        count = reader.count_rows(exact=True, at_most=limit)
    return count
