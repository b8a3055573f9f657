"""Fixtures of the FileTokenizer oracle tests: transformers' tokenizer and ours, of the embedded model."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from tests.model.tokenizer_cases import open_as_installed


@pytest.fixture(scope="module")
def hf(default_model_path):
    return AutoTokenizer.from_pretrained(default_model_path)


@pytest.fixture(scope="module")
def ft(default_model_path):
    return open_as_installed(default_model_path)
