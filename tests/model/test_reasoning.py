"""Reasoning output (model/reasoning.py): where an output's thinking block is, its split into reasoning and
completion against vLLM's text rule, stop-string cuts, and which parser a model's files call for."""

from __future__ import annotations

import json

import pytest
from tokenizers import AddedToken
from transformers import AutoTokenizer

from batchgen.model.reasoning import (
    AFTER,
    BEFORE,
    INSIDE,
    ReasoningParser,
    Thinking,
    parser_for,
    parser_name,
    split_reasoning,
    think_spans,
)

START, END = "<think>", "</think>"


def _thinking_tokenizer(path: str, special: bool):
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.add_tokens([AddedToken(text, special=special) for text in (START, END)], special_tokens=special)
    return tokenizer


@pytest.fixture(scope="module")
def tok(default_model_path):
    return _thinking_tokenizer(default_model_path, special=False)  # Qwen3's: think tokens decode as text


@pytest.fixture(scope="module")
def qwen3(tok):
    return parser_for("qwen3", tok)


def _ids(tok, pieces: tuple[str, ...]) -> list[int]:
    """Token ids of ``pieces``: the think tags as their single tokens, other text encoded."""
    ids: list[int] = []
    for piece in pieces:
        tag = tok.convert_tokens_to_ids(piece) if piece in (START, END) else None
        ids += [tag] if tag is not None else tok.encode(piece, add_special_tokens=False)
    return ids


def _decoder(tok, skip: bool = True):
    return lambda seqs: [tok.decode(seq, skip_special_tokens=skip) for seq in seqs]


def vllm_rule(text: str, begins: str) -> tuple[str | None, str]:
    """vLLM's split on the output's text: a block opened by the prompt or by the output's first token
    runs to the first </think> (or the end); what follows, leading whitespace stripped, is the answer."""
    if text.startswith(START):
        text = text[len(START) :]
    elif begins != INSIDE:
        return None, text
    reasoning, _, answer = text.partition(END)
    return reasoning, answer.lstrip()


CASES = [  # (output pieces, where the output begins)
    ((START, "Let me see: 2+2.", END, "\n\nIt is 4."), BEFORE),
    (("Hm, fine.", END, " Answer: yes"), INSIDE),
    (("still thinking, cut by max_tokens",), INSIDE),  # truncated inside the block: all reasoning
    (("a plain answer",), BEFORE),  # no block: the completion as without a parser
    (("an answer after the prompt's closed block",), AFTER),
    (("x ", START, "y", END, "z"), BEFORE),  # a block must open the output
    ((START, "a", END, "b", END, " c"), BEFORE),  # the first </think> ends it
    ((START, END, "\n\nNo thoughts."), BEFORE),
    ((START, "again", END, "ok"), INSIDE),  # opened by the prompt and by the output
]


@pytest.mark.parametrize("pieces, begins", CASES)
def test_the_split_follows_vllms_text_rule(tok, qwen3, pieces, begins):
    ids = _ids(tok, pieces)
    got = split_reasoning(ids, Thinking(qwen3, begins), _decoder(tok))
    assert got == vllm_rule(tok.decode(ids), begins)


@pytest.mark.parametrize("pieces, begins", CASES)
def test_think_tokens_that_decoding_skips_split_alike(default_model_path, tok, qwen3, pieces, begins):
    special = _thinking_tokenizer(default_model_path, special=True)
    ids = _ids(tok, pieces)
    parser = parser_for("qwen3", special)
    assert parser == qwen3  # the same ids
    got = split_reasoning(ids, Thinking(parser, begins), _decoder(special, skip=True))
    shown = split_reasoning(ids, Thinking(qwen3, begins), _decoder(tok))
    # The same split; think tags outside the block are skipped in the text like any special token.
    assert got == tuple(None if text is None else text.replace(START, "").replace(END, "") for text in shown)


@pytest.mark.parametrize(
    "pieces, begins, keep",
    [
        ((START, "Think about it.", END, "\n\nThe end. STOP here"), BEFORE, "The end. "),  # in the answer
        ((START, "I think STOP more", END, " answer"), BEFORE, "I think "),  # in the thinking
        (("I think STOP more",), INSIDE, "I think "),  # opened by the prompt
        (("no block STOP x",), BEFORE, "no block "),
    ],
)
def test_a_stop_string_cut_applies_to_the_whole_output(tok, qwen3, pieces, begins, keep):
    ids = _ids(tok, pieces)
    full = tok.decode(ids)
    cut = full[: full.index("STOP")]  # what the engine hands over after a stop string
    got = split_reasoning(ids, Thinking(qwen3, begins), _decoder(tok), cut=cut)
    assert got == vllm_rule(cut, begins)
    assert keep in (got[0] or "") + got[1]


def test_think_spans_positions(tok, qwen3):
    ids = _ids(tok, (START, "ab", END, "cd"))
    spans = think_spans(ids, Thinking(qwen3, BEFORE))
    assert (spans.start, ids[spans.stop], spans.closed) == (1, qwen3.end, True)
    assert think_spans(ids[1:-2], Thinking(qwen3, INSIDE)).closed is False  # "ab", cut: never closed
    assert think_spans(ids[1:], Thinking(qwen3, BEFORE)) is None


@pytest.mark.parametrize(
    "prompt, qwen3_begins, r1_begins",
    [
        (("user: hi\nassistant:\n", START, "\n"), INSIDE, INSIDE),  # the template opened the block
        (("hi", START, "\n\n", END, "\n\n"), AFTER, AFTER),  # enable_thinking false: an empty block, closed
        (("just a prompt",), BEFORE, INSIDE),  # no think token: DeepSeek-R1 thinks from its first token
        ((START, "old", END, "then", START, "\n"), INSIDE, INSIDE),  # the last think token counts
    ],
)
def test_where_an_output_begins(tok, qwen3, prompt, qwen3_begins, r1_begins):
    ids = _ids(tok, prompt)
    r1 = ReasoningParser("deepseek_r1", qwen3.start, qwen3.end)
    assert (qwen3.output_begins(ids), r1.output_begins(ids)) == (qwen3_begins, r1_begins)


def test_which_parser_the_model_files_call_for(tmp_path, default_model_path, tok):
    thinking_dir, plain_dir = tmp_path / "thinking", default_model_path
    tok.save_pretrained(thinking_dir)
    assert parser_name("auto", lambda: str(thinking_dir)) == "qwen3"
    assert parser_name("deepseek_r1", lambda: str(thinking_dir)) == "deepseek_r1"
    assert parser_name("none", lambda: str(thinking_dir)) is None
    assert parser_name("auto", lambda: plain_dir) is None
    with pytest.raises(ValueError, match="--reasoning-parser qwen3: the model's tokenizer has no <think>"):
        parser_name("qwen3", lambda: plain_dir)
    with pytest.raises(ValueError, match="choose one of auto, none, deepseek_r1, qwen3"):
        parser_name("granite", lambda: plain_dir)


def test_a_tokenizer_without_tokenizer_json_is_read_from_its_added_tokens(tmp_path):
    added = {"7": {"content": START}, "8": {"content": END}}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"added_tokens_decoder": added}))
    assert parser_name("auto", lambda: str(tmp_path)) == "qwen3"


def test_unreadable_model_files_leave_the_model_load_to_say_why(tmp_path):
    def missing() -> str:
        raise OSError("no model here")

    assert parser_name("auto", missing) is None
    assert parser_name("qwen3", missing) == "qwen3"  # checked again on the loaded tokenizer


def test_a_named_parser_needs_the_think_tokens_of_the_loaded_tokenizer(default_model_path, tok):
    assert parser_for(None, tok) is None
    with pytest.raises(ValueError, match="the tokenizer has no <think> and </think> tokens"):
        parser_for("qwen3", AutoTokenizer.from_pretrained(default_model_path))
