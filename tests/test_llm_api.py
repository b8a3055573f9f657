"""The Python API in vLLM's shape: ``LLM.generate`` and ``LLM.chat`` return one ``RequestOutput`` per
prompt, in input order, holding its ``n`` samples. Oracles: the engine's own per-sample outputs (the
same requests streamed), the tokenizer's encoding and chat template, and the model's log-softmax."""

from __future__ import annotations

import gc

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from batchgen import LLM, CompletionOutput, GenerationRequest, RequestOutput, SamplingParams
from tests.support.models import build_tiny_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")

PROMPTS = ["The river", "Once upon a time", "Numbers: 1, 2, 3,"]
SAMPLED = SamplingParams(n=2, temperature=0.8, seed=3, max_new_tokens=6, ignore_eos=True)
GREEDY = SamplingParams(max_new_tokens=4, ignore_eos=True)
CONVERSATION = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Name a colour."},
]
# A template that shows each of chat()'s options in the text it renders.
TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if tools %}tools: {{ tools | map(attribute='name') | join(',') }}\n{% endif %}"
    "{% if shout %}LOUD\n{% endif %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    return str(build_tiny_model("llama", tmp_path_factory.mktemp("api") / "llama"))


@pytest.fixture(scope="module")
def llm(model_dir) -> LLM:
    return LLM(model_dir, max_model_len=64)


@pytest.fixture(scope="module")
def hf_tokenizer(model_dir):
    return AutoTokenizer.from_pretrained(model_dir)


def _engine_samples(llm: LLM, prompt_ids: list[list[int]], params: list[SamplingParams]) -> dict:
    """The engine's outputs for the same requests, by (prompt, sample)."""
    requests = [
        GenerationRequest(i, ids, p) for i, (ids, p) in enumerate(zip(prompt_ids, params, strict=True))
    ]
    return {(out.index, out.sample): out for out in llm.stream(requests)}


def _assert_same_samples(results: list[RequestOutput], engine: dict, counts: list[int]) -> None:
    assert [len(result.outputs) for result in results] == counts
    for i, result in enumerate(results):
        assert [c.index for c in result.outputs] == list(range(counts[i]))
        for completion in result.outputs:
            want = engine[i, completion.index]
            assert isinstance(completion, CompletionOutput) and completion.finished()
            assert completion.token_ids == want.token_ids and completion.text == want.text
            assert completion.finish_reason == want.finish_reason


def test_generate_gives_n_samples_per_prompt_in_input_order(llm, hf_tokenizer):
    results = llm.generate(PROMPTS, SAMPLED, use_tqdm=False)
    prompt_ids = [hf_tokenizer.encode(p) for p in PROMPTS]  # raw text, as vLLM's generate sends it
    assert [r.prompt for r in results] == PROMPTS
    assert [r.prompt_token_ids for r in results] == prompt_ids
    _assert_same_samples(results, _engine_samples(llm, prompt_ids, [SAMPLED] * 3), [2, 2, 2])
    assert all(r.finished and r.prompt_logprobs is None for r in results)
    assert all(c.logprobs is None and c.cumulative_logprob is None for r in results for c in r.outputs)
    assert results[0].outputs[0].token_ids != results[0].outputs[1].token_ids  # two draws, not one twice
    again = llm.generate(PROMPTS[0], SAMPLED, use_tqdm=False)  # one prompt, not in a list
    assert len(again) == 1 and again[0].outputs == results[0].outputs
    ids = [r.request_id for r in [*results, *again]]
    assert all(isinstance(i, str) for i in ids) and len(set(ids)) == 4


def test_token_id_and_dict_prompts_equal_their_text(llm, hf_tokenizer):
    ids = hf_tokenizer.encode(PROMPTS[1])
    forms = [PROMPTS[1], ids, {"prompt": PROMPTS[1]}, {"prompt_token_ids": ids}]
    results = llm.generate(forms, GREEDY, use_tqdm=False)
    assert [r.prompt for r in results] == [PROMPTS[1], None, PROMPTS[1], None]
    assert all(r.prompt_token_ids == ids for r in results)
    assert len({tuple(r.outputs[0].token_ids) for r in results}) == 1
    engine = _engine_samples(llm, [ids], [GREEDY])
    _assert_same_samples(results[:1], engine, [1])


def test_one_sampling_params_per_prompt(llm, hf_tokenizer):
    params = [GREEDY, SAMPLED, GREEDY.with_overrides(max_new_tokens=2)]
    results = llm.generate(PROMPTS, params, use_tqdm=False)
    prompt_ids = [hf_tokenizer.encode(p) for p in PROMPTS]
    _assert_same_samples(results, _engine_samples(llm, prompt_ids, params), [1, 2, 1])
    assert [len(c.token_ids) for r in results for c in r.outputs] == [4, 6, 6, 2]
    with pytest.raises(ValueError, match="2 sampling params for 3 prompts"):
        llm.generate(PROMPTS, params[:2], use_tqdm=False)


def test_prompts_generate_cannot_take_are_refused(llm):
    with pytest.raises(TypeError, match="goes to LLM.chat"):
        llm.generate([CONVERSATION], GREEDY, use_tqdm=False)
    with pytest.raises(ValueError, match="not multi_modal_data"):
        llm.generate({"prompt": "a cat", "multi_modal_data": {}}, GREEDY, use_tqdm=False)


def test_a_prompt_that_cannot_run_gets_error_samples(llm):
    [too_long, fine] = llm.generate([list(range(5, 80)), [5, 6, 7]], SamplingParams(n=2), use_tqdm=False)
    assert [c.finish_reason for c in too_long.outputs] == ["error", "error"]
    assert all("at most" in c.error and c.token_ids == [] for c in too_long.outputs)
    assert [c.finish_reason for c in fine.outputs] == ["length", "length"] and fine.outputs[0].error is None


def test_logprobs_have_vllms_shape_and_the_models_values(llm, model_dir, hf_tokenizer):
    params = SamplingParams(max_new_tokens=4, ignore_eos=True, logprobs=2, prompt_logprobs=1)
    [result] = llm.generate(PROMPTS[2], params, use_tqdm=False)
    [completion] = result.outputs
    prompt, output = result.prompt_token_ids, completion.token_ids
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.inference_mode():
        log_probs = torch.log_softmax(hf(torch.tensor([prompt + output])).logits[0], -1)
    for t, position in enumerate(completion.logprobs):  # greedy: the chosen token is the most likely
        best = log_probs[len(prompt) - 1 + t].topk(2)
        assert list(position) == best.indices.tolist() and output[t] == best.indices[0]
        assert [p.rank for p in position.values()] == [1, 2]
        assert torch.allclose(torch.tensor([p.logprob for p in position.values()]), best.values, atol=1e-3)
        assert [p.decoded_token for p in position.values()] == [hf_tokenizer.decode([i]) for i in position]
    chosen = [completion.logprobs[t][token].logprob for t, token in enumerate(output)]
    assert completion.cumulative_logprob == pytest.approx(sum(chosen))
    assert result.prompt_logprobs[0] is None and len(result.prompt_logprobs) == len(prompt)
    for p, position in enumerate(result.prompt_logprobs[1:], 1):
        token, best = prompt[p], int(log_probs[p - 1].argmax())
        assert next(iter(position)) == token and position[best].rank == 1
        assert position[token].rank == (1 if token == best else None) and len(position) == 1 + (token != best)
        assert position[token].logprob == pytest.approx(float(log_probs[p - 1, token]), abs=1e-3)


def test_a_sampled_token_outside_the_top_n_has_no_rank(llm):
    # The tiny model is near uniform: a low temperature picks its most likely token about half the time.
    params = SamplingParams(max_new_tokens=16, temperature=0.2, seed=1, ignore_eos=True, logprobs=1)
    [completion] = llm.generate(PROMPTS[0], params, use_tqdm=False)[0].outputs
    ranks = []
    for token, position in zip(completion.token_ids, completion.logprobs, strict=True):
        ranks.append(position[token].rank)
        assert next(iter(position)) == token and len(position) == (1 if ranks[-1] == 1 else 2)
        assert [p.rank for p in position.values()][-1] == 1
    assert set(ranks) == {1, None}  # both cases were seen


def test_chat_equals_generate_on_the_rendered_conversation(llm, hf_tokenizer):
    text = hf_tokenizer.apply_chat_template(CONVERSATION, add_generation_prompt=True, tokenize=False)
    ids = hf_tokenizer.encode(text, add_special_tokens=False)
    [chatted] = llm.chat(CONVERSATION, SAMPLED, use_tqdm=False)
    [generated] = llm.generate({"prompt_token_ids": ids}, SAMPLED, use_tqdm=False)
    assert chatted.prompt == text and chatted.prompt_token_ids == ids
    assert chatted.outputs == generated.outputs
    other = [{"role": "user", "content": "Count to three."}]
    both = llm.chat([CONVERSATION, other], SAMPLED, use_tqdm=False)
    assert len(both) == 2 and both[0].outputs == chatted.outputs and both[1].prompt != text


def test_chat_options_reach_the_template(llm, hf_tokenizer):
    tools = [{"name": "search"}, {"name": "calc"}]
    [full] = llm.chat(CONVERSATION, GREEDY, use_tqdm=False, chat_template=TEMPLATE,
                      chat_template_kwargs={"shout": True}, tools=tools)  # fmt: skip
    turns = "system: You are terse.\nuser: Name a colour.\n"
    assert full.prompt == turns + "tools: search,calc\nLOUD\nassistant:"
    assert full.prompt_token_ids == hf_tokenizer.encode(full.prompt, add_special_tokens=False)
    [bare] = llm.chat(
        CONVERSATION, GREEDY, use_tqdm=False, chat_template=TEMPLATE, add_generation_prompt=False
    )
    assert bare.prompt == turns


def test_use_tqdm_draws_a_bar_over_prompts_or_nothing(llm, capsys):
    llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    llm.chat(CONVERSATION, GREEDY, use_tqdm=False)
    assert capsys.readouterr() == ("", "")
    llm.generate(PROMPTS, GREEDY)
    drawn = capsys.readouterr()
    assert drawn.out == "" and "Processed prompts" in drawn.err and "3/3" in drawn.err


def test_the_heap_is_frozen_while_a_stream_runs_and_thawed_after(llm):
    """``LLM.stream`` (and so ``generate``) keeps the collector off the objects made before it: the
    collections a long generation makes walk only its own objects (gc_policy.py)."""
    assert gc.get_freeze_count() == 0
    requests = [GenerationRequest(i, [1, 2, 3], SamplingParams(max_tokens=3)) for i in range(2)]
    frozen = [gc.get_freeze_count() for _ in llm.stream(requests)]
    assert len(frozen) == 2 and all(frozen)
    assert gc.get_freeze_count() == 0
    stream = llm.stream(requests)
    next(stream)
    stream.close()  # a caller that stops early thaws the heap too
    assert gc.get_freeze_count() == 0
