"""vLLM's sampling parameters on the embedded model in float32, against oracles that are not batchgen:
transformers' own generate and logits processors (or the formula written out as one here), and
log_softmax of transformers' logits. Greedy output with a penalty, a logit bias, stop token ids or
min_tokens is token-exact; log-probabilities agree within 1e-3; sampled first tokens follow
softmax(logits / T) within exact sampling's noise; and rows give the same tokens whatever batch they
share."""

from __future__ import annotations

import gc

import pytest
import torch
from transformers import AutoModelForCausalLM, LogitsProcessor, LogitsProcessorList

from batchgen import LLM, GenerationRequest, SamplingParams
from tests.engine.oracle import make_prompts
from tests.engine.sampling_cases import fits

NEW_TOKENS = 16
PROMPT_COUNT = 6


@pytest.fixture(scope="module")
def hf(default_model_path):
    return AutoModelForCausalLM.from_pretrained(default_model_path, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def llm(default_model_path):
    return LLM(default_model_path, max_num_seqs=8)


@pytest.fixture(scope="module")
def prompts(llm):
    return make_prompts(llm.tokenizer, count=PROMPT_COUNT, max_tokens=80, seed=3)


class FrequencyPresence(LogitsProcessor):
    """vLLM's frequency and presence penalties, written out: over the generated tokens only."""

    def __init__(self, prompt_len: int, frequency: float, presence: float) -> None:
        self.prompt_len, self.frequency, self.presence = prompt_len, frequency, presence

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        out = input_ids[0, self.prompt_len :]
        counts = torch.bincount(out, minlength=scores.shape[-1])[: scores.shape[-1]].to(scores.dtype)
        return scores - self.frequency * counts - self.presence * (counts > 0).to(scores.dtype)


def _reference(hf, prompt: list[int], **generate) -> list[int]:
    processors = generate.pop("processors", lambda n: [])(len(prompt))
    with torch.inference_mode():
        out = hf.generate(
            torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0,
            logits_processor=LogitsProcessorList(processors), **generate,
        )  # fmt: skip
    return out[0, len(prompt) :].tolist()


def _eos(llm) -> int:
    return llm.tokenizer.eos_token_id


# name -> (batchgen's SamplingParams fields, transformers generate's arguments)
def _penalties(frequency: float, presence: float) -> dict:
    return {"processors": lambda prompt_len: [FrequencyPresence(prompt_len, frequency, presence)]}


CASES = {
    "repetition_penalty": ({"repetition_penalty": 1.4}, {"repetition_penalty": 1.4}),
    "frequency_penalty": ({"frequency_penalty": 1.5}, _penalties(1.5, 0.0)),
    "presence_penalty": ({"presence_penalty": 1.8}, _penalties(0.0, 1.8)),
    "logit_bias": ({"logit_bias": {"13": 6.0, "30": -100}}, {"sequence_bias": {(13,): 6.0, (30,): -100.0}}),
}  # fmt: skip


@pytest.mark.parametrize("case", list(CASES))
def test_greedy_with_a_penalty_or_a_bias_matches_transformers(llm, hf, prompts, case):
    ours, theirs = CASES[case]
    params = SamplingParams(max_new_tokens=NEW_TOKENS, **ours)
    got = [o.token_ids for o in llm.generate_samples(prompts, params)]
    want = [_reference(hf, p, **theirs) for p in prompts]
    plain = [o.token_ids for o in llm.generate_samples(prompts, SamplingParams(max_new_tokens=NEW_TOKENS))]
    assert got == want
    assert got != plain  # the parameter changed something


def test_stop_token_ids_and_min_tokens_match_transformers(llm, hf, prompts):
    """A frequent token as a stop id ends rows where transformers' list of EOS ids ends them; with
    min_tokens, neither it nor EOS may end a row before that many tokens (transformers' min_new_tokens)."""
    plain = [o.token_ids for o in llm.generate_samples(prompts, SamplingParams(max_new_tokens=NEW_TOKENS))]
    stop = max(set(t for out in plain for t in out[1:6]), key=lambda t: sum(o.count(t) for o in plain))
    eos = [_eos(llm), stop]
    params = SamplingParams(max_new_tokens=NEW_TOKENS, stop_token_ids=[stop])
    outs = llm.generate_samples(prompts, params)
    assert [o.token_ids for o in outs] == [_reference(hf, p, eos_token_id=eos) for p in prompts]
    assert any(o.finish_reason == "stop" and o.token_ids[-1] == stop for o in outs)
    held = SamplingParams(max_new_tokens=NEW_TOKENS, stop_token_ids=[stop], min_tokens=8)
    got = [o.token_ids for o in llm.generate_samples(prompts, held)]
    assert got == [_reference(hf, p, eos_token_id=eos, min_new_tokens=8) for p in prompts]
    assert all(len(g) >= 8 for g in got)


def test_min_p_one_equals_greedy(llm, prompts):
    greedy = [o.token_ids for o in llm.generate_samples(prompts, SamplingParams(max_new_tokens=NEW_TOKENS))]
    cut = SamplingParams(max_new_tokens=NEW_TOKENS, temperature=0.8, min_p=1.0, seed=5)
    assert [o.token_ids for o in llm.generate_samples(prompts, cut)] == greedy


def test_log_probabilities_are_log_softmax_of_transformers_logits(llm, hf, prompts):
    params = SamplingParams(max_new_tokens=NEW_TOKENS, temperature=0.9, seed=2, logprobs=5, prompt_logprobs=3)
    for prompt, out in zip(prompts, llm.generate_samples(prompts, params), strict=True):
        ids = prompt + out.token_ids
        with torch.inference_mode():
            raw = torch.log_softmax(hf(torch.tensor([ids])).logits[0].float(), -1)  # [L, V]
        positions = range(len(prompt) - 1, len(ids) - 1)  # each output token's predicting position
        want = [raw[p, ids[p + 1]].item() for p in positions]
        assert torch.allclose(torch.tensor(out.logprobs), torch.tensor(want), atol=1e-3)
        for p, top in zip(positions, out.top_logprobs, strict=True):
            best = raw[p].topk(5)
            assert [t for t, _ in top] == best.indices.tolist()
            assert torch.allclose(torch.tensor([lp for _, lp in top]), best.values, atol=1e-3)
        assert out.prompt_logprobs[0] is None and out.prompt_top_logprobs[0] is None
        want_prompt = [raw[p - 1, prompt[p]].item() for p in range(1, len(prompt))]
        assert torch.allclose(torch.tensor(out.prompt_logprobs[1:]), torch.tensor(want_prompt), atol=1e-3)
        for p, top in enumerate(out.prompt_top_logprobs[1:], 1):
            assert [t for t, _ in top] == raw[p - 1].topk(3).indices.tolist()


def test_kept_log_probabilities_leave_the_garbage_collector_nothing_to_walk(llm, prompts):
    """Every token's alternatives live until its row is written: as tracked containers they would make
    each full collection walk millions of objects, a stall of the whole run."""
    params = SamplingParams(max_new_tokens=NEW_TOKENS, logprobs=5, prompt_logprobs=3)
    outs = llm.generate_samples(prompts[:2], params)
    gc.collect()  # untracks the (token, logprob) pairs, and the next pass the tuples that hold them
    gc.collect()
    kept = [top for out in outs for top in [*out.top_logprobs, *out.prompt_top_logprobs[1:]]]
    assert len(kept) > 2 * NEW_TOKENS and not any(map(gc.is_tracked, kept))


def test_prompt_logprobs_of_a_long_prompt_come_chunk_by_chunk(default_model_path, hf):
    """A prompt longer than a step's token budget and than the scored chunk (scheduler's
    PROMPT_LOGPROBS_CHUNK) is scored in several steps, every position once, prefix caching or not."""
    llm = LLM(default_model_path, max_batch_tokens=256)
    prompt = make_prompts(llm.tokenizer, count=5, max_tokens=700, seed=4)[3]
    assert len(prompt) > 600
    out = llm.generate_samples([prompt, prompt], SamplingParams(max_new_tokens=2, prompt_logprobs=0))
    with torch.inference_mode():
        raw = torch.log_softmax(hf(torch.tensor([prompt])).logits[0].float(), -1)
    want = torch.tensor([raw[p - 1, prompt[p]].item() for p in range(1, len(prompt))])
    for o in out:
        assert o.prompt_top_logprobs is None
        assert torch.allclose(torch.tensor(o.prompt_logprobs[1:]), want, atol=1e-3)
    assert llm.stats.partial_prefills > 0


@pytest.mark.parametrize("temperature, top_p", [(0.7, 1.0), (1.0, 0.8)])
def test_first_sampled_tokens_follow_the_models_scaled_distribution(llm, hf, temperature, top_p):
    """Samples of one prompt (each its own random stream) fit exact sampling from softmax(logits / T), cut
    to the top-p nucleus (a chi-square test whose threshold follows from the sample size), and do not fit
    the distribution where the temperature (or the cut) were ignored."""
    prompt = llm.encode("The weather today is", chat=False)
    samples = 1500
    params = SamplingParams(max_new_tokens=1, temperature=temperature, top_p=top_p, n=samples, seed=9)
    firsts = torch.tensor([o.token_ids[0] for o in llm.generate_samples([prompt], params)])
    with torch.inference_mode():
        logits = hf(torch.tensor([prompt])).logits[0, -1].double()
    counts = torch.bincount(firsts, minlength=logits.shape[0])
    assert fits(counts, _nucleus(logits, temperature, top_p))
    assert not fits(counts, _nucleus(logits, 1.0, 1.0))


def _nucleus(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    probs = torch.softmax(logits / temperature, -1)
    order = probs.argsort(descending=True)
    before = torch.cumsum(probs[order], 0) - probs[order]
    keep = torch.ones_like(probs, dtype=torch.bool)
    keep[order] = before < top_p if top_p < 1 else True
    kept = torch.where(keep, probs, 0.0)
    return kept / kept.sum()


def test_n_samples_are_distinct_and_reproducible(llm):
    prompt = llm.encode("Write one word:", chat=False)
    params = SamplingParams(max_new_tokens=8, temperature=1.0, n=4, seed=3, repetition_penalty=1.2)
    first = [o.token_ids for o in llm.generate_samples([prompt], params)]
    again = [o.token_ids for o in llm.generate_samples([prompt], params)]
    assert first == again and len({tuple(t) for t in first}) == 4


def test_every_parameter_gives_the_same_tokens_in_any_batch(default_model_path, prompts):
    """Rows sampled with penalties, a bias, min-p, min_tokens, stop ids and log-probabilities, alone or
    among others, in batches of 2 or 8 rows, async or not: the same tokens and alternatives, and the same
    log-probabilities to float32's rounding (batches of other sizes sum in another order)."""
    kinds = [
        SamplingParams(max_new_tokens=NEW_TOKENS, temperature=0.8, top_p=0.9, min_p=0.05, seed=1,
                       repetition_penalty=1.2, frequency_penalty=0.5, presence_penalty=0.3, logprobs=2),
        SamplingParams(max_new_tokens=NEW_TOKENS, logit_bias={"13": 3.0}, min_tokens=4, stop_token_ids=[30]),
        SamplingParams(max_new_tokens=NEW_TOKENS, temperature=1.1, top_k=20, seed=4, n=2),
    ]  # fmt: skip
    rows = [GenerationRequest(i, p, kinds[i % 3]) for i, p in enumerate(prompts)]

    def run(order, **options):
        llm = LLM(default_model_path, **options)
        outs = llm.stream([rows[i] for i in order])
        return {(o.index, o.sample): o for o in outs}

    def same(got: dict, want: dict) -> None:
        assert got.keys() == want.keys()
        for key, out in got.items():
            assert out.token_ids == want[key].token_ids, key
            assert (out.logprobs is None) == (want[key].logprobs is None)
            assert out.logprobs is None or out.logprobs == pytest.approx(want[key].logprobs, abs=1e-4)
            ids = [[t for t, _ in top] for top in out.top_logprobs or []]
            assert ids == [[t for t, _ in top] for top in want[key].top_logprobs or []]

    together = run(range(len(rows)), max_num_seqs=8)
    same(run(reversed(range(len(rows))), max_num_seqs=2, async_mode=True), together)
    alone = {}
    for i in range(len(rows)):
        alone.update(run([i], max_num_seqs=8))
    same(alone, together)
