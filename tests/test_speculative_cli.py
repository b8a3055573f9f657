"""``batchgen run --speculative``: the records a plain run writes, the acceptance in the summary and the
stats file, and one-line refusals of what cannot run."""

from __future__ import annotations

import json

import pytest

from tests.helpers import read_records, write_jsonl

# Requests to copy a sentence: the embedded model's output repeats n-grams of the prompt.
SENTENCES = ["The mill grinds flour for the bakery.", "Children cross the bridge to school each morning."]
ROWS = [{"prompt": f"Repeat exactly: {s} {s}", "max_new_tokens": 24} for s in SENTENCES * 3]


def _completions(path) -> list[tuple]:
    return sorted((r["index"], r["completion"], r["finish_reason"]) for r in read_records(path))


@pytest.mark.parametrize("method", ["ngram", "draft"])
def test_speculative_run_writes_the_plain_runs_records(gen, tmp_path, default_model_path, tiny_llama, method):
    """Prompt lookup, and a draft model (a tiny random one with the same tokenizer: guesses are rarely
    right, and never change the records)."""
    inp = write_jsonl(tmp_path / "in.jsonl", ROWS)
    assert gen(inp, tmp_path / "plain.jsonl", "--ignore-eos", model=default_model_path)[0] == 0
    stats = tmp_path / "stats.json"
    how = ["--ngram-min", "1"] if method == "ngram" else ["--draft-model", tiny_llama]
    code, err = gen(
        inp, tmp_path / "spec.jsonl", "--ignore-eos", "--speculative", method, *how,
        "--num-speculative-tokens", "3", "--speculative-policy", "always", "--stats-file", stats,
        model=default_model_path,
    )  # fmt: skip
    assert code == 0, err
    assert _completions(tmp_path / "spec.jsonl") == _completions(tmp_path / "plain.jsonl")
    engine = json.loads(stats.read_text())["engine"]
    accept = {k: v for k, v in engine.items() if "accept" in k}
    assert set(accept) == {"accepted_tokens", "acceptance_rate", "accepted_per_verify_step"}
    assert engine["verify_steps"] > 0 and 0 <= engine["accepted_tokens"] <= engine["draft_tokens"]
    assert method == "draft" or engine["accepted_tokens"] > 0
    assert engine["acceptance_rate"] == pytest.approx(
        engine["accepted_tokens"] / engine["draft_tokens"], abs=1e-4
    )
    assert "speculation:" in err and "guessed tokens accepted" in err


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--speculative", "draft"], "--speculative draft and --draft-model PATH go together"),
        (["--draft-model", "x"], "go together"),
        (["--speculative", "ngram", "--num-speculative-tokens", "16"], "num_speculative_tokens must be in"),
        (["--speculative", "ngram", "--ngram-min", "5"], "ngram_min <= ngram_max"),
    ],
)
def test_what_cannot_run_is_refused_in_one_line(gen, tmp_path, args, needle):
    inp = write_jsonl(tmp_path / "in.jsonl", ROWS)
    code, err = gen(inp, tmp_path / "out.jsonl", *args)
    assert code == 2 and needle in err
    assert needle in err.strip().splitlines()[-1]  # click's usage lines, then the reason in one line
    assert not (tmp_path / "out.jsonl").exists()
