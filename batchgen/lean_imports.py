"""Keep a ``batchgen run`` process from importing packages that transformers loads because they are
installed, though text generation never calls them.

transformers' config and tokenizer modules import its image and video helpers, which import torchvision
when it is installed (most PyTorch images ship it), and torchvision imports torch._dynamo and sympy;
transformers' generation utilities import scikit-learn the same way. Those imports were seconds of every
process's start-up (docs/results.md, "Installs and start-up without transformers"). A package marked absent
in ``sys.modules`` (``None``) makes ``importlib.util.find_spec`` answer None, so transformers treats it as
not installed. The command line hides these unless ``--trust-remote-code`` (remote code may import them)
or ``BATCHGEN_IMPORT_ALL=1``; the names travel to its worker processes in ``BATCHGEN_HIDDEN_PACKAGES``.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Iterable, MutableMapping

UNUSED_BY_TEXT_GENERATION = ("torchvision", "torchaudio", "torchcodec", "sklearn")
IMPORT_ALL_ENV = "BATCHGEN_IMPORT_ALL"
HIDDEN_ENV = "BATCHGEN_HIDDEN_PACKAGES"


def hide_packages(names: Iterable[str], modules: MutableMapping[str, object] | None = None) -> list[str]:
    """Mark each installed, not yet imported package absent; returns the names hidden."""
    modules = sys.modules if modules is None else modules
    hidden = []
    for name in names:
        if not name or name in modules:  # already imported (or already hidden): leave it be
            continue
        try:
            installed = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            installed = False
        if installed:
            modules[name] = None
            hidden.append(name)
    return hidden


def hide_for_command(trust_remote_code: bool, environ: MutableMapping[str, str] | None = None) -> list[str]:
    """The command line's policy (see the module docstring); exports what it hid for child processes."""
    environ = os.environ if environ is None else environ
    if trust_remote_code or environ.get(IMPORT_ALL_ENV, "") not in ("", "0"):
        return []
    hidden = hide_packages(UNUSED_BY_TEXT_GENERATION)
    environ[HIDDEN_ENV] = ",".join(hidden)
    return hidden


def hide_inherited(environ: MutableMapping[str, str] | None = None) -> list[str]:
    """In a worker process: hide what the command that started it hid."""
    environ = os.environ if environ is None else environ
    return hide_packages(environ.get(HIDDEN_ENV, "").split(","))
