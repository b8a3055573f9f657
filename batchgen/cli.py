"""The ``batchgen`` command line: option parsing and exit codes only; the work lives in batchgen.app."""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import traceback
from typing import Any

import click

from batchgen import __version__
from batchgen.app.signals import StoppedEarly
from batchgen.bench.command import bench_command
from batchgen.cli_options import (
    GroupedCommand,
    chat_options,
    engine_options,
    input_options,
    model_options,
    output_options,
    run_control_options,
    sampling_options,
    shard_options,
)
from batchgen.lean_imports import hide_for_command

EXIT_FATAL, EXIT_USAGE, EXIT_INTERRUPTED = 1, 2, 75
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)
_SIZE_UNITS = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


class _LogHandler(logging.Handler):
    """stderr, resolved at each record (test runners swap it), and through tqdm so a bar stays intact."""

    def emit(self, record: logging.LogRecord) -> None:
        from tqdm import tqdm

        try:
            tqdm.write(self.format(record), file=sys.stderr)
        except Exception:  # a closed stream at exit must not raise
            self.handleError(record)


def _setup_logging(verbose: bool, tag: str | None = None) -> None:
    """``batchgen: message`` on stderr; ``batchgen[tag]: message`` for a shard (workers share a log)."""
    logger = logging.getLogger("batchgen")
    handler = next((h for h in logger.handlers if isinstance(h, _LogHandler)), None)
    if handler is None:
        handler = _LogHandler()
        logger.addHandler(handler)
        logger.propagate = False
    handler.setFormatter(logging.Formatter(f"batchgen{f'[{tag}]' if tag else ''}: %(message)s"))
    logger.setLevel(logging.DEBUG if verbose else logging.INFO)


def _fail(exc: BaseException, verbose: bool, expected: bool = True) -> None:
    """A fatal error: one line (the traceback too with -v), exit 1."""
    if verbose:
        traceback.print_exception(exc, file=sys.stderr)
    message = " ".join(str(exc).split())
    if not expected or not message:  # an unexpected exception: its type says what happened
        message = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
    click.echo(f"batchgen: error: {message}", err=True)
    sys.exit(EXIT_FATAL)


def _byte_size(value: str | None) -> int | None:
    """``--kv-cache-bytes 2G`` -> 2147483648."""
    if value is None:
        return None
    text = value.strip().lower().removesuffix("ib").removesuffix("b")
    scale = _SIZE_UNITS.get(text[-1:], 1)
    try:
        return int(float(text[:-1] if scale > 1 else text) * scale)
    except ValueError:
        raise click.BadParameter(
            f"{value!r} is not a size like 2G or 536870912", param_hint="--kv-cache-bytes"
        ) from None


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(__version__, "--version", prog_name="batchgen")
def cli() -> None:
    """Offline batch generation for LLMs: a JSONL/Parquet file of prompts in, completions out, resumable."""


@cli.command("run", cls=GroupedCommand)
@click.argument("input_path", metavar="INPUT")
@click.argument("output", metavar="OUTPUT")
@input_options
@shard_options
@chat_options
# sampling: one option per SamplingParams field (rows override them by the same names)
@sampling_options
@output_options
@model_options
@engine_options
@run_control_options
def run_command(input_path: str, output: str, verbose: bool, **kw: Any) -> None:
    """Generate a completion for every row of INPUT into OUTPUT (.jsonl or .parquet).

    Re-running the same command resumes; SIGTERM/SIGINT/SIGUSR1 save and exit 75. INPUT - reads JSONL
    from stdin, streamed: such a run cannot resume (a re-run needs --overwrite) nor be sharded.
    """
    _setup_logging(verbose, tag=f"shard {kw['shard'].strip()}" if kw["shard"] else None)
    hide_for_command(kw["trust_remote_code"])  # before anything imports transformers
    if kw["tensor_parallel"] > 1:
        _tensor_parallel_worker(kw)  # a launcher (torchrun, srun) started every rank: ranks > 0 serve
    if kw["data_parallel"] > 1:
        sys.exit(_data_parallel(input_path, output, verbose, kw))
    saved = {s: signal.signal(s, _exit_interrupted) for s in _STOP_SIGNALS}  # until the run's own handlers
    signal.pthread_sigmask(
        signal.SIG_UNBLOCK, _STOP_SIGNALS
    )  # a data-parallel worker starts with them blocked
    try:
        code = _run(input_path, output, verbose, kw)
    except StoppedEarly as stop:  # the one line a user sees for a stop before anything started
        logging.getLogger("batchgen").info(stop.text())
        code = EXIT_INTERRUPTED
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
    sys.exit(code)  # main() then skips the interpreter's teardown (_exit_process)


def _tensor_parallel_worker(kw: dict[str, Any]) -> None:
    from batchgen.model.loader import resolve_device
    from batchgen.tensor_parallel.launch import launched_rank

    rdzv = launched_rank(kw["tensor_parallel"])
    if rdzv is not None and rdzv.rank > 0:
        from batchgen.tensor_parallel.worker import serve_launched

        serve_launched(rdzv, resolve_device(kw["device"]).type == "cuda")
        sys.exit(0)


def _data_parallel(input_path: str, output: str, verbose: bool, kw: dict[str, Any]) -> int:
    from batchgen.app.data_parallel import run_data_parallel
    from batchgen.app.errors import FatalError
    from batchgen.app.run import merged_target_done
    from batchgen.app.shards import slurm_shard

    try:
        if kw["shard"] is not None or slurm_shard() is not None:
            raise click.UsageError(
                "--data-parallel runs its own shards: drop --shard, or run it outside a Slurm array"
            )
        argv = sys.argv[1:]
        if not argv or argv[0] != "run":
            raise click.UsageError("--data-parallel works from the command line (batchgen run ...)")
        if merged_target_done(_run_options(input_path, output, kw)):
            return 0
        return run_data_parallel(
            argv[1:], kw["data_parallel"], output, kw["overwrite"], kw["stats_file"], kw["tensor_parallel"],
            kw["max_error_rate"],
        )  # fmt: skip
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    except (FatalError, RuntimeError) as exc:
        _fail(exc, verbose)
    return EXIT_FATAL


def _exit_interrupted(signum: int, frame: Any) -> None:
    """A stop signal while still importing or reading the input's head: nothing started, nothing to save."""
    raise StoppedEarly(signum, EXIT_INTERRUPTED)


def _run(input_path: str, output: str, verbose: bool, kw: dict[str, Any]) -> int:
    from batchgen.app.errors import FatalError
    from batchgen.app.run import run
    from batchgen.io.readers import InputError
    from batchgen.io.row_parser import MissingColumn, SchemaError, UnknownKey
    from batchgen.io.writers import OutputError
    from batchgen.model.location import ModelNotFound

    opts = _run_options(input_path, output, kw)
    try:
        return run(opts)
    except UnknownKey as exc:
        raise click.UsageError(f"INPUT {exc}") from None
    except MissingColumn as exc:
        raise click.UsageError(str(exc)) from None
    except InputError as exc:
        raise click.BadParameter(str(exc), param_hint="'INPUT'") from None
    except OutputError as exc:
        raise click.BadParameter(str(exc), param_hint="'OUTPUT'") from None
    except (FatalError, SchemaError, ModelNotFound) as exc:
        _fail(exc, verbose)
    except Exception as exc:  # unexpected: still one line, -v for the traceback
        _fail(exc, verbose, expected=False)
    return EXIT_FATAL


def _run_options(input_path: str, output: str, kw: dict[str, Any]):
    """Click values -> RunOptions; invalid combinations are usage errors (exit 2)."""
    from batchgen.app.options import options_from_cli

    try:
        return options_from_cli(input_path, output, kw, _byte_size(kw["kv_cache_bytes"]))
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None


@cli.command("merge")
@click.argument("output", metavar="OUTPUT")
@click.option("--into", type=click.Path(dir_okay=False), help="Write here [default: OUTPUT; {shard} -> all].")
@click.option("--count", type=click.IntRange(min=1), help="The shard count, when shards of several exist.")
@click.option("--overwrite", is_flag=True, help="Replace a target that holds another job's output.")
@click.option("-v", "--verbose", is_flag=True)
def merge_command(output: str, into: str | None, count: int | None, overwrite: bool, verbose: bool) -> None:
    """Check that every shard of OUTPUT is complete, then join them into OUTPUT in input order."""
    from batchgen.app.errors import FatalError
    from batchgen.app.merge import merge
    from batchgen.io.writers import OutputError

    _setup_logging(verbose)
    try:
        merge(output, into, count, overwrite)
    except OutputError as exc:
        raise click.BadParameter(str(exc), param_hint="'OUTPUT'") from None
    except (FatalError, RuntimeError, OSError) as exc:
        _fail(exc, verbose)
    except Exception as exc:  # unexpected: still one line, -v for the traceback
        _fail(exc, verbose, expected=False)


@cli.command("status")
@click.argument("output", metavar="OUTPUT")
@click.option("--json", "as_json", is_flag=True, help="Print the state as JSON.")
@click.option("-v", "--verbose", is_flag=True)
def status_command(output: str, as_json: bool, verbose: bool) -> None:
    """Rows done / total, errors, tokens and last rate of a run on OUTPUT (or of its shards)."""
    from batchgen.app.errors import FatalError
    from batchgen.app.status import status_data, status_text

    try:
        data = status_data(output)
    except (FatalError, RuntimeError) as exc:
        _fail(exc, verbose)
    click.echo(json.dumps(data, indent=2) if as_json else status_text(data))


cli.add_command(bench_command)


def main(argv: list[str] | None = None) -> None:
    """The console script (``argv=None``: this process is batchgen's own) or a caller's ``argv``."""
    from batchgen.threads import prefer_short_spins

    prefer_short_spins()  # before anything loads torch: OpenMP reads it once, at load
    try:
        cli.main(args=argv, prog_name="batchgen")
    except SystemExit as done:
        if argv is not None:  # a script that called us goes on afterwards
            raise
        _exit_process(done.code)


def _exit_process(code: int | str | None) -> None:
    """End the process once a command returned: its files are written and closed, its threads joined.
    The interpreter's own teardown (unloading torch, transformers and what they imported) can take longer
    than a short job's generation, and can block in NCCL's destructors after a
    rank died; a command has nothing left for it to do."""
    if isinstance(code, str):  # sys.exit("message"): Python prints it and exits 1
        print(code, file=sys.stderr)
        code = EXIT_FATAL
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code or 0)


if __name__ == "__main__":
    main()
