"""Which reader opens a checkpoint (``model/loader.open_checkpoint``): its own files for the models
batchgen's fused forward runs, transformers for the rest; and a run of such a model never imports
transformers."""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import sys

import pytest
from transformers import GenerationConfig

from batchgen.config import EngineConfig
from batchgen.model.files import tokenizer as file_tokenizer
from batchgen.model.files.checkpoint_config import FileConfig, read_config
from batchgen.model.files.generation import GenerationDefaults, read_generation_defaults
from batchgen.model.files.tokenizer import FileTokenizer, verified_transformers
from batchgen.model.loader import TRANSFORMERS_READERS_ENV, open_checkpoint


def _same_as_transformers(defaults: GenerationDefaults, config: GenerationConfig) -> None:
    for name in GenerationDefaults._fields:
        assert getattr(defaults, name) == getattr(config, name), name


def test_generation_defaults_read_from_generation_config_json(tmp_path, tiny_llama):
    model = shutil.copytree(tiny_llama, tmp_path / "m")
    fields = {"do_sample": True, "temperature": 0.6, "top_p": 0.9, "top_k": 20, "eos_token_id": [2, 7]}
    (model / "generation_config.json").write_text(json.dumps(fields))
    defaults = read_generation_defaults(str(model), 99)
    _same_as_transformers(defaults, GenerationConfig.from_pretrained(model))
    assert defaults == GenerationDefaults(True, 0.6, 0.9, 20, [2, 7])


def test_generation_defaults_without_generation_config_come_from_the_model_config(tmp_path, tiny_llama):
    from transformers import AutoConfig

    model = shutil.copytree(tiny_llama, tmp_path / "m")
    (model / "generation_config.json").unlink()
    raw = json.loads((model / "config.json").read_text()) | {"temperature": 0.3, "eos_token_id": 5}
    (model / "config.json").write_text(json.dumps(raw))
    defaults = read_generation_defaults(str(model), read_config(str(model)).eos_token_id)
    _same_as_transformers(defaults, GenerationConfig.from_model_config(AutoConfig.from_pretrained(model)))
    assert defaults == GenerationDefaults(eos_token_id=5)  # config.json's temperature is no config field


@pytest.mark.parametrize("arch", ["llama", "qwen2", "mistral", "qwen3"])
def test_fused_models_open_from_their_files(tiny_models, arch):
    checkpoint = open_checkpoint(tiny_models[arch], EngineConfig(model=tiny_models[arch]))
    assert isinstance(checkpoint.config, FileConfig)
    assert isinstance(checkpoint.generation, GenerationDefaults)
    # transformers gives a qwen2 model its own tokenizer class, which rebuilds the pre-tokenizer
    file_tokenizer = arch != "qwen2" and verified_transformers()
    assert isinstance(checkpoint.tokenizer, FileTokenizer) == file_tokenizer


@pytest.mark.parametrize(
    "options, env",
    [
        ({"model_impl": "transformers"}, {}),
        ({"trust_remote_code": True}, {}),
        ({}, {TRANSFORMERS_READERS_ENV: "1"}),
    ],
)
def test_transformers_reads_what_the_files_readers_are_not_asked_to(tiny_llama, monkeypatch, options, env):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    checkpoint = open_checkpoint(tiny_llama, EngineConfig(model=tiny_llama, **options))
    assert not isinstance(checkpoint.config, FileConfig)
    assert isinstance(checkpoint.generation, GenerationConfig)
    # the tokenizer does not depend on the forward: only remote code or the variable send it to transformers
    file_tokenizer = not env and "trust_remote_code" not in options and verified_transformers()
    assert isinstance(checkpoint.tokenizer, FileTokenizer) == file_tokenizer


@pytest.mark.parametrize("version", ["9.0.0", "5.16.0", "5.99.0.dev0"])
def test_an_unverified_transformers_release_gives_its_own_tokenizer_and_says_so(
    tiny_llama, monkeypatch, caplog, version
):
    """A transformers release outside the verified ones (simulated): the checkpoint still opens, with
    transformers' tokenizer, which encodes; one line says why the start-up is slower."""
    monkeypatch.setattr(file_tokenizer, "_transformers_version", lambda: version)
    with caplog.at_level(logging.DEBUG, logger="batchgen"):
        checkpoint = open_checkpoint(tiny_llama, EngineConfig(model=tiny_llama))
    assert not isinstance(checkpoint.tokenizer, FileTokenizer)
    assert checkpoint.tokenizer.encode("Hello") == FileTokenizer.open(tiny_llama, (5, 24, 0)).encode("Hello")
    said = [record for record in caplog.records if record.name == "batchgen"]
    assert len(said) == 1 and said[0].levelno == logging.INFO
    assert f"installed: {version}" in said[0].getMessage() and "through transformers" in said[0].getMessage()


def test_random_weights_read_the_config_through_transformers(tiny_llama):
    checkpoint = open_checkpoint(tiny_llama, EngineConfig(model=tiny_llama, load_format="random"))
    assert not isinstance(checkpoint.config, FileConfig)


_RUN_AND_LIST_MODULES = """
import sys
from batchgen.cli import main
try:
    main(["run", sys.argv[1], sys.argv[2], "--model", sys.argv[3], "--max-new-tokens", "3"])
except SystemExit as done:
    assert done.code == 0, done.code
print(sorted({m.split(".")[0] for m in sys.modules}))
"""


def test_a_run_of_a_fused_model_never_imports_transformers(tmp_path, tiny_llama):
    rows = tmp_path / "in.jsonl"
    rows.write_text("".join(json.dumps({"prompt": f"Say {i}"}) + "\n" for i in range(3)))
    argv = [sys.executable, "-c", _RUN_AND_LIST_MODULES, str(rows), str(tmp_path / "out.jsonl"), tiny_llama]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    modules = json.loads(done.stdout.strip().splitlines()[-1].replace("'", '"'))
    # a transformers release whose tokenizer rules are not verified loads the tokenizer through it
    assert ("transformers" in modules) == (not verified_transformers())
    assert len((tmp_path / "out.jsonl").read_text().splitlines()) == 3
