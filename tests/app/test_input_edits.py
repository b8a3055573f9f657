"""An input edited between runs (SPEC "Resume"): a change in the part the output's records came from is
refused with the first changed row and the output left as it was; rows appended after it are new work.

The edits keep the file's size and lie past its first MiB: what a fingerprint of the size and the head
cannot see. Runs are in this process on the tiny random Llama (tests/test_cli.py's way).
"""

import gzip
import os

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from click.testing import CliRunner

from batchgen.cli import cli
from batchgen.io.checkpoint import load_state, save_state, sidecar_dir
from batchgen.io.readers import open_input

PAD = 64 << 10  # a data column no prompt reads: row 18 starts past the first MiB
ROWS = [{"id": f"r{i}", "prompt": f"Row {i}: say something.", "pad": f"{i:02x}" * (PAD // 2)}
        for i in range(30)]  # fmt: skip

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture
def gen(tiny_llama):
    """``batchgen run`` in this process: (exit code, stderr)."""

    def _run(*args):
        argv = ["run", *map(str, args), "--model", tiny_llama, "--max-new-tokens", "2", "--max-num-seqs", "8"]
        result = CliRunner().invoke(cli, argv, catch_exceptions=False)
        return result.exit_code, result.stderr

    return _run


def _jsonl(rows: list[dict]) -> bytes:
    return b"".join(orjson.dumps(r) + b"\n" for r in rows)


def _write(path, rows: list[dict]) -> None:
    """``path`` in the format its name says (Parquet: 4 rows a row group, uncompressed)."""
    name = str(path)
    if name.endswith(".parquet"):
        table = pa.table({c: [r[c] for r in rows] for c in rows[0]})
        pq.write_table(table, path, row_group_size=4, compression="none")
    elif name.endswith(".gz"):
        path.write_bytes(gzip.compress(_jsonl(rows), mtime=0))
    elif name.endswith(".zst"):
        path.write_bytes(zstandard.ZstdCompressor().compress(_jsonl(rows)))
    else:
        path.write_bytes(_jsonl(rows))


def _edited(row: int, rows: list[dict] = ROWS) -> list[dict]:
    """``rows`` with one character of row ``row``'s prompt changed."""
    rows = [dict(r) for r in rows]
    rows[row]["prompt"] = rows[row]["prompt"].replace("say", "sax")
    return rows


def _saved(out) -> dict[str, bytes]:
    """The output and every file beside it but the lock, byte for byte."""
    files = {"output": out.read_bytes()}
    for p in sidecar_dir(out).iterdir():
        if p.is_file() and p.name != "lock":
            files[p.name] = p.read_bytes()
    return files


def _indices(out) -> list[int]:
    return sorted(orjson.loads(line)["index"] for line in out.read_bytes().splitlines())


@pytest.mark.parametrize("name", ["in.jsonl", "in.jsonl.gz", "in.jsonl.zst", "in.parquet"])
def test_an_edit_in_the_consumed_part_is_refused_naming_its_row(gen, tmp_path, name):
    """Run 20 rows, change one character of row 18's prompt, ask for 30: refused, nothing touched."""
    inp, out = tmp_path / name, tmp_path / "out.jsonl"
    _write(inp, ROWS)
    assert gen(inp, out, "--limit", "20")[0] == 0
    before, size = _saved(out), os.path.getsize(inp)
    _write(inp, _edited(18))
    if name == "in.jsonl":  # the case a fingerprint of the size and the first MiB misses
        assert os.path.getsize(inp) == size and inp.read_bytes().index(b"Row 18") > 1 << 20
    code, err = gen(inp, out, "--limit", "30")
    where = "row group 4 of in.parquet (rows 16 to 19)" if name.endswith(".parquet") else "row 18"
    assert code == 1 and f"changed at {where}" in err and "--overwrite" in err, err
    assert "Traceback" not in err and err.count("changed at") == 1  # one line
    assert _saved(out) == before
    code, err = gen(inp, out, "--limit", "30", "--overwrite")
    assert code == 0 and _indices(out) == list(range(30))


def test_a_finished_run_re_run_on_an_edited_input_is_refused(gen, tmp_path):
    """Nothing to do would hide that the records came from other rows than the input's now."""
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    _write(inp, ROWS)
    assert gen(inp, out)[0] == 0
    before = _saved(out)
    _write(inp, _edited(25))
    code, err = gen(inp, out)
    assert code == 1 and "changed at row 25" in err and _saved(out) == before


def test_an_unedited_input_resumes_and_extends(gen, tmp_path):
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    _write(inp, ROWS)
    assert gen(inp, out, "--limit", "20")[0] == 0
    first = out.read_bytes()
    code, err = gen(inp, out, "--limit", "30")
    assert code == 0 and "resuming" in err, err
    assert out.read_bytes().startswith(first) and _indices(out) == list(range(30))
    code, err = gen(inp, out, "--limit", "30")
    assert code == 0 and "already complete" in err


@pytest.mark.parametrize("name", ["in.jsonl", "in.parquet"])
def test_rows_appended_after_the_consumed_part_are_new_work(gen, tmp_path, name):
    """The input grew: what was consumed is unchanged, so the re-run goes on with the new rows, after an
    interrupted run as after a finished one."""
    inp, out = tmp_path / name, tmp_path / "out.jsonl"
    _write(inp, ROWS[:12])
    assert gen(inp, out, "--limit", "8")[0] == 0
    _write(inp, ROWS[:20])
    code, err = gen(inp, out)
    assert code == 0 and "resuming" in err, err
    assert _indices(out) == list(range(20)) and load_state(out).complete
    _write(inp, ROWS)
    code, err = gen(inp, out)
    assert code == 0 and _indices(out) == list(range(30))
    _write(inp, _edited(4))  # the grown input is now consumed too
    code, err = gen(inp, out)
    assert code == 1 and ("changed at row 4" in err or "rows 4 to 7" in err), err


def test_a_shard_checks_its_own_part(gen, tmp_path):
    """Each shard keeps the tags of the rows it read: an edit in shard 1's rows stops shard 1 alone."""
    inp = tmp_path / "in.jsonl"
    _write(inp, ROWS)
    outs = [tmp_path / f"out.shard-0000{i}-of-00002.jsonl" for i in range(2)]
    for i in range(2):
        assert gen(inp, tmp_path / "out.jsonl", "--shard", f"{i}/2")[0] == 0
    parts = [load_state(o).fingerprint["part"] for o in outs]
    assert parts[0][1] <= 25 and parts[1][0] <= 25
    before = _saved(outs[1])
    _write(inp, _edited(25))
    assert gen(inp, tmp_path / "out.jsonl", "--shard", "0/2")[0] == 0
    code, err = gen(inp, tmp_path / "out.jsonl", "--shard", "1/2")
    assert code == 1 and "changed at row 25" in err and _saved(outs[1]) == before


def test_an_output_from_before_the_digest_resumes_on_its_size_and_head(gen, tmp_path):
    """Its state names the input by size and head hash, and it has no digest: those are compared, as
    then; the resume records the digest from there on."""
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    _write(inp, ROWS[:24])
    assert gen(inp, out, "--limit", "10")[0] == 0
    state = load_state(out)
    state.fingerprint["input"] = open_input(str(inp)).fingerprint()  # as written before the digest
    save_state(out, state)
    (sidecar_dir(out) / "input.digest").unlink()
    code, err = gen(inp, out, "--limit", "20")
    assert code == 0 and "resuming" in err, err
    assert (sidecar_dir(out) / "input.digest").stat().st_size == 20 * 8
    state = load_state(out)
    state.fingerprint["input"] = open_input(str(inp)).fingerprint()
    save_state(out, state)
    _write(inp, ROWS)
    code, err = gen(inp, out, "--limit", "30")
    assert code == 1 and "input size: " in err, err
