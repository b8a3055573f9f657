"""Everything ``batchgen run`` was asked to do, as one frozen value, and the fingerprint a resume checks."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, fields, replace
from functools import cached_property
from typing import Any

from batchgen.app.shards import Shard
from batchgen.app.template_options import chat_template_kwargs, read_chat_template, template_fingerprint
from batchgen.config import MODEL_DEFAULTS, PARAMS, EngineConfig, SamplingParams
from batchgen.io.row_parser import RowSpec

ON_ERROR = ("record", "skip", "fail")


@dataclass(frozen=True)
class RunOptions:
    input: str
    output: str
    spec: RowSpec = field(default_factory=RowSpec)
    limit: int | None = None
    row_start: int = 0  # first row (global index) this run covers: sharding sets it
    shard: Shard | None = None  # resolved against the input's rows by ``run``
    part: tuple[int, int | None] | None = None  # a resolved shard's rows [start, stop or None = the end)
    split: str | None = None  # "bytes": the shard is a byte range of plain JSONL (see app/shards.py)
    # prompts
    chat: bool | None = None  # None = auto
    system_prompt: str | None = None
    chat_template: str | None = None  # --chat-template's text: replaces the model's
    chat_template_kwargs: dict[str, Any] | None = None  # extra template variables (rows add their own)
    # the sampling parameters given on the command line, checked (by SamplingParams field name); the
    # model's generation config and SamplingParams' defaults give the others, rows override them
    sampling: dict[str, Any] = field(default_factory=dict)
    return_tokens: bool = False
    reasoning_parser: str = "auto"  # --reasoning-parser: auto | none | a parser's name (``reasoning``)
    engine: EngineConfig = field(default_factory=EngineConfig)
    # run control
    overwrite: bool = False
    on_error: str = "record"
    max_error_rate: float = 1.0  # a finished run with more failed rows exits 1 (not in the fingerprint)
    flush_every: float = 10.0
    log_every: float = 30.0
    drain_timeout: float = 30.0
    stats_file: str | None = None
    progress_bar: bool | None = None  # None = a bar when stderr is a terminal
    # "auto": OpenAI Batch requests when the first line is one, else rows; ``run`` resolves it
    input_format: str = "auto"

    def __post_init__(self) -> None:
        if self.on_error not in ON_ERROR:
            raise ValueError(f"on_error must be one of {ON_ERROR}")
        if not 0 <= self.max_error_rate <= 1:
            raise ValueError(f"--max-error-rate {self.max_error_rate:g}: give a fraction from 0 to 1")

    @property
    def batch_api(self) -> bool:
        """OpenAI Batch requests in, response lines out (io/openai_batch.py, io/openai_output.py)."""
        return self.input_format == "openai"

    @cached_property
    def reasoning(self) -> str | None:
        """The reasoning parser the run uses, None for none: ``auto``'s comes from the model's tokenizer
        files, read once, before the model loads (the fingerprint holds it). FatalError: a parser named
        for a model without think tokens."""
        from batchgen.app.errors import FatalError
        from batchgen.model.loader import local_model_dir
        from batchgen.model.reasoning import parser_name

        try:
            return parser_name(self.reasoning_parser, lambda: local_model_dir(self.engine.model))
        except ValueError as exc:
            raise FatalError(str(exc)) from None

    @property
    def row_stop(self) -> int | None:
        return None if self.limit is None else self.row_start + self.limit

    @property
    def n(self) -> int:
        """Samples per row (rows may ask for another number)."""
        return self.sampling.get("n", SamplingParams.n)

    @property
    def logprobs(self) -> bool:
        """Whether the run asks for log-probabilities (rows may ask too)."""
        return self.sampling.get("logprobs") is not None

    def base_sampling(self, model_defaults: SamplingParams) -> SamplingParams:
        """Every row's parameters before its own: the model's defaults with the command line's values."""
        return replace(model_defaults, **self.sampling)

    def fingerprint(self, model_name: str, input_fingerprint: dict[str, Any]) -> dict[str, Any]:
        """What an output depends on. Not in it: --limit (a longer re-run extends a shorter one; a shard's
        rows, which --limit moves, are in it as ``part``), the input's path and mtime (a copy staged
        elsewhere is the same input), and throughput options."""
        spec, engine = self.spec, self.engine
        part = {"part": list(self.part)} if self.part is not None else {}
        if self.split is not None:  # shards of batchgen before byte ranges covered other rows: refused
            part["split"] = self.split
        return {
            "model": model_name,
            "dtype": engine.dtype,
            "quantization": engine.quantization,  # None (absent in older states) = none
            "kv_cache_dtype": None if engine.kv_cache_dtype == "auto" else "fp8",
            "max_model_len": engine.max_model_len,
            "sampling": sampling_fingerprint(self.sampling),
            "prompts": {
                "prompt_column": spec.prompt_column,
                "template": spec.template,
                "id_column": spec.id_column,
                "keep_columns": list(spec.keep_columns),
                "chat": self.chat,
                "system_prompt": self.system_prompt,
                "return_tokens": self.return_tokens,
                **template_fingerprint(self.chat_template, self.chat_template_kwargs),
            },
            "input": input_fingerprint,
            # The parser in effect, not the option: ``auto`` adds the key only for a model with think
            # tokens, so a state written before reasoning output existed compares equal for the others,
            # and records with and without ``reasoning`` never share an output.
            **({"reasoning_parser": self.reasoning} if self.reasoning else {}),
            **({"input_format": "openai"} if self.input_format == "openai" else {}),
            "row_start": self.row_start,
            **part,
        }


# The sampling parameters every state records, as batchgen recorded them before the others existed (unset:
# the model's default, or the dataclass's); the others are recorded only when set to something else, so a
# state written before they existed compares equal to a run that does not use them.
_ALWAYS = ("max_new_tokens", "temperature", "top_p", "top_k", "seed", "n", "stop", "ignore_eos")


def sampling_fingerprint(given: dict[str, Any]) -> dict[str, Any]:
    """Every sampling parameter an output depends on: a re-run that changes any is refused, naming it."""
    defaults = SamplingParams()
    out: dict[str, Any] = {}
    for name in _ALWAYS:
        value = given.get(name, None if name in MODEL_DEFAULTS else getattr(defaults, name))
        out[name] = _plain(value)
    logprobs = given.get("logprobs")  # before N: a flag
    out["logprobs"] = False if logprobs is None else True if logprobs == 0 else logprobs
    out["json_schema"] = _digest(given.get("json_schema"))
    for name, value in sorted(given.items()):
        if name not in out and value != getattr(defaults, name):
            out[name] = _plain(value)
    return out


def _plain(value: Any) -> Any:
    """A value as JSON holds it (tuples become lists)."""
    return [_plain(v) for v in value] if isinstance(value, (tuple, list)) else value


def _digest(text: str | None) -> str | None:
    return None if text is None else "sha256:" + hashlib.sha256(text.encode()).hexdigest()[:16]


def read_json_schema(path: str) -> str:
    """--json-schema FILE -> compact JSON text (ValueError naming the problem: a usage error)."""
    from batchgen.engine.grammar import check_json_schema

    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        raise ValueError(f"--json-schema {path}: {exc.strerror or exc}") from None
    problem = check_json_schema(text)
    if problem:
        raise ValueError(f"--json-schema {path}: {problem}")
    return SamplingParams(json_schema=text).json_schema


def sampling_from_cli(kw: dict[str, Any]) -> dict[str, Any]:
    """The sampling parameters given on the command line, by field name, checked by SamplingParams
    (ValueError: a usage error). ``--json-schema FILE`` is read; ``--stop-token-ids 7,42`` is split."""
    given: dict[str, Any] = {}
    for name, param in PARAMS.items():
        value = kw.get(name)
        if value is None or value == ():
            continue
        if param.kind == "ints":
            try:
                value = [int(part) for part in value.replace(",", " ").split()]
            except ValueError:
                raise ValueError(
                    f"--{name.replace('_', '-')} takes token ids like 7,42, not {value!r}"
                ) from None
        elif param.kind == "schema":
            value = read_json_schema(value)
        given[name] = value
    params = SamplingParams(**given)
    return {name: getattr(params, name) for name in given}


_RUN_FIELDS = (
    "limit", "system_prompt", "return_tokens", "overwrite", "on_error", "flush_every", "log_every",
    "drain_timeout", "stats_file", "progress_bar", "reasoning_parser", "max_error_rate",
)  # fmt: skip


def options_from_cli(
    input_path: str, output: str, kw: dict[str, Any], kv_cache_bytes: int | None
) -> RunOptions:
    """``batchgen run``'s option values -> RunOptions (ValueError: an invalid combination)."""
    from batchgen.app.shards import parse_shard, slurm_shard
    from batchgen.app.stdin_input import check_dashes
    from batchgen.io.row_parser import unescape_template

    keep = tuple(c.strip() for item in kw["keep_columns"] for c in item.split(",") if c.strip())
    chat = False if kw["no_chat"] else {"auto": None, "on": True, "off": False}[kw["chat_mode"]]
    engine = {f.name: kw[f.name] for f in fields(EngineConfig) if kw.get(f.name) is not None}
    engine.update(dtype=None if kw["dtype"] == "auto" else kw["dtype"], kv_cache_bytes=kv_cache_bytes)
    spec = RowSpec(
        prompt_column=kw["prompt_column"],
        template=None if kw["template"] is None else unescape_template(kw["template"]),
        id_column=kw["id_column"],
        keep_columns=keep,
    )
    shard = parse_shard(kw["shard"]) if kw["shard"] is not None else slurm_shard()
    check_dashes(input_path, output, shard, kw.get("data_parallel", 1))
    run = {name: kw[name] for name in _RUN_FIELDS}
    run["input_format"] = kw.get("input_format") or "auto"
    run["chat_template"] = read_chat_template(kw.get("chat_template"))
    run["chat_template_kwargs"] = chat_template_kwargs(kw.get("chat_template_kwargs"))
    return RunOptions(input=input_path, output=output, spec=spec, shard=shard, chat=chat,
                      sampling=sampling_from_cli(kw), engine=EngineConfig(**engine), **run)  # fmt: skip
