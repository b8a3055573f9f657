"""Comments and docstrings say why the code is as it is, in words that stay true. A GPU model's name, a
measured time or rate, or a reference to past work by its number ("session 31", "issue 12") is true of one
machine on one day, or means something only to whoever was there; such figures belong in
``docs/results.md``, where each comes with its source. This guard reads every comment and docstring of the
package (``tokenize``, so strings in code are not read; ``//`` comments of its CUDA sources) and names each
offending line."""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "batchgen"

GPU_MODEL = re.compile(
    r"\b(?:[AH](?:10G?|20|30|40|100|200|800)|[BG]B?(?:100|200)|GH200|L4|L40S?|[PV]100|T4"
    r"|RTX\s?\d{4}|MI\d{3}X?)\b"
)
PAST_WORK = re.compile(r"\b(?:session|stop|issue|wave)s?\s+#?\d+", re.IGNORECASE)
# Figures, not words: a number with a unit of time or rate ("12 ms", "~3 s", "1.5 GB/s", "40k tok/s"), or
# a speed-up ("1.3x faster"). "a timeout in seconds" or "``TURN_TIMEOUT_S``" describe an API and pass.
TIMING = re.compile(
    r"(?<![\w.])~?\d+(?:[.,]\d+)?k?"
    r"(?:\s?(?:ms|µs|us|ns|[GMT]i?B/s|T?FLOP/s|TFLOPS|tok/s|tokens/s|rows/s)|\s(?:s|secs?|seconds|minutes))(?![\w/])"
    r"|(?<![\w.])\d+(?:\.\d+)?\s?x\s+(?:faster|slower|the speed|speed-?up)"
)
RULES = {"a GPU model": GPU_MODEL, "past work by its number": PAST_WORK, "a timing": TIMING}


def prose(source: str):
    """(line, text) of every comment and docstring line: comments, and strings that stand as a statement
    of their own (module, class and function docstrings)."""
    previous = tokenize.NEWLINE
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            yield tok.start[0], tok.string
        elif tok.type == tokenize.STRING and previous in (tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT):
            for offset, line in enumerate(tok.string.splitlines()):
                yield tok.start[0] + offset, line
        if tok.type not in (tokenize.NL, tokenize.COMMENT):
            previous = tok.type


def cuda_prose(source: str):
    """(line, text) of every ``//`` comment of a CUDA source."""
    for line_no, line in enumerate(source.splitlines(), 1):
        if "//" in line:
            yield line_no, line[line.index("//") :]


def offences(path: Path, root: Path) -> list[str]:
    found = []
    lines = prose if path.suffix == ".py" else cuda_prose
    for line_no, text in lines(path.read_text()):
        for what, pattern in RULES.items():
            match = pattern.search(text)
            if match:
                where = f"{path.relative_to(root)}:{line_no}"
                found.append(f"{where}: {what} ({match.group(0).strip()!r}): {text.strip()}")
    return found


@pytest.mark.parametrize(
    "text, rule",
    [
        ("# on the H200 this ran faster", "a GPU model"),
        ("# A100s and H100 alike", "a GPU model"),
        ("# as measured in session 31", "past work by its number"),
        ("# (issue 12: small models)", "past work by its number"),
        ("# took ~12 ms a step", "a timing"),
        ("# 0.55-0.75 s on the machine", "a timing"),
        ("# about 1.5 GB/s from the page cache", "a timing"),
        ("# ran at 17.4k tok/s", "a timing"),
        ("# 3.1x faster than before", "a timing"),
    ],
)
def test_the_guard_catches(text, rule):
    assert RULES[rule].search(text)


@pytest.mark.parametrize(
    "text",
    [
        "# a timeout in seconds; ``TURN_TIMEOUT_S`` bounds the wait",
        "# B7s: rows of staggered lengths; B1 and B3 run at TP=2",
        "# 128 x 128 blocks, 1.5x the tokens at most, a stop token ends the step",
        "# step 0's tokens, the L2 cache, an H2D copy",
        "// k-step s takes the lane's bytes 4s..4s+3",
    ],
)
def test_the_guard_passes(text):
    assert not any(pattern.search(text) for pattern in RULES.values())


def test_comments_name_no_gpu_timing_or_past_work():
    root = PACKAGE.parent
    sources = sorted([*PACKAGE.rglob("*.py"), *PACKAGE.rglob("*.cu")])
    found = [hit for path in sources for hit in offences(path, root)]
    assert not found, "comments and docstrings that will not stay true (docs/results.md takes figures):\n" + (
        "\n".join(found)
    )
