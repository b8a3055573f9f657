"""``batchgen run``'s options, one decorator per group of options (input, chat, output, model, engine, run
control), so the command reads as a list of groups; its sampling options, made from ``SamplingParams``'
fields (one per parameter, so there is no second list to keep in step); and its ``--help`` in groups."""

from __future__ import annotations

from collections.abc import Callable

import click

from batchgen.config import MODEL_DEFAULTS, PARAMS, EngineConfig, SamplingParams
from batchgen.model.reasoning import CHOICES

_DTYPES = ("auto", "float32", "bfloat16", "float16", "fp32", "bf16", "fp16")

# ``--help``'s sections, in order: each option of ``batchgen run`` is listed in one (tests check it).
HELP_GROUPS = {
    "Input": (
        "prompt_column", "template", "id_column", "chat_mode", "no_chat", "system_prompt", "chat_template",
        "chat_template_kwargs", "input_format", "limit",
    ),
    "Sampling": tuple(PARAMS),
    "Output": ("keep_columns", "return_tokens", "reasoning_parser"),
    "Model and engine": (
        "model", "dtype", "device", "trust_remote_code", "model_impl", "quantization", "kv_cache_dtype",
        "max_num_seqs", "max_batch_tokens", "max_model_len", "gpu_memory_utilization", "block_size",
        "async_mode", "cuda_graphs", "prefix_caching", "threads",
    ),
    "Speculative decoding": (
        "speculative", "num_speculative_tokens", "ngram_max", "ngram_min", "draft_model",
    ),
    "Parallelism": ("shard", "data_parallel", "tensor_parallel"),
    "Run control": (
        "overwrite", "on_error", "max_error_rate", "flush_every", "log_every", "drain_timeout", "stats_file",
        "verbose", "help",
    ),
}  # fmt: skip


class GroupedCommand(click.Command):
    """A command whose ``--help`` lists its options under HELP_GROUPS' headings."""

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        records = {p.name: p.get_help_record(ctx) for p in self.get_params(ctx)}
        for title, names in HELP_GROUPS.items():
            rows = [records[name] for name in names if records.get(name)]
            if rows:
                with formatter.section(title):
                    formatter.write_dl(rows)


def _cli_default(name: str) -> str:
    if name in MODEL_DEFAULTS:
        return "the model's generation config"
    default = SamplingParams.__dataclass_fields__[name].default
    if isinstance(default, bool):
        return "on" if default else "off"
    return "none" if default is None or default == () else str(default)


def _option(name: str) -> Callable:
    """The ``batchgen run`` option of sampling parameter ``name``: its value is None (or empty) when not
    given, so that the model's and the rows' values apply (``app/options.sampling_from_cli``)."""
    param = PARAMS[name]
    flags = [f"--{alias.replace('_', '-')}" for alias in (name, *param.aliases)]
    kind = param.kind
    repeat = " Repeatable." if kind in ("strings", "choices") else ""
    help = f"{param.help}{repeat} [default: {_cli_default(name)}]"
    if kind == "bool":
        if SamplingParams.__dataclass_fields__[name].default:  # on by default: --no-X turns it off
            flags = [f"{flag}/--no-{flag[2:]}" for flag in flags[:1]]
            return click.option(*flags, name, default=None, help=help)
        return click.option(*flags, name, is_flag=True, default=None, help=help)
    if kind == "count":  # --logprobs alone: the sampled tokens' only
        return click.option(*flags, name, type=click.IntRange(min=0), is_flag=False, flag_value=0,
                            metavar="[N]", help=help)  # fmt: skip
    if kind in ("strings", "choices"):
        return click.option(*flags, name, multiple=True, help=help)
    if kind == "schema":
        return click.option(*flags, name, type=click.Path(dir_okay=False), metavar="FILE", help=help)
    types = {"int": int, "float": float, "ints": str, "bias": str, "regex": str}
    return click.option(*flags, name, type=types[kind], help=help)


def sampling_options(command: Callable) -> Callable:
    """Decorate ``command`` with one option per sampling parameter."""
    for name in reversed(PARAMS):
        command = _option(name)(command)
    return command


def chat_template_options(command: Callable) -> Callable:
    """Decorate ``command`` with the chat template's options (checked in ``app/template_options.py``)."""
    kwargs = click.option(
        "--chat-template-kwargs",
        metavar="JSON",
        help="Extra chat template variables, e.g. '{\"enable_thinking\": false}'; a row's "
        "chat_template_kwargs object wins key by key.",
    )
    template = click.option(
        "--chat-template",
        metavar="FILE",
        help="A Jinja chat template replacing the model's (the template text itself is accepted too).",
    )
    return template(kwargs(command))


def reasoning_option(command: Callable) -> Callable:
    """Decorate ``command`` with ``--reasoning-parser`` (model/reasoning.py)."""
    return click.option(
        "--reasoning-parser",
        type=click.Choice(CHOICES),
        default="auto",
        show_default=True,
        help="Split a thinking block (<think>...</think>) from the answer: records get 'reasoning' and the "
        "answer in 'completion'; structured output applies after the block. auto: when the tokenizer has "
        "think tokens.",
    )(command)


def _stack(*decorators: Callable) -> Callable:
    """One decorator applying ``decorators`` as if written one above the other, the first on top (so
    ``--help`` and the command's parameters keep their order)."""

    def apply(command: Callable) -> Callable:
        for decorator in reversed(decorators):
            command = decorator(command)
        return command

    return apply


def input_options(command: Callable) -> Callable:
    """The rows' columns, the columns a record keeps, and how much of the input a run reads."""
    return _stack(
        click.option(
            "--prompt-column", help="Column holding the prompt (a string or a list of chat messages)."
        ),
        click.option(
            "--template", help=r'Build the prompt from columns: "Q: {question}\nA:" (\n, \t understood).'
        ),
        click.option(
            "--id-column", help="Column holding the row id [default: 'id' when present, else the index]."
        ),
        click.option("--keep-columns", multiple=True, help="Input columns to copy into each record: a,b."),
        click.option("--limit", type=click.IntRange(min=1), help="Only the first N rows."),
        click.option(
            "--input-format",
            type=click.Choice(["auto", "openai", "rows"]),
            default="auto",
            show_default=True,
            help="openai: OpenAI Batch requests (custom_id, url, body), answered in OpenAI's response lines; "
            "auto: by the first line.",
        ),
    )(command)


def shard_options(command: Callable) -> Callable:
    """Which part of the input this process runs, or how many workers share it."""
    return _stack(
        click.option(
            "--shard",
            help="Run shard I (0-based) of N: a contiguous part of the input "
            "[default: the Slurm array task's].",
        ),
        click.option(
            "--data-parallel",
            type=click.IntRange(min=1),
            default=1,
            show_default=True,
            help="Run K workers (one GPU each) as K shards, then merge.",
        ),
    )(command)


def chat_options(command: Callable) -> Callable:
    """Whether and how prompts are put through the chat template."""
    return _stack(
        click.option(
            "--chat",
            "chat_mode",
            type=click.Choice(["auto", "on", "off"]),
            default="auto",
            show_default=True,
            help="Chat template for plain 'prompt' rows (messages rows always get it).",
        ),
        click.option("--no-chat", is_flag=True, help="Same as --chat off: send plain prompts raw."),
        click.option("--system-prompt", help="A system message added to every chat prompt."),
        chat_template_options,
    )(command)


def output_options(command: Callable) -> Callable:
    """What each record carries beyond the completion."""
    return _stack(
        click.option("--return-tokens", is_flag=True, help="Add the completion's token_ids to each record."),
        reasoning_option,
    )(command)


def model_options(command: Callable) -> Callable:
    """Which model, in which dtype, on which device."""
    return _stack(
        click.option(
            "--model", help="Hub id or local directory [default: the embedded SmolLM2-135M-Instruct]."
        ),
        click.option(
            "--dtype",
            type=click.Choice(_DTYPES),
            default="auto",
            show_default=True,
            help="auto = bf16 on CUDA, fp32 on CPU.",
        ),
        click.option("--device", help="cuda, cuda:1, cpu [default: cuda if present]."),
        click.option("--trust-remote-code", is_flag=True),
    )(command)


def engine_options(command: Callable) -> Callable:
    """The engine's limits and switches: batch sizes, memory, graphs, parallelism, FP8."""
    return _stack(
        click.option(
            "--max-num-seqs",
            type=click.IntRange(min=1),
            help="Rows decoded together [default: on a GPU, as many as the KV cache holds at 512 tokens "
            f"each, up to {EngineConfig.max_num_seqs_cap}; 256 on the CPU].",
        ),
        click.option(
            "--max-batch-tokens",
            type=click.IntRange(min=1),
            default=EngineConfig.max_batch_tokens,
            show_default=True,
        ),
        click.option(
            "--max-model-len", type=click.IntRange(min=2), help="[default: the model's context length]"
        ),
        click.option(
            "--gpu-memory-utilization",
            type=click.FloatRange(0, 1, min_open=True),
            default=0.9,
            show_default=True,
        ),
        click.option("--block-size", type=click.IntRange(min=1), default=16, show_default=True),
        click.option("--async/--sync", "async_mode", default=None, help="[default: async on CUDA]"),
        click.option("--cuda-graphs/--no-cuda-graphs", default=None, help="[default: on on CUDA]"),
        click.option("--prefix-caching/--no-prefix-caching", default=True, show_default=True),
        click.option(
            "--threads",
            type=click.IntRange(min=1),
            help="CPU threads for the model "
            "[default on the CPU: the cores free, by affinity and load average].",
        ),
        click.option("--kv-cache-bytes", hidden=True, help="Explicit KV cache budget, e.g. 2G."),
        click.option("--attention-backend", type=click.Choice(["torch", "triton"]), hidden=True),
        click.option(
            "--model-impl",
            type=click.Choice(["auto", "batchgen", "transformers"]),
            default="auto",
            show_default=True,
            help="Forward pass: batchgen's fused one (Llama, Mistral, Qwen2/3 and their MoE, Mixtral, OLMoE) "
            "or transformers' modelling code.",
        ),
        click.option(
            "--tensor-parallel",
            type=click.IntRange(min=1),
            default=1,
            show_default=True,
            help="Split the model over K GPUs of this node (K processes; gloo on the CPU).",
        ),
        click.option(
            "--quantization", type=click.Choice(["fp8"]), help="Quantize the model's projections at load."
        ),
        click.option(
            "--kv-cache-dtype", type=click.Choice(["auto", "fp8"]), default="auto", show_default=True
        ),
        *_speculative_options(),
    )(command)


def _speculative_options() -> list[Callable]:
    """Speculative decoding: never changes the output (greedy or sampled), only how fast it comes."""
    return [
        click.option(
            "--speculative",
            type=click.Choice(["ngram", "draft"]),
            help="Guess tokens and verify them in one step: ngram = prompt lookup (the row's own prompt "
            "and output), draft = a small model with the same tokenizer (--draft-model). Verify steps run "
            "only where measured faster [default: off].",
        ),
        *(
            click.option(
                f"--{name.replace('_', '-')}",
                type=click.IntRange(min=1),
                default=getattr(EngineConfig, name),
                show_default=True,
                help=help,
            )
            for name, help in (
                ("num_speculative_tokens", "Most tokens a row guesses a step."),
                ("ngram_max", "Longest suffix looked up."),
                ("ngram_min", "Shortest suffix looked up."),
            )
        ),
        click.option(
            "--draft-model", help="The draft model of --speculative draft: a directory or hub name."
        ),
        click.option("--speculative-policy", type=click.Choice(["adaptive", "always"]), hidden=True),
    ]


def run_control_options(command: Callable) -> Callable:
    """Resume, errors, flushing, progress and signals."""
    return _stack(
        click.option(
            "--overwrite", is_flag=True, help="Start afresh instead of resuming an existing OUTPUT."
        ),
        click.option(
            "--on-error",
            type=click.Choice(["record", "skip", "fail"]),
            default="record",
            show_default=True,
            help="A bad row: an error record, nothing, or stop with exit 1.",
        ),
        click.option(
            "--max-error-rate",
            type=click.FloatRange(0, 1),
            default=1.0,
            show_default=True,
            help="Exit 1 when more than this fraction of rows failed (errors and skips), once all are "
            "written. A run in which every row failed exits 1 whatever it is.",
        ),
        click.option(
            "--flush-every",
            type=click.FloatRange(min=0),
            default=10.0,
            show_default=True,
            help="Seconds between durable flushes (a crash loses at most this much).",
        ),
        click.option(
            "--log-every",
            type=click.FloatRange(min=0),
            default=30.0,
            show_default=True,
            help="Seconds between progress lines when stderr is not a terminal.",
        ),
        click.option(
            "--drain-timeout",
            type=click.FloatRange(min=0),
            default=30.0,
            show_default=True,
            help="On SIGTERM/SIGINT/SIGUSR1: seconds to finish in-flight rows before exit 75.",
        ),
        click.option(
            "--stats-file", type=click.Path(dir_okay=False), help="Write the final summary here as JSON."
        ),
        click.option(
            "--progress/--no-progress",
            "progress_bar",
            default=None,
            hidden=True,
            help="Force the tqdm bar on or off [default: on a terminal].",
        ),
        click.option("-v", "--verbose", is_flag=True, help="Debug logs; tracebacks with errors."),
    )(command)
