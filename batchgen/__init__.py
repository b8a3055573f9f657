"""batchgen: offline batch generation for LLMs."""

from batchgen.config import EngineConfig, SamplingParams
from batchgen.engine.outputs import CompletionOutput, GenerationRequest

__version__ = "0.1.0"

__all__ = ["LLM", "EngineConfig", "SamplingParams", "GenerationRequest", "CompletionOutput", "__version__"]


def __getattr__(name: str):
    # LLM pulls in torch and transformers: import it only when asked for (fast `batchgen --help`).
    if name == "LLM":
        from batchgen.llm import LLM

        return LLM
    raise AttributeError(name)
