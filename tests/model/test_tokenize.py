"""Batch decoding of completions (the writer thread) against the tokenizer's own ``decode``, and batched
prompt encoding (the prompt thread) against transformers' own encoding."""

from __future__ import annotations

import copy
import threading

import pytest
from transformers import AutoTokenizer

from batchgen.model.tokenize import (
    backend_only,
    batch_decoder,
    build_messages,
    encode_prompt,
    encode_rendered,
    render_prompt,
    tokenizer_for_thread,
)
from tests.model.tokenizer_cases import open_as_installed
from tests.support.chat_template_cases import THINK_TEMPLATE, WEATHER_TOOL, rendered
from tests.support.models import tokenizer_path


def _sequences(tokenizer) -> list[list[int]]:
    texts = ["Hello, world!  It's  fine .", "naïve café — 東京 🙂", "", "a\n\n b\tc"]
    seqs = [tokenizer.encode(t, add_special_tokens=False) for t in texts]
    special = [tokenizer.eos_token_id, *seqs[0], tokenizer.eos_token_id]  # dropped by skip_special_tokens
    split = seqs[1][:3]  # may end inside a multi-byte character
    return [*seqs, special, split, list(range(0, 3000, 7))]


def test_batch_decode_matches_decode_one_at_a_time():
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path())
    seqs = _sequences(tokenizer)
    want = [tokenizer.decode(ids, skip_special_tokens=True) for ids in seqs]
    assert batch_decoder(tokenizer)(seqs) == want


def test_a_tokenizer_that_cleans_up_spaces_decodes_through_its_own_decode():
    tokenizer = copy.deepcopy(AutoTokenizer.from_pretrained(tokenizer_path()))
    tokenizer.clean_up_tokenization_spaces = True
    calls = []
    decode = tokenizer.decode
    tokenizer.decode = lambda ids, **kw: calls.append(ids) or decode(ids, **kw)
    seqs = _sequences(tokenizer)
    assert batch_decoder(tokenizer)(seqs) == [decode(ids, skip_special_tokens=True) for ids in seqs]
    assert calls == seqs


_PROMPTS = [
    "Hello, world!  It's  fine .",
    "naïve café — 東京 🙂",
    "a\n\n b\tc ",
    "<|im_start|>user\nliteral special tokens in a prompt<|im_end|>",
    " leading space",
    "x" * 3000,
]


def _old_encode(tokenizer, prompt, chat: bool, system_prompt=None) -> list[int]:
    """What encode_prompt did through transformers alone: the oracle of the batched path."""
    if not chat:
        return list(tokenizer.encode(prompt, add_special_tokens=True))
    ids = tokenizer.apply_chat_template(
        build_messages(prompt, system_prompt), add_generation_prompt=True, tokenize=True
    )
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def test_batched_encoding_gives_transformers_ids():
    """Rendered prompts encoded in one Rust call give exactly transformers' ids: chat-templated (with and
    without a system prompt) and raw, mixed in one batch as the prompt thread sends them."""
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path())
    rendered, want = [], []
    for i, prompt in enumerate(_PROMPTS):
        for chat, system in ((True, None), (True, "Be brief."), (False, None)):
            rendered.append(render_prompt(tokenizer, prompt, chat, system))
            want.append(_old_encode(tokenizer, prompt, chat, system))
        messages = [
            {"role": "user", "content": prompt},
            {"role": "assistant", "content": "ok"},
            {"role": "user", "content": str(i)},
        ]
        rendered.append(render_prompt(tokenizer, messages))
        want.append(_old_encode(tokenizer, messages, True))
    assert encode_rendered(tokenizer, rendered) == want
    assert [encode_prompt(tokenizer, p, False) for p in _PROMPTS] == want[2::4]


def test_a_tokenizer_without_a_rust_backend_encodes_one_at_a_time():
    tokenizer = copy.deepcopy(AutoTokenizer.from_pretrained(tokenizer_path()))
    rendered = [render_prompt(tokenizer, p) for p in _PROMPTS[:3]]
    want = encode_rendered(tokenizer, rendered)
    calls = []
    encode = tokenizer.encode
    tokenizer.split_special_tokens = True  # the backend would then differ from transformers' encode: not used
    tokenizer.encode = lambda text, **kw: calls.append(text) or encode(text, **kw)
    got = encode_rendered(tokenizer, rendered)
    assert calls == [r.text for r in rendered]
    assert len(got) == len(want)


def test_threads_share_a_backend_only_tokenizer_and_copy_any_other():
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path())
    assert tokenizer_for_thread(tokenizer) is tokenizer
    cleaning = copy.deepcopy(tokenizer)
    cleaning.clean_up_tokenization_spaces = True  # decodes through transformers' Python
    splitting = copy.deepcopy(tokenizer)
    splitting.split_special_tokens = True  # encodes through transformers' encode, which may reconfigure it
    for other in (cleaning, splitting):
        own = tokenizer_for_thread(other)
        assert own is not other and own.backend_tokenizer is not other.backend_tokenizer


@pytest.mark.parametrize("kind", ["transformers", "file"])
def test_a_shared_tokenizer_gives_each_thread_what_one_thread_gets(kind):
    """The prompt thread encodes and renders while the writer decodes, on one tokenizer (transformers' or
    the lean start-up's ``FileTokenizer``), the GIL given up inside both Rust calls: every result is the
    one a lone thread gets, and neither call fails."""
    path = str(tokenizer_path())
    loaded = AutoTokenizer.from_pretrained(path) if kind == "transformers" else open_as_installed(path)
    tokenizer = tokenizer_for_thread(loaded)
    assert tokenizer is loaded
    rendered = [render_prompt(tokenizer, p) for p in _PROMPTS] * 8
    seqs = _sequences(tokenizer) * 8
    want_ids, want_texts = encode_rendered(tokenizer, rendered), batch_decoder(tokenizer)(seqs)
    results: dict[str, list] = {"ids": [], "texts": [], "errors": []}

    def encode() -> None:
        for _ in range(40):
            again = [render_prompt(tokenizer, p) for p in _PROMPTS] * 8
            results["ids"].append(encode_rendered(tokenizer, again) == want_ids)

    def decode() -> None:
        for _ in range(40):
            results["texts"].append(batch_decoder(tokenizer)(seqs) == want_texts)

    def guarded(work):
        def run() -> None:
            try:
                work()
            except Exception as exc:  # e.g. "Already borrowed" from a shared Rust object
                results["errors"].append(exc)

        return threading.Thread(target=run)

    threads = [guarded(encode), guarded(decode), guarded(decode)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results["errors"] == []
    assert results["ids"] == [True] * 40 and results["texts"] == [True] * 80


@pytest.mark.parametrize("setting", ["truncation", "padding"])
def test_a_tokenizer_json_that_truncates_or_pads_encodes_as_transformers_and_is_not_shared(setting):
    """Its Rust backend would truncate or pad every prompt (transformers' ``encode`` turns that off, and
    so changes the backend: never shared between threads)."""
    clean = AutoTokenizer.from_pretrained(tokenizer_path())
    rendered = [render_prompt(clean, p) for p in _PROMPTS[:4]]
    want = encode_rendered(clean, rendered)
    tokenizer = copy.deepcopy(clean)
    if setting == "truncation":
        tokenizer.backend_tokenizer.enable_truncation(max_length=8)
    else:
        tokenizer.backend_tokenizer.enable_padding(length=600)
    assert not backend_only(tokenizer) and tokenizer_for_thread(tokenizer) is not tokenizer
    assert encode_rendered(tokenizer, rendered) == want


@pytest.fixture(scope="module", params=["transformers", "files"])
def either_tokenizer(request):
    """transformers' tokenizer and batchgen's file-based one: both must honour the template options."""
    if request.param == "transformers":
        return AutoTokenizer.from_pretrained(tokenizer_path())
    return open_as_installed(tokenizer_path())


def test_a_given_chat_template_its_variables_and_tools_are_what_renders(either_tokenizer):
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather?"}]
    text = render_prompt(
        either_tokenizer, chat, chat_template=THINK_TEMPLATE, chat_template_kwargs={"enable_thinking": True},
        tools=[WEATHER_TOOL],
    )  # fmt: skip
    assert text == (rendered(chat, thinking=True, tools="get_weather"), False)
    plain = render_prompt(either_tokenizer, "Hi", chat_template=THINK_TEMPLATE)
    assert plain.text == rendered([{"role": "user", "content": "Hi"}], thinking=False)
    assert render_prompt(either_tokenizer, "Hi").text != plain.text  # the model's own template otherwise


def test_a_given_chat_template_serves_a_model_without_one(either_tokenizer, monkeypatch):
    monkeypatch.setattr(either_tokenizer, "chat_template", None)
    chat = [{"role": "user", "content": "Hi"}]
    with pytest.raises(ValueError, match="--chat-template"):
        render_prompt(either_tokenizer, chat)
    assert render_prompt(either_tokenizer, "Hi") == ("Hi", True)  # a plain prompt goes raw
    given = render_prompt(either_tokenizer, chat, chat=True, chat_template=THINK_TEMPLATE)
    assert given.text == rendered(chat, thinking=False)
    ids = encode_prompt(either_tokenizer, chat, chat_template=THINK_TEMPLATE)
    assert ids == either_tokenizer.encode(given.text, add_special_tokens=False)
