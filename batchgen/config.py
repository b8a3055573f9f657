"""Frozen configuration: engine options and per-request sampling parameters."""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field, fields, replace
from typing import Any, NamedTuple

# Structured-output constraints: at most one per request, and a row's own replaces the run's.
CONSTRAINT_FIELDS = ("json_schema", "regex", "choices")
MAX_LOGPROBS = 20  # the most alternatives ``logprobs`` / ``prompt_logprobs`` may ask for (vLLM's default)
LOGIT_BIAS_LIMIT = 100.0  # each bias is clipped to [-100, 100], as OpenAI's API does
QUANTIZATIONS = ("fp8",)  # what ``quantization`` may name (None: the checkpoint's own weights)
# The model's generation config gives these when neither the command nor the row does.
MODEL_DEFAULTS = ("temperature", "top_p", "top_k")


class Param(NamedTuple):
    """How a sampling parameter is given: its value kind (``coerce``), its help, and its names. Every
    parameter is a row key and a ``batchgen run`` option (``--min-p``); ``aliases`` are more names of both."""

    kind: str  # int, float, bool, count (an int or nothing), strings, ints, bias, schema, regex, choices
    help: str
    aliases: tuple[str, ...] = ()


def _param(default: Any, kind: str, help: str, *aliases: str) -> Any:
    return field(default=default, metadata={"param": Param(kind, help, aliases)})


def _accept_aliases(cls: type) -> type:
    """Let the constructor take each field's aliases too (``SamplingParams(max_tokens=64)``, as in vLLM)."""
    init = cls.__init__
    names = {alias: f.name for f in fields(cls) for alias in f.metadata["param"].aliases}

    @functools.wraps(init)
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        for alias in names.keys() & kwargs.keys():
            if names[alias] in kwargs:
                raise TypeError(f"give {names[alias]} or {alias}, not both")
            kwargs[names[alias]] = kwargs.pop(alias)
        init(self, *args, **kwargs)

    cls.__init__ = __init__
    return cls


@_accept_aliases
@dataclass(frozen=True)
class SamplingParams:
    """How one prompt is sampled, with vLLM's ``SamplingParams`` names and meanings. ``temperature == 0``
    (or ``top_k == 1``) means greedy. The engine applies them in vLLM's order: logit bias and min_tokens,
    then the penalties, then temperature, then min-p, top-k and top-p."""

    n: int = _param(1, "int", "Samples per row.")
    max_new_tokens: int = _param(256, "int", "Most tokens generated per sample.", "max_tokens")
    min_tokens: int = _param(0, "int", "Tokens generated before EOS or a stop token id may end a sample.")
    temperature: float = _param(0.0, "float", "0 = greedy.")
    top_p: float = _param(1.0, "float", "Nucleus sampling: the smallest set of tokens with this mass.")
    top_k: int = _param(0, "int", "Sample among the k most likely tokens; 0 (or -1) = all.")
    min_p: float = _param(0.0, "float", "Drop tokens less likely than min_p x the most likely one's.")
    seed: int = _param(0, "int", "With the row's index and sample number, fixes its random draws.")
    repetition_penalty: float = _param(
        1.0, "float", "> 1 discourages tokens of the prompt and the output so far (divides positive logits)."
    )
    presence_penalty: float = _param(0.0, "float", "Subtracted from the logit of every token already output.")
    frequency_penalty: float = _param(0.0, "float", "Subtracted once per earlier output of the token.")
    # ((token id, bias), ...) sorted by id; given as {token_id: bias}, each bias clipped to [-100, 100]
    logit_bias: tuple[tuple[int, float], ...] = _param((), "bias", "Added to logits: '{\"1234\": -100}'.")
    stop: tuple[str, ...] = _param((), "strings", "Stop string (repeatable); excluded from the completion.")
    stop_token_ids: tuple[int, ...] = _param((), "ints", "Token ids that end a sample, as EOS does: 7,42.")
    include_stop_str_in_output: bool = _param(False, "bool", "Keep a matched stop string in the completion.")
    ignore_eos: bool = _param(False, "bool", "Generate max-new-tokens whatever the model says.")
    skip_special_tokens: bool = _param(True, "bool", "Leave special tokens out of the completion's text.")
    # None: none; 0: the sampled tokens' log-probabilities; N: and the N most likely tokens' at each step
    logprobs: int | None = _param(None, "count", "Log-probabilities of the sampled tokens, and N more.")
    prompt_logprobs: int | None = _param(None, "count", "Log-probabilities of the prompt tokens (and N).")
    # Structured output (engine/grammar.py): a JSON Schema (a dict, or its JSON text; kept as compact
    # JSON text), a regular expression, or a list of strings the completion must be exactly one of.
    json_schema: str | dict | None = _param(None, "schema", "A JSON Schema the completions validate against.")
    regex: str | None = _param(None, "regex", "A regular expression the completion matches.")
    choices: tuple[str, ...] | None = _param(None, "choices", "Strings the completion is exactly one of.")

    def __post_init__(self) -> None:
        for spec in fields(self):
            value = getattr(self, spec.name)
            if value is not None and value != spec.default:
                object.__setattr__(self, spec.name, coerce(spec.name, value))
        self._check_ranges()
        self._check_constraint()

    def _check_ranges(self) -> None:
        if self.top_k == -1:  # vLLM's "off"
            object.__setattr__(self, "top_k", 0)
        for name, (low, high, open_low) in _RANGES.items():
            value = getattr(self, name)
            if value is None:
                continue
            if value < low or (open_low and value == low) or (high is not None and value > high):
                bounds = f"{'(' if open_low else '['}{low}, {'inf)' if high is None else f'{high}]'}"
                raise ValueError(f"{name} must be in {bounds}, got {value}")
        if self.min_tokens > self.max_new_tokens:
            raise ValueError(
                f"min_tokens ({self.min_tokens}) must not exceed max_tokens ({self.max_new_tokens})"
            )

    def _check_constraint(self) -> None:
        given = [name for name in CONSTRAINT_FIELDS if getattr(self, name) is not None]
        if len(given) > 1:
            raise ValueError(f"{' and '.join(given)} exclude each other: give one constraint")

    @property
    def max_tokens(self) -> int:
        """vLLM's name for ``max_new_tokens``."""
        return self.max_new_tokens

    @property
    def constrained(self) -> bool:
        return self.json_schema is not None or self.regex is not None or self.choices is not None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1

    @property
    def penalized(self) -> bool:
        """Whether a penalty applies: the engine keeps this row's token counts on the device."""
        return self.repetition_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0

    @property
    def adjusted(self) -> bool:
        """Whether fixed per-token changes apply: a logit bias, or min_tokens holding back the stop ids."""
        return bool(self.logit_bias) or self.min_tokens > 0

    def with_overrides(self, **overrides) -> SamplingParams:
        """A copy with the non-None overrides applied (per-row overrides from the input). A row's own
        constraint replaces the base one, whatever its kind."""
        given = {k: v for k, v in overrides.items() if v is not None}
        if any(name in given for name in CONSTRAINT_FIELDS):
            given = {**dict.fromkeys(CONSTRAINT_FIELDS), **given}
        return replace(self, **given)


# name -> (lowest, highest or None, whether the lowest itself is refused)
_RANGES = {
    "n": (1, None, False), "max_new_tokens": (1, None, False), "min_tokens": (0, None, False),
    "temperature": (0, None, False), "top_p": (0, 1, True), "top_k": (0, None, False), "min_p": (0, 1, False),
    "repetition_penalty": (0, None, True), "presence_penalty": (-2, 2, False),
    "frequency_penalty": (-2, 2, False), "logprobs": (0, MAX_LOGPROBS, False),
    "prompt_logprobs": (0, MAX_LOGPROBS, False),
}  # fmt: skip
# name -> its Param, and every accepted name (aliases included) -> the field it sets
PARAMS: dict[str, Param] = {f.name: f.metadata["param"] for f in fields(SamplingParams)}
PARAM_NAMES: dict[str, str] = {
    alias: name for name, param in PARAMS.items() for alias in (name, *param.aliases)
}


def coerce(name: str, value: Any) -> Any:
    """A parameter's value as the dataclass holds it, from a row's JSON (or Parquet) value or the Python
    API; ValueError naming the parameter when it has the wrong type."""
    kind = PARAMS[name].kind
    try:
        return _COERCE[kind](value)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} {exc}") from None


def _int(value: Any) -> int:
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # Parquet int columns with nulls come back as float
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"must be an integer, not {value!r}")
    return value


def _float(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        raise ValueError(f"must be a number, not {value!r}")
    return float(value)


def _bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"must be true or false, not {value!r}")
    return value


def _count(value: Any) -> int | None:
    """logprobs: N, or true for the sampled tokens' alone (0), false for none."""
    return None if value is False else 0 if value is True else _int(value)


def _strings(value: Any) -> tuple[str, ...]:
    items = (value,) if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)) or not all(isinstance(s, str) and s for s in items):
        raise ValueError(f"must be a string or a list of non-empty strings, not {value!r}")
    return tuple(items)


def _ints(value: Any) -> tuple[int, ...]:
    items = (value,) if isinstance(value, (int, float)) and not isinstance(value, bool) else value
    if not isinstance(items, (list, tuple)):
        raise ValueError(f"must be a list of token ids, not {value!r}")
    ids = tuple(_int(item) for item in items)
    if any(i < 0 for i in ids):
        raise ValueError(f"must be token ids >= 0, not {value!r}")
    return ids


def _bias(value: Any) -> tuple[tuple[int, float], ...]:
    """{token_id: bias} (keys strings, as JSON has them, or ints), or its JSON text, or (id, bias) pairs."""
    if isinstance(value, str):
        value = json.loads(value)
    pairs = value.items() if isinstance(value, dict) else value
    if not isinstance(pairs, (list, tuple)) and not isinstance(value, dict):
        raise ValueError(f'must be an object of token ids to biases like {{"1234": -100}}, not {value!r}')
    out: dict[int, float] = {}
    for token, bias in pairs:
        text = str(token)
        if not text.isdigit():
            raise ValueError(f"keys must be token ids, not {token!r}")
        limit = LOGIT_BIAS_LIMIT
        out[int(text)] = min(max(_float(bias), -limit), limit)
    return tuple(sorted(out.items()))


def _schema(value: Any) -> str:
    """A JSON Schema as compact JSON text (property order kept: it is the order of the output's keys)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise ValueError(f"is not valid JSON: {exc}") from None
    if not isinstance(value, (dict, bool)):
        raise ValueError(f"must be a JSON object (or true), not {type(value).__name__}")
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _regex(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"must be a non-empty string, not {value!r}")
    return value


def _choices(value: Any) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, (list, tuple)) or not value:
        raise ValueError(f"must be a non-empty list of non-empty strings, not {value!r}")
    return _strings(value)


_COERCE = {
    "int": _int, "float": _float, "bool": _bool, "count": _count, "strings": _strings, "ints": _ints,
    "bias": _bias, "schema": _schema, "regex": _regex, "choices": _choices,
}  # fmt: skip


@dataclass(frozen=True)
class EngineConfig:
    """Engine options. ``None`` means "derive from the model / device"."""

    model: str | None = None  # hub id or local dir; None = the embedded default model
    dtype: str | None = None  # "float32" | "bfloat16" | "float16"; None = bf16 on CUDA, fp32 on CPU
    device: str | None = None  # "cuda" | "cpu" | "cuda:1"; None = cuda if present
    # Rows decoded together. None = auto (engine/batch_width.py): as many as the KV cache holds at
    # ROW_TOKENS each on a GPU, the CPU's fixed width elsewhere, never more than max_num_seqs_cap.
    max_num_seqs: int | None = None
    max_num_seqs_cap: int = 1024
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
    # "auto": the checkpoint's weights; "random": random weights of its shapes (``LLM.from_model``: the
    # model's own weights, taken as random, so --quantization fp8 does not calibrate them)
    load_format: str = "auto"
    quantization: str | None = None  # "fp8": quantize a bf16/fp16 checkpoint's projections at load
    kv_cache_dtype: str = "auto"  # "auto" (the model dtype) | "fp8"
    threads: int | None = None  # torch intra-op threads; None: on the CPU, the free cores (threads.py)
    # Speculative decoding (engine/speculative): "ngram" guesses a row's next tokens from its own prompt
    # and output (from its last ngram_max .. ngram_min tokens), "draft" with draft_model (a small model
    # with the same tokenizer); up to num_speculative_tokens a step.
    speculative: str | None = None
    num_speculative_tokens: int = 4
    ngram_min: int = 2
    ngram_max: int = 4
    draft_model: str | None = None
    # "adaptive": a verify step runs where measured faster than plain decoding; "always": every step.
    speculative_policy: str = "adaptive"
    extra: dict = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        if self.max_num_seqs is not None and self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.max_num_seqs_cap < 1:
            raise ValueError(f"max_num_seqs_cap must be >= 1, got {self.max_num_seqs_cap}")
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
        check_quantization(self.quantization)
        self._check_speculative()
        if self.kv_cache_dtype not in ("auto", "fp8"):
            raise ValueError(f"unknown KV cache dtype {self.kv_cache_dtype!r} (auto or fp8)")

    def _check_speculative(self) -> None:
        if (self.draft_model is not None) != (self.speculative == "draft"):
            raise ValueError("--speculative draft and --draft-model PATH go together")
        if self.speculative is None:
            return
        if self.speculative not in ("ngram", "draft"):
            raise ValueError(f"unknown speculative method {self.speculative!r} (supported: ngram, draft)")
        if self.speculative == "draft" and self.tensor_parallel > 1:
            raise ValueError("--speculative draft runs in one process: --tensor-parallel must be 1")
        if not 1 <= self.num_speculative_tokens < self.block_size:
            raise ValueError(
                f"num_speculative_tokens must be in [1, block_size - 1 = {self.block_size - 1}], "
                f"got {self.num_speculative_tokens}"
            )
        if not 1 <= self.ngram_min <= self.ngram_max:
            raise ValueError(f"need 1 <= ngram_min <= ngram_max, got {self.ngram_min} and {self.ngram_max}")
        if self.speculative_policy not in ("adaptive", "always"):
            raise ValueError(f"unknown speculative policy {self.speculative_policy!r} (adaptive or always)")


def check_quantization(quantization: str | None) -> None:
    """Refuse a quantization method batchgen does not run, naming the ones it does."""
    if quantization is not None and quantization not in QUANTIZATIONS:
        raise ValueError(f"unknown quantization {quantization!r} (supported: {', '.join(QUANTIZATIONS)})")
