"""Inputs the Qwen2Tokenizer oracle tests (test_file_tokenizer_classes.py) compare on: texts, the Qwen
vocabularies' added tokens, pre-tokenizer patterns, Qwen3's chat template and conversations."""

from __future__ import annotations

import unicodedata

_CAFE = "héllo wörld — ünïcødé naïve café Ångström"
# fmt: off
CORPUS = [
    "", " ", "Hello, world!", "x\r\ny", "crlf\r\nline  \n\n  blank lines\r\n\r\n", "tab\tand\nlines\n\r\n",
    "   \n \t  \n", "   leading and trailing   ", "I'm sure they'll say we'd've DON'T It's THEY'RE",
    "digits 1234567890 and 3.14159e-10, 2024-05-01, ١٢٣ ¼", _CAFE, unicodedata.normalize("NFD", _CAFE),
    "\u212b vs \u00c5 vs A\u030a, \ufb01 ligature, \u1e9b\u0323", "हिन्दी ภาษาไทย 한국어", "日本語、中文",
    "emoji 😀👍🏽 family 👨\u200d👩\u200d👧 flag 🇫🇷", "zero\u200bwidth\ufeffchars", "a" * 300,
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\nhm\n</think>\n\nok<|im_end|><|endoftext|>",
    ' <tool_call>\n{"name": "f", "arguments": {}}\n</tool_call> <|fim_prefix|>x<|fim_suffix|>y<|fim_middle|>',
    "text<|im_end|>more <|im_start| <|vision_pad|><|image_pad|> <think></think>", "a <|im_end|> b\n",
    "def f(x):\n    return x  # comment\n\n\nclass A:\n\tpass\n", "x\u0301yz self.x = (self)\n\nend.\n\nOk",
]
# fmt: on
# fmt: off
SPECIAL = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>",
    "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>",
]
PLAIN = [  # added tokens that are not special (Qwen2.5 ends with <|file_sep|>, Qwen3 adds the last four)
    "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
    "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>", "<think>", "</think>",
]
# fmt: on
QWEN_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"""
    r"""|\s+(?!\S)|\s+"""
)
# Qwen3.5's tokenizer.json pattern: combining marks join letters (transformers' Qwen2Tokenizer has no \p{M})
MARKS_REGEX = QWEN_REGEX.replace(r"?\p{L}+", r"?[\p{L}\p{M}]+").replace(r"^\s\p{L}\p", r"^\s\p{L}\p{M}\p")
BYTE_LEVEL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
QWEN3_TEMPLATE = """{%- if tools %}
{{- '<|im_start|>system\\n' }}
{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}
{{- "# Tools\\n\\nYou may call one or more functions.\\n<tools>" }}
{%- for tool in tools %}{{- "\\n" }}{{- tool | tojson }}{%- endfor %}
{{- "\\n</tools><|im_end|>\\n" }}
{%- elif messages[0].role == 'system' %}{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}{%- set index = (messages|length - 1) - loop.index0 %}
{%- if ns.multi_step_tool and message.role == "user" and message.content is string and not(message.content.\
startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
{%- set ns.multi_step_tool = false %}{%- set ns.last_query_index = index %}{%- endif %}{%- endfor %}
{%- for message in messages %}
{%- if message.content is string %}{%- set content = message.content %}
{%- else %}{%- set content = '' %}{%- endif %}
{%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
{{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>' + '\\n' }}
{%- elif message.role == "assistant" %}{%- set reasoning_content = '' %}
{%- if message.reasoning_content is string %}{%- set reasoning_content = message.reasoning_content %}
{%- elif '</think>' in content %}
{%- set reasoning_content = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}
{%- set content = content.split('</think>')[-1].lstrip('\\n') %}{%- endif %}
{%- if loop.index0 > ns.last_query_index and (loop.last or reasoning_content) %}
{{- '<|im_start|>' + message.role + '\\n<think>\\n' + reasoning_content.strip('\\n') + '\\n</think>\\n\\n' + \
content.lstrip('\\n') }}
{%- else %}{{- '<|im_start|>' + message.role + '\\n' + content }}{%- endif %}
{%- if message.tool_calls %}{%- for tool_call in message.tool_calls %}
{%- if (loop.first and content) or (not loop.first) %}{{- '\\n' }}{%- endif %}
{%- if tool_call.function %}{%- set tool_call = tool_call.function %}{%- endif %}
{{- '<tool_call>\\n{"name": "' }}{{- tool_call.name }}{{- '", "arguments": ' }}
{%- if tool_call.arguments is string %}{{- tool_call.arguments }}
{%- else %}{{- tool_call.arguments | tojson }}{%- endif %}{{- '}\\n</tool_call>' }}{%- endfor %}{%- endif %}
{{- '<|im_end|>\\n' }}
{%- elif message.role == "tool" %}
{%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}{{- '<|im_start|>user' }}{%- endif %}
{{- '\\n<tool_response>\\n' }}{{- content }}{{- '\\n</tool_response>' }}
{%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}{{- '<|im_end|>\\n' }}{%- endif %}
{%- endif %}{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}
{%- if enable_thinking is defined and enable_thinking is false %}
{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}
{%- endif %}"""
_CALLS = [
    {"type": "function", "function": {"name": "weather", "arguments": {"city": "Zürich", "days": 2}}},
    {"function": {"name": "f", "arguments": "{}"}},
]
CONVERSATIONS = [
    [{"role": "user", "content": "Hi!"}],
    [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "2+2? <|im_end|> <think>"}],
    [
        {"role": "user", "content": "A colour?"},
        {"role": "assistant", "content": "<think>\nblue or red\n</think>\n\nBlue."},
        {"role": "user", "content": "Why?"},
        {"role": "assistant", "content": "Because.", "reasoning_content": "sky"},
    ],
    [
        {"role": "system", "content": "Use tools."},
        {"role": "user", "content": "Weather in Zürich?"},
        {"role": "assistant", "content": "", "tool_calls": _CALLS},
        {"role": "tool", "content": '{"temp": 21}'},
        {"role": "tool", "content": "ok"},
    ],
]
TOOLS = [{"type": "function", "function": {"name": "weather", "parameters": {"city": {"type": "string"}}}}]
