"""What the config readers (``checkpoint_config.py``, ``moe_config.py``) share: the error that sends a config
to transformers, and the value checks transformers' config classes make (huggingface_hub's ``@strict`` field
types, ``validate_layer_type``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

LAYER_TYPES = ("full_attention", "sliding_attention")


class UnsupportedConfig(Exception):
    """A config this reader cannot reproduce exactly: transformers must read it."""


def of(*types: type) -> Callable[[Any], bool]:
    """A check of a value's exact type, as huggingface_hub's @strict makes it (1 is no float, True no int)."""
    return lambda v: type(v) in types


INT, OPT_INT, BOOL, NUMBER = of(int), of(int, type(None)), of(bool), of(int, float)


def int_list(value: Any) -> bool:
    """``list[int]``: a JSON array of integers (no booleans)."""
    return type(value) is list and all(map(INT, value))


def check_layer_types(types: Any, window: int | None, layers: int) -> list[str]:
    """A config's ``layer_types``: one known kind per layer, and a window wherever a layer slides (the
    sliding mask would raise without one)."""
    if type(types) is not list or len(types) != layers or any(t not in LAYER_TYPES for t in types):
        raise UnsupportedConfig(f"layer_types {types!r}")
    if window is None and "sliding_attention" in types:
        raise UnsupportedConfig("sliding layers without a sliding window")
    return types
