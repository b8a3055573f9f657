"""A tiny random model that can think: the embedded tokenizer with ``<think>`` and ``</think>`` added as
single tokens (not special, as Qwen3 has them) and a chat template with a thinking block."""

from __future__ import annotations

from pathlib import Path

import torch

from tests.support.models import TINY_CONFIGS, tokenizer_path

_SYSTEM = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] "
    "+ '<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
)
# Qwen3's switch: thinking on, the model opens its block itself; off, the prompt holds an empty one.
QWEN3_TEMPLATE = (
    _SYSTEM + "{% if enable_thinking is defined and enable_thinking is false %}"
    "{{ '<think>\\n\\n</think>\\n\\n' }}{% endif %}{% endif %}"
)
# Qwen3.5's (and DeepSeek-R1's later ones, thinking on): the generation prompt opens the block.
OPENING_TEMPLATE = (
    _SYSTEM + "{% if enable_thinking is defined and enable_thinking is false %}"
    "{{ '<think>\\n\\n</think>\\n\\n' }}{% else %}{{ '<think>\\n' }}{% endif %}{% endif %}"
)


def build_thinking_model(out_dir: str | Path, chat_template: str = QWEN3_TEMPLATE, seed: int = 0) -> Path:
    """Save a random tiny Llama whose tokenizer has the think tokens into ``out_dir``."""
    from transformers import AddedToken, AutoConfig, AutoModelForCausalLM, AutoTokenizer

    out_dir = Path(out_dir)
    if (out_dir / "config.json").exists():
        return out_dir
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path())
    tokenizer.add_tokens([AddedToken(text, special=False) for text in ("<think>", "</think>")])
    tokenizer.chat_template = chat_template
    fields = dict(TINY_CONFIGS["llama"])
    config = AutoConfig.for_model(
        fields.pop("model_type"), vocab_size=len(tokenizer), bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=False,
        **fields,
    )  # fmt: skip
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():  # decisive argmax, as the other tiny models
        model.lm_head.weight.mul_(8.0)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir
