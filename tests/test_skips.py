"""The skip guard (tests/skips.py, tests/conftest.py): a test may skip only for a thing this machine lacks;
any other skip fails it, and the summary counts the skips and names each reason."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch

from tests.skips import unexplained

_CASES = """
import pytest

def test_lacks_many_gpus():
    pytest.skip("needs 999 GPUs")

def test_an_old_excuse():
    pytest.skip("transformers is not a verified release")

def test_a_package_that_is_here():
    pytest.importorskip("json_is_here_but", reason="could not import 'json'")

def test_a_package_that_is_not():
    pytest.importorskip("no_such_module_for_batchgen")

@pytest.mark.skipif(True, reason="needs a machine without CUDA")
def test_a_machine_without_cuda():
    pass
"""


def test_only_missing_things_explain_a_skip():
    assert unexplained("needs 999 GPUs") is None
    assert unexplained("could not import 'no_such_module_for_batchgen': No module named ...") is None
    assert "has what the skip says it lacks" in unexplained("could not import 'json'")
    assert "names nothing" in unexplained("transformers is not a verified release")
    assert "names nothing" in unexplained("too slow here")
    assert (unexplained("needs CUDA") is None) == (not torch.cuda.is_available())
    assert (unexplained("needs a machine without CUDA") is None) == torch.cuda.is_available()


def test_a_skip_without_cause_fails_its_test_and_the_summary_names_every_skip(tmp_path):
    (tmp_path / "test_cases.py").write_text(_CASES)
    root = Path(__file__).resolve().parents[1]
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "tests.conftest", "-p", "no:cacheprovider"]
    argv += ["--rootdir", str(tmp_path), str(tmp_path / "test_cases.py")]
    done = subprocess.run(argv, cwd=root, capture_output=True, text=True, timeout=300)
    out = done.stdout
    assert done.returncode == 1, out
    # a skip at set-up (a skipif mark) fails as an error, one in the test's body as a failure
    ended = [line for line in out.splitlines() if line.startswith(("FAILED", "ERROR"))]
    failed = {line.split("::")[1].split()[0] for line in ended}
    want = {"test_an_old_excuse", "test_a_package_that_is_here"}
    want |= set() if torch.cuda.is_available() else {"test_a_machine_without_cuda"}
    assert failed == want, out
    skipped = 3 - len(want - {"test_an_old_excuse", "test_a_package_that_is_here"})
    assert f"skips: {skipped}" in out and "1 x needs 999 GPUs" in out, out
