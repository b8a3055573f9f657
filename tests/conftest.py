import os
from collections import Counter

import pytest

from batchgen.model.loader import default_model_dir
from tests.skips import unexplained
from tests.support.models import TINY_CONFIGS, build_tiny_model

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _skip_reason(report: pytest.TestReport) -> str:
    longrepr = report.longrepr
    text = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    return text.removeprefix("Skipped: ")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A skip that names nothing this machine lacks fails its test (tests/skips.py)."""
    outcome = yield
    report = outcome.get_result()
    if report.skipped and not hasattr(report, "wasxfail"):
        problem = unexplained(_skip_reason(report))
        if problem is not None:
            report.outcome, report.longrepr = "failed", f"skipped without cause: {problem}"


def pytest_terminal_summary(terminalreporter) -> None:
    """The number of skips and each reason, for CI's log (what a green run did not check)."""
    reasons = Counter(_skip_reason(report) for report in terminalreporter.stats.get("skipped", []))
    terminalreporter.write_line(f"skips: {sum(reasons.values())}")
    for reason, count in sorted(reasons.items()):
        terminalreporter.write_line(f"  {count} x {reason}")


@pytest.fixture(scope="session")
def default_model_path() -> str:
    """The embedded SmolLM2-135M-Instruct, converted once into the user cache."""
    return str(default_model_dir())


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory) -> dict[str, str]:
    """arch -> local dir of a tiny random model (llama, qwen2, mistral, qwen3)."""
    root = tmp_path_factory.mktemp("tiny-models")
    return {arch: str(build_tiny_model(arch, root / arch)) for arch in TINY_CONFIGS}


@pytest.fixture(scope="session")
def tiny_llama(tiny_models) -> str:
    return tiny_models["llama"]


@pytest.fixture
def gen(tiny_llama):
    """Run ``batchgen run`` in-process on the tiny model: (exit code, stderr)."""
    from click.testing import CliRunner

    from batchgen.cli import cli

    def _run(*args, model=tiny_llama, max_new_tokens=4):
        argv = ["run", *map(str, args), "--model", model, "--max-num-seqs", "4"]
        if "--max-new-tokens" not in args:
            argv += ["--max-new-tokens", str(max_new_tokens)]
        result = CliRunner().invoke(cli, argv, catch_exceptions=False)
        return result.exit_code, result.stderr

    return _run


@pytest.fixture(scope="module")
def one_torch_thread():
    """Tiny models gain nothing from intra-op threads, and on a busy 2-core runner their spin-waits make every
    step many times slower. Use with ``pytestmark = pytest.mark.usefixtures("one_torch_thread")``."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
