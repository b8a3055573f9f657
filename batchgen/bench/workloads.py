"""The benchmark workloads (docs/results.md reports them): shapes, prompts and random models.

GPU workloads use random-weight models built from the real architectures' configs, so nothing is
downloaded; prompts are random token ids of a fixed length and every request decodes exactly
``max_new_tokens`` (EOS ignored), so runs are comparable token for token. B4 is the CPU case as a user
meets it: the embedded model, chat prompts of mixed length (a few long ones among many short), timed as
whole commands (``bench/whole_commands.py``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

# Real configs, written out so no hub access is needed. max_position_embeddings is raised above
# Llama-3-8B's 8192 because B1 needs 256 + 8192 positions (random weights: no quality to lose).
LLAMA3_8B: dict = dict(
    model_type="llama",
    hidden_size=4096,
    intermediate_size=14336,
    num_hidden_layers=32,
    num_attention_heads=32,
    num_key_value_heads=8,
    head_dim=128,
    vocab_size=128256,
    rope_theta=500000.0,
    rms_norm_eps=1e-5,
    max_position_embeddings=16384,
    tie_word_embeddings=False,
)
QWEN3_0_6B: dict = dict(
    model_type="qwen3",
    hidden_size=1024,
    intermediate_size=3072,
    num_hidden_layers=28,
    num_attention_heads=16,
    num_key_value_heads=8,
    head_dim=128,
    vocab_size=151936,
    rope_theta=1000000.0,
    rms_norm_eps=1e-6,
    max_position_embeddings=40960,
    tie_word_embeddings=True,
)
LLAMA3_70B: dict = dict(
    LLAMA3_8B, hidden_size=8192, intermediate_size=28672, num_hidden_layers=80, num_attention_heads=64,
    max_position_embeddings=8192,
)  # fmt: skip
QWEN3_30B_A3B: dict = dict(  # every layer a MoE: 128 experts, top-8, intermediate 768
    model_type="qwen3_moe",
    hidden_size=2048,
    intermediate_size=6144,
    moe_intermediate_size=768,
    num_experts=128,
    num_experts_per_tok=8,
    norm_topk_prob=True,
    num_hidden_layers=48,
    num_attention_heads=32,
    num_key_value_heads=4,
    head_dim=128,
    vocab_size=151936,
    rope_theta=1000000.0,
    rms_norm_eps=1e-6,
    max_position_embeddings=40960,
    tie_word_embeddings=False,
)
SMOLLM2_135M: dict = dict(  # the embedded model's shape (B7 on a machine without its wheel)
    model_type="llama", hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
    num_key_value_heads=3, head_dim=64, vocab_size=49152, rope_theta=100000.0, rms_norm_eps=1e-5,
    max_position_embeddings=8192, tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=2,
)  # fmt: skip
ARCHS: dict[str, dict] = {
    "llama3-8b": LLAMA3_8B,
    "qwen3-0.6b": QWEN3_0_6B,
    "llama3-70b": LLAMA3_70B,
    "qwen3-30b-a3b": QWEN3_30B_A3B,
    "smollm2-135m": SMOLLM2_135M,
}

EMBEDDED = "embedded"  # the embedded default model, loaded by LLM(None)
_BUILTIN_PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about autumn leaves.",
    "Explain garbage collection to a ten-year-old.",
    "List three uses of a paperclip.",
    "Translate 'good morning' into Spanish and German.",
    "Why is the sky blue? Answer briefly.",
    "Give a one-line summary of the water cycle.",
    "Name two prime numbers greater than fifty.",
    "Describe a cat in five words.",
    "What does a compiler do?",
    "Suggest a name for a bakery.",
    "How many legs does a spider have?",
    "Write a limerick about a robot.",
    "What is photosynthesis?",
    "Explain what a linked list is.",
    "Give a tip for learning a new language.",
]


@dataclass(frozen=True)
class Workload:
    """One benchmark case. ``arch`` names an entry of ARCHS, EMBEDDED, or a local model directory."""

    name: str
    arch: str
    num_requests: int
    prompt_len: int  # 0 = text prompts (the embedded model's case), tokenized by the engine's tokenizer
    max_new_tokens: int
    device: str = "cuda"
    dtype: str = "bfloat16"
    hf_max_new_tokens: int | None = None  # generate_batch runs shorter when it is too slow for the budget
    seed: int = 0
    # > 1: the model is split over this many GPUs, each rank creating only its own random shard (no
    # whole model in one process, so no transformers baselines).
    tensor_parallel: int = 1
    # transformers' side of the comparison: generate_batch, or batchgen's engine on transformers' forward
    # ("hf_forward", the MoE case), on the first hf_num_requests requests when it is too slow for the budget
    baselines: tuple[str, ...] = ("generate_batch",)
    hf_num_requests: int | None = None
    quantization: str | None = None  # batchgen's runs: "fp8" quantizes the projections at load
    kv_cache_dtype: str = "auto"  # batchgen's runs: "fp8" for an e4m3 KV cache (the baselines stay 16-bit)
    max_num_seqs: int | None = None  # batchgen's runs: the batch width; None: the engine's choice
    max_batch_tokens: int | None = None  # batchgen's runs: tokens a step; None: the engine's default

    @property
    def engine_options(self) -> dict:
        sizes = {"max_num_seqs": self.max_num_seqs, "max_batch_tokens": self.max_batch_tokens}
        given = {key: value for key, value in sizes.items() if value is not None}
        return dict(quantization=self.quantization, kv_cache_dtype=self.kv_cache_dtype, **given)

    @property
    def precision(self) -> str:
        """What batchgen's runs store in FP8 ("" when nothing)."""
        parts = ["fp8 weights"] * (self.quantization == "fp8") + ["fp8 KV"] * (self.kv_cache_dtype == "fp8")
        return " + ".join(parts)

    # Structured output: every request under this JSON Schema (its length is bounded by max_new_tokens)
    json_schema: dict | None = None
    command: bool = False  # timed as whole commands (batchgen run vs a generate_batch script), mixed prompts
    staggered: bool = False  # whole commands: each row its own max_new_tokens (``staggered_lengths``)
    run_flags: tuple[str, ...] = ()  # whole commands: more `batchgen run` flags
    # batchgen's runs: more SamplingParams fields for every request (penalties, logprobs, ...)
    sampling: tuple[tuple[str, Any], ...] = ()

    @property
    def label(self) -> str:
        prompt = self.prompt_len if self.prompt_len else "text"
        extra = "".join(f", {name}={value}" for name, value in self.sampling)
        return f"{self.num_requests} x ({prompt} + {self.max_new_tokens}){extra}"


# B3j's schema: records of the usual kinds (bounded integers, short strings, enums, booleans), at least
# 200 of them, so that a random model still writes JSON when max_new_tokens cuts every row: the same
# token count as B3, under a mask each step.
RECORDS_SCHEMA: dict = {
    "type": "array",
    "minItems": 200,
    "items": {
        "type": "object",
        "properties": {
            "id": {"type": "integer", "minimum": 0, "maximum": 9999},
            "name": {"type": "string", "maxLength": 12},
            "kind": {"enum": ["cat", "dog", "fish", "bird"]},
            "ok": {"type": "boolean"},
        },
        "required": ["id", "name", "kind", "ok"],
    },
}

WORKLOADS: dict[str, Workload] = {
    "B1": Workload("B1", "llama3-8b", 32, 256, 8192, hf_max_new_tokens=512),
    "B1s": Workload("B1s", "llama3-8b", 32, 256, 1024, hf_max_new_tokens=256),
    "B2": Workload("B2", "llama3-8b", 1024, 512, 512, hf_max_new_tokens=128),
    "B3": Workload("B3", "qwen3-0.6b", 256, 128, 1024, hf_max_new_tokens=256),
    "B4": Workload("B4", EMBEDDED, 78, 0, 64, device="cpu", dtype="float32", command=True),
    # B4 with both commands in bf16: a CPU with avx512_bf16 or AMX runs bf16 matmuls faster than fp32
    "B4b": Workload("B4b", EMBEDDED, 78, 0, 64, device="cpu", dtype="bfloat16", command=True),
    # The whole `batchgen run` on a GPU with a small model: is the host fast enough to keep the GPU busy?
    "B7": Workload("B7", EMBEDDED, 8192, 0, 256, command=True, baselines=()),
    # B7 with rows of 16-496 new tokens (mean 256): they end at different steps, as completions ending on
    # EOS do, so new rows join the running batch every few steps (engine/admission.py).
    "B7s": Workload("B7s", EMBEDDED, 8192, 0, 256, command=True, baselines=(), staggered=True),
    # B7 with 1024 rows a step: a small model's step costs the GPU about the same at 256 or 1024 rows
    # (kernel launches, not bytes), so wider batches may be worth more than the host time they add.
    "B7w": Workload(
        "B7w", EMBEDDED, 8192, 0, 256, command=True, baselines=(), run_flags=("--max-num-seqs", "1024")
    ),
    "B5": Workload("B5", "llama3-70b", 64, 512, 1024, tensor_parallel=2),
    # The fused MoE path; its baseline is one wave (256 requests) of the same requests.
    "B6": Workload("B6", "qwen3-30b-a3b", 512, 512, 512, baselines=("hf_forward",), hf_num_requests=256),
    # B3 with a JSON Schema on every row: what structured output costs against B3 (docs/results.md, B3j)
    "B3j": Workload("B3j", "qwen3-0.6b", 256, 128, 1024, baselines=(), json_schema=RECORDS_SCHEMA),
}

# B4's prompts: short questions (41-60 tokens with the chat template) and two long ones (507 and 812
# tokens), as a real prompt file mixes them. Built from fixed text, so every run sees the same tokens.
_TOPICS = (
    "the ocean", "volcanoes", "bread baking", "chess openings", "honey bees", "the moon", "railways",
    "coffee", "glaciers", "jazz", "bicycles", "owls", "copper", "deserts", "lighthouses", "paper making",
    "solar panels", "whales", "castles", "maple syrup", "clocks", "bridges", "spiders", "comets", "salt",
    "windmills",
)  # fmt: skip
_ASKS = (
    "Explain in simple terms how {} work and why people care about them.",
    "Write a short paragraph describing {} for a curious child.",
    "Give three surprising facts about {}, one sentence each.",
    "What are the main risks and benefits associated with {}?",
    "Describe the history of {}, the people who shaped it, and one question about it that is still open "
    "today, in a friendly tone.",
)
_LONG_NOTES = (19, 31)  # meeting notes of ~25 tokens each: 507- and 812-token prompts


def _notes(count: int, offset: int) -> str:
    notes = (
        f"Note {k + 1}: the committee reviewed item {k + 1} about {_TOPICS[(offset + 7 * k) % len(_TOPICS)]} "
        "and agreed to revisit it after the next quarterly review."
        for k in range(count)
    )
    return "Summarize these meeting notes in three bullet points:\n" + " ".join(notes)


def chat_prompts(num: int) -> list[str]:
    """``num`` distinct short chat questions (B7): B4's questions, each with its own request number."""
    return [f"{p} (Request {i}.)" for i, p in enumerate(mixed_prompts(num, long_notes=()))]


def staggered_lengths(num: int) -> list[int]:
    """``num`` rows' max_new_tokens, 16-496 (mean ~256), spread evenly over the rows (B7s)."""
    return [16 + (7919 * i) % 481 for i in range(num)]


# The quality measures' chat prompts (FP8 agreement: tests/model/test_fp8_quality.py,
# scripts/fp8_quality.py): questions, instructions, code, poems, translation and arithmetic, written to span
# the kinds of chat a synthesis job sends; with mixed_prompts' short questions they make 178.
VARIED_PROMPTS = [
    "What is the capital of France?", "Write a haiku about autumn leaves.", "Explain recursion to a child.",
    "List three uses of a paperclip.", "Translate 'good morning' into Spanish.", "Why is the sky blue?",
    "Summarise the water cycle in one sentence.", "Name two prime numbers greater than fifty.",
    "Describe a cat in five words.", "What does a compiler do?", "Suggest a name for a bakery.",
    "How many legs does a spider have?", "Write a limerick about a robot.", "What is photosynthesis?",
    "Explain what a linked list is.", "Give a tip for learning a new language.", "What is 17 times 3?",
    "Write a Python function that reverses a string.", "Who wrote Romeo and Juliet?",
    "What causes earthquakes?", "Give me a recipe for pancakes.", "What is the boiling point of water?",
    "Tell me a joke about computers.", "How do vaccines work?", "Write the opening line of a mystery novel.",
    "What are the primary colours?", "Explain the difference between weather and climate.",
    "Convert 5 kilometres to miles.", "What is a black hole?", "Write a short poem about the sea.",
    "How do I make a cup of green tea?", "What is the largest planet in our solar system?",
    "Give three synonyms for happy.", "Explain how a bicycle stays upright.", "What is machine learning?",
    "Describe the taste of a lemon.", "Write an email asking for a day off.", "What is the speed of light?",
    "Why do leaves change colour in autumn?", "Name a famous painting by Leonardo da Vinci.",
    "What is the square root of 144?", "How does a refrigerator keep food cold?",
    "Write a two-sentence horror story.", "What language is spoken in Brazil?",
    "Explain what an API is to a beginner.", "What should I pack for a beach holiday?",
    "How many continents are there?", "Write a motivational quote.",
]  # fmt: skip


def mixed_prompts(num: int = 78, long_notes: tuple[int, ...] = _LONG_NOTES) -> list[str]:
    """``num`` prompts: the long ones spread evenly among short questions."""
    short = num - len(long_notes)
    prompts = [_ASKS[i % len(_ASKS)].format(_TOPICS[(3 * i) % len(_TOPICS)]) for i in range(short)]
    for j, n in enumerate(long_notes):
        prompts.insert((j + 1) * len(prompts) // (len(long_notes) + 1), _notes(n, j))
    return prompts


def quick(w: Workload) -> Workload:
    """A smoke-sized variant: same model and batch shape, a short decode (CPU workloads unchanged)."""
    if w.device == "cpu":
        return w
    new = min(w.max_new_tokens, 256)
    hf_new = min(w.hf_max_new_tokens or new, 64)
    hf_requests = min(w.hf_num_requests, 64) if w.hf_num_requests else None
    return replace(
        w, num_requests=min(w.num_requests, 256), max_new_tokens=new, hf_max_new_tokens=hf_new,
        hf_num_requests=hf_requests,
    )  # fmt: skip


def get_workload(
    name: str, device: str | None = None, tensor_parallel: int | None = None,
    quantization: str | None = None, kv_cache_dtype: str = "auto", sampling: dict | None = None,
    max_num_seqs: int | None = None, max_batch_tokens: int | None = None,
) -> Workload:  # fmt: skip
    try:
        w = WORKLOADS[name]
    except KeyError:
        raise ValueError(f"unknown workload {name!r}; choose from {', '.join(WORKLOADS)}") from None
    w = replace(w, quantization=quantization, kv_cache_dtype=kv_cache_dtype, max_num_seqs=max_num_seqs)
    w = replace(w, max_batch_tokens=max_batch_tokens)
    w = replace(w, sampling=tuple(sorted((sampling or {}).items())))
    w = replace(w, device=device) if device else w
    return replace(w, tensor_parallel=tensor_parallel) if tensor_parallel else w


def random_prompts(n: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    """Random token ids; ids 0..99 are avoided since small ids are often special tokens."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(100, vocab, (n, length), generator=gen).tolist()


def text_prompts(path: str | Path = "examples/prompts.jsonl") -> list[str | list[dict]]:
    """The examples' prompts (``prompt`` strings and ``messages`` lists) when the file is there (run
    from the repository root), else built-in ones."""
    path = Path(path)
    if not path.exists():
        return list(_BUILTIN_PROMPTS)
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    prompts = [r.get("prompt") or r.get("messages") for r in rows]
    prompts = [p for p in prompts if isinstance(p, (str, list)) and p]
    return prompts or list(_BUILTIN_PROMPTS)


def build_random_model(arch: str, device: str, dtype: torch.dtype, seed: int = 0) -> torch.nn.Module:
    """A random-weight model of ``arch``, created directly on ``device``.

    Building under ``torch.device(device)`` makes every parameter and buffer (rotary tables included)
    start on the device, and transformers' own init (normal, std=initializer_range) runs there too: an
    8B model initialises in about a second on a GPU instead of minutes on the CPU.
    """
    from transformers import AutoModelForCausalLM

    config = arch_config(arch)
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")
    return model.eval()


def arch_config(arch: str):
    from transformers import AutoConfig

    fields = dict(ARCHS[arch])
    return AutoConfig.for_model(fields.pop("model_type"), **fields)


def load_tokenizer():
    """The embedded model's tokenizer: prompts are token ids, so it is only needed to satisfy the API."""
    from transformers import AutoTokenizer

    from batchgen.model.loader import tokenizer_path

    return AutoTokenizer.from_pretrained(tokenizer_path())
