"""A small FP8 model's forward on the GPU kernels, its logits saved to a file: the PDL and split-sum tests
compare two runs of it (each in a fresh process where a switch is decided once per process)."""

from __future__ import annotations

import torch


def fp8_forward_logits(path: str, intermediate: int = 3072) -> None:
    """A small Qwen3-shaped FP8 model (weights and cache) on the GPU kernels: prompt chunks, then decode
    steps (RMSNorm, rotary write, decode attention and its merge, FP8 products with split-K sums, SiLU),
    the logits saved to ``path``. Run in a fresh process: PDL is decided once per process."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from batchgen.config import EngineConfig
    from batchgen.distributed.group import ParallelGroup
    from batchgen.kernels.fp8_format import FP8
    from batchgen.model.backends import TritonBackend
    from batchgen.model.build import ModelFiles, build_model
    from batchgen.model.kv_cache import KVShape
    from batchgen.model.paged_sequence import sequence_logits

    config = AutoConfig.for_model(
        "qwen3", vocab_size=4096, hidden_size=1024, intermediate_size=intermediate, num_hidden_layers=4,
        num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=4096,
    )  # fmt: skip
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).eval().cuda()
    ids = torch.randint(0, 4096, (700,), device="cuda")
    options = EngineConfig(device="cuda", quantization="fp8", kv_cache_dtype="fp8")
    bundle = build_model(options, ModelFiles(None, model.config, model), ParallelGroup.single(),
                         torch.device("cuda"), torch.bfloat16, 4096)  # fmt: skip
    with torch.inference_mode():
        logits = sequence_logits(bundle.forward, ids, [512, 160] + [1] * 28, KVShape(4, 8, 128), FP8,
                                 TritonBackend())  # fmt: skip
    torch.save(logits.cpu(), path)
