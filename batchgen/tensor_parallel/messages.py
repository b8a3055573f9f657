"""The orders rank 0 sends the other ranks of a tensor-parallel job, and their one encoding.

Each order is a small dataclass. On the control connection it travels as a tuple: its tag, then its
fields in order (``encode``); ``decode`` turns such a tuple back into the order and refuses a tag it does
not know, so a worker never drops an order silently. Replies (``Stats``, ``TimeAllReduce``) are plain
values.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from batchgen.config import EngineConfig
from batchgen.engine.batch import StepInputs
from batchgen.engine.step_sampling import SamplingFeatures


class UnknownMessage(ValueError):
    """A control message that no order of this module encodes."""


@dataclass(frozen=True)
class Init:
    """The job, sent once to each worker: its options, its model files, rank 0's rendezvous."""

    TAG: ClassVar[str] = "init"
    config: EngineConfig
    files: Any  # model.build.ModelFiles, without the in-memory module (not imported: launch stays light)
    rendezvous: Any  # launch.Rendezvous


@dataclass(frozen=True)
class Launch:
    """Launch a step from its host inputs."""

    TAG: ClassVar[str] = "launch"
    inputs: StepInputs


@dataclass(frozen=True)
class Sample:
    """Sample the newest (masked) step with the token masks rank 0 filled."""

    TAG: ClassVar[str] = "sample"
    masks: np.ndarray  # [S, W] int32


@dataclass(frozen=True)
class Reset:
    """Forget the previous step (nothing carries over)."""

    TAG: ClassVar[str] = "reset"


@dataclass(frozen=True)
class Capture:
    """Capture every graph for steps with these sampling features (and token masks this wide)."""

    TAG: ClassVar[str] = "capture"
    features: SamplingFeatures
    mask_width: int | None


@dataclass(frozen=True)
class Stats:
    """Reply with this rank's busy and host-prep time."""

    TAG: ClassVar[str] = "stats"


@dataclass(frozen=True)
class TimeAllReduce:
    """Reply with the median ms of ``count`` graph-captured all-reduces of ``shape``."""

    TAG: ClassVar[str] = "time_all_reduce"
    shape: tuple[int, ...]
    count: int


@dataclass(frozen=True)
class Stop:
    """Leave the serve loop: the job is over."""

    TAG: ClassVar[str] = "stop"


Message = Init | Launch | Sample | Reset | Capture | Stats | TimeAllReduce | Stop
_BY_TAG: dict[str, type] = {
    kind.TAG: kind for kind in (Init, Launch, Sample, Reset, Capture, Stats, TimeAllReduce, Stop)
}


def encode(message: Message) -> tuple:
    """The tuple that travels: the order's tag, then its fields."""
    if _BY_TAG.get(getattr(message, "TAG", None)) is not type(message):
        raise UnknownMessage(f"not a tensor-parallel order: {message!r}")
    return (message.TAG, *(getattr(message, f.name) for f in dataclasses.fields(message)))


def decode(raw: Any) -> Message:
    """The order a received tuple encodes; a tag no order has raises ``UnknownMessage``."""
    tag = raw[0] if isinstance(raw, tuple) and raw else raw
    kind = _BY_TAG.get(tag) if isinstance(tag, str) else None
    if kind is None:
        raise UnknownMessage(f"unknown tensor-parallel message {tag!r} (known: {', '.join(_BY_TAG)})")
    try:
        return kind(*raw[1:])
    except TypeError as exc:  # the right tag with the wrong fields
        raise UnknownMessage(f"malformed tensor-parallel message {raw!r}: {exc}") from exc
