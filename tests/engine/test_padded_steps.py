"""Steps padded as the CUDA runner's graphs pad them give the tokens of the unpadded steps: a step with
new prompts to a token bucket and every sequence row (mixed_graphs.py), a decode step to its row bucket
(cuda_slots.fill_host: padding tokens write no KV, padding sequences have no query rows, padding samples
are dropped). On the CPU, through the engine's own forward; the GPU replays these shapes from graphs
(tests/engine/test_cuda_runner.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from batchgen import LLM, GenerationRequest, SamplingParams
from batchgen.engine import cuda_slots
from batchgen.engine.batch import StepInputs
from batchgen.engine.mixed_graphs import MixedGraphs, token_buckets
from batchgen.engine.runner import EagerRunner
from batchgen.engine.sampler import SampleOutput
from batchgen.model.kv_cache import kv_shape

MAX_SEQS, MAX_TOKENS, BLOCK_SIZE = 8, 160, 16


class PaddedRunner(EagerRunner):
    """The CPU runner on inputs laid out and padded by the CUDA runner's packed buffers."""

    def __init__(self, runner: EagerRunner, max_model_len: int, larger: bool = False) -> None:
        super().__init__(runner.forward, runner.kv_caches, runner.backend, runner.device, runner.sampler)
        self.larger = larger  # decode steps padded to the bucket above their own (a captured larger graph)
        self.max_model_len, self.max_blocks = max_model_len, -(-max_model_len // BLOCK_SIZE)
        self.padded = {"mixed": 0, "decode": 0}  # steps given padding rows
        self.mixed = MixedGraphs(token_buckets(MAX_TOKENS), forced=True)
        biggest = cuda_slots.Shape(MAX_TOKENS, MAX_SEQS, MAX_SEQS)
        size = cuda_slots.packed_layout(biggest, self.max_blocks).nbytes
        self._host = torch.full((size,), 0xAB, dtype=torch.uint8)  # stale bytes between layouts

    def launch(self, inputs: StepInputs):
        if inputs.masked:
            return super().launch(inputs)
        samples = len(inputs.logits_indices)
        out = super().launch(self._pad(inputs))
        out.sampled = SampleOutput(*(None if t is None else t[:samples] for t in out.sampled))
        return out

    def _pad(self, inputs: StepInputs) -> StepInputs:
        """The CUDA runner's layout and bounds (``cuda_slots.step_layout``), every bucket graphed."""
        decode_buckets = cuda_slots.decode_buckets(MAX_SEQS)
        bucket, part, shape, (max_q_len, max_seq_len, _) = cuda_slots.step_layout(
            inputs, decode_buckets, self.mixed.bucket, MAX_SEQS, self.max_model_len
        )
        if self.larger and part == "step" and bucket < decode_buckets[-1]:
            above = decode_buckets[decode_buckets.index(bucket) + 1]
            _, part, shape, (max_q_len, max_seq_len, _) = cuda_slots.graph_layout(
                above, part, MAX_SEQS, self.max_model_len
            )
        kind = "mixed" if part == "mixed" else "decode"
        self.padded[kind] += shape.tokens > inputs.num_tokens or shape.seqs > len(inputs.seq_lens)
        views = cuda_slots.packed_views(self._host, self._host, shape, self.max_blocks)
        cuda_slots.fill_host(views.host, inputs)
        arrays = {name: np.array(view) for name, view in views.host.items()}
        return inputs._replace(**arrays, max_q_len=max_q_len, max_seq_len=max_seq_len)


@pytest.mark.parametrize("larger", [False, True], ids=["own-bucket", "bucket-above"])
def test_padded_steps_give_the_unpadded_steps_tokens(tiny_llama, larger):
    """A small KV pool hands every block out, so a padding row writing KV anywhere would show. Decode steps
    padded to the bucket above their own: a key not captured yet replays a larger captured graph
    (graph_capture._padded)."""
    from transformers import AutoConfig

    pool = 40 * kv_shape(AutoConfig.from_pretrained(tiny_llama)).bytes_per_block(BLOCK_SIZE, torch.float32)
    lengths = [2 + (5 * i) % 17 for i in range(24)]
    prompts = [[1 + (i * j) % 97 for j in range(1 + (7 * i) % 45)] for i in range(24)]
    kinds = [SamplingParams(), SamplingParams(temperature=0.8, seed=1, logprobs=True)]
    rows = [GenerationRequest(i, p, kinds[i % 2].with_overrides(max_new_tokens=n, ignore_eos=True))
            for i, (p, n) in enumerate(zip(prompts, lengths, strict=True))]  # fmt: skip
    results = {}
    for padded in (False, True):
        llm = LLM(tiny_llama, dtype="float32", max_num_seqs=MAX_SEQS, max_batch_tokens=MAX_TOKENS,
                  block_size=BLOCK_SIZE, kv_cache_bytes=pool)  # fmt: skip
        if padded:
            llm._engine.runner = runner = PaddedRunner(llm._engine.runner, llm.max_model_len, larger)
        outs = sorted(llm.stream(rows), key=lambda o: o.index)
        results[padded] = ([o.token_ids for o in outs], [lp for o in outs for lp in o.logprobs or []])
    assert runner.padded["mixed"] > 0 and runner.padded["decode"] > 0
    assert results[True][0] == results[False][0]
    assert results[True][1] == pytest.approx(results[False][1], abs=1e-5)
