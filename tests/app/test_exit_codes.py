"""Exit codes that tell the truth (SPEC.md, "Signals, exit codes, errors"): a run whose rows all failed, or
more than --max-error-rate of them, exits 1 once every record is written; a --keep-columns name the input
lacks is a usage error; a model that cannot be found is one line and leaves no output behind. Each path:
the exit status, the one line, and nothing already done lost (a re-run redoes nothing)."""

import json
from dataclasses import replace

import huggingface_hub.constants
import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from batchgen.cli import cli
from batchgen.io.checkpoint import load_state, sidecar_dir

pytestmark = pytest.mark.usefixtures("one_torch_thread")

LONG = "word " * 200  # over --max-model-len 64: "prompt too long"
GOOD = [{"id": f"ok{i}", "prompt": f"Say {i}", "topic": "t"} for i in range(3)]
TOO_LONG = [{"id": f"long{i}", "prompt": LONG + str(i)} for i in range(3)]
NO_PROMPT = {"id": "none", "text": "no prompt here"}


def write_jsonl(path, rows):
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    return str(path)


@pytest.fixture
def run(tiny_llama):
    """``batchgen run`` in this process on the tiny model: (exit code, stderr)."""

    def _run(*args, model=tiny_llama):
        argv = ["run", *map(str, args), "--model", model, "--max-new-tokens", "2", "--max-model-len", "64"]
        result = CliRunner().invoke(cli, argv, catch_exceptions=False)
        return result.exit_code, result.stderr

    return _run


def last_line(stderr: str) -> str:
    return stderr.strip().splitlines()[-1]


# -- every row failed -----------------------------------------------------------------------------------
def test_a_run_whose_rows_all_failed_exits_1_naming_the_commonest_error(run, tmp_path):
    inp, out = write_jsonl(tmp_path / "in.jsonl", [*TOO_LONG, NO_PROMPT]), tmp_path / "out.jsonl"
    code, err = run(inp, out)
    assert code == 1, err
    line = last_line(err)
    assert line.startswith("batchgen: error: all 4 rows failed; commonest error (3 rows): prompt too long: ")
    assert "Traceback" not in err and "complete: 4 rows" in err  # the summary, then the verdict
    records = [orjson.loads(x) for x in out.read_bytes().splitlines()]
    assert sorted(r["index"] for r in records) == [0, 1, 2, 3]  # every record written, all errors
    assert {r["finish_reason"] for r in records} == {"error"}
    state = load_state(out)
    assert state.complete and state.failed_rows == 4 and sum(state.error_counts.values()) == 4
    before = out.read_bytes()
    code, again = run(inp, out)  # finished: nothing redone, the same verdict
    assert code == 1 and last_line(again) == line and "already complete" in again
    assert out.read_bytes() == before


def test_a_resumed_run_counts_the_errors_it_found_in_the_output(run, tmp_path):
    inp, out = write_jsonl(tmp_path / "in.jsonl", [*TOO_LONG, NO_PROMPT]), tmp_path / "out.jsonl"
    code, err = run(inp, out, "--limit", "2")
    assert code == 1 and "all 2 rows failed; commonest error (2 rows): prompt too long" in last_line(err)
    first = out.read_bytes()
    code, err = run(inp, out)  # extends the output: its 2 error records are read back, not redone
    assert code == 1 and "resuming" in err
    assert "all 4 rows failed; commonest error (3 rows): prompt too long" in last_line(err)
    assert out.read_bytes().startswith(first) and len(out.read_bytes().splitlines()) == 4


def test_rows_all_skipped_exit_1(run, tmp_path):
    inp, out = write_jsonl(tmp_path / "in.jsonl", [*TOO_LONG[:2], NO_PROMPT]), tmp_path / "out.jsonl"
    code, err = run(inp, out, "--on-error", "skip")
    assert code == 1
    assert last_line(err).startswith("batchgen: error: all 3 rows failed; commonest error (2 rows): prompt")
    assert not out.exists() or out.read_bytes() == b""  # skipped rows write nothing
    state = load_state(out)
    assert state.complete and (state.skipped, state.failed_rows, state.records) == (3, 3, 0)


def test_a_run_with_some_good_rows_exits_0_by_default(run, tmp_path):
    inp, out = write_jsonl(tmp_path / "in.jsonl", [*GOOD, TOO_LONG[0]]), tmp_path / "out.jsonl"
    code, err = run(inp, out)
    assert code == 0, err
    assert load_state(out).failed_rows == 1


# -- --max-error-rate -----------------------------------------------------------------------------------
def test_max_error_rate_exits_1_after_every_record_and_is_not_part_of_the_job(run, tmp_path):
    inp, out = write_jsonl(tmp_path / "in.jsonl", [*GOOD, TOO_LONG[0]]), tmp_path / "out.jsonl"
    code, err = run(inp, out, "--max-error-rate", "0.2")
    assert code == 1, err
    line = last_line(err)
    assert line.startswith(
        "batchgen: error: 1 of 4 rows failed (25.0%, more than --max-error-rate 0.2); "
        "commonest error (1 row): prompt too long: "
    )
    before = out.read_bytes()
    assert sorted(orjson.loads(x)["index"] for x in before.splitlines()) == [0, 1, 2, 3]
    code, again = run(inp, out, "--max-error-rate", "0.2")  # nothing redone, the same verdict
    assert code == 1 and last_line(again) == line and out.read_bytes() == before
    code, relaxed = run(inp, out, "--max-error-rate", "0.25")  # not a different job: no refusal
    assert code == 0 and "already complete" in relaxed and out.read_bytes() == before


def test_skipped_rows_count_as_failed_for_the_rate(run, tmp_path):
    inp, out = write_jsonl(tmp_path / "in.jsonl", [*GOOD, NO_PROMPT]), tmp_path / "out.jsonl"
    code, err = run(inp, out, "--on-error", "skip", "--max-error-rate", "0.1")
    assert code == 1
    assert (
        "1 of 4 rows failed (25.0%, more than --max-error-rate 0.1); commonest error (1 row): no prompt"
        in (last_line(err))
    )
    assert sorted(orjson.loads(x)["id"] for x in out.read_bytes().splitlines()) == ["ok0", "ok1", "ok2"]


@pytest.mark.parametrize("rate", ["1.5", "-0.1", "lots"])
def test_max_error_rate_outside_0_to_1_is_a_usage_error(run, tmp_path, rate):
    inp, out = write_jsonl(tmp_path / "in.jsonl", GOOD), tmp_path / "out.jsonl"
    code, err = run(inp, out, "--max-error-rate", rate)
    assert code == 2 and "--max-error-rate" in last_line(err) and not out.exists()


def test_run_options_refuse_a_rate_outside_0_to_1():  # the Python side of the same check
    from batchgen.app.options import RunOptions

    with pytest.raises(ValueError, match="^--max-error-rate 1.5: give a fraction from 0 to 1$"):
        RunOptions(input="in.jsonl", output="out.jsonl", max_error_rate=1.5)


# -- --keep-columns -------------------------------------------------------------------------------------
def test_keep_columns_the_jsonl_input_lacks_is_refused(run, tmp_path):
    inp, out = write_jsonl(tmp_path / "in.jsonl", GOOD), tmp_path / "out.jsonl"
    code, err = run(inp, out, "--keep-columns", "topic,topc")
    assert code == 2
    assert (
        last_line(err)
        == "Error: --keep-columns 'topc' not found; columns in the first 3 rows: id, prompt, topic"
    )
    assert not out.exists() and not sidecar_dir(out).exists()


def test_keep_columns_the_parquet_schema_lacks_is_refused(run, tmp_path):
    inp = tmp_path / "in.parquet"
    pq.write_table(pa.table({"id": ["a"], "prompt": ["hi"]}), inp)
    code, err = run(inp, tmp_path / "out.jsonl", "--keep-columns", "topic")
    assert code == 2
    assert (
        last_line(err) == "Error: --keep-columns 'topic' not found; columns in the Parquet schema: id, prompt"
    )


def test_a_kept_column_some_first_rows_have_is_accepted(run, tmp_path):
    rows = [GOOD[0], {**GOOD[1], "note": "n"}]
    inp, out = write_jsonl(tmp_path / "in.jsonl", rows), tmp_path / "out.jsonl"
    assert run(inp, out, "--keep-columns", "note")[0] == 0
    records = sorted(map(orjson.loads, out.read_bytes().splitlines()), key=lambda r: r["index"])
    assert [r["note"] for r in records] == [None, "n"]


# -- a model that cannot be found -----------------------------------------------------------------------
@pytest.fixture
def no_hub(monkeypatch, tmp_path):
    """No hub access and an empty hub cache."""
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub-cache"))


@pytest.mark.parametrize(
    ("model", "why"),
    [
        ("./nope", "not a directory with config.json, nor a hub id"),
        ("some-org/some-model", "not a directory with config.json, and there is no hub access"),
        ("empty-dir", "the directory has no config.json"),
        ("in.jsonl", "a file, not a directory with config.json"),
    ],
)
@pytest.mark.usefixtures("no_hub")
def test_a_missing_model_is_one_line_and_leaves_no_output(run, tmp_path, monkeypatch, model, why):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "empty-dir").mkdir()
    inp, out = write_jsonl(tmp_path / "in.jsonl", GOOD), tmp_path / "out" / "out.jsonl"
    code, err = run(inp, out, model=model)
    assert code == 1
    assert err.strip() == f"batchgen: error: no model at {model}: {why}"
    assert not (tmp_path / "out").exists()


@pytest.mark.usefixtures("no_hub")
def test_a_missing_model_loses_nothing_already_done(run, tmp_path):
    inp, out = write_jsonl(tmp_path / "in.jsonl", GOOD), tmp_path / "out.jsonl"
    assert run(inp, out, "--limit", "2")[0] == 0
    before, state = out.read_bytes(), sidecar_dir(out) / "state.json"
    saved = json.loads(state.read_text())
    code, err = run(inp, out, model=str(tmp_path / "nope"))
    assert code == 1 and last_line(err).startswith(f"batchgen: error: no model at {tmp_path / 'nope'}: ")
    assert out.read_bytes() == before and json.loads(state.read_text()) == saved


# -- the advice to re-run ------------------------------------------------------------------------------
def test_an_output_that_is_a_directory_gets_no_advice_to_re_run(run, tmp_path):
    inp, out = write_jsonl(tmp_path / "in.jsonl", GOOD), tmp_path / "out.jsonl"
    (out / "kept").mkdir(parents=True)
    code, err = run(inp, out, "--overwrite")
    assert code == 1 and "re-run the same command" not in err and (out / "kept").is_dir()
    assert last_line(err) == (
        f"batchgen: error: I/O error on {out}: Is a directory (EISDIR); a re-run meets it again: "
        "fix the path or its permissions first (what was saved is kept)"
    )


# -- data parallel: shards are judged as one job ---------------------------------------------------------
def test_data_parallel_merges_shards_whose_rows_failed_and_judges_the_job(run, tmp_path, tiny_llama):
    from batchgen.app.data_parallel import _finish
    from batchgen.app.options import RunOptions
    from batchgen.app.outcome import RunFailed
    from batchgen.app.run import merged_target_done
    from batchgen.config import EngineConfig

    inp, out = write_jsonl(tmp_path / "in.jsonl", [*GOOD, *TOO_LONG]), tmp_path / "res.jsonl"
    codes = [run(inp, out, "--shard", f"{i}/2")[0] for i in range(2)]
    assert codes == [0, 1]  # the byte ranges put only an over-long row in shard 1: its own verdict
    assert _finish(codes, str(out), overwrite=False) == 0  # every shard complete: merged all the same
    merged = load_state(out)
    assert (merged.rows_done, merged.failed_rows, sum(merged.error_counts.values())) == (6, 3, 3)
    engine = EngineConfig(model=tiny_llama, max_model_len=64)
    opts = RunOptions(input=inp, output=str(out), sampling={"max_new_tokens": 2}, engine=engine)
    assert merged_target_done(opts)  # half the rows failed: fine under the default rate
    with pytest.raises(RunFailed, match=r"^3 of 6 rows failed \(50.0%, more than --max-error-rate 0.4\); "):
        merged_target_done(replace(opts, max_error_rate=0.4))


@pytest.mark.parametrize(
    ("codes", "advice"), [([0, 75], "re-run the same command to resume"), ([0, 2], "see their errors above")]
)
def test_data_parallel_advises_a_rerun_only_for_stopped_workers(tmp_path, caplog, codes, advice):
    from batchgen.app.data_parallel import _finish

    with caplog.at_level("INFO", logger="batchgen"):
        assert _finish(codes, str(tmp_path / "res.jsonl"), overwrite=False) == max(codes)
    assert caplog.records[-1].getMessage() == f"workers [1] did not complete (exit codes {codes}): {advice}"
