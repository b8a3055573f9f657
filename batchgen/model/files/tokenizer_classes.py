"""Which tokenizer class ``AutoTokenizer.from_pretrained`` builds for a checkpoint, and Qwen2Tokenizer's
backend built as transformers builds it, for ``tokenizer.FileTokenizer`` (the releases of
``tokenizer.verified_transformers``).

TokenizersBackend (alias PreTrainedTokenizerFast) uses tokenizer.json as is. Qwen2Tokenizer defines its own
``__init__``, so ``TokenizersBackend.convert_to_native_format`` (tokenization_utils_tokenizers.py) takes only
the vocab, merges, post-processor, padding and truncation from tokenizer.json; ``Qwen2Tokenizer.__init__``
(models/qwen2/tokenization_qwen2.py) builds the BPE model, NFC normalizer, Split + ByteLevel pre-tokenizer
and ByteLevel decoder itself, with its own special token defaults; ``TokenizersBackend.__init__`` adds the
declared added tokens (tokenizer_config.json's ``added_tokens_decoder``, else tokenizer.json's) in id order,
taking new ids in that order, and Qwen2Tokenizer then adds every special token again as
``AddedToken(token, special=True)``, which overwrites the flags of one already added. ``qwen2_backend``
makes the same calls on tokenizer.json's BPE model, and accepts only where tokenizer.json already encodes and
decodes exactly so: the same components (up to fields the tokenizers library ignores), the same added tokens
with the same ids and flags."""

from __future__ import annotations

import fnmatch
import json
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers
from tokenizers.models import BPE

TOKENIZERS_BACKEND = "TokenizersBackend"
QWEN2_TOKENIZER = "Qwen2Tokenizer"
# tokenizer_class values for which AutoTokenizer builds TokenizersBackend straight from tokenizer.json.
_VERBATIM_CLASSES = frozenset({"TokenizersBackend", "PreTrainedTokenizerFast"})
_QWEN2_CLASSES = frozenset({"Qwen2Tokenizer", "Qwen2TokenizerFast"})  # "Fast" is dropped (tokenization_auto)
# Model types whose TOKENIZER_MAPPING_NAMES entry is Qwen2Tokenizer (the text models of the family).
_QWEN2_MODEL_TYPES = frozenset({"qwen2", "qwen2_moe", "qwen3", "qwen3_moe"})
# MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS (models/auto/tokenization_auto.py): AutoTokenizer builds these
# model types' own tokenizer class, whatever tokenizer_class says (qwen2's: Qwen2Tokenizer, on every verified
# release). The list differs by release: this is the union over 5.17.0-5.25.0, so that a model type that any
# of them remaps is refused on all (5.17-5.21 add chameleon, deepseek_*, janus, step3p5; 5.20-5.21
# unlimited_ocr; 5.17 vision-encoder-decoder; internlm3 and iquestcoder come in 5.23, qwen3_5* in 5.18;
# 5.25 drops camembertv2-base).
_REMAPPED_MODEL_TYPES = frozenset((
    "arctic", "chatlm", "ernie4_5", "ernie4_5_moe", "fuyu", "h2ovl_chat", "hyperclovax", "hyperclovax_vlm",
    "hyperclovax_vision_v2", "internlm2", "internlm3", "iquestcoder", "jamba", "llava", "llava_next",
    "minicpm3", "minicpmv", "minimax_m2", "modernbert", "modernbert-decoder", "molmo", "molmo2", "nemotron",
    "nvfp4", "opencua", "openvla", "paddleocr_vl", "phi3", "phi3_v", "phimoe", "qwen2", "qwen3_5",
    "qwen3_5_moe", "qwen3_5_moe_text", "qwen4_exp", "step3_vl", "vipllava", "cohere_asr", "camembertv2-base",
    "siglip2", "smolvlm", "chameleon", "deepseek_v2", "deepseek_v3", "deepseek_v32", "deepseek_v4",
    "deepseek_vl", "deepseek_vl_hybrid", "deepseek_vl_v2", "deepseek_ocr", "deepseek_ocr2", "janus",
    "step3p5", "unlimited_ocr", "vision-encoder-decoder",
))  # fmt: skip
# MODEL_IDS_TO_TOKENIZERS_BACKEND (5.17 lacks donut): a config named so (a local dir's name is its path)
# gets TokenizersBackend.
_TOKENIZERS_BACKEND_NAMES = (
    "deepseek-ai/deepseek-r1-distill-llama-*", "deepseek-ai/deepseek-coder-*", "allenai/dolma2-tokenizer",
    "google/umt5-small", "naver-clova-ix/donut-*", "salesforce/blip2-opt-*", "salesforce/blip2-flan-t5-*",
    "salesforce/instructblip-flan-t5-*", "stepfun-ai/step-3.7-*",
)  # fmt: skip
# Qwen2Tokenizer.__init__'s defaults for the special tokens tokenizer_config.json does not set (bos: None).
QWEN2_SPECIAL_DEFAULTS = dict.fromkeys(("unk_token", "eos_token", "pad_token"), "<|endoftext|>")
# tokenization_qwen2.PRETOKENIZE_REGEX
_QWEN2_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"""
    r"""|\s+(?!\S)|\s+"""
)
# The BPE settings Qwen2Tokenizer.__init__ passes (ignore_merges: BPE's default).
_QWEN2_BPE = {
    "dropout": None, "unk_token": None, "continuing_subword_prefix": "", "end_of_word_suffix": "",
    "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
}  # fmt: skip


class Refused(Exception):
    """Why a directory's tokenizer cannot be reproduced without transformers."""


class Unverified(Refused):
    """The installed transformers is not a release whose loading rules were verified: no directory's
    tokenizer is reproduced under it."""


def tokenizer_class(path: str, config: dict[str, Any], model: dict[str, Any]) -> tuple[str, str]:
    """(TOKENIZERS_BACKEND or QWEN2_TOKENIZER, what selects it): the class ``AutoTokenizer.from_pretrained``
    builds for directory ``path`` from its tokenizer_config.json (``config``) and config.json (``model``)
    (models/auto/tokenization_auto.py); Refused for any other class, or where the choice is uncertain."""
    hub = config.get("tokenizer_class")
    model_type, model_name = (model.get(key) for key in ("model_type", "model_name"))
    if isinstance(model_name, str) and model_name in _REMAPPED_MODEL_TYPES:
        raise Refused(f"transformers overrides tokenizer_class for model_name {model_name!r}")
    if hub in _VERBATIM_CLASSES:
        if model_type == "qwen2":  # remapped to its registered class
            why = f"model_type {model_type!r}"
        elif isinstance(model_type, str) and model_type in _REMAPPED_MODEL_TYPES:
            raise Refused(f"transformers overrides tokenizer_class for model_type {model_type!r}")
        else:
            return TOKENIZERS_BACKEND, f"tokenizer_class {hub!r}"
    elif hub in _QWEN2_CLASSES:
        if not isinstance(model_type, str) or model_type not in _QWEN2_MODEL_TYPES:
            raise Refused(f"tokenizer_class {hub!r} with model_type {model_type!r} (only Qwen's are read)")
        why = f"tokenizer_class {hub!r}"
    else:
        raise Refused(f"tokenizer_class {hub!r} does not use tokenizer.json as is")
    if any(fnmatch.fnmatch(path.lower(), name) for name in _TOKENIZERS_BACKEND_NAMES):
        raise Refused(f"transformers loads {path!r} as TokenizersBackend (MODEL_IDS_TO_TOKENIZERS_BACKEND)")
    return QWEN2_TOKENIZER, why


def _state(component: Any) -> Any:
    """A normalizer's, pre-tokenizer's or decoder's serialization, as parsed JSON (None for none)."""
    return None if component is None else json.loads(component.__getstate__())


def _without_trim_offsets(state: Any) -> Any:
    """A pre-tokenizer's state without ByteLevel's trim_offsets, which only the ByteLevel post-processor
    reads (tokenizers' pre_tokenizers/byte_level.rs: pre_tokenize reads add_prefix_space and use_regex)."""
    if isinstance(state, dict) and state.get("type") == "Sequence":
        return {**state, "pretokenizers": [_without_trim_offsets(item) for item in state["pretokenizers"]]}
    if isinstance(state, dict) and state.get("type") == "ByteLevel":
        return {key: value for key, value in state.items() if key != "trim_offsets"}
    return state


def _qwen2_components(backend: Tokenizer, why: str, add_prefix_space: bool) -> tuple[Any, Any, Any]:
    """Qwen2Tokenizer's (normalizer, pre-tokenizer, decoder), as its ``__init__`` builds them, where
    tokenizer.json's BPE model and components work as they do."""
    split = pre_tokenizers.Split(Regex(_QWEN2_REGEX), behavior="isolated", invert=False)
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=add_prefix_space, use_regex=False)
    built = normalizers.NFC(), pre_tokenizers.Sequence([split, byte_level]), decoders.ByteLevel()
    model, decoder = backend.model, _state(backend.decoder)
    settings = {key: getattr(model, key, None) for key in _QWEN2_BPE}
    differs = {
        "BPE settings": not isinstance(model, BPE) or settings != _QWEN2_BPE,
        "normalizer": _state(backend.normalizer) != _state(built[0]),
        "pre-tokenizer": _without_trim_offsets(_state(backend.pre_tokenizer))
        != _without_trim_offsets(_state(built[1])),
        # ByteLevel's decode reads none of its fields (tokenizers' decoders: byte_level.rs decode_chain)
        "decoder": not isinstance(decoder, dict) or decoder.get("type") != "ByteLevel",
    }  # fmt: skip
    for what, different in differs.items():
        if different:
            raise Refused(f"{why}: transformers builds Qwen2Tokenizer, whose {what} tokenizer.json lacks")
    return built


def _added(backend: Tokenizer) -> dict[int, Any]:
    return {index: token.__getstate__() for index, token in backend.get_added_tokens_decoder().items()}


def _listed_added_tokens(path: Path) -> dict[int, AddedToken]:
    """tokenizer.json's added tokens by the ids it lists, as transformers reads them where
        tokenizer_config.json has no added_tokens_decoder (``_from_pretrained``: json.load, a later id wins);
        the tokenizers library numbers them in list order instead. Parsing the whole file is the cost of this
    reading, so it is done only where it is needed."""
    try:
        with open(path, encoding="utf-8") as file:
            listed = json.load(file)["added_tokens"]
        tokens = {}
        for fields in listed:
            index, token = fields["id"], AddedToken(**{k: v for k, v in fields.items() if k != "id"})
            if not isinstance(index, int) or isinstance(index, bool):
                raise TypeError(f"id {index!r}")
            tokens[index] = token
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise Refused(f"tokenizer.json's added_tokens as transformers reads them: {exc!r}") from exc
    return tokens


def qwen2_backend(
    backend: Tokenizer, path: Path, config: dict[str, Any], why: str, declared: dict[int, AddedToken],
    specials: list[str],
) -> Tokenizer:  # fmt: skip
    """The backend Qwen2Tokenizer builds over directory ``path``'s tokenizer.json (``backend``, read as is)
    from the declared added tokens (``TokenizersBackend.__init__`` adds them, in the order of their ids) and
    the texts of all special tokens (named, model-specific and extra); Refused unless it encodes and decodes
    as ``backend`` does."""
    if "added_tokens_decoder" not in config:  # declared: tokenizer.json's, with the ids transformers reads
        declared = _listed_added_tokens(path / "tokenizer.json")
    add_prefix_space = config.get("add_prefix_space")
    if add_prefix_space is not None and not isinstance(add_prefix_space, bool):
        raise Refused("tokenizer_config.json's add_prefix_space is not a boolean (transformers fails)")
    normalizer, pre_tokenizer, decoder = _qwen2_components(backend, why, bool(add_prefix_space))
    # Qwen2Tokenizer re-adds each special token with default flags: a no-op only where it has them already
    # (which also makes TokenizersBackend.__init__ add no special token of its own and set no flag).
    declared_as = {token.content: token.__getstate__() for token in declared.values()}
    for text in specials:
        default = AddedToken(text, special=True).__getstate__()
        if declared_as.get(text) != default:
            raise Refused(f"Qwen2Tokenizer adds special token {text!r} as {default}, not as declared")
    built = Tokenizer(backend.model)  # shares the model (vocab and merges, as transformers reads them)
    built.normalizer, built.pre_tokenizer, built.decoder = normalizer, pre_tokenizer, decoder
    built.post_processor = backend.post_processor  # tokenizer.json's, or the one update_post_processor makes
    built.encode_special_tokens = False
    if declared:
        built.add_tokens([declared[index] for index in sorted(declared)])
    if specials:
        built.add_tokens([AddedToken(text, special=True) for text in dict.fromkeys(specials)])
    if _added(built) != _added(backend):
        raise Refused("the added tokens Qwen2Tokenizer builds (new ids in id order) are not tokenizer.json's")
    return built
