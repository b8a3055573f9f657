"""batchgen: offline batch generation for LLMs."""

from batchgen.config import EngineConfig, SamplingParams
from batchgen.engine.completions import GenerationRequest
from batchgen.outputs import CompletionOutput, Logprob, RequestOutput

__version__ = "0.1.0"

# RequestOutput and CompletionOutput are vLLM's shapes (what generate and chat return); the engine's
# per-sample output that LLM.stream yields is batchgen.engine.completions.CompletionOutput.
__all__ = [
    "LLM", "EngineConfig", "SamplingParams", "GenerationRequest",
    "RequestOutput", "CompletionOutput", "Logprob", "__version__",
]  # fmt: skip


def __getattr__(name: str):
    # LLM pulls in torch and transformers: import it only when asked for (fast `batchgen --help`).
    if name == "LLM":
        from batchgen.llm import LLM

        return LLM
    raise AttributeError(name)
