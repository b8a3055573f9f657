"""Structured output on the embedded model (CPU): JSON Schema, regex and choices completions validate,
async == sync, seeded samples do not depend on batching, and a grammar that allows any text changes
nothing."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
import torch

from batchgen import LLM, GenerationRequest, SamplingParams
from batchgen.engine.grammar import GrammarCompiler, GrammarError, apply_token_mask, check_json_schema
from batchgen.engine.sampler import sample
from batchgen.engine.step_sampling import SamplingFeatures
from tests.engine.sampling_cases import tensors

pytestmark = pytest.mark.usefixtures("one_torch_thread")

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "mood": {"enum": ["happy", "sad", "calm"]},
        "height_m": {"type": "number", "minimum": 0.5, "maximum": 2.5},
        "pets": {
            "type": "array",
            "maxItems": 2,
            "items": {
                "type": "object",
                "properties": {
                    "kind": {"enum": ["cat", "dog", "fish"]},
                    "names": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 2},
                },
                "required": ["kind", "names"],
            },
        },
    },
    "required": ["name", "age", "mood", "height_m", "pets"],
}
DATE = r"\d{4}-\d{2}-\d{2}"
LABELS = ["positive", "negative", "neutral"]
SAMPLED = dict(temperature=0.9, top_p=0.95, seed=11)
# (prompt, params): every kind of constraint, greedy and sampled (n = 2), in one batch.
JSON_ROW = SamplingParams(max_new_tokens=120, json_schema=PERSON)
ROWS = [
    ("Describe a person called Ann and her pets as JSON.", JSON_ROW),
    ("Invent a fisherman as a JSON record.", JSON_ROW.with_overrides(json_schema=json.dumps(PERSON))),
    ("When did the Second World War end? Reply with a date.", SamplingParams(max_new_tokens=16, regex=DATE)),
    ("Sentiment of 'I love this phone!'", SamplingParams(max_new_tokens=8, choices=LABELS)),
    ("Describe a sailor as JSON.", JSON_ROW.with_overrides(n=2, **SAMPLED)),
    ("What is 2+2?", SamplingParams(max_new_tokens=12)),  # unconstrained, in the same steps
]


def _requests(llm, indices):
    return [GenerationRequest(i, llm.encode(ROWS[i][0]), ROWS[i][1]) for i in indices]


def _run(llm, indices, samples=None):
    reqs = _requests(llm, indices)
    if samples is not None:
        reqs = [r._replace(samples=samples) for r in reqs]
    return {(o.index, o.sample): o for o in llm.stream(reqs)}


@pytest.fixture(scope="module")
def async_llm():
    # One fixed thread: automatic threads follow the load, and another count rounds the logits
    # differently (a test below compares log-probabilities exactly, run against run).
    return LLM(async_mode=True, threads=1)


@pytest.fixture(scope="module")
def sync_llm():
    return LLM(async_mode=False, max_num_seqs=3, threads=1)  # fewer rows a step: other batchings than async's


@pytest.fixture(scope="module")
def batched(async_llm):
    return _run(async_llm, range(len(ROWS)))


def _check(row: int, text: str) -> None:
    params = ROWS[row][1]
    if params.json_schema is not None:
        jsonschema.validate(json.loads(text), json.loads(params.json_schema))
        # Compact: json.dumps' separators and nothing else (no newlines, no runs of blanks outside strings).
        assert json.dumps(json.loads(text), ensure_ascii=False) == text
    elif params.regex is not None:
        assert re.fullmatch(params.regex, text), text
    elif params.choices is not None:
        assert text in params.choices


def test_every_constrained_completion_validates(batched):
    assert len(batched) == 7
    for (row, _), out in batched.items():
        if ROWS[row][1].constrained:
            assert out.finish_reason == "stop", (row, out.text)
            _check(row, out.text)
    assert batched[(4, 0)].text != batched[(4, 1)].text  # the samples differ


def test_async_equals_sync_and_samples_do_not_depend_on_batching(batched, sync_llm):
    together = _run(sync_llm, reversed(range(len(ROWS))))
    assert {k: o.token_ids for k, o in together.items()} == {k: o.token_ids for k, o in batched.items()}
    alone = _run(sync_llm, [4], samples=(1,))  # one sample of the sampled row, alone (a resume's case)
    assert alone[(4, 1)].token_ids == batched[(4, 1)].token_ids


def test_a_grammar_that_allows_any_text_changes_nothing(async_llm):
    prompts = [async_llm.encode(p) for p in ("Name a colour.", "Tell me a joke.")]
    greedy = SamplingParams(max_new_tokens=24, logprobs=True)
    # Both runs below find the prompts' full blocks cached by this one, so they compute the same prefill
    # chunks: a prompt prefilled whole and one prefilled from cached blocks round differently (CPU SDPA).
    async_llm.generate_samples(prompts, greedy)
    for base in (greedy, greedy.with_overrides(**SAMPLED)):
        free = async_llm.generate_samples(prompts, base)
        constrained = async_llm.generate_samples(prompts, base.with_overrides(regex=r"[\s\S]*"))
        assert [o.token_ids for o in constrained] == [o.token_ids for o in free]
        assert [o.logprobs for o in constrained] == [o.logprobs for o in free]


def test_stop_strings_cut_a_constrained_completion(batched, async_llm):
    params = ROWS[0][1].with_overrides(stop=('"mood"',), logprobs=True)
    (out,) = async_llm.generate_samples([async_llm.encode(ROWS[0][0])], params)
    full = batched[(0, 0)].text
    assert out.finish_reason == "stop" and out.text == full[: full.index('"mood"')]
    assert len(out.logprobs) == len(out.token_ids) and all(-100 < lp <= 0 for lp in out.logprobs)


def test_a_constraint_that_does_not_compile_is_an_error_record(async_llm):
    ids = async_llm.encode("Hello")
    bad = [SamplingParams(max_new_tokens=4, json_schema={"type": "strin"}), SamplingParams(regex="(a", n=2)]
    good = SamplingParams(max_new_tokens=4, choices=["yes", "no"])
    outs = async_llm.generate_samples([ids, ids, ids], [*bad, good])
    assert [o.finish_reason for o in outs] == ["error", "error", "error", "stop"]
    assert "invalid json_schema" in outs[0].error and "strin" in outs[0].error
    assert outs[1].error.startswith("invalid regex") and outs[3].text in ("yes", "no")


def test_a_refused_token_fails_its_row_not_the_run(async_llm, monkeypatch):
    from batchgen.engine.grammar import Guide

    monkeypatch.setattr(Guide, "accept", lambda self, token: False)  # as after non-finite logits
    ids = async_llm.encode("Hello")
    constrained = SamplingParams(max_new_tokens=4, choices=["yes", "no"])
    outs = async_llm.generate_samples([ids, ids], [constrained, SamplingParams(max_new_tokens=4)])
    assert (outs[0].finish_reason, outs[0].text) == ("error", "") and "refused" in outs[0].error
    assert outs[1].finish_reason in ("stop", "length")


# --- no model ---------------------------------------------------------------------------------------------


def test_params_validate_and_a_rows_constraint_replaces_the_runs():
    with pytest.raises(ValueError, match="not valid JSON"):
        SamplingParams(json_schema="{nope")
    with pytest.raises(ValueError, match="exclude each other"):
        SamplingParams(regex="a+", choices=["a"])
    with pytest.raises(ValueError, match="choices"):
        SamplingParams(choices=[])
    base = SamplingParams(json_schema={"b": 1, "a": 2})
    assert base.json_schema == '{"b":1,"a":2}'  # compact, key order kept (it orders the output)
    row = base.with_overrides(choices=["x", "y"], temperature=None)
    assert row.json_schema is None and row.choices == ("x", "y") and base.with_overrides().json_schema


def test_check_json_schema_names_the_problem():
    assert check_json_schema(json.dumps(PERSON)) is None
    assert "Unsupported type" in check_json_schema('{"type": "strin"}')
    assert "not valid JSON" in check_json_schema("{")
    assert "Cannot find" in check_json_schema('{"$ref": "#/defs/x"}')


def test_compiler_caches_compiles_choices_with_quotes_and_fills_masks(async_llm):
    grammars = GrammarCompiler(async_llm.tokenizer, 49152 + 40, [2])  # an LM head padded past the tokenizer
    params = SamplingParams(choices=['say "hi"', "back\\slash"])
    assert grammars.compile(params) is grammars.compile(params)
    with pytest.raises(GrammarError, match="invalid regex"):
        grammars.compile(SamplingParams(regex="[a-"))
    guide = grammars.guide(grammars.compile(params))
    for token in async_llm.tokenizer.encode('say "hi"', add_special_tokens=False):
        assert guide.accept(token)
    assert guide.accept(2) and guide.done
    masks = torch.zeros((3, grammars.mask_width), dtype=torch.int32)
    grammars.fill_masks([grammars.guide(grammars.compile(params)), None, guide], masks)
    assert (masks[1:] == -1).all() and 0 < masks[0].count_nonzero() < grammars.mask_width


def test_masks_apply_on_the_logits_and_logprobs_stay_the_models():
    logits = torch.randn(2, 70)  # 64 tokens in the bitmask's two words, 6 ids of LM-head padding
    bitmask = torch.tensor([[0b1010, 0], [-1, -1]], dtype=torch.int32)
    masked = apply_token_mask(logits, bitmask)
    assert torch.isfinite(masked[0]).tolist() == [i in (1, 3) for i in range(70)]
    assert torch.equal(masked[1], logits[1])  # all ones: unconstrained, padding ids included
    params = tensors(2)._replace(token_mask=bitmask)
    tokens, logprobs, *_ = sample(logits, params, SamplingFeatures(logprobs=True))
    assert tokens[0].item() == (1 if logits[0, 1] > logits[0, 3] else 3)
    assert torch.allclose(logprobs, torch.log_softmax(logits, -1).gather(1, tokens[:, None]).squeeze(1))
