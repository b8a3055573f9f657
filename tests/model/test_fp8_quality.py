"""``--quantization fp8`` keeps the embedded model's greedy tokens: on the CPU, against the unquantized
model in fp32, the first 8 greedy tokens agree for at least 70 % of varied prompts (issue 44).

How the prompts were chosen: ``bench/workloads.VARIED_PROMPTS`` (48 chat prompts written to span the kinds
of request a synthesis job sends: questions, instructions, code, poems, translation, arithmetic) and 130 of
B4's short questions (``mixed_prompts``: 26 topics x 5 asks), 178 in all. The set was fixed before the
rounding was chosen (``docs/results.md``, "FP8 quality on the CPU"), and the calibration chats
(``model/weights/calibration_text.py``) contain none of them. Chat template, greedy, EOS ignored, one CPU
thread (the same sums on any machine), prefix caching off (each prompt computed whole).

The count is a strict measure (one changed token of 8 fails a prompt); docs/results.md ("FP8 quality on
the CPU") has each rounding's count on this set: rounded to nearest, with or without e4m3 activations,
falls short of 70 %."""

from __future__ import annotations

import pytest

from batchgen import LLM, SamplingParams
from batchgen.bench.workloads import VARIED_PROMPTS, mixed_prompts

TOKENS = 8
PROMPTS = VARIED_PROMPTS + mixed_prompts(130, long_notes=())


def _greedy(llm: LLM) -> list[list[int]]:
    params = SamplingParams(max_new_tokens=TOKENS, ignore_eos=True)
    return [list(o.token_ids) for o in llm.generate_samples(PROMPTS, params)]


@pytest.mark.usefixtures("one_torch_thread")
def test_quantization_fp8_keeps_most_greedy_tokens(default_model_path):
    options = dict(device="cpu", threads=1, prefix_caching=False, extra={"progress": False})
    plain, fp8 = LLM(default_model_path, **options), LLM(default_model_path, quantization="fp8", **options)
    want, got = _greedy(plain), _greedy(fp8)
    same = sum(a == b for a, b in zip(want, got, strict=True))
    assert len(PROMPTS) == 178 and same >= 0.7 * len(PROMPTS), f"{same} of {len(PROMPTS)}"
