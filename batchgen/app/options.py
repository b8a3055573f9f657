"""Everything ``batchgen run`` was asked to do, as one frozen value, and the fingerprint a resume checks."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

from batchgen.app.shards import Shard
from batchgen.config import SamplingParams
from batchgen.io.rows import RowSpec

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
    # sampling; None = the model's generation config
    max_new_tokens: int = 256
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int = 0
    n: int = 1
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    logprobs: bool = False
    json_schema: str | None = None  # --json-schema FILE's schema as compact JSON text
    return_tokens: bool = False
    # engine: EngineConfig fields (model, dtype, device, max_num_seqs, ...)
    engine: dict[str, Any] = field(default_factory=dict)
    # run control
    overwrite: bool = False
    on_error: str = "record"
    flush_every: float = 10.0
    log_every: float = 30.0
    drain_timeout: float = 30.0
    stats_file: str | None = None
    progress_bar: bool | None = None  # None = a bar when stderr is a terminal

    def __post_init__(self) -> None:
        if self.on_error not in ON_ERROR:
            raise ValueError(f"on_error must be one of {ON_ERROR}")

    @property
    def row_stop(self) -> int | None:
        return None if self.limit is None else self.row_start + self.limit

    def fingerprint(self, model_name: str, input_fingerprint: dict[str, Any]) -> dict[str, Any]:
        """What an output depends on. Not in it: --limit (a longer re-run extends a shorter one; a shard's
        rows, which --limit moves, are in it as ``part``), the input's path and mtime (a copy staged
        elsewhere is the same input), and throughput options."""
        spec = self.spec
        part = {"part": list(self.part)} if self.part is not None else {}
        if self.split is not None:  # shards of batchgen before byte ranges covered other rows: refused
            part["split"] = self.split
        return {
            "model": model_name,
            "dtype": self.engine.get("dtype"),
            "quantization": self.engine.get("quantization"),  # None (absent in older states) = none
            "kv_cache_dtype": None if self.engine.get("kv_cache_dtype", "auto") == "auto" else "fp8",
            "max_model_len": self.engine.get("max_model_len"),
            "sampling": {
                "max_new_tokens": self.max_new_tokens,
                "temperature": self.temperature,
                "top_p": self.top_p,
                "top_k": self.top_k,
                "seed": self.seed,
                "n": self.n,
                "stop": list(self.stop),
                "ignore_eos": self.ignore_eos,
                "logprobs": self.logprobs,
                "json_schema": _digest(self.json_schema),
            },
            "prompts": {
                "prompt_column": spec.prompt_column,
                "template": spec.template,
                "id_column": spec.id_column,
                "keep_columns": list(spec.keep_columns),
                "chat": self.chat,
                "system_prompt": self.system_prompt,
                "return_tokens": self.return_tokens,
            },
            "input": input_fingerprint,
            "row_start": self.row_start,
            **part,
        }


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


_ENGINE_FIELDS = (
    "model", "device", "max_num_seqs", "max_batch_tokens", "max_model_len", "gpu_memory_utilization",
    "block_size", "async_mode", "cuda_graphs", "prefix_caching", "attention_backend", "model_impl",
    "trust_remote_code", "tensor_parallel", "quantization", "kv_cache_dtype", "threads",
)  # fmt: skip
_RUN_FIELDS = (
    "limit", "system_prompt", "max_new_tokens", "temperature", "top_p", "top_k", "seed", "n",
    "ignore_eos", "logprobs", "return_tokens", "overwrite", "on_error", "flush_every", "log_every",
    "drain_timeout", "stats_file", "progress_bar",
)  # fmt: skip


def options_from_cli(
    input_path: str, output: str, kw: dict[str, Any], kv_cache_bytes: int | None
) -> RunOptions:
    """``batchgen run``'s option values -> RunOptions (ValueError: an invalid combination)."""
    from batchgen.app.shards import parse_shard, slurm_shard
    from batchgen.config import EngineConfig
    from batchgen.io.rows import unescape_template

    keep = tuple(c.strip() for item in kw["keep_columns"] for c in item.split(",") if c.strip())
    chat = False if kw["no_chat"] else {"auto": None, "on": True, "off": False}[kw["chat_mode"]]
    engine = {name: kw[name] for name in _ENGINE_FIELDS}
    engine.update(dtype=None if kw["dtype"] == "auto" else kw["dtype"], kv_cache_bytes=kv_cache_bytes)
    EngineConfig(**engine)
    spec = RowSpec(
        prompt_column=kw["prompt_column"],
        template=None if kw["template"] is None else unescape_template(kw["template"]),
        id_column=kw["id_column"],
        keep_columns=keep,
    )
    shard = parse_shard(kw["shard"]) if kw["shard"] is not None else slurm_shard()
    run = {name: kw[name] for name in _RUN_FIELDS}
    schema = read_json_schema(kw["json_schema"]) if kw.get("json_schema") else None
    return RunOptions(input=input_path, output=output, spec=spec, shard=shard, chat=chat,
                      stop=tuple(kw["stop"]), engine=engine, json_schema=schema, **run)  # fmt: skip
