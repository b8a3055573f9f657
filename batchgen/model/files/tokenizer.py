"""A checkpoint's tokenizer read with ``tokenizers`` and ``jinja2`` alone (importing transformers for
``AutoTokenizer.from_pretrained`` costs a CPU process seconds). ``FileTokenizer.open`` returns one only where
transformers builds a ``TokenizersBackend`` over ``tokenizer.json`` as is, or a ``Qwen2Tokenizer`` that
encodes and decodes as tokenizer.json does (tokenizer_classes.py), with the same special tokens and chat
template; wherever ids, decoding or rendering could differ it raises ``Refused`` with the reason, and the
caller loads the tokenizer through transformers (``model/loader.open_tokenizer``). Under a transformers
release outside the verified ones (``verified_transformers``) it raises ``Unverified``, a ``Refused``."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Tokenizer
from tokenizers.processors import TemplateProcessing

from batchgen.model.files.chat_template import TemplateRules, render_chat, template_rules, template_variables
from batchgen.model.files.tokenizer_classes import (
    QWEN2_SPECIAL_DEFAULTS,
    QWEN2_TOKENIZER,
    Refused,
    Unverified,
    qwen2_backend,
    tokenizer_class,
)

_NAMED = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
# The transformers releases whose loading and rendering this file and chat_template.py reproduce, both
# bounds included. The rules were derived from 5.24.0; each other release was verified by diffing its
# tokenizer code (tokenization_utils_tokenizers.py, tokenization_utils_base.py,
# models/auto/tokenization_auto.py, models/qwen2/tokenization_qwen2.py, utils/chat_template_utils.py)
# against 5.24.0's and by running tests/model/test_file_tokenizer*.py under it (they hold FileTokenizer to
# the installed release's rules, verified or not). They load and encode alike; rendering differs by release
# (chat_template.TemplateRules, chosen by ``rules``). Loading details that differ are refused on every
# release instead of mirrored: a model type remapped by any of them (tokenizer_classes), an empty
# extra_special_tokens beside a non-empty additional_special_tokens (before 5.18.0 the empty one wins) and a
# chat_control_tokens that is not a list (5.20.0 fails, older releases ignore it). Newer releases are
# unverified, patch releases too (5.22.2 changed rendering), so they are refused, as are dev and pre-releases
# and releases before 5.17.0 (not checked). To add one: `make upgrade-deps` runs those tests under it; then
# diff the files above and move the bound.
_OLDEST_TRANSFORMERS = (5, 17, 0)
_NEWEST_TRANSFORMERS = (5, 25, 0)
# tokenizer_config.json keys that make transformers pick another class or build or patch the backend.
_REFUSED_KEYS = (
    "auto_map", "fast_tokenizer_files", "tokenizer_object", "gguf_file", "post_processor",
    "tokenizer_padding", "tokenizer_truncation", "_json_truncation", "_json_padding", "fix_mistral_regex",
    "model_specific_special_tokens",
)  # fmt: skip


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise Refused(f"cannot read {path.name}: {exc}") from exc
    if not isinstance(data, dict):
        raise Refused(f"{path.name} is not a JSON object")
    return data


def _transformers_version() -> str | None:
    """The installed transformers' version, read from its ``__init__.py`` (importing it is what this module
    avoids; importlib.metadata scans every installed distribution); None when it is not found."""
    try:
        spec = importlib.util.find_spec("transformers")
    except (ImportError, ValueError):  # ValueError: hidden as sys.modules["transformers"] = None
        return None
    try:
        text = Path(spec.origin).read_text(encoding="utf-8") if spec and spec.origin else ""
    except (OSError, UnicodeError):
        return None
    found = re.search(r'^__version__ = "([^"]+)"', text, re.MULTILINE)
    return found.group(1) if found else None


def _release(version: str | None) -> tuple[int, int, int] | None:
    """(major, minor, patch) of a final release; None for a dev, pre- or post-release, or anything else."""
    found = re.fullmatch(r"(\d+)\.(\d+)\.(\d+)", version or "")
    return (int(found[1]), int(found[2]), int(found[3])) if found else None


def installed_release() -> tuple[int, int, int] | None:
    """The installed transformers' (major, minor, patch); None when it is absent or not a final release."""
    return _release(_transformers_version())


def verified_transformers() -> bool:
    """Whether the installed transformers is a release whose rules this module reproduces (under any other,
    ``FileTokenizer.open`` raises ``Unverified`` unless told which release's rules to follow)."""
    release = installed_release()
    return release is not None and _OLDEST_TRANSFORMERS <= release <= _NEWEST_TRANSFORMERS


def rules(release: tuple[int, int, int] | None = None) -> TemplateRules:
    """How transformers ``release`` renders chat templates; by default the installed one's, refused with
    ``Unverified`` unless it is a verified release (another one may load or render differently)."""
    if release is not None:
        return template_rules(release)
    if not verified_transformers():
        oldest, newest = (".".join(map(str, bound)) for bound in (_OLDEST_TRANSFORMERS, _NEWEST_TRANSFORMERS))
        installed = _transformers_version()
        raise Unverified(f"checked against transformers {oldest} to {newest} only (installed: {installed})")
    return template_rules(installed_release())


def _check_class(directory: Path, config: dict[str, Any]) -> tuple[str, str]:
    """(the class AutoTokenizer picks, what selects it): TokenizersBackend or Qwen2Tokenizer
    (``tokenizer_classes.tokenizer_class``). Other classes build their backends otherwise, remote code may do
    anything, and tekken.json may select MistralCommonBackend."""
    for key in _REFUSED_KEYS:
        if key in config:
            raise Refused(f"tokenizer_config.json sets {key}")
    if (directory / "tekken.json").exists():
        raise Refused("tekken.json: transformers may load MistralCommonBackend")
    model = _read_json(directory / "config.json") if (directory / "config.json").exists() else {}
    return tokenizer_class(str(directory), config, model)


def _check_options(config: dict[str, Any]) -> list[str]:
    """Options that change transformers' encode or decode, or make its constructor fail; returns the
    ``model_input_names`` (what ``apply_chat_template(tokenize=True)`` returns)."""
    for key in ("split_special_tokens", "clean_up_tokenization_spaces"):
        if config.get(key):
            raise Refused(f"tokenizer_config.json sets {key}")
    for key in ("padding_side", "truncation_side"):
        if config.get(key, "right") not in ("right", "left"):
            raise Refused(f"tokenizer_config.json's {key} is neither right nor left")
    control = config.get("chat_control_tokens")  # a list only matters to sanitize_control_tokens
    if control is not None and not isinstance(control, list):  # 5.20.0+ fails, older releases ignore it
        raise Refused("tokenizer_config.json's chat_control_tokens is not a list (transformers 5.20+ fails)")
    names = config.get("model_input_names", ["input_ids", "attention_mask"])
    if not isinstance(names, list) or not all(isinstance(name, str) for name in names):
        raise Refused("model_input_names is not a list of names")
    return names


def _chat_template(directory: Path, config: dict[str, Any]) -> str | None:
    """chat_template.jinja wins over tokenizer_config.json's ``chat_template``; named templates (a list, or
    files in additional_chat_templates/) make transformers' attribute a dict, which is not supported."""
    named = directory / "additional_chat_templates"
    if named.is_dir() and any(named.glob("*.jinja")):
        raise Refused("named chat templates (additional_chat_templates/)")
    if (directory / "chat_template.jinja").is_file():
        with open(directory / "chat_template.jinja", encoding="utf-8") as file:  # text mode, as transformers
            return file.read()
    template = config.get("chat_template")
    if template is not None and not isinstance(template, str):
        raise Refused("named chat templates (tokenizer_config.json's chat_template is not a string)")
    return template


def _backend(directory: Path) -> Tokenizer:
    """tokenizer.json as TokenizersBackend leaves it: a missing post-processor becomes the one
    ``update_post_processor`` builds (add_bos/add_eos_token are dropped when tokenizer.json exists)."""
    try:
        backend = Tokenizer.from_file(str(directory / "tokenizer.json"))
    except Exception as exc:  # tokenizers raises plain Exception on a bad file
        raise Refused(f"cannot read tokenizer.json: {exc}") from exc
    if backend.truncation is not None or backend.padding is not None:
        raise Refused("tokenizer.json enables truncation or padding (transformers toggles them per call)")
    if backend.post_processor is None:
        backend.post_processor = TemplateProcessing(single="$A:0", pair="$A:0 $B:1", special_tokens=[])
    backend.encode_special_tokens = False
    return backend


def _added_token(fields: dict[str, Any], where: str) -> AddedToken:
    try:
        return AddedToken(**fields)
    except (TypeError, ValueError) as exc:
        raise Refused(f"{where}: {exc}") from exc


def _content(value: Any, key: str) -> str | None:
    """A special token's text: transformers takes a string or a serialized AddedToken, and fails on else."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, dict) and value.get("__type") == "AddedToken":
        return _added_token({k: v for k, v in value.items() if k != "__type"}, key).content
    raise Refused(f"{key} is neither a string nor an AddedToken")


def _legacy_special_map(directory: Path) -> dict[str, Any]:
    """special_tokens_map.json, which transformers reads only when tokenizer_config.json has no
    ``added_tokens_decoder``; its entries override the config's."""
    path = directory / "special_tokens_map.json"
    found = _read_json(path) if path.exists() else {}
    for key, value in found.items():
        if key not in _NAMED:
            raise Refused(f"special_tokens_map.json sets {key}")
        if isinstance(value, dict):
            fields = {k: v for k, v in value.items() if k != "special"}
            found[key] = _added_token({**fields, "special": True}, key).content
    return found


def _declared_tokens(directory: Path, config: dict[str, Any], backend: Tokenizer) -> dict[int, AddedToken]:
    """The added tokens TokenizersBackend.__init__ re-adds: tokenizer_config.json's, or tokenizer.json's own.
    Re-adding is a no-op only when they equal tokenizer.json's exactly (id and every flag)."""
    existing = backend.get_added_tokens_decoder()
    if "added_tokens_decoder" not in config:
        if (directory / "added_tokens.json").exists():
            raise Refused("added_tokens.json (transformers adds its tokens)")
        return existing
    declared = config["added_tokens_decoder"]
    if not isinstance(declared, dict) or not all(isinstance(v, dict) for v in declared.values()):
        raise Refused("added_tokens_decoder is not a map of token dicts")
    tokens = {}
    for index, fields in declared.items():
        token = _added_token(fields, "added_tokens_decoder")
        number = int(index) if index.isdigit() else -1
        if number not in existing or existing[number].__getstate__() != token.__getstate__():
            raise Refused(f"added_tokens_decoder's {index}: {fields} differs from tokenizer.json")
        tokens[number] = token
    return tokens


def _special_tokens(config: dict[str, Any]) -> tuple[dict[str, str], list[str]]:
    """(name -> text of the named and model-specific special tokens, the extra special tokens), as
    ``PreTrainedTokenizerBase.__init__`` sorts them; model-specific ones are template variables too."""
    named = {key: _content(config.get(key), key) for key in _NAMED}
    specials = {key: text for key, text in named.items() if text is not None}
    for key, value in config.items():
        is_token = isinstance(value, str) or (isinstance(value, dict) and value.get("__type") == "AddedToken")
        if key.endswith("_token") and key not in _NAMED and is_token:
            specials[key] = _content(value, key)
    # additional_special_tokens is the older name: used where extra_special_tokens is unset, and from 5.18.0
    # also where it is empty (before, an empty one wins)
    empty_extra = "extra_special_tokens" in config and not config["extra_special_tokens"]
    if empty_extra and config.get("additional_special_tokens"):
        raise Refused("extra_special_tokens is empty and additional_special_tokens is not (releases differ)")
    extra = config.get("extra_special_tokens") or config.get("additional_special_tokens")
    if isinstance(extra, dict):
        specials.update({key: _content(value, key) or "" for key, value in extra.items()})
        extra = None
    if extra is not None and not isinstance(extra, (list, tuple)):
        raise Refused("extra_special_tokens is neither a list nor a dict")
    return specials, [_content(value, "extra_special_tokens") or "" for value in extra or ()]


def _check_special_tokens(
    directory: Path, config: dict[str, Any], backend: Tokenizer, defaults: dict[str, str]
) -> tuple[dict[str, str], list[str], dict[int, AddedToken]]:
    """(the special tokens by name, the texts of all of them, the declared added tokens), with the class's
    ``defaults`` for tokens that no file sets. transformers adds every special token that is not an added
    token yet (new ids, new splits) and marks a declared token special when it names one: both change the
    backend, so both are refused."""
    declared = _declared_tokens(directory, config, backend)
    if "added_tokens_decoder" not in config:
        config = {**config, **_legacy_special_map(directory)}
    specials, extra = _special_tokens({**defaults, **config})
    added = {token.content for token in backend.get_added_tokens_decoder().values()}
    for text in [*specials.values(), *extra]:
        if text not in added:
            raise Refused(f"special token {text!r} is not an added token of tokenizer.json")
    named = set(specials.values())
    if any(token.content in named and not token.special for token in declared.values()):
        raise Refused("a named special token is not marked special (transformers would change it)")
    return specials, [*specials.values(), *extra], declared


class FileTokenizer:
    """What batchgen uses of a transformers tokenizer, with transformers' semantics. ``bos_token``,
    ``eos_token_id`` and the other special tokens (and their ids) are looked up like transformers'."""

    split_special_tokens = False  # both refused when set: transformers' encode/decode differ then
    clean_up_tokenization_spaces = False

    def __init__(
        self, backend: Tokenizer, name_or_path: str, specials: dict[str, str], chat_template: str | None,
        model_input_names: list[str], template_rules: TemplateRules,
    ) -> None:  # fmt: skip
        self.backend_tokenizer = backend
        self.name_or_path = name_or_path
        self.chat_template = chat_template
        self.model_input_names = model_input_names
        self._specials = specials
        self.template_rules = template_rules  # how the installed transformers renders chat templates
        self._transformers: Any = None

    @classmethod
    def open(cls, path: str, release: tuple[int, int, int] | None = None) -> FileTokenizer:
        """The tokenizer of checkpoint directory ``path`` as transformers ``release`` loads it (by default the
        installed release, which must be a verified one); ``Refused`` with the reason where it may differ."""
        directory = Path(path)
        release_rules = rules(release)
        for name in ("tokenizer.json", "tokenizer_config.json"):
            if not (directory / name).is_file():
                raise Refused(f"no {name}")
        config = _read_json(directory / "tokenizer_config.json")
        name, why = _check_class(directory, config)
        names, template = _check_options(config), _chat_template(directory, config)
        backend = _backend(directory)
        qwen2 = name == QWEN2_TOKENIZER
        defaults = QWEN2_SPECIAL_DEFAULTS if qwen2 else {}
        specials, texts, declared = _check_special_tokens(directory, config, backend, defaults)
        if qwen2:  # the backend as Qwen2Tokenizer builds it, where it encodes as tokenizer.json's
            backend = qwen2_backend(backend, directory, config, why, declared, texts)
        return cls(backend, str(path), specials, template, names, release_rules)

    def __getattr__(self, name: str) -> Any:
        """``eos_token`` -> its text, ``eos_token_id`` -> its id (None when unset), as transformers."""
        specials = self.__dict__.get("_specials", {})
        token_name = name.removesuffix("_id")
        if token_name not in _NAMED and token_name not in specials:
            raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")
        text = specials.get(token_name)
        return text if text is None or token_name == name else self.backend_tokenizer.token_to_id(text)

    @property
    def special_tokens_map(self) -> dict[str, str]:
        return dict(self._specials)

    def __len__(self) -> int:
        return self.backend_tokenizer.get_vocab_size(with_added_tokens=True)

    def __repr__(self) -> str:
        return f"FileTokenizer({self.name_or_path!r}, vocab={len(self)}, special_tokens={self._specials})"

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        if not isinstance(text, str):
            raise TypeError("FileTokenizer.encode takes one string")
        return self.backend_tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, token_ids: Any, skip_special_tokens: bool = False) -> str | list[str]:
        """One sequence's text, or a list of texts for a list of sequences (as transformers)."""
        ids = token_ids.tolist() if hasattr(token_ids, "tolist") else token_ids
        ids = [ids] if isinstance(ids, int) else ids
        if ids and isinstance(ids[0], (list, tuple)):
            return [self.backend_tokenizer.decode(list(seq), skip_special_tokens) for seq in ids]
        return self.backend_tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def apply_chat_template(
        self,
        conversation: list[dict[str, Any]],
        tools: list[dict] | None = None,
        documents: list[dict] | None = None,
        chat_template: str | None = None,
        add_generation_prompt: bool = False,
        tokenize: bool = True,
        return_dict: bool = True,
        **kwargs: Any,
    ) -> str | list[int] | dict[str, list[int]]:
        """The rendered text (``tokenize=False``), else its ids encoded without special tokens: a dict of
        ``model_input_names`` (transformers' BatchEncoding, as a plain dict) or, with ``return_dict=False``,
        the list of ids. Other keyword arguments are template variables, as in transformers."""
        template = chat_template if chat_template is not None else self.chat_template
        if template is None:
            raise ValueError("Cannot use chat template functions because tokenizer.chat_template is not set")
        variables = template_variables(self._specials, kwargs)
        text = render_chat(
            template,
            conversation,
            add_generation_prompt,
            tools,
            documents,
            variables,
            rules=self.template_rules,
        )
        if not tokenize:
            return text
        encoding = self.backend_tokenizer.encode(text, add_special_tokens=False)
        if not return_dict:
            return encoding.ids
        fields = {"token_type_ids": encoding.type_ids, "attention_mask": encoding.attention_mask}
        return {"input_ids": encoding.ids} | {k: v for k, v in fields.items() if k in self.model_input_names}

    def transformers_tokenizer(self) -> Any:
        """transformers' own tokenizer for this directory (xgrammar reads it), loaded on first use."""
        if self._transformers is None:
            from transformers import AutoTokenizer

            self._transformers = AutoTokenizer.from_pretrained(self.name_or_path)
        return self._transformers
