"""A checkpoint's sampling defaults and end-of-sequence ids, read as transformers reads them: from
``generation_config.json``, else the model config's (``GenerationConfig.from_model_config``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import NamedTuple


class GenerationDefaults(NamedTuple):
    """The fields of transformers' ``GenerationConfig`` batchgen reads (None: unset, as there)."""

    do_sample: bool | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    eos_token_id: int | list[int] | None = None


def read_generation_defaults(path: str, config_eos: int | list[int] | None) -> GenerationDefaults:
    """``config_eos``: the model config's eos_token_id (its class default applied), which is all a
    checkpoint without a generation config gives transformers' (sampling keys in config.json are not
    config fields: transformers drops them)."""
    file = Path(path) / "generation_config.json"
    if not file.is_file():
        return GenerationDefaults(eos_token_id=config_eos)
    with open(file, encoding="utf-8") as f:
        fields = json.load(f)
    return GenerationDefaults(**{name: fields.get(name) for name in GenerationDefaults._fields})
