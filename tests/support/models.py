"""Tiny random decoder-only models that share the embedded model's tokenizer, saved as local dirs."""

from __future__ import annotations

from pathlib import Path

import torch

from batchgen.model.loader import tokenizer_path

# Small enough for CI, shaped like the real families (GQA, qk-norm for Qwen3, biases for Qwen2).
TINY_CONFIGS: dict[str, dict] = {
    "llama": dict(
        model_type="llama",
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=2048,
    ),
    "qwen2": dict(
        model_type="qwen2",
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=1,
        max_position_embeddings=2048,
    ),
    "mistral": dict(
        model_type="mistral",
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=2048,
        sliding_window=None,
    ),
    "qwen3": dict(
        model_type="qwen3",
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=2048,
    ),
    # Mixture of experts (dims multiples of 8: torch's CPU grouped GEMM, which transformers' experts use,
    # wants 16-byte strides). Each has a dense layer where its architecture allows one.
    "qwen3_moe": dict(
        model_type="qwen3_moe",
        hidden_size=64,
        intermediate_size=128,
        moe_intermediate_size=32,
        num_experts=8,
        num_experts_per_tok=2,
        norm_topk_prob=True,
        mlp_only_layers=[1],
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=2048,
    ),
    "qwen2_moe": dict(  # layer 0 dense (decoder_sparse_step 2), shared expert with its sigmoid gate
        model_type="qwen2_moe",
        hidden_size=64,
        intermediate_size=96,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=64,
        num_experts=8,
        num_experts_per_tok=3,
        norm_topk_prob=False,
        decoder_sparse_step=2,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
    ),
    "mixtral": dict(
        model_type="mixtral",
        hidden_size=64,
        intermediate_size=64,
        num_local_experts=4,
        num_experts_per_tok=2,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=2048,
    ),
    # No fused forward in batchgen (GeGLU MLP, scaled embeddings): transformers' forward, and under
    # --tensor-parallel transformers' tp_plan. Untied: tied random embeddings (scaled like lm_head below)
    # make a model that repeats its last token.
    "gemma": dict(
        model_type="gemma",
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=2048,
    ),
    "olmoe": dict(  # q/k norms over the whole projection width
        model_type="olmoe",
        hidden_size=64,
        intermediate_size=32,
        num_experts=8,
        num_experts_per_tok=2,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=2048,
    ),
}
DENSE_ARCHS = ("llama", "qwen2", "mistral", "qwen3")
MOE_ARCHS = ("qwen3_moe", "qwen2_moe", "mixtral", "olmoe")


def build_tiny_model(arch: str, out_dir: str | Path, seed: int = 0) -> Path:
    """Save a random ``arch`` model with the embedded model's tokenizer into ``out_dir``."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    out_dir = Path(out_dir)
    if (out_dir / "config.json").exists():
        return out_dir
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path())
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


def random_llama(hidden: int, layers: int, heads: int, kv_heads: int, intermediate: int, vocab: int,
                 device: str, dtype: torch.dtype, lm_head_scale: float = 8.0, seed: int = 0):  # fmt: skip
    """A random Llama-shaped model built directly on ``device`` (no download, no CPU init)."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(
        hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
        intermediate_size=intermediate, vocab_size=vocab, max_position_embeddings=4096,
        tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=2,
    )  # fmt: skip
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    with torch.no_grad():  # decisive argmax: greedy comparisons across kernels must not hit near-ties
        model.lm_head.weight.mul_(lm_head_scale)
    return model.eval()
