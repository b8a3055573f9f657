"""A tiny chat template that shows what reached it: the messages, the tools' names and whether
``enable_thinking`` was set (test_tokenize.py renders it, test_chat_inputs.py runs it end to end)."""

THINK_TEMPLATE = (
    "{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}"
    "{% if tools %}<tools>{{ tools | map(attribute='function') | map(attribute='name') | join(',') }}\n"
    "{% endif %}"
    "{% if enable_thinking %}<think>\n{% else %}no thinking here, answer at once\n{% endif %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)
WEATHER_TOOL = {
    "type": "function",
    "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {}}},
}


def rendered(messages: list[dict], thinking: bool, tools: str = "") -> str:
    """What THINK_TEMPLATE renders for ``messages`` (with the generation prompt)."""
    turns = "".join(f"<{m['role']}>{m['content']}\n" for m in messages)
    tool_line = f"<tools>{tools}\n" if tools else ""
    think = "<think>\n" if thinking else "no thinking here, answer at once\n"
    return f"{turns}{tool_line}{think}<assistant>"
