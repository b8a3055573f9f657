"""``batchgen run`` on a file with one huge row (a long line, a huge message, many messages, a huge Parquet
cell): the row gets its "too long" error record without the tokenizer ever seeing its text (tokenizing tens
of MB costs GiBs), and the other rows complete normally."""

from __future__ import annotations

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from batchgen.app import prepare
from batchgen.cli import cli

pytestmark = pytest.mark.usefixtures("one_torch_thread")

# The tiny model allows 2047 prompt tokens; its tokenizer's tokens cover at most 81 bytes each.
MOST_BYTES = 2047 * 81
HUGE = 2_000_000  # bytes of the huge row's text: twelve times what could fit
TEXT = ("The quick brown fox jumps over the lazy dog. " * (HUGE // 45 + 1))[:HUGE]
MANY = [{"role": "user" if i % 2 == 0 else "assistant", "content": "hello there"} for i in range(HUGE // 40)]


def _rows(huge: dict) -> list[dict]:
    return [{"id": "a", "prompt": "Say hi."}, {"id": "huge", **huge}, {"id": "c", "prompt": "Say bye."}]


CASES = {
    "line": {"prompt": TEXT},
    "message": {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": TEXT}]},
    "many-messages": {"messages": MANY},
}


def _write(path, rows: list[dict]) -> None:
    if path.suffix == ".parquet":
        pq.write_table(pa.table({key: [r.get(key) for r in rows] for key in ("id", "prompt")}), path)
    else:
        path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))


@pytest.mark.parametrize("name", ["line.jsonl", "message.jsonl", "many-messages.jsonl", "line.parquet"])
def test_a_huge_row_is_refused_before_it_is_tokenized(tiny_llama, tmp_path, monkeypatch, name):
    inp, out = tmp_path / name, tmp_path / "out.jsonl"
    _write(inp, _rows(CASES[name.split(".")[0]]))
    encoded: list[int] = []  # the length of every text the tokenizer is given
    real = prepare.encode_rendered

    def spy(tokenizer, texts):
        encoded.extend(len(t.text) for t in texts)
        if any(len(t.text) > MOST_BYTES for t in texts):  # fail fast instead of spending GiBs
            raise AssertionError("the tokenizer was given a prompt too long to fit")
        return real(tokenizer, texts)

    monkeypatch.setattr(prepare, "encode_rendered", spy)
    argv = ["run", str(inp), str(out), "--model", tiny_llama, "--max-new-tokens", "4", "--max-num-seqs", "4"]
    result = CliRunner().invoke(cli, argv, catch_exceptions=False)
    assert result.exit_code == 0, result.stderr
    assert encoded and max(encoded) <= MOST_BYTES, f"the tokenizer saw {max(encoded)} characters"
    records = {r["id"]: r for r in map(orjson.loads, out.read_bytes().splitlines())}
    bad = records["huge"]
    assert bad["finish_reason"] == "error" and bad["error"].startswith("prompt too long: ")
    assert f"more than the 2047 tokens the model allows can hold (at most {MOST_BYTES} bytes" in bad["error"]
    for row_id in ("a", "c"):
        assert records[row_id]["finish_reason"] in ("stop", "length") and records[row_id]["completion_tokens"]
