"""Fixtures of the FileTokenizer oracle tests: transformers' tokenizer and ours, of the embedded model."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from batchgen.model.files.tokenizer import FileTokenizer, verified_transformers


@pytest.fixture(scope="module")
def hf(default_model_path):
    return AutoTokenizer.from_pretrained(default_model_path)


@pytest.fixture(scope="module")
def ft(default_model_path):
    if not verified_transformers():
        pytest.skip("transformers is not a verified release")
    return FileTokenizer.open(default_model_path)
