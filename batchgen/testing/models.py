"""Tiny random decoder-only models that share the embedded model's tokenizer, saved as local dirs."""

from __future__ import annotations

from pathlib import Path

import torch

from batchgen.model.loader import default_model_dir

# Small enough for CI, shaped like the real families (GQA, qk-norm for Qwen3, biases for Qwen2).
TINY_CONFIGS: dict[str, dict] = {
    "llama": dict(
        model_type="llama", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=2048,
    ),
    "qwen2": dict(
        model_type="qwen2", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=1, max_position_embeddings=2048,
    ),
    "mistral": dict(
        model_type="mistral", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=2048,
        sliding_window=None,
    ),
    "qwen3": dict(
        model_type="qwen3", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=2048,
    ),
}


def build_tiny_model(arch: str, out_dir: str | Path, seed: int = 0) -> Path:
    """Save a random ``arch`` model with the embedded model's tokenizer into ``out_dir``."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    out_dir = Path(out_dir)
    if (out_dir / "config.json").exists():
        return out_dir
    tokenizer = AutoTokenizer.from_pretrained(default_model_dir())
    fields = dict(TINY_CONFIGS[arch])
    model_type = fields.pop("model_type")
    config = AutoConfig.for_model(
        model_type,
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
        **fields,
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():  # larger logits make greedy argmax decisive (no near-ties in the oracle)
        model.lm_head.weight.mul_(8.0)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir
