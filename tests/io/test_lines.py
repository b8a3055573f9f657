"""The vectorised row arithmetic over plain JSONL bytes against line-by-line Python, on random files made
of awkward lines, with chunks small enough that lines straddle them."""

import io
import random

import pytest

from batchgen.io import lines

PIECES = [b"{}\n", b"\n", b"\r\n", b"  \n", b" {}\n", b'{"a": 1}\r\n', b"\t\n", b"  x", b"\x0c\n", b"abc"]
PIECES += [b"         {}\n", b"          \n", b"x" * 40 + b"\n"]  # long leading whitespace, a long line


def _row_starts(data: bytes) -> list[int]:
    """What ``for line in f: if line.strip()`` sees: the offsets of the rows."""
    starts, pos = [], 0
    for line in io.BytesIO(data):
        if line.strip():
            starts.append(pos)
        pos += len(line)
    return starts


@pytest.mark.parametrize("seed", range(4))
def test_counts_and_offsets_equal_python_line_by_line(seed, monkeypatch):
    rng = random.Random(seed)
    for _ in range(300):
        data = b"".join(rng.choice(PIECES) for _ in range(rng.randint(0, 30)))
        monkeypatch.setattr(lines, "CHUNK", rng.choice([1, 2, 3, 7, 64, 1 << 24]))
        monkeypatch.setattr(lines, "_STEPS", rng.choice([0, 1, 8]))
        f, starts = io.BytesIO(data), _row_starts(data)
        assert lines.count_rows(f, 0) == len(starts), data
        pos = rng.randint(0, len(data))
        cut = lines.line_start_at_or_after(f, pos)
        assert cut == 0 or cut == len(data) or data[cut - 1 : cut] == b"\n"
        assert cut >= pos and b"\n" not in data[pos : max(pos, cut - 1)]  # no line start skipped
        before = sum(s < cut for s in starts)
        assert lines.count_rows(f, 0, cut) == before and lines.count_rows(f, cut) == len(starts) - before
        k = rng.randint(0, 12)
        want = (starts[k], k) if k < len(starts) else (len(data), len(starts))
        assert lines.find_row(f, k, 0) == want, (data, k)
