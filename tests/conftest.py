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


@pytest.fixture(scope="module")
def one_torch_thread():
    """Tiny models gain nothing from intra-op threads, and on a busy 2-core runner their spin-waits
    make every step ~10x slower. Use with ``pytestmark = pytest.mark.usefixtures("one_torch_thread")``."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
