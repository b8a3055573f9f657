"""``FileTokenizer`` for Qwen's tokenizer class (model/files/tokenizer_classes.py) against its oracle,
``transformers.AutoTokenizer``, in this process: Qwen-style checkpoints built here without the hub (a
byte-level BPE derived from the embedded model's merges, Qwen's added tokens, its tokenizer.json layout and
a Qwen3-like tokenizer_config.json and chat template) load with the same backend, ids, decoded text,
special tokens and rendered chats; and every variant where tokenizer.json does not encode or decode as the
Qwen2Tokenizer transformers builds is refused, with reading it as is shown to differ where it would."""

from __future__ import annotations

import copy
import json
import random
import re
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer
from tokenizers.pre_tokenizers import ByteLevel
from transformers import AutoTokenizer

from batchgen.model.files import tokenizer as file_tokenizer
from batchgen.model.files.tokenizer import FileTokenizer
from tests.model.qwen_tokenizer_cases import (
    BYTE_LEVEL,
    CONVERSATIONS,
    CORPUS,
    MARKS_REGEX,
    PLAIN,
    QWEN3_TEMPLATE,
    QWEN_REGEX,
    SPECIAL,
    TOOLS,
)
from tests.model.tokenizer_cases import heavy_modules_after, open_as_installed

_DROP = "<drop this key>"  # a tokenizer_config.json key to remove
_BOTH = (True, False)


# Merges across GPT-2's pre-tokenizer boundaries ("(self", ".\n\n") and a letter with a combining mark
# ("x\u0301"), as Qwen's vocabulary has: where pre-tokenizers differ, ids do too.
_QWEN_MERGES = [["(", "self"], [".", "ĊĊ"], ["Ì", "ģ"], ["x", "Ìģ"]]


@pytest.fixture(scope="module")
def merges(default_model_path) -> list[list[str]]:
    """The first merges of the embedded model's byte-level BPE (trained with GPT-2's pre-tokenizer) and a
    few of Qwen's kind: a small Qwen-like vocabulary."""
    source = json.loads((Path(default_model_path) / "tokenizer.json").read_text())["model"]["merges"]
    return source[:6000] + _QWEN_MERGES


def _tokenizer_json(merges: list[list[str]], plain: list[str]) -> dict[str, Any]:
    """A tokenizer.json laid out as Qwen2.5's and Qwen3's: byte alphabet and merges, the added tokens right
    after the vocab, ByteLevel components with every flag false (trim_offsets differs from what
    Qwen2Tokenizer builds; tokenizers ignores it there)."""
    vocab = {char: index for index, char in enumerate(sorted(ByteLevel.alphabet()))}
    for left, right in merges:
        vocab.setdefault(left + right, len(vocab))
    added = [
        {"id": len(vocab) + index, "content": text, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": text in SPECIAL}
        for index, text in enumerate(SPECIAL + plain)
    ]  # fmt: skip
    split = {"type": "Split", "pattern": {"Regex": QWEN_REGEX}, "behavior": "Isolated", "invert": False}
    bpe = {
        "type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
        "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
        "vocab": vocab,
        "merges": [f"{left} {right}" for left, right in merges],
    }  # fmt: skip
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [split, dict(BYTE_LEVEL)]},
        "post_processor": dict(BYTE_LEVEL), "decoder": dict(BYTE_LEVEL), "model": bpe,
    }  # fmt: skip


def _qwen_dir(merges, dest: Path, model=None, config=None, edit_json=None, files=None, qwen25=False) -> str:
    """A Qwen3-style tokenizer directory (Qwen2.5-style: ``qwen25``) with config.json and
    tokenizer_config.json keys set (or ``_DROP``ped), tokenizer.json edited and files written."""
    dest.mkdir(parents=True)
    data = _tokenizer_json(merges, PLAIN[:8] if qwen25 else PLAIN)
    if edit_json:
        edit_json(data)
    decoder = {str(t["id"]): {k: v for k, v in t.items() if k != "id"} for t in data["added_tokens"]}
    (dest / "tokenizer.json").write_text(json.dumps(data, ensure_ascii=False))
    tokenizer_config = {
        "add_bos_token": False, "add_prefix_space": False, "added_tokens_decoder": decoder,
        "additional_special_tokens": SPECIAL[1:], "bos_token": None, "chat_template": QWEN3_TEMPLATE,
        "clean_up_tokenization_spaces": False, "eos_token": "<|im_end|>", "errors": "replace",
        "model_max_length": 131072, "pad_token": "<|endoftext|>", "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer", "unk_token": None, **(config or {}),
    }  # fmt: skip
    tokenizer_config = {key: value for key, value in tokenizer_config.items() if value != _DROP}
    (dest / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    model = {"model_type": "qwen3", "transformers_version": "4.51.0", **(model or {})}
    (dest / "config.json").write_text(json.dumps(model))
    for name, text in (files or {}).items():
        (dest / name).write_text(text)
    return str(dest)


def _same_tokenizer(mine: FileTokenizer, theirs) -> None:
    """The same backend, special tokens, ids, decoded text and chat rendering."""
    assert mine.backend_tokenizer.to_str() == theirs.backend_tokenizer.to_str()
    assert len(mine) == len(theirs)
    tokens = [*file_tokenizer._NAMED, *theirs.special_tokens_map]
    names = [*tokens, *(token + "_id" for token in tokens), "special_tokens_map", "chat_template"]
    names += ["name_or_path", "split_special_tokens", "clean_up_tokenization_spaces", "model_input_names"]
    assert {name: getattr(mine, name) for name in names} == {name: getattr(theirs, name) for name in names}
    for special in (True, False):
        want = [theirs.encode(text, add_special_tokens=special) for text in CORPUS]
        assert [mine.encode(text, add_special_tokens=special) for text in CORPUS] == want
    rng = random.Random(0)
    added = sorted(theirs.added_tokens_decoder)
    seqs = [theirs.encode(text) for text in CORPUS]
    pick = lambda: rng.choice(added) if rng.random() < 0.3 else rng.randrange(len(theirs))
    seqs += [[pick() for _ in range(n)] for n in range(30)]
    for skip in (True, False):
        assert [mine.decode(ids, skip_special_tokens=skip) for ids in seqs] == theirs.batch_decode(seqs, skip)
    if theirs.chat_template is None:
        return
    for messages in CONVERSATIONS:
        for options in (
            {"add_generation_prompt": True, "tokenize": False}, {"tools": TOOLS, "tokenize": False},
            {"add_generation_prompt": True, "enable_thinking": False, "return_dict": False}, {},
        ):  # fmt: skip
            mine_out = mine.apply_chat_template(copy.deepcopy(messages), **options)
            theirs_out = theirs.apply_chat_template(copy.deepcopy(messages), **options)
            assert mine_out == (theirs_out if options else dict(theirs_out))


def _as_is_differs(path: str, texts=CORPUS) -> bool:
    """Whether tokenizer.json read as is encodes or decodes otherwise than what transformers builds."""
    theirs, as_is = AutoTokenizer.from_pretrained(path), Tokenizer.from_file(f"{path}/tokenizer.json")
    if [theirs.encode(text) for text in texts] != [e.ids for e in as_is.encode_batch(list(texts))]:
        return True
    ids = list(range(len(theirs) - 40, len(theirs))) + theirs.encode(texts[-1])
    return any(theirs.decode(ids, skip_special_tokens=skip) != as_is.decode(ids, skip) for skip in _BOTH)


def _set(**changes):
    return lambda data: data.update(changes)


def _bpe(**changes):
    return lambda data: data["model"].update(changes)


def _set_token(text: str, **changes):
    def edit(data):
        next(t for t in data["added_tokens"] if t["content"] == text).update(changes)

    return edit


def _pre_tokenizer(**changes):
    def edit(data):
        split, byte_level = data["pre_tokenizer"]["pretokenizers"]
        split["pattern"]["Regex"] = changes.get("regex", QWEN_REGEX)
        byte_level.update({key: value for key, value in changes.items() if key != "regex"})

    return edit


def _added_ids_gap(data):
    for token in data["added_tokens"][5:]:
        token["id"] += 1


def _swap_ids(data):
    first, second = data["added_tokens"][5:7]
    first["id"], second["id"] = second["id"], first["id"]


_PREFIX_SPACE = _pre_tokenizer(add_prefix_space=True)


def _drop_added(text: str):
    return lambda data: data.update(added_tokens=[t for t in data["added_tokens"] if t["content"] != text])


def _saved_by_transformers(merges, dest: Path) -> str:
    """A Qwen3 directory loaded and saved again by transformers (a fine-tuned checkpoint's files)."""
    AutoTokenizer.from_pretrained(_qwen_dir(merges, dest / "src")).save_pretrained(dest / "saved")
    (dest / "saved" / "config.json").write_text((dest / "src" / "config.json").read_text())
    return str(dest / "saved")


_TOKENIZERS_BACKEND = {"tokenizer_class": "TokenizersBackend"}
_NO_DECODER = {"added_tokens_decoder": _DROP}  # tokenizer_config.json without it: tokenizer.json's are read
_NO_SPECIALS = dict.fromkeys([*file_tokenizer._NAMED, "additional_special_tokens"], _DROP)


def _transformers_flags(data):
    """ByteLevel's flags as Qwen2Tokenizer sets them: trim_offsets in the pre-tokenizer, all decoder ones."""
    _pre_tokenizer(trim_offsets=True)(data)
    data["decoder"] = {**BYTE_LEVEL, "add_prefix_space": True, "trim_offsets": True, "use_regex": True}


# case -> how the directory differs from Qwen3's layout (a qwen3 model with tokenizer_class Qwen2Tokenizer)
# fmt: off
ACCEPTED: dict[str, dict[str, Any]] = {
    "qwen3": {},
    "qwen2.5 (model_type qwen2)": {"qwen25": True, "model": {"model_type": "qwen2"}},
    "qwen2 remaps TokenizersBackend": {"model": {"model_type": "qwen2"}, "config": _TOKENIZERS_BACKEND},
    "qwen2 remaps PreTrainedTokenizerFast": {
        "model": {"model_type": "qwen2"}, "config": {"tokenizer_class": "PreTrainedTokenizerFast"}},
    "Qwen2TokenizerFast, qwen3_moe": {
        "config": {"tokenizer_class": "Qwen2TokenizerFast"}, "model": {"model_type": "qwen3_moe"}},
    # Qwen2Tokenizer's own defaults: unk, eos and pad <|endoftext|>, bos None
    "class defaults, tokenizer.json's added tokens": {"config": {**_NO_SPECIALS, **_NO_DECODER}},
    "add_prefix_space": {"config": {"add_prefix_space": True}, "edit_json": _PREFIX_SPACE},
    "ByteLevel flags as Qwen2Tokenizer sets them": {"edit_json": _transformers_flags},
    "no post-processor, chat_template.jinja, model-specific token": {
        "edit_json": _set(post_processor=None), "config": {"image_token": "<|image_pad|>"},
        "files": {"chat_template.jinja": "{{ image_token }}" + QWEN3_TEMPLATE}},
    # tokenizers numbers added tokens in list order, transformers in the order of their ids: the same here
    "added token ids with a gap": {"edit_json": _added_ids_gap, "config": _NO_DECODER},
    "bos token, extra special tokens as a list": {"config": {
        "bos_token": "<|endoftext|>", "extra_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "additional_special_tokens": _DROP}},
}
# fmt: on


@pytest.mark.parametrize("case", ACCEPTED)
def test_qwen_tokenizers_match_transformers(merges, tmp_path, case):
    path = _qwen_dir(merges, tmp_path / "q", **ACCEPTED[case])
    mine, theirs = open_as_installed(path), AutoTokenizer.from_pretrained(path)
    assert type(theirs).__name__ == "Qwen2Tokenizer"
    _same_tokenizer(mine, theirs)


def test_a_qwen_tokenizer_saved_by_transformers_matches(merges, tmp_path):
    path = _saved_by_transformers(merges, tmp_path)
    assert json.loads(Path(path, "tokenizer_config.json").read_text())["tokenizer_class"] == "Qwen2Tokenizer"
    _same_tokenizer(open_as_installed(path), AutoTokenizer.from_pretrained(path))


def test_qwen3_with_tokenizers_backend_class_is_read_as_is(merges, tmp_path):
    """qwen3 is not remapped: its TokenizersBackend keeps tokenizer.json as is, trim_offsets included."""
    path = _qwen_dir(merges, tmp_path / "q", config={"tokenizer_class": "TokenizersBackend"})
    theirs = AutoTokenizer.from_pretrained(path)
    assert type(theirs).__name__ == "TokenizersBackend"
    assert theirs.backend_tokenizer.to_str() == Tokenizer.from_file(f"{path}/tokenizer.json").to_str()
    _same_tokenizer(open_as_installed(path), theirs)


_DROP_THINK = {"added_tokens_decoder": "drop <think>"}  # an added_tokens_decoder without it
# case -> (what the refusal says, how the directory differs from Qwen3's layout)
# fmt: off
REFUSALS: dict[str, tuple[str, dict[str, Any]]] = {
    "no normalizer": ("normalizer", {"edit_json": _set(normalizer=None)}),
    "NFKC": ("normalizer", {"edit_json": _set(normalizer={"type": "NFKC"})}),
    "Qwen3.5 regex (\\p{M})": ("pre-tokenizer", {"edit_json": _pre_tokenizer(regex=MARKS_REGEX)}),
    "ByteLevel regex": ("pre-tokenizer", {"edit_json": _pre_tokenizer(use_regex=True)}),
    "add_prefix_space in tokenizer.json": ("pre-tokenizer", {"edit_json": _PREFIX_SPACE}),
    "add_prefix_space in the config": ("pre-tokenizer", {"config": {"add_prefix_space": True}}),
    "add_prefix_space not a boolean": ("not a boolean", {"config": {"add_prefix_space": 1}}),
    "no decoder": ("decoder", {"edit_json": _set(decoder=None)}),
    "ignore_merges": ("BPE settings", {"edit_json": _bpe(ignore_merges=True)}),
    "byte_fallback": ("BPE settings", {"edit_json": _bpe(byte_fallback=True)}),
    "no continuing_subword_prefix": ("BPE settings", {"edit_json": _bpe(continuing_subword_prefix=None)}),
    "special token lstrip": ("'<|im_end|>'", {"edit_json": _set_token("<|im_end|>", lstrip=True),
                                              "config": _NO_DECODER}),
    "extra special token not special": ("'<think>'", {"config": {"extra_special_tokens": ["<think>"]}}),
    "special token missing": ("'<|im_end|>' is not an added token", {"edit_json": _drop_added("<|im_end|>"),
                                                                      "config": _NO_DECODER}),
    "default unk missing": ("'<|endoftext|>' is not an added token", {
        "edit_json": _drop_added("<|endoftext|>"),
        "config": {**_NO_DECODER, "unk_token": _DROP, "pad_token": "<|im_end|>"}}),
    "added tokens out of id order": ("not tokenizer.json's", {"edit_json": _swap_ids, "config": _NO_DECODER}),
    "added token ids with a gap, declared": ("added_tokens_decoder", {"edit_json": _added_ids_gap}),
    "added_tokens_decoder lacks <think>": ("not tokenizer.json's", {"config": _DROP_THINK}),
    "Qwen2Tokenizer for llama": ("tokenizer_class 'Qwen2Tokenizer' with model_type 'llama'",
                                 {"model": {"model_type": "llama"}}),
    "Qwen2Tokenizer for qwen3_5": ("model_type 'qwen3_5'", {"model": {"model_type": "qwen3_5"}}),
    "GPT2 class for qwen3": ("'GPT2Tokenizer'", {"config": {"tokenizer_class": "GPT2Tokenizer"}}),
    "model_name remapped": ("model_name 'phi3'", {"model": {"model_name": "phi3"}}),
}
# fmt: on
# The refusals whose tokenizer.json, read as is, encodes or decodes otherwise than transformers.
# fmt: off
_DIFFERING = [
    "no normalizer", "NFKC", "Qwen3.5 regex (\\p{M})", "ByteLevel regex", "add_prefix_space in the config",
    "add_prefix_space in tokenizer.json", "no decoder", "special token lstrip",
    "extra special token not special", "added tokens out of id order", "added_tokens_decoder lacks <think>",
]
# fmt: on


def _refused_dir(merges, tmp_path: Path, case: str) -> str:
    variant = copy.deepcopy(REFUSALS[case][1])
    if variant.get("config") == _DROP_THINK:
        path = _qwen_dir(merges, tmp_path / "full")
        decoder = json.loads(Path(path, "tokenizer_config.json").read_text())["added_tokens_decoder"]
        decoder = {index: token for index, token in decoder.items() if token["content"] != "<think>"}
        variant["config"] = {"added_tokens_decoder": decoder}
    return _qwen_dir(merges, tmp_path / "q", **variant)


@pytest.mark.parametrize("case", REFUSALS)
def test_refuses_where_qwen2tokenizer_may_differ(merges, tmp_path, case):
    path = _refused_dir(merges, tmp_path, case)
    with pytest.raises(file_tokenizer.Refused, match=re.escape(REFUSALS[case][0])):
        open_as_installed(path)


@pytest.mark.parametrize("case", _DIFFERING)
def test_reading_a_refused_qwen_variant_as_is_would_differ_from_transformers(merges, tmp_path, case):
    path = _refused_dir(merges, tmp_path, case)
    assert type(AutoTokenizer.from_pretrained(path)).__name__ == "Qwen2Tokenizer"
    assert _as_is_differs(path)


@pytest.mark.parametrize("model_type", ["qwen2", "qwen3"])
def test_the_embedded_smollm2_tokenizer_json_is_not_qwen2tokenizers(default_model_path, tmp_path, model_type):
    """SmolLM2's tokenizer.json (ByteLevel with GPT-2's regex, no normalizer) is not Qwen2Tokenizer's: read as
    is, "x\\r\\ny" is [104, 201, 198, 105], transformers' Qwen2Tokenizer gives [104, 2738, 105]."""
    source = Path(default_model_path)
    for name in ("tokenizer.json", "chat_template.jinja"):
        (tmp_path / name).symlink_to(source / name)
    config = json.loads((source / "tokenizer_config.json").read_text())
    classes = {"qwen2": config["tokenizer_class"], "qwen3": "Qwen2Tokenizer"}  # qwen2 remaps the saved class
    config["tokenizer_class"] = classes[model_type]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": model_type}))
    with pytest.raises(file_tokenizer.Refused, match="whose normalizer tokenizer.json lacks"):
        open_as_installed(str(tmp_path))
    theirs = AutoTokenizer.from_pretrained(str(tmp_path))
    assert type(theirs).__name__ == "Qwen2Tokenizer"
    assert Tokenizer.from_file(str(tmp_path / "tokenizer.json")).encode("x\r\ny").ids == [104, 201, 198, 105]
    assert theirs.encode("x\r\ny") == [104, 2738, 105]


def test_a_directory_named_as_a_tokenizers_backend_model_is_refused(merges, tmp_path, monkeypatch):
    """AutoTokenizer gives names matching MODEL_IDS_TO_TOKENIZERS_BACKEND (a local dir's name is its path)
    TokenizersBackend, whatever the class."""
    monkeypatch.chdir(tmp_path)
    path = "deepseek-ai/deepseek-coder-1b"
    _qwen_dir(merges, tmp_path / path)
    assert type(AutoTokenizer.from_pretrained(path)).__name__ == "TokenizersBackend"
    with pytest.raises(file_tokenizer.Refused, match="MODEL_IDS_TO_TOKENIZERS_BACKEND"):
        open_as_installed(path)


def test_an_unverified_transformers_release_refuses_qwen(merges, tmp_path, monkeypatch):
    monkeypatch.setattr(file_tokenizer, "_transformers_version", lambda: "9.0.0")
    with pytest.raises(file_tokenizer.Unverified):
        FileTokenizer.open(_qwen_dir(merges, tmp_path / "q"))


def test_loading_qwen_does_not_import_transformers(merges, tmp_path):
    path = _qwen_dir(merges, tmp_path / "q")
    ids = Tokenizer.from_file(f"{path}/tokenizer.json").encode("<|im_start|>x").ids
    probe = f"FileTokenizer.open({path!r}, release=INSTALLED).encode('<|im_start|>x') == {ids}"
    assert heavy_modules_after(probe) == []
