"""What the penalties and fixed logit adjustments of each row of the persistent batch read, kept on the
device from step to step (vLLM's penalties read the same: the prompt's tokens and the output's counts).

- ``counts[r, t]``: how often row r's request has output token t; the sampler adds each sampled token
  (``record``), inside the step, so a step's penalties see the token sampled by the step before it
  without a trip through the host.
- ``prompt[r, t]``: whether token t is in row r's prompt (the repetition penalty reads prompt and output).
- ``adjust_ids / adjust_values / adjust_gated``: row r's sparse logit changes: its logit bias, and, for
  min_tokens, -inf on its stop token ids while fewer than min_tokens tokens are out (``gated``).

A request's row is (re)built from the host when it takes the row (``RowInit``, from the scheduler's claim:
at admission, and again after a preemption): the only time tokens travel up. The last row is padding:
graph padding rows (state row -1) read and write it.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from batchgen.engine.step_sampling import MAX_ADJUSTMENTS, RowInit


class RowTokens:
    """Per-row token statistics on the device: [rows + 1, vocab] counts and prompt marks, made on first use
    (a run without penalties or adjustments never allocates them)."""

    def __init__(self, rows: int, vocab: int, device: torch.device) -> None:
        self.rows, self.vocab = rows, vocab
        self.counts = torch.zeros(rows + 1, vocab, dtype=torch.int32, device=device)  # [R + 1, V]
        self.prompt = torch.zeros(rows + 1, vocab, dtype=torch.bool, device=device)  # [R + 1, V]
        self.adjust_ids = torch.zeros(rows + 1, MAX_ADJUSTMENTS, dtype=torch.int64, device=device)
        self.adjust_values = torch.zeros(rows + 1, MAX_ADJUSTMENTS, dtype=torch.float32, device=device)
        self.adjust_gated = torch.zeros(rows + 1, MAX_ADJUSTMENTS, dtype=torch.bool, device=device)

    def index(self, state_rows: torch.Tensor) -> torch.Tensor:
        """[S] rows of the step's samples; -1 (graph padding) -> the padding row."""
        return torch.where(state_rows < 0, self.rows, state_rows)

    def record(self, rows: torch.Tensor, tokens: torch.Tensor) -> None:
        """Count each sampled token in its row ([S] each; rows already through ``index``)."""
        self.counts.index_put_((rows, tokens), torch.ones_like(tokens, dtype=torch.int32), accumulate=True)

    def init(self, inits: list[RowInit]) -> None:
        """Rebuild the rows of ``inits`` from their tokens: one host-to-device copy from pinned memory, so
        the host never waits for the steps still running on the device (this runs at every admission)."""
        ints, floats = _packed(inits)
        rows, prompt, output, adjust = _device_parts(ints, floats, self.counts.device)
        self.counts[rows] = 0
        self.prompt[rows] = False
        self.adjust_ids[rows] = 0
        self.adjust_values[rows] = 0.0
        self.adjust_gated[rows] = False
        self.prompt[prompt[0], prompt[1]] = True
        self.record(output[0], output[1])
        where = (adjust.rows, adjust.slots)
        self.adjust_ids[where] = adjust.ids
        self.adjust_values[where] = adjust.values
        self.adjust_gated[where] = adjust.gated


class _Adjustments(NamedTuple):
    rows: torch.Tensor  # [A] int64
    slots: torch.Tensor  # [A] int64: the entry's place in its row's list
    ids: torch.Tensor  # [A] int64 token ids
    values: torch.Tensor  # [A] float32
    gated: torch.Tensor  # [A] bool


def _packed(inits: list[RowInit]) -> tuple[np.ndarray, np.ndarray]:
    """Everything ``RowTokens.init`` writes, as one int64 and one float32 array: the rows [R], then the
    prompt's (row, id) pairs [2, P], the output's [2, O], and the adjustments' (row, slot, id, gated)
    [4, A] (their values are the float array). The first three ints are R, P and O."""
    rows = [i.row for i in inits]
    prompt = _pairs([i.prompt for i in inits], rows)
    output = _pairs([i.output for i in inits], rows)
    adjusted = [(i.row, slot, *entry) for i in inits for slot, entry in enumerate(i.adjustments)]
    adjust = np.array([(r, s, t, g) for r, s, t, _, g in adjusted], np.int64).reshape(-1, 4).T
    sizes = np.array([len(rows), prompt.shape[1], output.shape[1]], np.int64)
    ints = np.concatenate([sizes, np.array(rows, np.int64), prompt.ravel(), output.ravel(), adjust.ravel()])
    return ints, np.array([v for *_, v, _ in adjusted], np.float32)


def _device_parts(
    ints: np.ndarray, floats: np.ndarray, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, _Adjustments]:
    """``_packed``'s arrays on the device, cut back into rows [R], prompt [2, P], output [2, O] and the
    adjustments (non-blocking copies from pinned memory on CUDA; the host allocator keeps the pinned
    buffers until their copies are done)."""
    r, p, o = (int(n) for n in ints[:3])
    dev_ints, dev_floats = (_to_device(torch.from_numpy(a), device) for a in (ints[3:], floats))
    sizes = [r, 2 * p, 2 * o, dev_ints.numel() - r - 2 * (p + o)]
    rows, prompt, output, adjust = torch.split(dev_ints, sizes)
    adjust = adjust.view(4, -1)
    parts = _Adjustments(adjust[0], adjust[1], adjust[2], dev_floats, adjust[3].bool())
    return rows, prompt.view(2, p), output.view(2, o), parts


def _to_device(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


def _pairs(token_lists: list[list[int]], rows: list[int]) -> np.ndarray:
    """[2, N] int64: the row of each token, and the token, over all the lists."""
    lengths = [len(tokens) for tokens in token_lists]
    row_of = np.repeat(np.array(rows, np.int64), lengths)
    ids = np.fromiter((t for tokens in token_lists for t in tokens), np.int64, sum(lengths))
    return np.stack([row_of, ids])


def ready_row_tokens(current: RowTokens | None, capacity: int, vocab: int, device: torch.device) -> RowTokens:
    """The runner's statistics for ``capacity`` rows of the persistent batch: made on first use, and made
    again, twice as large and with every row kept, when the batch grew past them (it grows while rows whose
    last token is in flight still hold theirs). A runner then drops the graphs captured on the old ones."""
    if current is None:
        return RowTokens(capacity, vocab, device)
    if capacity <= current.rows:
        return current
    grown = RowTokens(max(capacity, 2 * current.rows), vocab, device)
    for name in ("counts", "prompt", "adjust_ids", "adjust_values", "adjust_gated"):
        getattr(grown, name)[: current.rows] = getattr(current, name)[: current.rows]
    return grown
