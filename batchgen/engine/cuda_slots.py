"""The CUDA runner's buffers: one slot's pinned host and device inputs, outputs, token masks and the
events that guard their reuse (cuda_runner.py says how they are ordered)."""

from __future__ import annotations

from typing import NamedTuple

import torch

from batchgen.engine.batch import StepInputs

TOKEN_FIELDS = ("input_ids", "carry_rows", "positions", "slot_mapping")  # [T]
SAMPLE_FIELDS = ("logits_indices", "temperature", "top_p", "top_k", "rng_keys", "rng_steps")  # [S]
PAD = {"carry_rows": -1, "slot_mapping": -1, "top_p": 1.0}  # padding rows: no KV write, no carry


def decode_buckets(max_num_seqs: int) -> list[int]:
    sizes = [1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256, 320, 384, 448, 512]
    return sorted({s for s in sizes if s < max_num_seqs} | {max_num_seqs})


class Slot:
    """Pinned host and device buffers of one slot, and the events that guard their reuse."""

    def __init__(self, device: torch.device, max_tokens: int, max_seqs: int, max_blocks: int) -> None:
        shapes = {name: (max_tokens,) for name in TOKEN_FIELDS}
        shapes |= {name: (max_seqs,) for name in SAMPLE_FIELDS}
        shapes |= {
            "cu_seqlens_q": (max_seqs + 1,),
            "seq_lens": (max_seqs,),
            "block_tables": (max_seqs, max_blocks),
        }
        dtypes = {"temperature": torch.float32, "top_p": torch.float32}
        dtypes |= {name: torch.int32 for name in ("cu_seqlens_q", "seq_lens", "block_tables")}
        self.host = {
            n: torch.zeros(s, dtype=dtypes.get(n, torch.int64), pin_memory=True) for n, s in shapes.items()
        }
        self.dev = {
            n: torch.zeros(s, dtype=dtypes.get(n, torch.int64), device=device) for n, s in shapes.items()
        }
        self.out_tokens = torch.zeros(max_seqs, dtype=torch.int64, device=device)
        self.out_logprobs = torch.zeros(max_seqs, dtype=torch.float32, device=device)
        self.host_tokens = torch.zeros(max_seqs, dtype=torch.int64, pin_memory=True)
        self.host_logprobs = torch.zeros(max_seqs, dtype=torch.float32, pin_memory=True)
        self.h2d_done = torch.cuda.Event()
        self.compute_start = torch.cuda.Event(enable_timing=True)
        self.compute_done = torch.cuda.Event(enable_timing=True)
        self.d2h_done = torch.cuda.Event()
        # A masked step: the compute stream idles between its two parts while the masks are filled;
        # busy time counts the parts only.
        self.logits_done = torch.cuda.Event(enable_timing=True)
        self.sample_start = torch.cuda.Event(enable_timing=True)
        self.mask_ready = torch.cuda.Event()
        self.mask_host: torch.Tensor | None = None  # [max_seqs, W] int32 token bitmasks, made on first use
        self.mask_dev: torch.Tensor | None = None
        self.max_seqs = max_seqs
        for name, value in PAD.items():
            self.dev[name].fill_(value)

    def mask_buffers(self, width: int) -> None:
        """Make the token-mask buffers once: captured sampling graphs keep their address."""
        if self.mask_dev is None:
            shape = (self.max_seqs, width)
            # Plain tensors even when made under inference mode (capture_all): the host writes masks
            # outside it too (a tensor-parallel worker's loop).
            with torch.inference_mode(False):
                self.mask_host = torch.full(shape, -1, dtype=torch.int32, pin_memory=True)
                self.mask_dev = torch.full(shape, -1, dtype=torch.int32, device=self.out_tokens.device)
        elif self.mask_dev.shape[1] != width:
            raise ValueError(f"token masks are {self.mask_dev.shape[1]} words wide, not {width}")


class Shape(NamedTuple):
    """How many rows of each kind a launch uses (padded to the bucket for graph replays)."""

    tokens: int
    seqs: int
    samples: int


def rows_of(name: str, shape: Shape) -> int:
    if name in TOKEN_FIELDS:
        return shape.tokens
    if name in SAMPLE_FIELDS:
        return shape.samples
    return shape.seqs + 1 if name == "cu_seqlens_q" else shape.seqs


def reset_inputs(slot: Slot) -> None:
    for name, dev in slot.dev.items():
        dev.fill_(PAD.get(name, 0))


def fill_host(slot: Slot, inputs: StepInputs, shape: Shape) -> None:
    """Copy the step's arrays into the slot's pinned buffers; pad up to ``shape`` with inert rows."""
    for name, host in slot.host.items():
        src = getattr(inputs, name)
        view = host.numpy()
        n = len(src)
        if src.ndim == 2:  # block tables: columns past the step's widest table are never read
            view[:n, : src.shape[1]] = src
        else:
            view[:n] = src
        rows = rows_of(name, shape)
        if rows > n:
            pad = src[-1] if name == "cu_seqlens_q" else PAD.get(name, 0)  # empty padding sequences
            view[n:rows] = pad
