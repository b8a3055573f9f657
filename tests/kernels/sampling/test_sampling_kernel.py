"""The fused sampler (kernels/sampling/fused_sampler.py through engine/sampler.sample(fused=True)) against the
torch sampler (fused=False), which tests/engine/test_sampler.py checks against written-out formulas and
transformers: the same tokens, the same log-probabilities, over penalties, temperature, min-p, greedy and
sampled rows side by side, logit bias, token masks, graph padding rows and a partial last column block.
Off-GPU under TRITON_INTERPRET=1 with 64-column blocks."""

from __future__ import annotations

import pytest
import torch

from batchgen.engine.row_tokens import RowTokens
from batchgen.engine.sampler import sample
from batchgen.engine.step_sampling import RowInit, SamplingFeatures
from batchgen.kernels.sampling import fused_sampler as fused_kernels
from tests.engine.sampling_cases import tensors

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
V = 3 * 64 + 17  # three full blocks of 64 and a partial one (off-GPU)
ROWS = 6


@pytest.fixture(autouse=True)
def _small_blocks(monkeypatch):
    if DEVICE == "cpu":  # the interpreter runs a program per block: keep them few
        monkeypatch.setattr(fused_kernels, "_BLOCK", 64)


def _state(adjust: bool = False) -> RowTokens:
    """Row r's prompt holds tokens r..r+9; its output some tokens several times; with ``adjust``, a logit
    bias on 3 tokens and a stop id held back by min_tokens."""
    state = RowTokens(ROWS, V, torch.device(DEVICE))
    inits = []
    for r in range(ROWS):
        output = [(7 * r + k) % V for k in range(5)] * (r % 3) + [V - 1]
        adjustments = ((11, 4.0, False), (V - 2, -100.0, False), (3 * r, 2.5, True)) if adjust else ()
        inits.append(RowInit(r, list(range(r, r + 10)), output, adjustments))
    state.init(inits)
    return state


def _params(state: RowTokens, temperature: torch.Tensor, **values):
    given = {
        "state_rows": torch.tensor([0, 1, 2, 3, -1, 5]),  # a graph padding row (-1): the padding state row
        "rng_keys": torch.arange(ROWS) * 977,
        "rng_steps": torch.tensor([0, 1, 2, 3, 4, 9]),
        **values,
    }
    return tensors(ROWS, DEVICE, temperature=temperature, **given)._replace(row_tokens=state)


def _both(logits, params, features):
    """sample() fused and not, each on its own copy of the row statistics (a pick is counted in them)."""
    results = []
    for fused in (False, True):
        state = params.row_tokens
        copy = None
        if state is not None:
            copy = RowTokens(state.rows, state.vocab, state.counts.device)
            for name in ("counts", "prompt", "adjust_ids", "adjust_values", "adjust_gated"):
                getattr(copy, name).copy_(getattr(state, name))
        results.append((sample(logits, params._replace(row_tokens=copy), features, fused=fused), copy))
    return results


PENALTIES = dict(
    repetition_penalty=torch.tensor([1.0, 1.3, 0.7, 2.0, 1.1, 1.2]),
    frequency_penalty=torch.tensor([0.0, 0.5, -0.3, 1.0, 0.2, 0.1]),
    presence_penalty=torch.tensor([0.0, 0.2, 0.4, -0.5, 0.0, 1.5]),
)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_greedy_penalties_and_log_probabilities_match_the_torch_sampler(dtype):
    torch.manual_seed(0)
    logits = (torch.randn(ROWS, V) * 4).to(DEVICE, dtype)
    params = _params(_state(), torch.zeros(ROWS), **PENALTIES)
    features = SamplingFeatures(penalties=True, logprobs=True, top_logprobs=True)
    (want, want_state), (got, got_state) = _both(logits, params, features)
    assert got.tokens.tolist() == want.tokens.tolist()
    assert torch.equal(got_state.counts, want_state.counts)  # the picks were counted, padding row included
    assert torch.allclose(got.logprobs, want.logprobs, atol=1e-5)
    assert torch.allclose(got.top_logprobs, want.top_logprobs, atol=1e-5)
    if dtype == torch.float32:  # bfloat16 logits tie often, and ties may come in either order
        assert torch.equal(got.top_ids, want.top_ids)


def test_sampled_rows_with_temperature_min_p_and_penalties_draw_the_same_tokens():
    torch.manual_seed(1)
    logits = (torch.randn(ROWS, V) * 3).to(DEVICE)
    temperature = torch.tensor([0.7, 0.0, 1.3, 1.0, 0.5, 2.0])  # row 1 greedy among sampled rows
    min_p = torch.tensor([0.05, 0.0, 0.2, 0.0, 1.0, 0.01])  # min_p 1.0 keeps only the best token
    features = SamplingFeatures(sampling=True, penalties=True, logprobs=True)
    for step in range(4):  # new noise each step; the counts grow with each step's picks
        params = _params(_state(), temperature, min_p=min_p, rng_steps=torch.full((ROWS,), step), **PENALTIES)
        (want, _), (got, _) = _both(logits, params, features)
        assert got.tokens.tolist() == want.tokens.tolist()
        assert torch.allclose(got.logprobs, want.logprobs, atol=1e-5)
    assert got.top_ids is None


def test_plain_sampling_draws_the_torch_samplers_tokens_over_many_steps():
    """Without penalties: only the noise and temperature; 8 draws of one row over a near-flat
    distribution spread over several tokens, each the torch sampler's."""
    logits = torch.linspace(-1, 1, V).repeat(ROWS, 1).to(DEVICE)
    params = _params(_state(), torch.full((ROWS,), 1.0))._replace(row_tokens=None)
    picks = set()
    for step in range(8):
        step_params = params._replace(rng_steps=torch.full((ROWS,), step, device=DEVICE))
        (want, _), (got, _) = _both(logits, step_params, SamplingFeatures(sampling=True))
        assert got.tokens.tolist() == want.tokens.tolist()
        picks.add(int(got.tokens[0]))
    assert len(picks) >= 5  # a draw, not an argmax


def test_bias_min_tokens_and_token_masks_apply_before_the_fused_part():
    torch.manual_seed(2)
    logits = torch.randn(ROWS, V).to(DEVICE)
    mask = torch.full((ROWS, (V + 31) // 32), -1, dtype=torch.int32)
    mask[2, :] = 0
    mask[2, 1] = 1 << 5  # row 2 may take token 37 only
    temperature = torch.tensor([0.0, 0.9, 0.0, 1.0, 0.0, 0.0])
    params = _params(_state(adjust=True), temperature, min_tokens=2, **PENALTIES)
    params = params._replace(token_mask=mask.to(DEVICE))
    features = SamplingFeatures(sampling=True, penalties=True, adjustments=True, logprobs=True)
    (want, _), (got, _) = _both(logits, params, features)
    assert got.tokens.tolist() == want.tokens.tolist()
    assert int(got.tokens[2]) == 37
    assert int(got.tokens[0]) == 11  # the +4 bias wins
    assert torch.allclose(got.logprobs, want.logprobs, atol=1e-5)  # of the raw logits, not the adjusted


def test_rows_of_minus_infinity_pick_the_first_column_as_torch_argmax_does():
    logits = torch.full((ROWS, V), float("-inf"), device=DEVICE)
    logits[1, V - 1] = 0.0
    params = _params(_state(), torch.zeros(ROWS), **PENALTIES)
    (want, _), (got, _) = _both(logits, params, SamplingFeatures(penalties=True))
    assert got.tokens.tolist() == want.tokens.tolist() == [0, V - 1, 0, 0, 0, 0]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize(("rows", "vocab"), [(256, 128256), (64, 151936)])
def test_gpu_real_vocabularies_match_the_torch_sampler(rows, vocab):
    """Real widths, bf16 logits: greedy penalized picks equal, sampled ones too (but for near-ties in the
    noise's last bits), log-probabilities close."""
    torch.manual_seed(3)
    logits = (torch.randn(rows, vocab, device="cuda") * 3).bfloat16()
    state = RowTokens(rows, vocab, torch.device("cuda"))
    state.init(
        [RowInit(r, list(range(r, r + 500)), [r % 7] * 9 + list(range(600, 640)), ()) for r in range(rows)]
    )
    penalties = dict(repetition_penalty=1.1, frequency_penalty=0.2, presence_penalty=0.1)
    for temperature, min_p in ((0.0, 0.0), (0.8, 0.05)):
        params = tensors(rows, "cuda", temperature=temperature, min_p=min_p, rng_keys=torch.arange(rows) * 31,
                         **penalties)._replace(row_tokens=state)  # fmt: skip
        features = SamplingFeatures(
            sampling=temperature > 0, penalties=True, logprobs=True, top_logprobs=True
        )
        (want, _), (got, _) = _both(logits, params, features)
        same = (got.tokens == want.tokens).float().mean()
        assert same == 1 if temperature == 0 else same > 0.99
        assert torch.allclose(got.logprobs, want.logprobs, atol=1e-4)
        assert torch.allclose(got.top_logprobs, want.top_logprobs, atol=1e-4)
