"""Crash, signal and resume tests: a resumed run ends with the records of an uninterrupted one, exactly once.

Crashes are real SIGKILLs of ``batchgen run`` subprocesses, at points named by ``BATCHGEN_FAULT`` (see
batchgen/io/faults.py) or sent from outside once records appear. The subprocesses start together (their
imports dominate); each resume runs in this process. Each fault writes a report as it fires (the point,
and what the engine held): the tests check that the kill came from the fault, in the state it is named
for, and not from this file's deadline.
"""

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import NamedTuple

import orjson
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from batchgen.cli import cli
from batchgen.io.checkpoint import load_state

ROWS = [{"id": f"r{i}", "prompt": f"Row {i}: " + "tell me more " * (i % 7)} for i in range(24)]
for _row in ROWS[2::4]:  # rows that end early, so rows admitted together do not all finish together
    _row["max_new_tokens"] = 3
ROWS[5] = {"id": "chat", "messages": [{"role": "user", "content": "Hi!"}]}
ROWS[9] = {"id": "bad", "prompt": None}  # an error record must also be written exactly once
LONG_ROWS = [
    {"id": f"doc{i}", "prompt": f"Document {i}: " + "lorem ipsum dolor sit amet " * 80} for i in range(6)
]
OPTIONS = ["--max-new-tokens", "8", "--max-num-seqs", "4", "--flush-every", "0", "--log-every", "0.5"]
# input name -> (rows, extra options); long prompts are prefilled in 64-token chunks over many steps
INPUTS = {"short": (ROWS, []), "long": (LONG_ROWS, ["--max-batch-tokens", "64"])}

# name -> (input, output extension, BATCHGEN_FAULT, what the driver does)
CRASHES = {
    "chunked-prefill": ("long", "jsonl", "output:1", None),  # first row done, the others mid-prefill
    "admission": ("short", "jsonl", "submit:12", None),  # the engine just took a row: about to prefill it
    "mid-decode": ("short", "jsonl", "output:6", None),  # an output came back while others decode
    "torn-record": ("short", "jsonl", "torn:9", None),  # half a record written
    "during-flush": ("short", "jsonl", "flush:7", None),  # records handed to the OS, not yet fsynced
    "before-state": ("short", "jsonl", "state:5", None),  # output synced, state file not yet written
    "parquet-part": ("short", "parquet", "part:3", None),  # a part file written, not yet renamed
    "parquet-final": ("short", "parquet", "finalize:1", None),  # final file in place, parts still there
    "sigkill-outside": ("short", "jsonl", None, ("kill", signal.SIGKILL, 5)),  # kill -9 at 5 records
    "sigterm": ("short", "jsonl", None, ("signal", signal.SIGTERM, 3)),  # drain, exit 75
}


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _args(inputs: dict, name: str, out: Path, model: str) -> list[str]:
    return ["run", str(inputs[name]), str(out), "--model", model, *OPTIONS, *INPUTS[name][1]]


def _records_on_disk(out: Path) -> int:
    try:
        return out.read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


def _drive(procs: dict, deadline: float) -> set[str]:
    """Send the outside signals once enough records exist; wait for every process. The names of those
    still running at the deadline, which are killed: their tests must fail, not pass as crashed."""
    pending = dict(procs)
    while pending and time.monotonic() < deadline:
        for name, (proc, out, action) in list(pending.items()):
            if proc.poll() is not None:
                del pending[name]
            elif action and _records_on_disk(out) >= action[2]:
                proc.send_signal(action[1])
                pending[name] = (proc, out, None)
        time.sleep(0.02)
    for proc, _, _ in pending.values():
        proc.kill()
    return set(pending)


@pytest.fixture(scope="module")
def crashed(tiny_llama, tmp_path_factory):
    """Every crash scenario run once, concurrently: name -> (output path, return code, stderr)."""
    root = tmp_path_factory.mktemp("crashes")
    inputs = {}
    for name, (rows, _) in INPUTS.items():
        inputs[name] = root / f"{name}.jsonl"
        inputs[name].write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    procs = {}
    for name, (inp, ext, fault, action) in CRASHES.items():
        out = root / f"{name}.{ext}"
        report = root / f"{name}.fault.json"
        run_env = {**env, "BATCHGEN_FAULT": fault, "BATCHGEN_FAULT_REPORT": str(report)} if fault else env
        cmd = [sys.executable, "-m", "batchgen", *_args(inputs, inp, out, tiny_llama)]
        err = open(root / f"{name}.err", "wb")  # noqa: SIM115 - closed below
        procs[name] = (subprocess.Popen(cmd, env=run_env, stderr=err, stdout=err), out, action)
        err.close()
    timed_out = _drive(procs, time.monotonic() + 400)
    results = {}
    for name, (proc, out, _) in procs.items():
        report = root / f"{name}.fault.json"
        fired = orjson.loads(report.read_bytes()) if report.exists() else None
        results[name] = Crash(out, proc.wait(), (root / f"{name}.err").read_text(), fired, name in timed_out)
    return inputs, results


class Crash(NamedTuple):
    out: Path
    code: int
    stderr: str
    fault: dict | None  # the report the fault wrote as it fired (None: it never fired)
    timed_out: bool  # killed by this file's deadline, not by the scenario


def _mid_prefill(engine: dict) -> bool:
    return any(0 < r["computed"] < r["prompt"] for r in engine["running"])


def _mid_decode(engine: dict) -> bool:
    return any(r["output"] > 0 for r in engine["running"])


# What the engine held at the kill, for the points named after an engine state (see the CRASHES notes).
ENGINE_AT_KILL = {
    # Rows are being taken in (queued, not started) while the first ones generate; none has finished.
    "admission": lambda e: e["steps"] > 0 and e["finished"] == 0 and e["running"] and e["waiting"] > 0,
    # A long prompt is partly in the KV cache: its prefill spans steps and is cut here.
    "chunked-prefill": lambda e: e["finished"] == 1 and _mid_prefill(e),
    # Outputs came back while other rows hold generated tokens and go on decoding.
    "mid-decode": lambda e: e["finished"] >= 5 and _mid_decode(e),
}


def _lose_unsynced(out: Path, synced_bytes: int) -> None:
    """Power loss right after a kill in flush: data not yet fsynced may be gone. SIGKILL alone cannot
    lose it (the kernel's page cache holds it and writes it back), so simulate the loss: keep what the
    writer had fsynced (its size, from the fault report) and a torn half of the rest."""
    data = out.read_bytes()
    durable = data[:synced_bytes].count(b"\n")
    assert data.count(b"\n") > durable, "the kill left no un-fsynced record to lose"
    assert load_state(out).records <= durable, "the state counts records that were not yet fsynced"
    lost = data[synced_bytes:]
    out.write_bytes(data[:synced_bytes] + lost[: len(lost) // 2])


@pytest.fixture(scope="module")
def baseline(crashed, tiny_llama, tmp_path_factory):
    """The uninterrupted runs' records: (input, output extension) -> sorted records."""
    inputs, _ = crashed
    root = tmp_path_factory.mktemp("baseline")
    outs = {}
    for inp, ext in {(c[0], c[1]) for c in CRASHES.values()}:
        out = root / f"{inp}.{ext}"
        result = CliRunner().invoke(cli, _args(inputs, inp, out, tiny_llama))
        assert result.exit_code == 0, result.stderr
        outs[inp, ext] = _sorted_records(out)
    return outs


def _sorted_records(out: Path) -> list:
    """JSONL: the raw lines (bytes) sorted by (index, sample); Parquet: the rows, sorted the same way."""
    if out.suffix == ".parquet":
        return sorted(pq.read_table(out).to_pylist(), key=lambda r: (r["index"], r["sample"]))
    return sorted(
        out.read_bytes().splitlines(), key=lambda b: (orjson.loads(b)["index"], orjson.loads(b)["sample"])
    )


@pytest.mark.parametrize("name", list(CRASHES))
def test_resume_after_crash_equals_uninterrupted_run(name, crashed, baseline, tiny_llama):
    inputs, results = crashed
    inp, ext, fault = CRASHES[name][:3]
    out, code, err, fired, timed_out = results[name]
    assert not timed_out, f"{name}: still running at the test's deadline (killed): {err[-2000:]}"
    expected_code = 75 if name == "sigterm" else -signal.SIGKILL
    assert code == expected_code, err
    if fault:
        assert fired is not None and f"{fired['point']}:{fired['at']}" == fault, (fired, err[-2000:])
        if name in ENGINE_AT_KILL:
            assert ENGINE_AT_KILL[name](fired["snapshot"]), fired["snapshot"]
    state = load_state(out)
    assert state is not None and not state.complete
    if name == "sigterm":
        assert "SIGTERM" in err and "re-run the same command to resume" in err
    if name == "during-flush":
        _lose_unsynced(out, fired["snapshot"]["synced_bytes"])
    result = CliRunner().invoke(cli, _args(inputs, inp, out, tiny_llama))
    assert result.exit_code == 0, result.stderr
    assert _sorted_records(out) == baseline[inp, ext]  # byte for byte (JSONL), each record exactly once
    assert load_state(out).complete
    again = CliRunner().invoke(cli, _args(inputs, inp, out, tiny_llama))
    assert again.exit_code == 0 and "already complete" in again.stderr


# -- signals delivered to this process (handlers run in the main thread, as in the CLI) -----------------
def _generated_on_disk(out: Path) -> int:
    """Records of rows that ran (the bad row's error record is written as soon as it is read)."""
    try:
        lines = out.read_bytes().splitlines()
    except FileNotFoundError:
        return 0
    return sum(b'"finish_reason":"error"' not in line for line in lines)


def _signal_when(out: Path, records: int, sigs: list[int], done: threading.Event) -> None:
    """Signal once `records` rows have generated: by then the engine holds rows in flight to drain."""
    while not done.is_set() and _generated_on_disk(out) < records:
        time.sleep(0.01)
    for sig in sigs:
        if done.is_set():
            return
        os.kill(os.getpid(), sig)
        time.sleep(0.05)


@pytest.fixture
def harmless_signals():
    """If a signal lands after the run restored the handlers, it must not stop pytest."""
    saved = {s: signal.signal(s, lambda *a: None) for s in (signal.SIGUSR1, signal.SIGINT)}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


def _run_with_signals(args: list[str], out: Path, records: int, sigs: list[int]):
    done = threading.Event()
    sender = threading.Thread(target=_signal_when, args=(out, records, sigs, done))
    sender.start()
    try:
        return CliRunner().invoke(cli, args)
    finally:
        done.set()
        sender.join()


@pytest.mark.parametrize(
    ("sigs", "extra", "message", "name"),
    [
        ([signal.SIGUSR1], [], "SIGUSR1: no new rows", "short"),  # drain: in-flight rows finish
        # Long decodes: the drain of the running rows takes many steps, so the second SIGINT lands in it.
        ([signal.SIGINT, signal.SIGINT], ["--max-new-tokens", "300"], "second SIGINT: abandoning", "short"),
        ([signal.SIGUSR1], ["--drain-timeout", "0.001"], "drain timeout", "short"),
    ],
)
def test_signals_save_and_exit_75_then_resume_exactly_once(
    sigs, extra, message, name, crashed, baseline, tiny_llama, tmp_path, harmless_signals
):
    _signals_then_resume(sigs, extra, message, name, crashed, baseline, tiny_llama, tmp_path)


@pytest.fixture
def helper_turns(monkeypatch):
    """A GPU run's helper-thread turns (threads.HostTurns) on the CPU: the eager runner says each step is
    still running when fetched, so the engine opens the helpers' turn at every fetch as a CUDA run does
    while it waits for the device, and the prompt and writer threads wait for their turns."""
    from batchgen.engine.runner import EagerRunner

    monkeypatch.setattr(EagerRunner, "ready", lambda self, handle: False, raising=False)


@pytest.mark.parametrize(
    ("sigs", "extra", "message"),
    [
        ([], [], None),  # the whole run
        ([signal.SIGUSR1], [], "SIGUSR1: no new rows"),
        ([signal.SIGINT, signal.SIGINT], ["--max-new-tokens", "300"], "second SIGINT: abandoning"),
    ],
)
def test_with_helper_turns_runs_drains_and_resumes_exactly_once(
    sigs, extra, message, crashed, baseline, tiny_llama, tmp_path, harmless_signals, helper_turns
):
    if not sigs:
        inputs, _ = crashed
        out = tmp_path / "out.jsonl"
        result = CliRunner().invoke(cli, _args(inputs, "short", out, tiny_llama))
        assert result.exit_code == 0, result.stderr
        assert _sorted_records(out) == baseline["short", "jsonl"]
        return
    _signals_then_resume(sigs, extra, message, "short", crashed, baseline, tiny_llama, tmp_path)


def _signals_then_resume(sigs, extra, message, name, crashed, baseline, tiny_llama, tmp_path) -> None:
    inputs, _ = crashed
    out = tmp_path / "out.jsonl"
    args = _args(inputs, name, out, tiny_llama)
    result = _run_with_signals(args + extra, out, 1, sigs)
    assert result.exit_code == 75, result.stderr
    assert message in result.stderr
    records = _records_on_disk(out)
    assert 1 <= records < len(INPUTS[name][0]) and load_state(out).records == records
    resumed = CliRunner().invoke(cli, args + extra)
    assert resumed.exit_code == 0, resumed.stderr
    expected = baseline[name, "jsonl"]
    if "--max-new-tokens" in extra:  # its own uninterrupted run: the options differ from the baseline's
        fresh = tmp_path / "fresh.jsonl"
        assert CliRunner().invoke(cli, _args(inputs, name, fresh, tiny_llama) + extra).exit_code == 0
        expected = _sorted_records(fresh)
    assert _sorted_records(out) == expected
