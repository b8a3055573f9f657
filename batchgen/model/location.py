"""Where a model's files are: a local directory holding config.json, or a hub snapshot (fetched, or
already in the hub cache). A model that is neither is one line saying which, before anything is created
or loaded (``batchgen run`` checks it before it makes ``OUTPUT.batchgen/``)."""

from __future__ import annotations

import os

# The files a snapshot fetches: config, tokenizer and safetensors weights; nothing else.
SNAPSHOT_PATTERNS = ["*.json", "*.safetensors", "*.jinja", "*.model", "*.txt", "*.tiktoken"]


class ModelNotFound(LookupError):
    """``--model`` names neither a model directory nor a hub model this machine can reach."""


def check_model_found(model: str | None) -> None:
    """A ``ModelNotFound`` for a ``--model`` that cannot be found (None, the embedded model, is checked
    as it loads). A hub model is fetched here, so the load after it reads the cache."""
    if model is not None:
        find_model(model)


def find_model(model: str) -> str:
    """The directory of ``model``: a local path as given, else its hub snapshot."""
    if os.path.isdir(model):
        if not os.path.isfile(os.path.join(model, "config.json")):
            raise ModelNotFound(f"no model at {model}: the directory has no config.json")
        return model
    if os.path.exists(model):
        raise ModelNotFound(f"no model at {model}: a file, not a directory with config.json")
    return _hub_snapshot(model)


def _hub_snapshot(repo_id: str) -> str:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import GatedRepoError, LocalEntryNotFoundError, RepositoryNotFoundError

    _check_hub_id(repo_id)
    missing = f"no model at {repo_id}: not a directory with config.json"
    try:
        return snapshot_download(repo_id, allow_patterns=SNAPSHOT_PATTERNS)
    except GatedRepoError:
        raise ModelNotFound(f"{repo_id} is gated on the hub: accept its terms there, then log in") from None
    except RepositoryNotFoundError:
        raise ModelNotFound(f"{missing}, nor a model on the hub (a private one needs a login)") from None
    except LocalEntryNotFoundError:  # offline, or the hub unreachable, and not in the hub cache
        raise ModelNotFound(f"{missing}, and there is no hub access") from None


def _check_hub_id(repo_id: str) -> None:
    """``./nope`` or ``a/b/c`` is a path that does not exist, not a hub id to look up."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(repo_id)
    except HFValidationError:
        raise ModelNotFound(
            f"no model at {repo_id}: not a directory with config.json, nor a hub id"
        ) from None
