"""EOS, stop strings, max_new_tokens and ignore_eos, as SPEC.md says."""

from __future__ import annotations

import pytest

from batchgen import LLM, SamplingParams


@pytest.fixture(scope="module")
def smol(default_model_path):
    return LLM(default_model_path, max_num_seqs=8)


def test_eos_stops_and_is_not_in_the_text(smol):
    [out] = smol.generate_samples([[{"role": "user", "content": "Reply with the single word: yes"}]],
                                  SamplingParams(max_new_tokens=64))  # fmt: skip
    assert out.finish_reason == "stop"
    assert out.token_ids[-1] == smol.tokenizer.eos_token_id
    assert out.text and "<|im_end|>" not in out.text
    assert out.completion_tokens == len(out.token_ids) < 64


def test_ignore_eos_runs_to_max_new_tokens(smol):
    [out] = smol.generate_samples([[{"role": "user", "content": "Reply with the single word: yes"}]],
                                  SamplingParams(max_new_tokens=40, ignore_eos=True))  # fmt: skip
    assert out.finish_reason == "length" and out.completion_tokens == 40


def test_max_new_tokens_gives_length(smol):
    [out] = smol.generate_samples(["Write a long story about a river."], SamplingParams(max_new_tokens=5))
    assert out.finish_reason == "length" and out.completion_tokens == 5


def test_stop_string_is_excluded_and_ends_generation(smol):
    prompt = ["Count from one to twenty in words, separated by commas."]
    [free] = smol.generate_samples(prompt, SamplingParams(max_new_tokens=48, ignore_eos=True))
    words = free.text.split()
    assert len(words) > 4
    stop = words[3]
    [cut] = smol.generate_samples(
        prompt, SamplingParams(max_new_tokens=48, ignore_eos=True, stop=(stop, "zzzz"))
    )
    assert cut.finish_reason == "stop"
    assert cut.text == free.text[: free.text.find(stop)]
    assert stop not in cut.text
    assert cut.token_ids == free.token_ids[: len(cut.token_ids)]
    assert len(cut.token_ids) < len(free.token_ids)


def test_n_samples_each_get_a_record(smol):
    outs = smol.generate_samples(
        ["Name a colour."], SamplingParams(max_new_tokens=8, temperature=1.0, n=3, seed=1)
    )
    assert [(o.index, o.sample) for o in outs] == [(0, 0), (0, 1), (0, 2)]


def test_overlong_prompt_is_an_error_output(tiny_llama):
    llm = LLM(tiny_llama, max_model_len=32)
    [bad, good] = llm.generate_samples([list(range(5, 45)), [5, 6, 7]], SamplingParams(max_new_tokens=100))
    assert bad.finish_reason == "error" and "at most 31" in bad.error
    assert good.finish_reason == "length" and good.completion_tokens == 32 - 3
