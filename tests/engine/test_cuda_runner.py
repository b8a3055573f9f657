"""On a GPU: async == sync == eager (graphs on/off), token-exact in fp32, and equal to transformers."""

from __future__ import annotations

import pytest
import torch

from batchgen import LLM, GenerationRequest, SamplingParams
from batchgen.engine.mixed_graphs import MixedGraphs
from batchgen.engine.rank_engine import CAPTURE_AFTER
from batchgen.engine.step_sampling import SamplingFeatures
from batchgen.model.kv_cache import kv_shape
from tests.engine.oracle import generate_greedy, make_prompts, reference_greedy
from tests.support.models import MOE_ARCHS

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

GREEDY = SamplingParams(max_new_tokens=24)
SAMPLED = SamplingParams(max_new_tokens=24, temperature=0.8, top_p=0.9, top_k=50, seed=3, ignore_eos=True)
MODES = {
    "async_graphs": dict(async_mode=True, cuda_graphs=True),
    "sync_graphs": dict(async_mode=False, cuda_graphs=True),
    "async_eager": dict(async_mode=True, cuda_graphs=False),
    "sync_eager": dict(async_mode=False, cuda_graphs=False),
}


def _outputs(llm: LLM, prompts, params) -> dict:
    outs = llm.stream([GenerationRequest(i, p, params) for i, p in enumerate(prompts)])
    return {(o.index, o.sample): o.token_ids for o in outs}


def _capture_soon(llm: LLM, after: int = 1) -> None:
    """Short test runs meet a decode key a few times: capture on its 2nd use (the 1st runs eagerly),
    so both the eager bucket-shaped steps and the graph replays are compared."""
    runner = llm._engine.runner
    runner.capture_after = min(runner.capture_after, after)


def _modes_agree(make_llm, prompts, expected_greedy=None) -> dict:
    results = {}
    for name, mode in MODES.items():
        llm = make_llm(**mode)
        _capture_soon(llm)
        results[name] = (_outputs(llm, prompts, GREEDY), _outputs(llm, prompts, SAMPLED), llm.stats)
        del llm
        torch.cuda.empty_cache()
    first = results["async_graphs"]
    for name, (greedy, sampled, _) in results.items():
        assert greedy == first[0], f"{name} greedy differs from async_graphs"
        assert sampled == first[1], f"{name} sampled differs from async_graphs"
    if expected_greedy is not None:
        got = [first[0][(i, 0)] for i in range(len(prompts))]
        bad = [i for i, (g, e) in enumerate(zip(got, expected_greedy, strict=True)) if g != e]
        assert not bad, f"prompts {bad} differ from transformers"
    return results


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", *MOE_ARCHS])
def test_tiny_models_all_modes_agree_with_transformers(tiny_models, arch):
    from transformers import AutoConfig, AutoTokenizer

    path = tiny_models[arch]
    prompts = make_prompts(AutoTokenizer.from_pretrained(path), count=24, max_tokens=300)
    # MoE: transformers' experts run torch's grouped GEMM, whose CUDA kernel may refuse fp32: CPU oracle.
    device = "cpu" if arch in MOE_ARCHS else "cuda"
    expected = reference_greedy(path, prompts, GREEDY.max_new_tokens, device=device)
    # Small batch-token budget and KV pool: chunked prefill and preemption inside the async pipeline.
    kv_bytes = kv_shape(AutoConfig.from_pretrained(path)).bytes_per_block(450, torch.float32)
    results = _modes_agree(
        lambda **m: LLM(
            path, dtype="float32", max_num_seqs=8, max_batch_tokens=128, kv_cache_bytes=kv_bytes, **m
        ),
        prompts,
        expected,
    )
    stats = results["async_graphs"][2]
    assert stats.preemptions > 0 and stats.gpu_busy_s > 0


def _near_tie(model, prompt: list[int], expected: list[int], got: list[int]) -> str | None:
    """Why ``got`` may differ from transformers' ``expected``, else None: at the first differing token,
    transformers' own top two logits are within 1e-4 of each other (relative) and ``got`` took the
    second. fp32 kernels that sum in other orders leave logits ~1e-6 (relative) apart, so a gap below
    1e-4 is a tie either side may break; a real error flips decisive tokens (the lm_head is scaled 8x:
    the top two logits are typically ~1 logit apart) and whole continuations."""
    j = next((k for k, (g, e) in enumerate(zip(got, expected, strict=False)) if g != e), None)
    if j is None:
        return None  # one is a prefix of the other: a stop that only one side saw
    engines_attention = model.config._attn_implementation  # the engines registered their paged attention
    model.set_attn_implementation("sdpa")  # transformers' own, as generate_greedy ran it
    try:
        with torch.inference_mode():
            ids = torch.tensor([prompt + expected[:j]], device=next(model.parameters()).device)
            logits = model(ids).logits[0, -1].float()
    finally:
        model.set_attn_implementation(engines_attention)
    top = logits.topk(2)
    gap = (top.values[0] - top.values[1]).item()
    if got[j] == top.indices[1].item() and gap <= 1e-4 * top.values[0].abs().item():
        return f"token {j}: top-2 gap {gap:.2e}"
    return None


def test_1b_random_model_all_modes_agree_with_transformers():
    from transformers import AutoTokenizer

    from tests.support.models import random_llama, tokenizer_path

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path())
    model = random_llama(2048, 16, 32, 8, 5632, len(tokenizer), "cuda", torch.float32)
    prompts = make_prompts(tokenizer, count=40, max_tokens=700)
    expected = generate_greedy(model, prompts, GREEDY.max_new_tokens)  # fp32, sdpa, one prompt at a time
    # A 512-token step budget (prompts up to ~730 tokens) and a KV pool of 1600 tokens (the longest row
    # needs ~760, 32 rows ~12 000): chunked prefill and preemption inside every mode's pipeline.
    kv_bytes = kv_shape(model.config).bytes_per_block(1600, torch.float32)
    graph_memory = {}

    def make(**mode):
        llm = LLM.from_model(model, tokenizer, max_num_seqs=32, max_batch_tokens=512, kv_cache_bytes=kv_bytes,
                             **mode)  # fmt: skip
        if mode == MODES["async_graphs"]:  # every graph up front (as tensor parallelism does); the
            llm._engine.runner.capture_all(progress=False)  # other graph mode captures on demand
            graph_memory.update(llm._engine.runner.graph_memory)
        return llm

    results = _modes_agree(make, prompts)
    greedy, _, stats = results["async_graphs"]
    got = [greedy[(i, 0)] for i in range(len(prompts))]
    differ = [i for i, (g, e) in enumerate(zip(got, expected, strict=True)) if g != e]
    ties = {i: _near_tie(model, prompts[i], expected[i], got[i]) for i in differ}
    bad = [i for i, why in ties.items() if why is None]
    assert not bad and len(ties) <= 2, f"prompts {bad} differ from transformers (near-ties: {ties})"
    assert stats.preemptions > 0 and stats.partial_prefills > 0 and stats.max_step_tokens <= 512, stats
    # Both slots' graphs share one memory pool: the second slot adds little to the first.
    one, both = graph_memory["one_slot"], graph_memory["all_slots"]
    assert both <= 1.25 * one + (64 << 20), (
        f"graph pool: one slot {one / 2**20:.0f} MiB, both {both / 2**20:.0f} MiB"
    )


def test_decode_graphs_are_captured_on_demand(tiny_models):
    """A single GPU starts with no graph (its first token waits for no capture; ``prepare`` adds none):
    a decode key's first ``capture_after`` uses run eagerly at the bucket's shape, the next one captures
    it, and tokens equal the eager engine's, greedy and sampled with log-probabilities."""
    path, prompts = tiny_models["llama"], [[1, 2, 3, 4 + i] for i in range(5)]
    params = SamplingParams(max_new_tokens=16, temperature=0.8, seed=1, logprobs=True, ignore_eos=True)
    want = {}
    for graphs in (False, True):
        llm = LLM(path, dtype="float32", max_num_seqs=8, cuda_graphs=graphs)
        runner = llm._engine.runner
        llm.prepare(params)
        assert not runner.graphs and runner.capture_after == CAPTURE_AFTER > 3
        runner.capture_after = 3  # this short run meets each key 7-12 times
        want[graphs] = (_outputs(llm, prompts, GREEDY), _outputs(llm, prompts, params))
    assert want[True] == want[False]
    assert runner.graphs, runner._eager_uses
    for key, uses in runner._eager_uses.items():  # the uses that ran eagerly, then the capture
        if key[2] != "mixed":  # a token bucket's graph also waits for its verdict (mixed_graphs.py)
            assert (key in runner.graphs) == (uses > 3), (key, uses)
    # greedy; sampled with log-probabilities
    assert {k[3] for k in runner.graphs} == {
        SamplingFeatures(),
        SamplingFeatures(sampling=True, logprobs=True),
    }


def test_widths_not_captured_yet_replay_a_larger_graph_padded(tiny_models):
    """Rows ending one by one after the full width's graph was captured (a first run): the narrower
    widths' uses before their own capture replay a larger captured graph padded (graph_capture._padded)
    instead of running eagerly, and the tokens equal the eager engine's, greedy and sampled."""
    path, prompts = tiny_models["llama"], [[1, 2, 3, 4 + i] for i in range(16)]
    sampled = SamplingParams(temperature=0.8, seed=1, logprobs=True, ignore_eos=True)
    want = {}
    for graphs in (False, True):
        llm = LLM(path, dtype="float32", max_num_seqs=16, cuda_graphs=graphs)
        runner = llm._engine.runner
        outs = {}
        for params in (SamplingParams(ignore_eos=True), sampled):
            _outputs(llm, prompts, params.with_overrides(max_new_tokens=12))  # width 16's graphs
            rows = [GenerationRequest(i, p, params.with_overrides(max_new_tokens=4 + 3 * i))
                    for i, p in enumerate(prompts)]  # fmt: skip
            outs[params.temperature] = {o.index: o.token_ids for o in llm.stream(rows)}
        want[graphs] = outs
    assert want[True] == want[False]
    assert runner.padded_steps > 0, runner._eager_uses
    narrow = [key for key in runner._eager_uses if key[1] < 16 and key[2] == "step"]
    assert narrow and all(runner._eager_uses[key] <= CAPTURE_AFTER + 1 for key in narrow)


def test_every_sampling_parameter_in_captured_graphs_equals_the_eager_engine(tiny_models):
    """Penalties (per-row token counts kept on the device, inside the graphs), a logit bias, min_tokens,
    stop token ids, min-p, top-N and prompt log-probabilities, rows mixing them: captured decode and mixed
    graphs, async, give the eager synchronous engine's tokens and log-probabilities."""
    kinds = [
        SamplingParams(max_new_tokens=20, temperature=0.9, top_p=0.9, min_p=0.05, seed=2,
                       repetition_penalty=1.3, frequency_penalty=0.4, presence_penalty=0.2, logprobs=3,
                       ignore_eos=True),
        SamplingParams(max_new_tokens=20, logit_bias={"7": 4.0, "9": -100}, min_tokens=6,
                       stop_token_ids=[11], prompt_logprobs=2),
        SamplingParams(max_new_tokens=12, temperature=0.7, seed=5, ignore_eos=True),
        GREEDY,
    ]  # fmt: skip
    prompts = [[1 + (i * j) % 97 for j in range(3 + i % 30)] for i in range(24)]
    rows = [GenerationRequest(i, p, kinds[i % 4]) for i, p in enumerate(prompts)]
    results = {}
    for mode in ("async_graphs", "sync_eager"):
        llm = LLM(tiny_models["llama"], dtype="float32", max_num_seqs=8, max_batch_tokens=64, **MODES[mode])
        _capture_soon(llm)
        llm._engine.runner.mixed.forced = True if mode == "async_graphs" else None
        outs = sorted(llm.stream(rows), key=lambda o: (o.index, o.sample))
        results[mode] = outs
        if mode == "async_graphs":
            assert any(k[3].penalties for k in llm._engine.runner.graphs), "no penalty graph captured"
        del llm
        torch.cuda.empty_cache()
    for got, want in zip(results["async_graphs"], results["sync_eager"], strict=True):
        assert got.token_ids == want.token_ids, got.index
        for field in ("logprobs", "prompt_logprobs"):
            a, b = getattr(got, field), getattr(want, field)
            assert (a is None) == (b is None) and (a is None or a == pytest.approx(b, abs=1e-4)), field
        assert (got.top_logprobs is None) == (want.top_logprobs is None)
        if got.top_logprobs:
            assert [[t for t, _ in top] for top in got.top_logprobs] == [
                [t for t, _ in top] for top in want.top_logprobs
            ]


SCHEMA = {
    "type": "object",
    "properties": {
        "n": {"type": "integer", "minimum": 0, "maximum": 999},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3},
    },
    "required": ["n", "tags"],
}


def test_structured_output_agrees_across_modes(tiny_models):
    """Masked steps (the forward graph, then the sampling graph behind the copy of the token masks)
    give the same tokens in every mode, beside unconstrained rows, and the completions validate."""
    import json

    import jsonschema
    from transformers import AutoTokenizer

    path = tiny_models["llama"]
    prompts = make_prompts(AutoTokenizer.from_pretrained(path), count=24, max_tokens=300)
    kinds = [GREEDY, SAMPLED.with_overrides(ignore_eos=False)]
    params = [
        kinds[i % 2].with_overrides(max_new_tokens=40, json_schema=SCHEMA if i % 3 else None)
        for i in range(24)
    ]
    results = {}
    for name, mode in MODES.items():
        llm = LLM(path, dtype="float32", max_num_seqs=8, max_batch_tokens=128, **mode)
        _capture_soon(llm)
        outs = llm.generate_samples(prompts, params)
        results[name] = [o.token_ids for o in outs]
        for out, p in zip(outs, params, strict=True):
            if p.constrained:
                assert out.finish_reason == "stop", (name, out.text)
                jsonschema.validate(json.loads(out.text), SCHEMA)
        if mode["cuda_graphs"]:  # the masked steps' two parts, captured on demand
            assert {"logits", "sample"} <= {k[2] for k in llm._engine.runner.graphs}
        assert llm.stats.gpu_busy_s > 0 and llm.stats.mask_s > 0
        del llm
        torch.cuda.empty_cache()
    for name, tokens in results.items():
        assert tokens == results["async_graphs"], f"{name} differs from async_graphs"


def test_masked_steps_capture_both_parts_on_demand(tiny_models):
    llm = LLM(tiny_models["llama"], dtype="float32", max_num_seqs=8)
    runner = llm._engine.runner
    params = SamplingParams(max_new_tokens=24, temperature=0.8, seed=1, json_schema=SCHEMA)
    llm.prepare(params)
    assert not runner.graphs
    runner.capture_after = 2  # this short run meets each key ~10 times
    outs = _outputs(llm, [[1, 2, 3, 4 + i] for i in range(8)], params)
    assert len(outs) == 8 and {k[2] for k in runner.graphs} == {"logits", "sample"}


def test_rows_freed_a_few_at_a_time_wait_for_the_price_of_an_eager_step(tiny_models):
    """The CUDA runner measures its steps (``step_costs``, engine/admission.py): on a tiny model an eager
    step is bound by its launch, so it prices admission above 0, and rows that end at different steps
    join in fewer eager steps, with the tokens of an engine admitting them at once."""
    params = [SamplingParams(max_new_tokens=4 + (7 * i) % 29, ignore_eos=True) for i in range(64)]
    rows = [GenerationRequest(i, [1, 2, 3, 4 + i], p) for i, p in enumerate(params)]
    results = {}
    for hold in (False, True):
        llm = LLM(tiny_models["llama"], dtype="float32", max_num_seqs=16)
        _capture_soon(llm)
        llm._engine.runner.mixed = MixedGraphs([], forced=False)  # every such step eager (as under TP)
        if not hold:
            llm._engine._costs = None  # the engine never reads a price: rows join at once
        outs = {(o.index, o.sample): o.token_ids for o in llm.stream(rows)}
        runner = llm._engine.runner
        results[hold] = (outs, runner.idle.steps["eager"], runner.step_costs.decode_steps_per_join)
        del llm
        torch.cuda.empty_cache()
    (want, eager_at_once, _), (got, eager_held, price) = results[False], results[True]
    assert got == want
    assert price > 0, "a tiny model's eager step is bound by its launch"
    assert eager_held < eager_at_once


def test_steps_with_new_prompts_replay_their_token_buckets_graphs(tiny_models):
    """Rows that end at different steps make most steps mixed (new prompts beside decodes). Padded to a
    token bucket and every sequence row, they replay graphs: forced on every bucket, and by measure
    (a tiny model's eager steps are bound by their launch). Tokens equal the eager engine's, greedy and
    sampled with log-probabilities, across chunked prompts (a 64-token budget)."""
    lengths = [3 + (7 * i) % 23 for i in range(48)]
    prompts = [[1 + (i * j) % 97 for j in range(2 + i % 40)] for i in range(48)]
    kinds = [GREEDY, SamplingParams(temperature=0.8, seed=1, logprobs=True, ignore_eos=True)]
    rows = [GenerationRequest(i, p, kinds[i % 2].with_overrides(max_new_tokens=n))
            for i, (p, n) in enumerate(zip(prompts, lengths, strict=True))]  # fmt: skip
    results, logprobs = {}, {}
    for mode in ("eager", "forced", "measured"):
        llm = LLM(tiny_models["llama"], dtype="float32", max_num_seqs=8, max_batch_tokens=64,
                  cuda_graphs=mode != "eager")  # fmt: skip
        runner = llm._engine.runner
        _capture_soon(llm)
        runner.mixed.forced = True if mode == "forced" else None
        outs = list(llm.stream(rows))
        results[mode] = {(o.index, o.sample): o.token_ids for o in outs}
        logprobs[mode] = [lp for o in sorted(outs, key=lambda o: o.index) for lp in o.logprobs or []]
        if mode != "eager":
            mixed = {k[1] for k in runner.graphs if k[2] == "mixed"}
            assert mixed and runner.idle.steps["mixed"] > 0, (mode, runner.mixed._runs)
            assert max(mixed) <= 64 and not runner.mixed._eager  # launch-bound: no bucket ruled out
        del llm
        torch.cuda.empty_cache()
    assert results["forced"] == results["eager"]
    assert results["measured"] == results["eager"]
    for mode in ("forced", "measured"):  # padded shapes may round differently in the last bits
        assert logprobs[mode] == pytest.approx(logprobs["eager"], abs=1e-4), mode
