"""FileTokenizer's chat templates (model/files/chat_template.py) against transformers' rendering of the
same template and messages: text and ids, template features, errors, the sandbox and the rules of each
transformers release."""

from __future__ import annotations

import copy
from pathlib import Path

import jinja2
import pytest

from batchgen.model.files import tokenizer as file_tokenizer
from batchgen.model.files.chat_template import TemplateRules, template_rules
from batchgen.model.files.tokenizer import FileTokenizer
from tests.model.tokenizer_cases import CONVERSATIONS, RICH_KWARGS, RICH_MESSAGES, RICH_TEMPLATE


@pytest.mark.parametrize("prompt", [True, False])
@pytest.mark.parametrize("messages", CONVERSATIONS, ids=range(len(CONVERSATIONS)))
def test_chat_template_renders_and_tokenizes_as_transformers(ft, hf, messages, prompt):
    for options in ({"tokenize": False}, {"return_dict": False}, {}):  # text, ids, BatchEncoding
        mine = ft.apply_chat_template(messages, add_generation_prompt=prompt, **options)
        theirs = hf.apply_chat_template(messages, add_generation_prompt=prompt, **options)
        assert mine == (theirs if options else dict(theirs))


@pytest.mark.parametrize("prompt", [True, False])
def test_template_features_render_as_transformers(ft, hf, prompt):
    kwargs = {**RICH_KWARGS, "add_generation_prompt": prompt, "tokenize": False}
    mine = ft.apply_chat_template(copy.deepcopy(RICH_MESSAGES), chat_template=RICH_TEMPLATE, **kwargs)
    theirs = hf.apply_chat_template(copy.deepcopy(RICH_MESSAGES), chat_template=RICH_TEMPLATE, **kwargs)
    assert mine == theirs
    assert "<assistant>ok<|im_end|>" in mine and "count=3 last=user" in mine  # generation, continue, break
    assert "x<y>&" in mine  # no HTML escaping
    # the installed release's rules: reasoning aliased (5.21.0+), None-valued keys dropped (5.23.0+)
    assert ('"thinking": "because"' in mine) == ft.template_rules.alias_reasoning
    assert ('"name": null' in mine) == (not ft.template_rules.drop_none_keys)
    assert mine.endswith("<assistant>") == prompt


def test_template_errors_raise_as_in_transformers(ft, hf):
    template = "{{ raise_exception('no ' + messages[0].role) }}"
    for tokenizer in (ft, hf):
        with pytest.raises(jinja2.TemplateError):
            tokenizer.apply_chat_template(CONVERSATIONS[0], chat_template=template, tokenize=False)


# Templates the strict sandbox (5.22.2+) refuses, and older releases render (to the text given: the
# sandbox hides underscore attributes).
SANDBOXED = {
    "{% set ns = namespace(_hidden=1) %}{{ ns._hidden }}": "",
    "{% set ns = namespace() %}{% set ns._hidden = 2 %}{{ ns._hidden }}": "",
    "{{ dict is mapping }}{{ dict.__name__ is defined }}": "FalseTrue",
}


@pytest.mark.parametrize("template", SANDBOXED)
def test_the_sandbox_rule_of_the_installed_release_is_followed(ft, hf, template):
    rendered = []
    for tokenizer in (ft, hf):
        try:
            rendered.append(
                tokenizer.apply_chat_template(CONVERSATIONS[0], chat_template=template, tokenize=False)
            )
        except jinja2.TemplateError as exc:
            rendered.append(type(exc))
    assert rendered[0] == rendered[1]
    if "namespace" in template:
        assert rendered[0] == (
            jinja2.exceptions.SecurityError if ft.template_rules.strict_sandbox else SANDBOXED[template]
        )


@pytest.mark.parametrize(
    "version, rules",
    [
        ("5.17.0", (False, False, False)), ("5.20.2", (False, False, False)),
        ("5.21.0", (False, True, False)), ("5.22.1", (False, True, False)), ("5.22.2", (False, True, True)),
        ("5.23.0", (True, True, True)), ("5.24.0", (True, True, True)),
        ("5.25.0", (True, True, True)),
    ],
)  # fmt: skip
def test_template_rules_follow_the_release(default_model_path, monkeypatch, version, rules):
    release = tuple(int(part) for part in version.split("."))
    assert template_rules(release) == TemplateRules(*rules)
    monkeypatch.setattr(file_tokenizer, "_transformers_version", lambda: version)
    assert FileTokenizer.open(default_model_path).template_rules == TemplateRules(*rules)


def test_unsupported_inputs_raise_instead_of_rendering_differently(ft):
    with pytest.raises(NotImplementedError):
        ft.apply_chat_template(CONVERSATIONS[0], continue_final_message=True, tokenize=False)
    with pytest.raises(NotImplementedError):
        ft.apply_chat_template([CONVERSATIONS[0]], tokenize=False)
    with pytest.raises(TypeError):
        ft.apply_chat_template([{"role": "user", "content": Path("x")}], tokenize=False)
    with pytest.raises(ValueError):
        ft.apply_chat_template([], tokenize=False)
