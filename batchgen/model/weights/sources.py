"""Where a model's tensors come from, by checkpoint name, sliced to what one rank needs.

- ``SafetensorsSource``: a checkpoint directory, read straight to the target device; only the requested
  rows or columns of a tensor are read, so a rank of a sharded model never holds the whole model.
- ``ModuleSource``: a model already built in memory (tests, ``LLM.from_model``); slices are views.
- ``RandomSource``: random weights of a config's shapes, generated slice by slice on the device
  (benchmarks of models too large to build whole, ``load_format="random"``).
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple, Protocol

import torch

from batchgen.distributed.shard import Span


class Part(NamedTuple):
    """``rows`` (dim 0) or ``cols`` (dim 1) of the tensor ``name``; None = all of them. With ``expert``,
    ``name`` is a stack of experts' matrices ([E, rows, cols], transformers' fused MoE parameters) and the
    spans apply to that expert's matrix."""

    name: str
    rows: Span | None = None
    cols: Span | None = None
    expert: int | None = None


class WeightSource(Protocol):
    device: torch.device
    # Its stacks are views of tensors someone else holds (an in-memory model's parameters): a format must
    # multiply them as they are, since a converted copy would add to memory instead of replacing them.
    shares_storage: bool

    def has(self, name: str) -> bool: ...

    def shape(self, name: str) -> tuple[int, ...]: ...

    def dtype(self, name: str) -> torch.dtype: ...

    def get(self, part: Part) -> torch.Tensor: ...

    def stack_rows(self, parts: Sequence[Part]) -> torch.Tensor: ...


# safetensors' dtype names (the header's) -> torch dtypes
_SAFETENSORS_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2, "I64": torch.int64, "I32": torch.int32,
    "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool,
}  # fmt: skip


def _index(part: Part) -> tuple[int | slice, ...]:
    rows = slice(part.rows.start, part.rows.stop) if part.rows else slice(None)
    index = (rows,) if part.cols is None else (rows, slice(part.cols.start, part.cols.stop))
    return index if part.expert is None else (part.expert, *index)


class SafetensorsSource:
    shares_storage = False

    def __init__(self, directory: str | Path, device: torch.device) -> None:
        from safetensors import safe_open

        self.device = device
        directory = Path(directory)
        index = directory / "model.safetensors.index.json"
        if index.exists():
            weight_map = json.loads(index.read_text())["weight_map"]
            files = sorted(set(weight_map.values()))
        else:
            files = sorted(p.name for p in directory.glob("*.safetensors"))
        if not files:
            raise FileNotFoundError(f"no .safetensors files in {directory}")
        where = "cpu" if device.type == "cpu" else str(device)
        self._handles = {f: safe_open(directory / f, framework="pt", device=where) for f in files}
        self._file_of = {name: f for f, h in self._handles.items() for name in h.keys()}  # noqa: SIM118

    def has(self, name: str) -> bool:
        return name in self._file_of

    def _slice(self, name: str):
        if name not in self._file_of:
            raise KeyError(f"the checkpoint has no tensor {name!r}")
        return self._handles[self._file_of[name]].get_slice(name)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._slice(name).get_shape())

    def dtype(self, name: str) -> torch.dtype:
        kind = self._slice(name).get_dtype()
        if kind not in _SAFETENSORS_DTYPES:
            raise ValueError(f"{name} has dtype {kind}, which batchgen does not read")
        return _SAFETENSORS_DTYPES[kind]

    def get(self, part: Part) -> torch.Tensor:
        if part.rows is None and part.cols is None and part.expert is None:
            return self._handles[self._file_of[part.name]].get_tensor(part.name)
        return self._slice(part.name)[_index(part)].contiguous()

    def stack_rows(self, parts: Sequence[Part]) -> torch.Tensor:
        return torch.cat([self.get(p) for p in parts])


class ModuleSource:
    """The tensors of an in-memory model. Unsliced row stacks of ``nn.Linear`` weights are merged once
    and the modules' own parameters become views of the merged tensor: memory does not grow, and the
    model's own forward still works."""

    shares_storage = True

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.tensors = dict(model.state_dict(keep_vars=True))
        self.device = next(model.parameters()).device

    def has(self, name: str) -> bool:
        return name in self.tensors

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.tensors[name].shape)

    def dtype(self, name: str) -> torch.dtype:
        return self.tensors[name].dtype

    def get(self, part: Part) -> torch.Tensor:
        return self.tensors[part.name].detach()[_index(part)]

    def stack_rows(self, parts: Sequence[Part]) -> torch.Tensor:
        if len(parts) == 1 or any(p.rows or p.cols for p in parts):
            return torch.cat([self.get(p) for p in parts]) if len(parts) > 1 else self.get(parts[0])
        owners = [self.model.get_submodule(p.name.rpartition(".")[0]) for p in parts]
        return _merged(owners, parts[0].name.rpartition(".")[2])


def _merged(modules: list[torch.nn.Module], attr: str) -> torch.Tensor:
    """One tensor whose row blocks are the modules' ``attr`` tensors, which become views of it.

    Already merged (a second engine on the same model): the blocks sit back to back in one storage, and
    the view over all of them is returned without copying."""
    parts = [getattr(m, attr) for m in modules]
    rows = sum(p.shape[0] for p in parts)
    if _adjacent(parts):
        return (
            parts[0]
            .detach()
            .as_strided((rows, *parts[0].shape[1:]), parts[0].stride(), parts[0].storage_offset())
        )
    with torch.inference_mode(False):  # normal tensors: the model stays usable outside inference mode
        merged = torch.cat([p.detach() for p in parts])
        for module, view in zip(modules, merged.split([p.shape[0] for p in parts]), strict=True):
            getattr(module, attr).data = view
    return merged


def _adjacent(parts: list[torch.Tensor]) -> bool:
    first = parts[0]
    offset = first.storage_offset()
    for p in parts:
        same = p.untyped_storage().data_ptr() == first.untyped_storage().data_ptr()
        if not (same and p.is_contiguous() and p.storage_offset() == offset):
            return False
        offset += p.numel()
    return True


class RandomSource:
    """Random tensors of the given full shapes: weights ~ N(0, std), norms 1, biases 0. Each slice is
    a pure function of (name, slice, seed), so ranks that replicate a slice hold the same values."""

    shares_storage = False

    def __init__(
        self, shapes: dict[str, tuple[int, ...]], device: torch.device, dtype: torch.dtype,
        seed: int = 0, std: float = 0.02,
    ) -> None:  # fmt: skip
        self.shapes, self.device, self.value_dtype, self.seed, self.std = shapes, device, dtype, seed, std

    @classmethod
    def for_model(cls, skeleton: torch.nn.Module, device: torch.device, dtype: torch.dtype) -> RandomSource:
        """Shapes from a model built on the meta device (no memory)."""
        shapes = {name: tuple(t.shape) for name, t in skeleton.state_dict().items()}
        return cls(shapes, device, dtype)

    def has(self, name: str) -> bool:
        return name in self.shapes

    def shape(self, name: str) -> tuple[int, ...]:
        return self.shapes[name]

    def dtype(self, name: str) -> torch.dtype:
        return self.value_dtype

    def get(self, part: Part) -> torch.Tensor:
        shape = list(self.shapes[part.name][0 if part.expert is None else 1 :])
        for dim, span in enumerate((part.rows, part.cols)):
            if span is not None:
                shape[dim] = span.size
        leaf = part.name.rsplit(".", 2)
        if "norm" in part.name and len(shape) == 1:
            return torch.ones(shape, dtype=self.value_dtype, device=self.device)
        if leaf[-1] == "bias":
            return torch.zeros(shape, dtype=self.value_dtype, device=self.device)
        generator = torch.Generator(self.device).manual_seed(self._seed(part))
        out = torch.empty(shape, dtype=self.value_dtype, device=self.device)
        return out.normal_(0.0, self.std, generator=generator)

    def _seed(self, part: Part) -> int:
        expert = "" if part.expert is None else f"|{part.expert}"
        key = f"{part.name}{expert}|{part.rows}|{part.cols}|{self.seed}".encode()
        return zlib.crc32(key)

    def stack_rows(self, parts: Sequence[Part]) -> torch.Tensor:
        return torch.cat([self.get(p) for p in parts])
