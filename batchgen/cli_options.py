"""``batchgen run``'s sampling options, made from ``SamplingParams``' fields (one per parameter, so there is
no second list to keep in step), and its ``--help`` in groups."""

from __future__ import annotations

from collections.abc import Callable

import click

from batchgen.config import MODEL_DEFAULTS, PARAMS, SamplingParams
from batchgen.model.reasoning import CHOICES

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
