"""The command line hides packages transformers would import only because they are installed
(batchgen/lean_imports.py). The oracle is transformers' own probe: a hidden package reads as absent."""

from __future__ import annotations

import subprocess
import sys

from batchgen import lean_imports

# pyarrow stands in for torchvision: installed here, and not imported by these subprocesses before the
# hiding (torchvision itself is not installed on the CPU machines).
_PROBE = """
import sys
from batchgen.lean_imports import hide_packages
hidden = hide_packages(["pyarrow", "no_such_package_here"])
from transformers.utils.import_utils import _is_package_available
try:
    import pyarrow
    imported = True
except ImportError:
    imported = False
print(hidden, _is_package_available("pyarrow")[0], imported)
"""


def test_a_hidden_package_reads_as_absent_to_transformers():
    done = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, check=True)
    assert done.stdout.split("\n")[0] == "['pyarrow'] False False"


def test_only_installed_packages_not_yet_imported_are_hidden():
    modules = {"json": sys.modules["json"]}
    hidden = lean_imports.hide_packages(["json", "pyarrow", "no_such_package_here", ""], modules)
    assert hidden == ["pyarrow"]
    assert modules == {"json": sys.modules["json"], "pyarrow": None}


def test_the_command_keeps_everything_for_remote_code_or_when_asked(monkeypatch):
    calls = []
    monkeypatch.setattr(lean_imports, "hide_packages", lambda names: calls.append(list(names)) or ["sklearn"])
    env = {}
    assert lean_imports.hide_for_command(trust_remote_code=True, environ=env) == [] and not calls
    assert lean_imports.hide_for_command(False, environ={lean_imports.IMPORT_ALL_ENV: "1"}) == []
    assert lean_imports.hide_for_command(False, environ=env) == ["sklearn"]
    assert calls == [list(lean_imports.UNUSED_BY_TEXT_GENERATION)]
    assert env == {lean_imports.HIDDEN_ENV: "sklearn"}  # what the command's workers inherit
    calls.clear()
    lean_imports.hide_inherited({lean_imports.HIDDEN_ENV: "sklearn"})
    assert calls == [["sklearn"]]
