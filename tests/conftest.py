import os

import pytest

from batchgen.model.loader import default_model_dir
from batchgen.testing.models import TINY_CONFIGS, build_tiny_model

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def default_model_path() -> str:
    """The embedded SmolLM2-135M-Instruct, converted once into the user cache."""
    return str(default_model_dir())


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory) -> dict[str, str]:
    """arch -> local dir of a tiny random model (llama, qwen2, mistral, qwen3)."""
    root = tmp_path_factory.mktemp("tiny-models")
    return {arch: str(build_tiny_model(arch, root / arch)) for arch in TINY_CONFIGS}


@pytest.fixture(scope="session")
def tiny_llama(tiny_models) -> str:
    return tiny_models["llama"]
