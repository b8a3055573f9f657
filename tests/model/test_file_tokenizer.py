"""``FileTokenizer`` (model/files/tokenizer.py) against its oracle, ``transformers.AutoTokenizer``: the same
ids, decoded text, special tokens and rendered chat templates for the embedded model's directory and for
variants of it, and a refusal (None) for every variant where transformers would load differently.

The comparisons run against whatever transformers is installed, with FileTokenizer held to that release's
rules (``open_as_installed``), so that a new release is checked by the same tests before it is added to the
verified ones. Outside those, ``FileTokenizer.open`` refuses every directory (``Unverified``), and that is
tested."""

from __future__ import annotations

import copy
import json
import os
import pickle
import random
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from batchgen.model.files import tokenizer as file_tokenizer
from batchgen.model.files.tokenizer import FileTokenizer, verified_transformers
from tests.model.tokenizer_cases import (
    CONVERSATIONS,
    CORPUS,
    INSTALLED,
    RICH_KWARGS,
    RICH_MESSAGES,
    RICH_TEMPLATE,
    heavy_modules_after,
    open_as_installed,
)

_DROP = object()  # a tokenizer_config.json key to remove


def _variant(src: str, dest: Path, config=None, model=None, remove=(), files=None, edit_json=None) -> str:
    """A copy of the tokenizer files of ``src`` with tokenizer_config.json keys set (or ``_DROP``ped),
    config.json keys set, files removed or written, and tokenizer.json edited."""
    dest.mkdir()
    for name in ("tokenizer_config.json", "config.json", "chat_template.jinja"):
        if name not in remove and (Path(src) / name).exists():
            shutil.copy(Path(src) / name, dest / name)
    if "tokenizer.json" not in remove:
        _write_tokenizer_json(Path(src) / "tokenizer.json", dest / "tokenizer.json", edit_json)
    for name, fields in (("tokenizer_config.json", config), ("config.json", model)):
        if fields:
            data = json.loads((dest / name).read_text())
            data.update(fields)
            (dest / name).write_text(json.dumps({k: v for k, v in data.items() if v is not _DROP}))
    for name, text in (files or {}).items():
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        (dest / name).write_bytes(text.encode())
    return str(dest)


def _write_tokenizer_json(src: Path, dest: Path, edit) -> None:
    if edit is None:
        os.symlink(src, dest)  # 3.5 MB: link it when unchanged
        return
    data = json.loads(src.read_text())
    edit(data)
    dest.write_text(json.dumps(data))


def _same_tokenizer(mine: FileTokenizer, theirs) -> None:
    assert mine.backend_tokenizer.to_str() == theirs.backend_tokenizer.to_str()
    assert len(mine) == len(theirs)
    tokens = [*file_tokenizer._NAMED, *theirs.special_tokens_map]
    names = [*tokens, *(token + "_id" for token in tokens), "special_tokens_map", "chat_template"]
    names += ["name_or_path", "split_special_tokens", "clean_up_tokenization_spaces"]
    assert {name: getattr(mine, name) for name in names} == {name: getattr(theirs, name) for name in names}
    for special in (True, False):
        want = [theirs.encode(text, add_special_tokens=special) for text in CORPUS]
        assert [mine.encode(text, add_special_tokens=special) for text in CORPUS] == want


def test_the_embedded_tokenizer_matches_transformers(ft, hf):
    _same_tokenizer(ft, hf)


@pytest.mark.parametrize("special", [True, False])
def test_batch_encoding_through_the_backend_matches_transformers_encode(ft, hf, special):
    encodings = ft.backend_tokenizer.encode_batch(CORPUS, add_special_tokens=special)
    assert [e.ids for e in encodings] == [hf.encode(text, add_special_tokens=special) for text in CORPUS]


@pytest.mark.parametrize("skip", [True, False])
def test_decoding_random_ids_matches_transformers(ft, hf, skip):
    rng = random.Random(0)
    specials = list(range(17))  # the added (special) tokens of the embedded tokenizer
    seqs = [
        [rng.choice(specials) if rng.random() < 0.2 else rng.randrange(len(hf)) for _ in range(n)]
        for n in range(40)
    ]
    for ids in [*seqs, 2]:
        assert ft.decode(ids, skip_special_tokens=skip) == hf.decode(ids, skip_special_tokens=skip)
    assert ft.decode(seqs, skip_special_tokens=skip) == hf.decode(seqs, skip_special_tokens=skip)


def _tokenizer_json_decoder(path: str) -> dict[str, dict]:
    """added_tokens_decoder as save_pretrained writes it: tokenizer.json's added tokens."""
    added = json.loads((Path(path) / "tokenizer.json").read_text())["added_tokens"]
    return {str(t["id"]): {k: v for k, v in t.items() if k != "id"} for t in added}


_LEGACY_MAP = {"bos_token": {"content": "<|endoftext|>", "lstrip": False}, "pad_token": None}
_TYPED_TOKEN = {"__type": "AddedToken", "content": "<|im_end|>"}  # how transformers 4 saved AddedTokens
# fmt: off
ACCEPTED: dict[str, dict[str, Any]] = {
    # the generic class, add_bos/eos_token (dropped when tokenizer.json exists), added_tokens_decoder equal to
    # tokenizer.json's, model-specific and extra special tokens, no post-processor, a config template
    "generic": {
        "config": {
            "tokenizer_class": "PreTrainedTokenizerFast", "add_bos_token": True, "add_eos_token": True,
            "added_tokens_decoder": "from tokenizer.json", "image_token": "<filename>",
            "extra_special_tokens": ["<gh_stars>"], "chat_template": RICH_TEMPLATE + "{{ image_token }}",
            "chat_control_tokens": ["<filename>"],
        },
        "remove": ["chat_template.jinja"], "edit_json": lambda data: data.update(post_processor=None),
    },
    "legacy special_tokens_map.json": {
        "config": {"additional_special_tokens": ["<gh_stars>"], "unk_token": _TYPED_TOKEN},
        "files": {"special_tokens_map.json": json.dumps(_LEGACY_MAP)},
    },
    "extra special tokens as a dict": {
        "config": {
            "extra_special_tokens": {"image_token": "<filename>", "video_token": "<reponame>"},
            "chat_template": "{{ image_token }}{{ video_token }}{{ messages[0].content }}",
        },
        "remove": ["chat_template.jinja"],
    },
    "chat_template.jinja over the config's, newlines read in text mode": {
        "config": {"chat_template": "CONFIG {{ messages[0].content }}"},
        "files": {"chat_template.jinja": "JINJA\r\n{% for m in messages %}{{ m.content }}\r\n{% endfor %}"},
    },
}
# fmt: on


@pytest.mark.parametrize("case", ACCEPTED)
def test_accepted_variants_match_transformers(default_model_path, tmp_path, case):
    variant = copy.deepcopy(ACCEPTED[case])
    if variant["config"].get("added_tokens_decoder"):
        variant["config"]["added_tokens_decoder"] = _tokenizer_json_decoder(default_model_path)
    path = _variant(default_model_path, tmp_path / "v", **variant)
    mine, theirs = open_as_installed(path), AutoTokenizer.from_pretrained(path)
    _same_tokenizer(mine, theirs)
    kwargs = {**RICH_KWARGS, "add_generation_prompt": True, "tokenize": False}
    assert mine.apply_chat_template(RICH_MESSAGES, **kwargs) == theirs.apply_chat_template(
        RICH_MESSAGES, **kwargs
    )


def _decoder_with(**changes) -> dict:
    token = {"content": "<|im_start|>", "lstrip": False, "normalized": False, "rstrip": False}
    return {"1": {**token, "single_word": False, "special": True, **changes}}


def _set_token(index: int, **changes):
    return lambda data: data["added_tokens"][index].update(changes)


_TRUNCATION = {"direction": "Right", "max_length": 8, "strategy": "LongestFirst", "stride": 0}
_NEW_TOKEN = {"49152": _decoder_with(content="<new>")["1"]}
_LEGACY_EXTRA = '{"additional_special_tokens": ["<gh_stars>"]}'


# case -> (what the refusal says, how the variant differs from the embedded tokenizer's directory)
def _config(**fields) -> dict[str, Any]:
    return {"config": fields}


def _decoder(tokens: dict) -> dict[str, Any]:
    return {"config": {"added_tokens_decoder": tokens}}


# fmt: off
REFUSALS: dict[str, tuple[str, dict[str, Any]]] = {
    "no tokenizer.json": ("no tokenizer.json", {"remove": ["tokenizer.json"]}),
    "no tokenizer_config.json": ("no tokenizer_config.json", {"remove": ["tokenizer_config.json"]}),
    "GPT2 class": ("tokenizer_class", _config(tokenizer_class="GPT2TokenizerFast")),
    "Llama class": ("tokenizer_class", _config(tokenizer_class="LlamaTokenizerFast")),
    "Qwen2 class": ("tokenizer_class", _config(tokenizer_class="Qwen2Tokenizer")),
    "no class": ("tokenizer_class", _config(tokenizer_class=_DROP)),
    "auto_map": ("auto_map", _config(auto_map={"AutoTokenizer": [None, "tok.Custom"]})),
    "split_special_tokens": ("split_special_tokens", _config(split_special_tokens=True)),
    "clean_up_spaces": ("clean_up", _config(clean_up_tokenization_spaces=True)),
    "chat_control_tokens not a list": ("chat_control_tokens", _config(chat_control_tokens="<|im_end|>")),
    "template list": ("named chat templates", {
        **_config(chat_template=[{"name": "default", "template": "x"}]), "remove": ["chat_template.jinja"]}),
    "template dir": ("named chat templates", {"files": {"additional_chat_templates/tool_use.jinja": "x"}}),
    "decoder content": ("added_tokens_decoder", _decoder(_decoder_with(content="<s>"))),
    "decoder id": ("added_tokens_decoder", _decoder({"5": _decoder_with()["1"]})),
    "decoder lstrip": ("added_tokens_decoder", _decoder(_decoder_with(lstrip=True))),
    "decoder special": ("added_tokens_decoder", _decoder(_decoder_with(special=False))),
    "decoder new token": ("added_tokens_decoder", _decoder(_NEW_TOKEN)),
    "pad not added": ("'<pad>' is not an added token", _config(pad_token="<pad>")),
    "pad a plain vocab token": ("'the' is not an added token", _config(pad_token="the")),
    "pad a plain dict": ("pad_token is neither", _config(pad_token={"content": "<|im_end|>"})),
    "model token not added": ("'<image>' is not an added token", _config(image_token="<image>")),
    "extra token not added": ("'<tool>' is not an added token", _config(extra_special_tokens=["<tool>"])),
    "empty extra tokens": (
        "releases differ", _config(extra_special_tokens=[], additional_special_tokens=["<gh_stars>"])),
    "remapped model type": ("model_type 'qwen2'", {"model": {"model_type": "qwen2"}}),
    "remapped before 5.22": ("model_type 'deepseek_v3'", {"model": {"model_type": "deepseek_v3"}}),
    "tekken.json": ("tekken.json", {"files": {"tekken.json": "{}"}}),
    "fix_mistral_regex": ("fix_mistral_regex", _config(fix_mistral_regex=True)),
    "fast_tokenizer_files": ("fast_tokenizer_files", _config(fast_tokenizer_files=["tokenizer.json"])),
    "truncation": ("truncation", {"edit_json": lambda data: data.update(truncation=_TRUNCATION)}),
    "eos not special": ("not marked special", {"edit_json": _set_token(2, special=False)}),
    "legacy extra tokens": ("special_tokens_map.json", {"files": {"special_tokens_map.json": _LEGACY_EXTRA}}),
    "legacy added_tokens.json": ("added_tokens.json", {"files": {"added_tokens.json": '{"<new>": 49152}'}}),
}
# fmt: on
# The refusals whose variant, read as is, encodes or decodes differently from what transformers builds.
_DIFFERING = ["pad not added", "split_special_tokens", "decoder lstrip", "eos not special", "truncation"]


@pytest.mark.parametrize("case", REFUSALS)
def test_refuses_where_transformers_may_differ(default_model_path, tmp_path, case):
    reason, variant = REFUSALS[case]
    path = _variant(default_model_path, tmp_path / "v", **variant)
    with pytest.raises(file_tokenizer.Refused, match=re.escape(reason)):
        open_as_installed(path)


@pytest.mark.parametrize("case", [*_DIFFERING, "remapped model type"])
def test_reading_a_refused_variant_as_is_would_differ_from_transformers(default_model_path, tmp_path, case):
    """Why the refusals matter: tokenizer.json read as is (what FileTokenizer would use) is not what
    transformers builds, or not how it encodes or decodes."""
    path = _variant(default_model_path, tmp_path / "v", **REFUSALS[case][1])
    theirs, as_is = AutoTokenizer.from_pretrained(path), Tokenizer.from_file(f"{path}/tokenizer.json")
    same_backend = theirs.backend_tokenizer.to_str() == as_is.to_str()
    same_ids = [theirs.encode(text) for text in CORPUS] == [e.ids for e in as_is.encode_batch(CORPUS)]
    ids = list(range(40))
    same_text = theirs.decode(ids, skip_special_tokens=True) == as_is.decode(ids, skip_special_tokens=True)
    assert not (same_backend and same_ids and same_text)


def test_transformers_fails_on_chat_control_tokens_that_are_not_a_list(default_model_path, tmp_path):
    """5.20.0 and newer fail, older releases ignore it: refused on every release."""
    path = _variant(default_model_path, tmp_path / "v", **REFUSALS["chat_control_tokens not a list"][1])
    if INSTALLED < (5, 20, 0):
        assert AutoTokenizer.from_pretrained(path) is not None  # ignored
        return
    with pytest.raises(TypeError, match="chat_control_tokens"):
        AutoTokenizer.from_pretrained(path)


@pytest.mark.parametrize(
    "version, verified",
    [
        ("5.23.0", True), ("5.24.0", True), ("5.22.2", True), ("5.17.0", True), ("5.16.0", False),
        ("4.57.6", False),
        ("5.25.0", True), ("5.25.1", False), ("5.26.0", False), ("6.0.0", False), ("5.24.0.dev0", False),
        ("5.24.0rc1", False),
        ("5.23.0.post1", False), ("", False), (None, False),
    ],
)  # fmt: skip
def test_only_verified_releases_are_accepted(default_model_path, monkeypatch, version, verified):
    monkeypatch.setattr(file_tokenizer, "_transformers_version", lambda: version)
    assert verified_transformers() == verified
    if verified:
        release = file_tokenizer.installed_release()
        assert FileTokenizer.open(default_model_path).template_rules == file_tokenizer.rules(release)
        return
    with pytest.raises(file_tokenizer.Unverified, match=re.escape(f"installed: {version}")):
        FileTokenizer.open(default_model_path)
    explicit = FileTokenizer.open(default_model_path, release=(5, 22, 1))  # that release's rules, asked for
    assert explicit.template_rules == file_tokenizer.rules((5, 22, 1))


def test_copies_and_pickles_keep_encoding(ft):
    for clone in (copy.deepcopy(ft), pickle.loads(pickle.dumps(ft))):
        assert [clone.encode(t) for t in CORPUS] == [ft.encode(t) for t in CORPUS]
        assert clone.eos_token_id == ft.eos_token_id and clone.chat_template == ft.chat_template
        assert clone.apply_chat_template(CONVERSATIONS[1], tokenize=False) == ft.apply_chat_template(
            CONVERSATIONS[1], tokenize=False
        )


def test_transformers_tokenizer_is_loaded_once(default_model_path):
    tokenizer = open_as_installed(default_model_path)
    real = tokenizer.transformers_tokenizer()
    assert isinstance(real, PreTrainedTokenizerBase) and real is tokenizer.transformers_tokenizer()
    assert real.name_or_path == default_model_path


def test_loading_does_not_import_transformers(default_model_path):
    assert heavy_modules_after(f"FileTokenizer.open({default_model_path!r}, release=INSTALLED)") == []
