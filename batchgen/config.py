"""Frozen configuration: engine options and per-request sampling parameters."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any

# Structured-output constraints: at most one per request, and a row's own replaces the run's.
CONSTRAINT_FIELDS = ("json_schema", "regex", "choices")


@dataclass(frozen=True)
class SamplingParams:
    """How one prompt is sampled. ``temperature == 0`` (or ``top_k == 1``) means greedy."""

    max_new_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = no top-k cut
    seed: int = 0
    n: int = 1
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    logprobs: bool = False
    # Structured output (engine/grammar.py): a JSON Schema (a dict, or its JSON text; kept as compact
    # JSON text), a regular expression, or a list of strings the completion must be exactly one of.
    json_schema: str | dict | None = None
    regex: str | None = None
    choices: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if self.n < 1:
            raise ValueError(f"n must be >= 1, got {self.n}")
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        else:
            object.__setattr__(self, "stop", tuple(self.stop))
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise ValueError("stop strings must be non-empty strings")
        self._check_constraint()

    def _check_constraint(self) -> None:
        if self.json_schema is not None:
            object.__setattr__(self, "json_schema", _schema_text(self.json_schema))
        if self.regex is not None and (not isinstance(self.regex, str) or not self.regex):
            raise ValueError("regex must be a non-empty string")
        if self.choices is not None:
            choices = (self.choices,) if isinstance(self.choices, str) else tuple(self.choices)
            if not choices or any(not isinstance(c, str) or not c for c in choices):
                raise ValueError("choices must be a non-empty list of non-empty strings")
            object.__setattr__(self, "choices", choices)
        given = [name for name in CONSTRAINT_FIELDS if getattr(self, name) is not None]
        if len(given) > 1:
            raise ValueError(f"{' and '.join(given)} exclude each other: give one constraint")

    @property
    def constrained(self) -> bool:
        return self.json_schema is not None or self.regex is not None or self.choices is not None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1

    def with_overrides(self, **overrides) -> SamplingParams:
        """A copy with the non-None overrides applied (per-row overrides from the input). A row's own
        constraint replaces the base one, whatever its kind."""
        given = {k: v for k, v in overrides.items() if v is not None}
        if any(name in given for name in CONSTRAINT_FIELDS):
            given = {**dict.fromkeys(CONSTRAINT_FIELDS), **given}
        return replace(self, **given)


def _schema_text(schema: Any) -> str:
    """A JSON Schema as compact JSON text (property order kept: it is the order of the output's keys)."""
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except ValueError as exc:
            raise ValueError(f"json_schema is not valid JSON: {exc}") from None
    if not isinstance(schema, (dict, bool)):
        raise ValueError(f"json_schema must be a JSON object (or true), not {type(schema).__name__}")
    return json.dumps(schema, separators=(",", ":"), ensure_ascii=False)


@dataclass(frozen=True)
class EngineConfig:
    """Engine options. ``None`` means "derive from the model / device"."""

    model: str | None = None  # hub id or local dir; None = the embedded default model
    dtype: str | None = None  # "float32" | "bfloat16" | "float16"; None = bf16 on CUDA, fp32 on CPU
    device: str | None = None  # "cuda" | "cpu" | "cuda:1"; None = cuda if present
    max_num_seqs: int = 256
    max_batch_tokens: int = 8192
    max_model_len: int | None = None  # None = the model's max_position_embeddings
    gpu_memory_utilization: float = 0.9
    kv_cache_bytes: int | None = None  # explicit KV budget (CPU default: 2 GiB, capped by need)
    block_size: int = 16
    async_mode: bool | None = None  # None = async on CUDA, sync on CPU
    cuda_graphs: bool | None = None  # None = on on CUDA
    prefix_caching: bool = True
    attention_backend: str | None = None  # "torch" | "triton"; None = triton on CUDA when available
    # "auto": batchgen's fused forward for the Llama family, else transformers' modelling code.
    model_impl: str = "auto"  # "auto" | "batchgen" | "transformers"
    trust_remote_code: bool = False
    tensor_parallel: int = 1  # processes (GPUs) one model is split over
    load_format: str = "auto"  # "auto": the checkpoint's weights; "random": random weights of its shapes
    quantization: str | None = None  # "fp8": quantize a bf16/fp16 checkpoint's projections at load
    kv_cache_dtype: str = "auto"  # "auto" (the model dtype) | "fp8"
    threads: int | None = None  # torch intra-op threads; None: on the CPU, the free cores (threads.py)
    extra: dict = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.max_batch_tokens < 1:
            raise ValueError(f"max_batch_tokens must be >= 1, got {self.max_batch_tokens}")
        if self.block_size < 1 or self.block_size & (self.block_size - 1):
            raise ValueError(f"block_size must be a power of two, got {self.block_size}")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.dtype not in (None, "float32", "bfloat16", "float16", "fp32", "bf16", "fp16"):
            raise ValueError(f"unknown dtype {self.dtype!r}")
        if self.attention_backend not in (None, "torch", "triton"):
            raise ValueError(f"unknown attention backend {self.attention_backend!r}")
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"threads must be >= 1, got {self.threads}")
        if self.model_impl not in ("auto", "batchgen", "transformers"):
            raise ValueError(f"unknown model implementation {self.model_impl!r}")
        if self.tensor_parallel < 1:
            raise ValueError(f"tensor_parallel must be >= 1, got {self.tensor_parallel}")
        if self.load_format not in ("auto", "random"):
            raise ValueError(f"unknown load format {self.load_format!r}")
        if self.quantization not in (None, "fp8"):
            raise ValueError(f"unknown quantization {self.quantization!r} (supported: fp8)")
        if self.kv_cache_dtype not in ("auto", "fp8"):
            raise ValueError(f"unknown KV cache dtype {self.kv_cache_dtype!r} (auto or fp8)")
