"""A step's shape must not pick a new kernel variant. Each variant is a compile on a machine whose Triton
cache is cold, and it happens inside the run: a job whose rows end at different steps meets many batch
sizes, so per-size variants cost it seconds (B7s: 20 kernels compiled against 12, docs/results.md).

Every launch's compile-time arguments are recorded (the kernel wrapped in place), and the outputs are
still checked against the torch reference. Triton also compiles a variant per integer argument equal to 1
or divisible by 16; the interpreter does not, so the arguments that follow the step's shape are checked
to be marked ``do_not_specialize``.
"""

from __future__ import annotations

import pytest
import torch

from batchgen.kernels import reference
from batchgen.kernels.attention import decode, prefill
from tests.kernels.cases import make_case, rel_error

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


class _Recorder:
    """Stands in for a @triton.jit kernel: records each launch's keyword (compile-time) arguments."""

    def __init__(self, kernel) -> None:
        self.kernel, self.variants = kernel, set()

    def __getitem__(self, grid):
        launch = self.kernel[grid]

        def run(*args, **constants):
            self.variants.add(tuple(sorted(constants.items())))
            return launch(*args, **constants)

        return run


def _unspecialized(kernel) -> set[str]:
    """The arguments ``kernel`` does not specialize on, interpreted (TRITON_INTERPRET) or compiled."""
    if hasattr(kernel, "params"):
        return {p.name for p in kernel.params if p.do_not_specialize}
    return set(kernel.kwargs["do_not_specialize"])


def _checked(out: torch.Tensor, case) -> None:
    assert rel_error(out, reference.paged_attention(*case.attn_args()), case.num_valid_rows) < 1e-3


def test_prefill_steps_of_up_to_511_sequences_share_one_variant(monkeypatch):
    assert {"num_seqs", "num_tiles"} <= _unspecialized(prefill._prefill_kernel)
    recorder = _Recorder(prefill._prefill_kernel)
    monkeypatch.setattr(prefill, "_prefill_kernel", recorder)
    for batch in (1, 2, 3, 5, 9, 17, 33):
        case = make_case([2] * batch, [2 + i % 5 for i in range(batch)], q_heads=3, kv_heads=1, head_dim=16,
                         device=DEVICE, seed=batch)  # fmt: skip
        _checked(prefill.prefill_attention(*case.attn_args(), block_m=16, block_n=16), case)
    assert len(recorder.variants) == 1


@pytest.mark.parametrize("kv_heads", [1, 2])
def test_decode_split_counts_compile_in_only_whether_they_split(monkeypatch, kv_heads):
    assert "num_splits" in _unspecialized(decode._decode_split_kernel)
    assert "num_splits" in _unspecialized(decode._decode_merge_kernel)
    splits = _Recorder(decode._decode_split_kernel)
    merges = _Recorder(decode._decode_merge_kernel)
    monkeypatch.setattr(decode, "_decode_split_kernel", splits)
    monkeypatch.setattr(decode, "_decode_merge_kernel", merges)
    case = make_case([1, 1, 1], [20, 70, 45], q_heads=2 * kv_heads, kv_heads=kv_heads, head_dim=16,
                     device=DEVICE, seed=kv_heads)  # fmt: skip
    for num_splits in range(1, 9):
        out = decode.decode_attention(*case.attn_args(), max_seq_len=70, num_splits=num_splits, block_n=16)
        _checked(out, case)
    assert len(splits.variants) == 2  # one without splits, one for 2-8 splits
    assert len(merges.variants) == 3  # the merge's lanes, the count's power of two: 2; 4 for 3-4; 8 for 5-8
