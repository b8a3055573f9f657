"""``--speculative draft``: a draft model's guesses, verified by the target, against plain decoding of the
target as the oracle. A random draft (acceptance near zero) and the target as its own draft (acceptance
near one) both leave the output token-identical, under queueing, chunked prefill, preemption and the
asynchronous loop, with the sampling options beside it; the draft's KV pool rolls back, evicts and
refuses as its unit tests below say."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from tokenizers import Tokenizer

from batchgen import LLM, SamplingParams
from batchgen.config import SamplingParams as Params
from batchgen.engine.request import Request, Status
from batchgen.engine.speculative.draft import PROBE_TEXT
from batchgen.engine.speculative.draft_pool import DraftPool
from tests.engine.regimes import REGIMES
from tests.engine.speculative_cases import copying_prompts

one_thread = pytest.mark.usefixtures("one_torch_thread")  # tiny models: threads only spin
ALWAYS = dict(speculative="draft", speculative_policy="always")


def _outputs(llm: LLM, prompts, params: SamplingParams) -> list:
    return [(o.token_ids, o.finish_reason) for o in llm.generate_samples(prompts, params)]


def _kv_bytes(target: str, draft: str, tokens: int) -> int:
    """A KV budget that holds ``tokens`` of the target's rows beside the draft's (both pools alike)."""
    probe = LLM(target, kv_cache_bytes=1 << 22, draft_model=draft, **ALWAYS)
    pools = (probe._engine.runner.kv_caches, probe._engine.speculator.proposer.model.kv_caches)
    per_block = sum(c[0][0][0].numel() * c[0][0].element_size() * 2 * len(c) for c in pools)
    return per_block * -(-tokens // probe.config.block_size)


@one_thread
@pytest.mark.parametrize("draft_arch", ["qwen2", "llama"])
@pytest.mark.parametrize("regime", ["queueing", "chunked_prefill", "tiny_kv", "async"])
def test_tiny_model_greedy_is_unchanged(tiny_models, regime, draft_arch):
    """A random draft of another architecture (guesses nearly always fail) and the target itself as the
    draft (nearly all accepted)."""
    target, draft = tiny_models["llama"], tiny_models[draft_arch]
    prompts = copying_prompts(24, seed=1)
    params = SamplingParams(max_new_tokens=40, ignore_eos=True)
    options = dict(REGIMES[regime])
    if regime == "tiny_kv":
        options["kv_cache_bytes"] = _kv_bytes(target, draft, 220)
    want = _outputs(LLM(target, **options), prompts, params)
    llm = LLM(target, **options, draft_model=draft, **ALWAYS)
    assert _outputs(llm, prompts, params) == want
    stats = llm.stats
    assert stats.verify_steps > 0 and stats.draft_tokens > 0
    if draft_arch == "llama":
        assert stats.acceptance_rate > 0.95, stats.acceptance_rate
    if regime == "tiny_kv":
        assert stats.preemptions > 0
    if regime == "chunked_prefill":
        assert stats.partial_prefills > 0


SAMPLING_CASES = {
    "sampled": dict(temperature=0.8, top_p=0.9, top_k=40, n=2),
    "logprobs": dict(logprobs=3),
    "stops": dict(stop_token_ids=[250, 251, 252], min_tokens=5, logit_bias={260: 4.0, 261: -50.0}),
}


@one_thread
@pytest.mark.parametrize("case", sorted(SAMPLING_CASES))
def test_tiny_model_sampling_options_are_unchanged(tiny_llama, case):
    prompts = copying_prompts(12, seed=2)
    params = SamplingParams(max_new_tokens=30, ignore_eos=True, seed=5, **SAMPLING_CASES[case])
    want = _outputs(LLM(tiny_llama, max_num_seqs=6), prompts, params)
    llm = LLM(tiny_llama, max_num_seqs=6, draft_model=tiny_llama, **ALWAYS)
    assert _outputs(llm, prompts, params) == want
    assert llm.stats.accepted_tokens > 0


@one_thread
def test_rows_past_the_drafts_positions_decode_plainly(tiny_llama):
    """A draft with fewer positions than a row needs guesses nothing for that row; the rest still guess."""
    prompts = copying_prompts(8, seed=3)
    params = SamplingParams(max_new_tokens=30, ignore_eos=True)
    want = _outputs(LLM(tiny_llama, max_num_seqs=8), prompts, params)
    llm = LLM(tiny_llama, max_num_seqs=8, draft_model=tiny_llama, **ALWAYS)
    proposer = llm._engine.speculator.proposer
    limit = sorted(len(p) for p in prompts)[4] + 10  # half the rows outgrow it
    proposer.model = proposer.model._replace(max_model_len=limit)
    seen, propose = [], proposer.propose

    def recorded(requests, ks):
        guesses = propose(requests, ks)
        for req, k, guess in zip(requests, ks, guesses, strict=True):
            seen.append((len(req.tokens) + k - 1 <= limit, bool(guess)))
        return guesses

    proposer.propose = recorded
    assert _outputs(llm, prompts, params) == want
    assert (False, True) not in seen and (True, True) in seen and (False, False) in seen


@one_thread
def test_the_drafts_guesses_are_its_greedy_continuation(tiny_llama):
    """The target as its own draft, sampled (so guesses are often rejected and rolled back) in a small
    pool (rows evicted and caught up again): every guess equals transformers' greedy continuation of the
    row's tokens, so the draft's KV held exactly the row's tokens whenever it guessed."""
    from transformers import AutoModelForCausalLM

    prompts = copying_prompts(16, seed=4)
    params = SamplingParams(max_new_tokens=24, ignore_eos=True, temperature=1.0, seed=3)
    options = dict(max_num_seqs=8, kv_cache_bytes=_kv_bytes(tiny_llama, tiny_llama, 700))
    llm = LLM(tiny_llama, **options, draft_model=tiny_llama, **ALWAYS)
    proposer = llm._engine.speculator.proposer
    seen, propose = [], proposer.propose

    def recorded(requests, ks):
        guesses = propose(requests, ks)
        seen.extend((list(r.tokens), g) for r, g in zip(requests, guesses, strict=True) if g)
        return guesses

    proposer.propose = recorded
    want = _outputs(LLM(tiny_llama, **options), prompts, params)
    assert _outputs(llm, prompts, params) == want
    assert proposer.pool.evicted > 0 and llm.stats.accepted_tokens < 0.8 * llm.stats.draft_tokens
    hf = AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32).eval()
    with torch.inference_mode():
        for tokens, guess in seen:
            logits = hf(torch.tensor([tokens + guess[:-1]])).logits[0, len(tokens) - 1 :]
            assert logits.argmax(-1).tolist() == guess


def test_a_draft_with_another_tokenizer_is_refused(tiny_models, tmp_path):
    """Token ids must mean the same text to both models: a tokenizer with two ids swapped is refused."""
    draft = tmp_path / "draft"
    shutil.copytree(tiny_models["qwen2"], draft)
    spec = json.loads((draft / "tokenizer.json").read_text())
    vocab = spec["model"]["vocab"]
    probe = Tokenizer.from_file(str(draft / "tokenizer.json")).encode(PROBE_TEXT, add_special_tokens=False)
    a, b = probe.tokens[:2]
    vocab[a], vocab[b] = vocab[b], vocab[a]
    (draft / "tokenizer.json").write_text(json.dumps(spec))
    with pytest.raises(ValueError, match="does not share the model's tokenizer"):
        LLM(tiny_models["llama"], draft_model=str(draft), **ALWAYS)


@pytest.fixture(scope="module")
def rewrite_prompts(default_model_path):
    from batchgen.bench.rewrite import rewrite_messages

    llm = LLM(default_model_path, max_num_seqs=2)
    return [llm.encode(messages) for messages in rewrite_messages(26, seed=7, sentences=(3, 5))]


@pytest.mark.parametrize("regime", ["chunked", "preempting"])
def test_embedded_model_with_a_random_draft_is_unchanged(
    default_model_path, tiny_llama, rewrite_prompts, regime
):  # fmt: skip
    """The issue's oracle: the embedded model (fp32) on 26 rewrite prompts, a tiny random draft, greedy
    output token-identical to plain greedy with prompts cut into chunks or rows preempted."""
    params = SamplingParams(max_new_tokens=24)
    options = dict(max_num_seqs=13, max_batch_tokens=96)
    if regime == "preempting":
        options = dict(max_num_seqs=13, kv_cache_bytes=_kv_bytes(default_model_path, tiny_llama, 800))
    want = _outputs(LLM(default_model_path, **options), rewrite_prompts, params)
    llm = LLM(default_model_path, **options, draft_model=tiny_llama, **ALWAYS)
    got = _outputs(llm, rewrite_prompts, params)
    assert [i for i, (g, w) in enumerate(zip(got, want, strict=True)) if g != w] == []
    assert llm.stats.verify_steps > 0 and llm.stats.draft_tokens > 0
    assert llm.stats.preemptions > 0 if regime == "preempting" else llm.stats.partial_prefills > 0


# --- the draft's KV pool -------------------------------------------------------------------------------


def _request(request_id: int, tokens: list[int]) -> Request:
    return Request(request_id, request_id, 0, None, Params(), list(tokens), len(tokens), 64, 1)


def test_pool_keeps_the_accepted_guesses_and_rolls_back_the_rest():
    pool = DraftPool(8, block_size=4)
    req = _request(0, range(10))
    pool.begin([req])
    row = pool.row(req)
    assert row.computed == 0
    row.computed, row.ahead = 10, [7, 8, 9]  # the tokens' KV, then guesses at positions 10, 11, 12
    req.tokens += [7, 8, 5, 6]  # two guesses accepted, then the target's own tokens
    assert pool.row(req).computed == 12
    row.ahead = [6]
    req.tokens += [3]
    assert pool.row(req).computed == 12  # the guess at 12 was rejected (5 came)
    row.computed, row.ahead = 14, [1]
    assert pool.row(req).computed == 14  # nothing past the tokens: the last one is computed again


def test_pool_evicts_finished_rows_first_then_the_least_recent():
    pool = DraftPool(6, block_size=4)
    old, done, live = _request(0, range(5)), _request(1, range(5)), _request(2, range(5))
    for req in (old, done, live):
        pool.begin([req])
        assert pool.reserve(pool.row(req), 8)  # two blocks each
    done.status = Status.FINISHED
    new = _request(3, range(9))
    pool.begin([live, new])
    pool.row(live)
    assert pool.reserve(pool.row(new), 12)  # three blocks: the finished row's two, then the oldest's
    assert pool.row(new).blocks and len(pool.row(live).blocks) == 2
    assert pool.num_free == 1
    bigger = _request(4, range(30))
    assert not pool.reserve(pool.row(bigger), 30)  # the rest are this round's rows: refused
    assert pool.num_free == 1 and pool.row(bigger).blocks == []


def test_a_reused_request_id_starts_over():
    pool = DraftPool(4, block_size=4)
    first = _request(0, range(6))
    pool.begin([first])
    row = pool.row(first)
    pool.reserve(row, 6)
    row.computed = 5
    later = _request(0, [9, 9, 9])
    assert pool.row(later).computed == 0 and pool.num_free == 4
