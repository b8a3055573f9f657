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
        """Rebuild the rows of ``inits`` from their tokens (a few host-to-device copies, at admission)."""
        device = self.counts.device
        rows = torch.tensor([i.row for i in inits], dtype=torch.int64, device=device)
        self.counts[rows] = 0
        self.prompt[rows] = False
        self.adjust_ids[rows] = 0
        self.adjust_values[rows] = 0.0
        self.adjust_gated[rows] = False
        prompt_rows, prompt_ids = _pairs([i.prompt for i in inits], [i.row for i in inits])
        self.prompt[torch.from_numpy(prompt_rows).to(device), torch.from_numpy(prompt_ids).to(device)] = True
        out_rows, out_ids = _pairs([i.output for i in inits], [i.row for i in inits])
        if len(out_ids):
            self.record(torch.from_numpy(out_rows).to(device), torch.from_numpy(out_ids).to(device))
        for init in inits:
            if init.adjustments:
                ids, values, gated = zip(*init.adjustments, strict=True)
                n = len(ids)
                self.adjust_ids[init.row, :n] = torch.tensor(ids, dtype=torch.int64)
                self.adjust_values[init.row, :n] = torch.tensor(values, dtype=torch.float32)
                self.adjust_gated[init.row, :n] = torch.tensor(gated, dtype=torch.bool)


def _pairs(token_lists: list[list[int]], rows: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """(row of each token, the token) over all the lists: [N] int64 each."""
    lengths = [len(tokens) for tokens in token_lists]
    row_of = np.repeat(np.array(rows, np.int64), lengths)
    ids = np.fromiter((t for tokens in token_lists for t in tokens), np.int64, sum(lengths))
    return row_of, ids


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
