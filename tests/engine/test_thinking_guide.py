"""Structured output behind a thinking block (engine/thinking.py): the mask is the grammar's plus <think>
before a block, all ones inside it, the grammar's from its start after </think>, checked against a plain
grammar matcher fed the same answer tokens, in the guide alone and per step of the engine (CPU here; the
``gpu`` variant runs the CUDA runner's masked steps, graphs included)."""

from __future__ import annotations

import json

import jsonschema
import pytest
import torch

from batchgen import LLM, GenerationRequest, SamplingParams
from batchgen.engine.grammar import GrammarCompiler, Guide, allow_token
from batchgen.engine.thinking import ThinkingGuide
from batchgen.model.reasoning import AFTER, BEFORE, INSIDE, Thinking, parser_for, split_reasoning, think_spans
from tests.support.thinking import OPENING_TEMPLATE, QWEN3_TEMPLATE, build_thinking_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SCHEMA = {
    "type": "object",
    "properties": {
        "n": {"type": "integer", "minimum": 0, "maximum": 99},
        "w": {"type": "string", "maxLength": 8},
    },
    "required": ["n", "w"],
}


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("thinking")
    return {
        "qwen3": str(build_thinking_model(root / "qwen3", QWEN3_TEMPLATE)),
        "opening": str(build_thinking_model(root / "opening", OPENING_TEMPLATE)),
    }


@pytest.fixture(scope="module")
def llm(models):
    return LLM(models["qwen3"], threads=1, max_num_seqs=4)


def _mask(compiler: GrammarCompiler, guide) -> torch.Tensor:
    out = torch.zeros((1, compiler.mask_width), dtype=torch.int32)
    compiler.fill_masks([guide], out)
    return out[0]


def _with(mask: torch.Tensor, token: int) -> torch.Tensor:
    out = mask.clone().unsqueeze(0)
    allow_token(out, 0, token)
    return out[0]


def _allows(mask: torch.Tensor, token: int) -> bool:
    return bool((int(mask[token // 32]) >> (token % 32)) & 1)


def test_allow_token_sets_one_bit_the_sign_bit_too():
    out = torch.zeros((2, 3), dtype=torch.int32)
    allow_token(out, 1, 63)  # bit 31 of word 1: the int32's sign
    allow_token(out, 1, 64)
    assert out.tolist() == [[0, 0, 0], [0, -(2**31), 1]]


def test_the_guide_walks_before_inside_after(llm):
    compiler, tok = llm.grammars, llm.tokenizer
    parser = parser_for("qwen3", tok)
    compiled = compiler.compile(SamplingParams(json_schema=SCHEMA))
    guide, plain = ThinkingGuide(compiler.guide(compiled), Thinking(parser, BEFORE)), compiler.guide(compiled)
    assert isinstance(plain, Guide)
    before = _mask(compiler, guide)
    assert not _allows(_mask(compiler, plain), parser.start)  # the grammar alone forbids <think>
    assert torch.equal(before, _with(_mask(compiler, plain), parser.start))
    assert guide.accept(parser.start)
    for token in [*tok.encode("not { json", add_special_tokens=False), parser.start, tok.eos_token_id]:
        assert torch.equal(_mask(compiler, guide), torch.full_like(before, -1))  # free inside
        assert guide.accept(token)
    assert guide.accept(parser.end)
    for token in [*tok.encode('{"n": 7, "w": "hi"}', add_special_tokens=False), tok.eos_token_id]:
        assert torch.equal(_mask(compiler, guide), _mask(compiler, plain))  # the grammar from its start
        assert guide.accept(token) and plain.accept(token)
    assert guide.done and plain.done


@pytest.mark.parametrize("begins", [BEFORE, AFTER])
def test_no_block_opens_once_the_answer_began(llm, begins):
    """An answer that began without a block, or a prompt that closed one (Qwen3, thinking off): the grammar
    alone, <think> never allowed."""
    compiler, tok = llm.grammars, llm.tokenizer
    parser = parser_for("qwen3", tok)
    compiled = compiler.compile(SamplingParams(json_schema=SCHEMA))
    guide, plain = ThinkingGuide(compiler.guide(compiled), Thinking(parser, begins)), compiler.guide(compiled)
    if begins == AFTER:
        assert torch.equal(_mask(compiler, guide), _mask(compiler, plain))
    first = tok.encode("{", add_special_tokens=False)[0]
    assert guide.accept(first) and plain.accept(first)
    assert torch.equal(_mask(compiler, guide), _mask(compiler, plain))
    assert not guide.free and guide.also_allowed is None


def _replay(compiler: GrammarCompiler, compiled, thinking: Thinking, tokens: list[int], step: int):
    """The mask the row's step ``step`` must have had: the oracle is a plain matcher fed the tokens after
    the block (``tokens``: the row's output)."""
    spans = think_spans(tokens, thinking)
    start = 0 if spans is None else spans.answer
    plain = compiler.guide(compiled)
    if spans is not None and step < spans.answer:
        if step == 0 and thinking.begins == BEFORE:
            return _with(_mask(compiler, plain), thinking.parser.start)
        return torch.full((compiler.mask_width,), -1, dtype=torch.int32)
    for token in tokens[start:step]:
        plain.accept(token)
    return _mask(compiler, plain)


def _spy(llm: LLM) -> list[torch.Tensor]:
    """The masks the engine fills, one a masked step."""
    fills, fill = [], llm.grammars.fill_masks

    def recording(guides, out):
        fill(guides, out)
        fills.append(out.clone())

    llm.grammars.fill_masks = recording
    return fills


THINKING_OFF = {"enable_thinking": False}
ROWS = [  # (prompt, template, its variables, logit bias on (<think>, </think>))
    # The Qwen3 template's prompt opens no block: <think> biased open, </think> (more) shut at once.
    ("Name a colour.", QWEN3_TEMPLATE, {}, (30.0, 40.0)),
    # The opening template's: "Hello" thinks freely until a small </think> bias wins, a few tokens in
    # (random weights never close a block alone; the bias was found by trying some).
    ("Hello", OPENING_TEMPLATE, {}, (0.0, 2.25)),
    # Thinking off, the prompt closed a block: however much <think> is favoured, the JSON comes at once.
    ("Hello", OPENING_TEMPLATE, THINKING_OFF, (30.0, 0.0)),
]


def _request(llm: LLM, row: tuple, params: SamplingParams) -> GenerationRequest:
    text, template, variables, (open_bias, close_bias) = row
    parser = parser_for("qwen3", llm.tokenizer)
    messages = [{"role": "user", "content": text}]
    ids = llm.tokenizer.apply_chat_template(
        messages, chat_template=template, add_generation_prompt=True, tokenize=True, return_dict=False,
        **variables,
    )  # fmt: skip
    bias = {parser.start: open_bias, parser.end: close_bias}
    return GenerationRequest(
        0, ids, params.with_overrides(logit_bias=bias), thinking=Thinking(parser, parser.output_begins(ids))
    )


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_the_engines_masks_are_free_inside_the_block_and_the_grammars_after(models, device):
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    llm = LLM(models["opening"], device=device, dtype="float32", threads=1, max_num_seqs=4)
    if device == "cuda":
        llm._engine.runner.capture_after = 1  # the masked steps' graphs are replayed in this short run
    tok, fills = llm.tokenizer, _spy(llm)
    params = SamplingParams(max_new_tokens=40, json_schema=SCHEMA)
    compiled = llm.grammars.compile(params)
    outs = []
    for row in ROWS:  # one row a stream: every fill is its step's
        fills.clear()
        request = _request(llm, row, params)
        (out,) = llm.stream([request])
        reasoning, answer = split_reasoning(out.token_ids, out.thinking, lambda s: tok.decode(s, True))
        assert out.finish_reason == "stop", out
        jsonschema.validate(json.loads(answer), SCHEMA)
        assert len(fills) >= out.completion_tokens
        for step in range(out.completion_tokens):
            want = _replay(llm.grammars, compiled, out.thinking, out.token_ids, step)
            assert torch.equal(fills[step][0], want), (row, step)
        outs.append((request.thinking.begins, reasoning))
    assert (
        outs[0] == (BEFORE, "") and outs[1][0] == INSIDE and outs[1][1]
    )  # opened by the output / the prompt
    assert outs[2] == (AFTER, None)
