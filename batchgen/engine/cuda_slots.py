"""The CUDA runner's buffers: one slot's pinned host and device inputs, outputs, token masks and the
events that guard their reuse (cuda_runner.py says how they are ordered).

A step's inputs travel as one packed buffer: every field is a typed view into one pinned byte buffer,
laid out for the step's shape (rows of each kind), and one copy moves the used bytes to the same layout
in the slot's device byte buffer (a copy per field cost host time for each field, every step). A graph is
captured on the views of its bucket's layout (``decode_shape``, ``mixed_shape``), so a replay finds its
inputs where it reads them; a layout is a pure function of the shape, so views made again after being
forgotten point at the same bytes.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import torch

from batchgen.config import MAX_LOGPROBS
from batchgen.engine.batch import StepInputs
from batchgen.engine.mixed_graphs import bucket_for, token_buckets
from batchgen.engine.sampler import SamplingTensors

TOKEN_FIELDS = ("input_ids", "carry_rows", "positions", "slot_mapping")  # [T]
# [S]: the rows whose logits are sampled, then sampler.SamplingTensors' fields (its tensors, in order)
SAMPLE_FIELDS = ("logits_indices", *SamplingTensors._fields[:-2])
# padding rows: no KV write, no carry, no truncation or penalty, the statistics' padding row
PAD = {"carry_rows": -1, "slot_mapping": -1, "top_p": 1.0, "repetition_penalty": 1.0, "state_rows": -1}
SEQ_FIELDS = ("cu_seqlens_q", "seq_lens", "block_tables")  # [B + 1], [B], [B, max_blocks]
FIELDS = ("block_tables",) + TOKEN_FIELDS + SAMPLE_FIELDS + ("cu_seqlens_q", "seq_lens")  # packed order
_FLOATS = ("temperature", "top_p", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty")
DTYPES = dict.fromkeys(_FLOATS, torch.float32) | {n: torch.int32 for n in SEQ_FIELDS}
_ALIGN = 64  # bytes: each field of the packed buffer starts on a cache line
_KEPT_LAYOUTS = 256  # views kept per slot: decode shapes, then recent others (remade when needed)


def decode_buckets(max_num_seqs: int) -> list[int]:
    sizes = [1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256, 320, 384, 448, 512]
    return sorted({s for s in sizes if s < max_num_seqs} | {max_num_seqs})


def verify_buckets(max_tokens: int, max_samples: int) -> list[int]:
    """Token counts a verify step pads to: mixed_graphs' token buckets, up to the first that holds
    ``max_samples`` (every decode row's guesses) or the token budget."""
    buckets = token_buckets(max_tokens)
    return buckets[: bisect.bisect_left(buckets, max_samples) + 1]


def decode_shape(rows: int) -> Shape:
    """A decode graph's rows: one token, one sequence and one sample each."""
    return Shape(rows, rows, rows)


def mixed_shape(tokens: int, max_seqs: int) -> Shape:
    """A step with new prompts padded to a token bucket (engine/mixed_graphs.py): every sequence has a
    token in the step, and at most one sample, so no more sequence or sample rows than tokens."""
    rows = min(tokens, max_seqs)
    return Shape(tokens, rows, rows)


class Layout(NamedTuple):
    """How the CUDA runner lays a step out: ``bucket`` > 0 pads it to a graph's shape (``part`` names
    the graph: "step" a decode, "mixed" new prompts, "logits" a masked decode's forward); 0 runs it at
    its own shape. ``bounds``: (max query length, max sequence length, leading decode rows) its kernels
    are launched for; the decode rows (sequences of one query row ahead of the prompts' chunks) of an
    eager step with prompts run the decode attention kernel, 0 in graphs (their rows change per step)."""

    bucket: int
    part: str
    shape: Shape
    bounds: tuple[int, int, int]


def verify_shape(tokens: int, max_seqs: int) -> Shape:
    """A verify step (engine/speculative) padded to a token bucket: mixed_shape's rows, and a sample for
    every token (each decode samples all its positions)."""
    return Shape(tokens, min(tokens, max_seqs), tokens)


def graph_layout(bucket: int, part: str, max_seqs: int, max_model_len: int) -> Layout:
    """A graph's shape and bounds: the same for its eager uses, its capture and every replay."""
    if part == "mixed":
        return Layout(bucket, part, mixed_shape(bucket, max_seqs), (bucket, max_model_len, 0))
    if part == "verify":
        return Layout(bucket, part, verify_shape(bucket, max_seqs), (bucket, max_model_len, 0))
    return Layout(bucket, part, decode_shape(bucket), (1, max_model_len, 0))


def step_layout(
    inputs: StepInputs, decode_buckets: list[int], mixed_bucket: Callable[[int], int], max_seqs: int,
    max_model_len: int, verify_bucket: Callable[[int], int] = lambda tokens: 0,
) -> Layout:  # fmt: skip
    """A decode pads to its row bucket; a step with new prompts to the token bucket ``mixed_bucket``
    gives (0: eager at its own shape); a verify step (engine/speculative: more samples than sequences) to
    ``verify_bucket``'s; a masked step with new prompts runs at its own shape."""
    part = "logits" if inputs.masked else "step"
    if inputs.decode_only:
        bucket = bucket_for(decode_buckets, len(inputs.seq_lens))
    elif len(inputs.logits_indices) > len(inputs.seq_lens):
        bucket = 0 if inputs.masked or inputs.prompt_rows is not None else verify_bucket(inputs.num_tokens)
        part = "verify" if bucket else part
    else:
        eager = inputs.masked or inputs.prompt_rows is not None  # (prompt scores: extra logits rows)
        bucket = 0 if eager else mixed_bucket(inputs.num_tokens)
        part = "mixed" if bucket else part
    if bucket:
        return graph_layout(bucket, part, max_seqs, max_model_len)
    shape = Shape(inputs.num_tokens, len(inputs.seq_lens), len(inputs.logits_indices))
    return Layout(0, part, shape, (inputs.max_q_len, inputs.max_seq_len, leading_decodes(inputs)))


def leading_decodes(inputs: StepInputs) -> int:
    """How many sequences before the first of more than one query row (the engine puts decodes first);
    0 for a decode-only step (it runs the decode kernel whole)."""
    if inputs.decode_only:
        return 0
    longer = np.flatnonzero(np.diff(inputs.cu_seqlens_q) != 1)
    return int(longer[0]) if len(longer) else 0


class Slot:
    """Pinned host and device buffers of one slot, and the events that guard their reuse."""

    def __init__(
        self, device: torch.device, max_tokens: int, max_seqs: int, max_blocks: int, max_samples: int = 0
    ) -> None:
        self.max_blocks = max_blocks
        max_samples = max(max_samples, max_seqs)  # more than one a sequence: verify steps' positions
        size = packed_layout(Shape(max_tokens, max_seqs, max_samples), max_blocks).nbytes
        self.host_bytes = torch.zeros(size, dtype=torch.uint8, pin_memory=True)
        self.dev_bytes = torch.zeros(size, dtype=torch.uint8, device=device)
        self._views: dict[Shape, PackedViews] = {}
        # the sampler's outputs (sampler.SampleOutput): tokens, their log-probabilities, the top ones'
        shapes = ((max_samples,), (max_samples,), (max_samples, MAX_LOGPROBS), (max_samples, MAX_LOGPROBS))
        dtypes = (torch.int64, torch.float32, torch.int64, torch.float32)
        self.outputs = [torch.zeros(s, dtype=d, device=device) for s, d in zip(shapes, dtypes, strict=True)]
        self.host_outputs = [
            torch.zeros(s, dtype=d, pin_memory=True) for s, d in zip(shapes, dtypes, strict=True)
        ]
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

    @property
    def out_tokens(self) -> torch.Tensor:
        """[max_samples] int64: the sampled tokens (a decode's carry-over reads them)."""
        return self.outputs[0]

    def views(self, shape: Shape) -> PackedViews:
        """The host and device views of a step of this shape (kept for the decode shapes)."""
        views = self._views.get(shape)
        if views is None:
            if len(self._views) >= _KEPT_LAYOUTS:  # keep the decode shapes; the others are made again
                self._views = {k: v for k, v in self._views.items() if k.tokens == k.seqs == k.samples}
            views = self._views[shape] = packed_views(self.host_bytes, self.dev_bytes, shape, self.max_blocks)
        return views

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


class PackedViews(NamedTuple):
    host: dict[str, np.ndarray]  # field -> its rows in the pinned byte buffer (numpy, for the host)
    dev: dict[str, torch.Tensor]  # field -> the same rows in the device byte buffer
    nbytes: int  # bytes the step's copy moves


class PackedLayout(NamedTuple):
    fields: dict[str, tuple[int, tuple[int, ...], torch.dtype]]  # name -> (byte offset, shape, dtype)
    nbytes: int


def packed_layout(shape: Shape, max_blocks: int) -> PackedLayout:
    """Each field's place in the packed buffer for a step of ``shape``: rows of its kind, in field order,
    each field starting on a 64-byte boundary. Block tables keep their full width: a graph reads them
    with that row stride."""
    fields, offset = {}, 0
    for name in FIELDS:
        rows = rows_of(name, shape)
        dims = (rows, max_blocks) if name == "block_tables" else (rows,)
        dtype = DTYPES.get(name, torch.int64)
        fields[name] = (offset, dims, dtype)
        offset += -(-int(np.prod(dims)) * dtype.itemsize // _ALIGN) * _ALIGN
    return PackedLayout(fields, offset)


def packed_views(host_bytes: torch.Tensor, dev_bytes: torch.Tensor, shape: Shape, max_blocks: int):
    """Typed views of a step's fields into the host and device byte buffers (same layout in both)."""
    layout = packed_layout(shape, max_blocks)

    def view(buffer: torch.Tensor, offset: int, dims: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        size = int(np.prod(dims)) * dtype.itemsize
        return buffer[offset : offset + size].view(dtype).view(dims)

    host = {n: view(host_bytes, *f).numpy() for n, f in layout.fields.items()}
    dev = {n: view(dev_bytes, *f) for n, f in layout.fields.items()}
    return PackedViews(host, dev, layout.nbytes)


def reset_inputs(views: PackedViews) -> None:
    """Inert inputs on the device: padding rows everywhere (graph warm-up runs write no KV)."""
    for name, dev in views.dev.items():
        dev.fill_(PAD.get(name, 0))


def fill_host(host: dict[str, np.ndarray], inputs: StepInputs) -> None:
    """Copy the step's arrays into its host views; pad the rest of each view with inert rows.

    Block tables: a row's columns past the step's widest table keep whatever the buffer held (another
    layout's fields). No kernel reads a row's table past its own length (tests/kernels/attention/
    test_block_tables.py); zeroing them wrote max_blocks - W columns a row every step, megabytes a step
    for a wide batch, a visible share of the engine thread's time."""
    for name, view in host.items():
        src = getattr(inputs, name)
        n = len(src)
        if src.ndim == 2:
            view[:n, : src.shape[1]] = src
        else:
            view[:n] = src
        if len(view) > n:
            pad = src[-1] if name == "cu_seqlens_q" else PAD.get(name, 0)  # empty padding sequences
            view[n:] = pad
