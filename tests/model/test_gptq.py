"""``--quantization fp8``'s rounding (``model/weights/gptq.py``) and its calibration at load
(``model/calibrate.py``). The oracle is GPTQ's own objective: on the inputs it was calibrated on, the
product ``X W^T`` with GPTQ's codes is closer to the unquantized one than with round to nearest's, under the
same scales; and where the inputs are uncorrelated there is nothing to spread, so the codes are round to
nearest's."""

from __future__ import annotations

import pytest
import torch

from batchgen.config import EngineConfig
from batchgen.distributed.group import ParallelGroup
from batchgen.kernels import fp8_format as ref
from batchgen.model.build import ModelFiles, build_model
from batchgen.model.paged_sequence import sequence_logits
from batchgen.model.weights.fp8 import Fp8RowLinear
from batchgen.model.weights.gptq import gptq_round, quantize_rows

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _correlated_inputs(tokens: int, k: int, seed: int) -> torch.Tensor:
    """[tokens, k] from one distribution (the mixing is fixed, ``seed`` draws the tokens): correlated
    columns with a decaying spectrum, as a layer's inputs have."""
    mix = (
        torch.randn(k, k, generator=torch.Generator().manual_seed(0)) * torch.logspace(0.5, -1.5, k)[:, None]
    )
    return torch.randn(tokens, k, generator=torch.Generator().manual_seed(seed)) @ mix


def _output_error(x: torch.Tensor, weight: torch.Tensor, codes: torch.Tensor, scale: torch.Tensor) -> float:
    return float((x @ (weight - codes.float() * scale[:, None]).T).norm())


def test_a_diagonal_hessian_gives_round_to_nearest_codes():
    """Uncorrelated inputs of uneven energy: act-order permutes the columns, and the codes come back in
    the weight's own order, equal to round to nearest's."""
    torch.manual_seed(0)
    weight = torch.randn(48, 96)
    codes, scale = ref.quantize_rows(weight)
    hessian = torch.diag(torch.rand(96, dtype=torch.float64) * 10 + 0.1)
    assert torch.equal(gptq_round(weight, scale, hessian).view(torch.uint8), codes.view(torch.uint8))


@pytest.mark.parametrize("act_order", [True, False])
def test_per_group_scales_and_either_column_order_round_to_nearest_on_a_diagonal_hessian(act_order):
    """Scales per row per 32 columns (one per weight, expanded): still round to nearest's codes."""
    torch.manual_seed(2)
    weight = torch.randn(16, 96)
    codes, scale = ref.quantize_blocks(weight, 1, 32)
    per_weight = ref.expand_groups(scale, 32, 96)
    hessian = torch.diag(torch.rand(96, dtype=torch.float64) + 0.1)
    got = gptq_round(weight, per_weight, hessian, act_order=act_order)
    assert torch.equal(got.view(torch.uint8), codes.view(torch.uint8))


def test_gptq_moves_the_product_less_than_rounding_to_nearest():
    """Calibrated on 512 inputs, judged on 512 others from the same distribution: GPTQ's codes, under the
    same row scales, move ``X W^T`` clearly less; a third or more of the codes differ."""
    torch.manual_seed(1)
    weight = torch.randn(64, 128) * 0.05
    seen, held_out = _correlated_inputs(512, 128, 2), _correlated_inputs(512, 128, 3)
    rtn, scale = ref.quantize_rows(weight)
    codes, same_scale = quantize_rows(weight, seen.double().T @ seen.double())
    assert torch.equal(same_scale, scale)
    moved = (codes.view(torch.uint8) != rtn.view(torch.uint8)).float().mean()
    assert moved > 0.3
    for x in (seen, held_out):
        assert _output_error(x, weight, codes, scale) < 0.7 * _output_error(x, weight, rtn, scale)


def _tiny_llama(tmp_path) -> str:
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(vocab_size=97, hidden_size=128, intermediate_size=256, num_attention_heads=4,
                         num_key_value_heads=2, num_hidden_layers=2, max_position_embeddings=256)  # fmt: skip
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(tmp_path)
    return str(tmp_path)


def _forward(path: str, calibration=(), quantization="fp8"):
    from transformers import AutoConfig

    files = ModelFiles(path, AutoConfig.from_pretrained(path), calibration=calibration)
    options = EngineConfig(model=path, quantization=quantization)
    bundle = build_model(options, files, ParallelGroup.single(), torch.device("cpu"), torch.float32, 256)
    return bundle


def _logits(bundle, ids: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return sequence_logits(bundle.forward, ids, [len(ids)], bundle.kv_shape, torch.float32)


def test_quantization_fp8_calibrates_every_projection_at_load(tmp_path):
    """Built with calibration sequences, every projection is weight-only e4m3 with GPTQ's codes (not round
    to nearest's), and the model's logits on those sequences are closer to the unquantized model's."""
    path = _tiny_llama(tmp_path)
    g = torch.Generator().manual_seed(4)
    calibration = tuple(tuple(torch.randint(0, 97, (48,), generator=g).tolist()) for _ in range(6))
    plain, rtn, gptq = _forward(path, quantization=None), _forward(path), _forward(path, calibration)
    for rtn_layer, layer in zip(rtn.forward.layers, gptq.forward.layers, strict=True):
        attn, mlp, rtn_attn, rtn_mlp = layer.attn, layer.mlp, rtn_layer.attn, rtn_layer.mlp
        pairs = [(rtn_attn.qkv, attn.qkv), (rtn_attn.o_proj, attn.o_proj), (rtn_mlp.gate_up, mlp.gate_up),
                 (rtn_mlp.down, mlp.down)]  # fmt: skip
        for a, b in pairs:
            assert isinstance(b, Fp8RowLinear) and b.act_quant is None
            assert torch.equal(a.scale, b.scale) and not torch.equal(a.weight.view(torch.uint8),
                                                                     b.weight.view(torch.uint8))  # fmt: skip
    ids = torch.tensor(calibration[0])
    want = _logits(plain, ids)
    assert (_logits(gptq, ids) - want).norm() < 0.8 * (_logits(rtn, ids) - want).norm()


def test_calibration_longer_than_the_models_window_is_cut_to_it(tmp_path):
    """A chat longer than the positions the model was built for calibrates on its first ones."""
    long = (tuple(range(1, 97)) * 4,)  # 384 tokens; the model is built for 256
    assert isinstance(_forward(_tiny_llama(tmp_path), long).forward.layers[1].mlp.down, Fp8RowLinear)


def test_random_weights_round_to_nearest_without_calibrating(tiny_llama, monkeypatch):
    """A benchmark's random weights have no quality to keep: ``--quantization fp8`` skips the calibration
    (its codes change no kernel's speed) and rounds to nearest."""
    import batchgen.model.assemble as assemble
    from batchgen import LLM

    def no_calibration(*args, **kwargs):
        raise AssertionError("random weights were calibrated")

    monkeypatch.setattr(assemble, "Calibration", no_calibration)
    llm = LLM(tiny_llama, load_format="random", quantization="fp8", device="cpu", extra={"progress": False})
    assert isinstance(llm._rank.bundle.forward.layers[0].attn.qkv, Fp8RowLinear)
    monkeypatch.undo()
    with pytest.raises(AssertionError, match="calibrated"):  # the same load of real weights calibrates
        monkeypatch.setattr(assemble, "Calibration", no_calibration)
        LLM(tiny_llama, quantization="fp8", device="cpu", extra={"progress": False})


def test_a_model_in_memory_taken_as_random_is_not_calibrated(tiny_llama, monkeypatch):
    """The benchmarks build random models in memory (``LLM.from_model``): ``load_format="random"`` says so,
    and their FP8 codes round to nearest without the calibration (an 8B model's takes minutes)."""
    from transformers import AutoModelForCausalLM

    import batchgen.model.assemble as assemble
    from batchgen import LLM
    from batchgen.bench.workloads import load_tokenizer

    def no_calibration(*args, **kwargs):
        raise AssertionError("random weights were calibrated")

    model, tokenizer = AutoModelForCausalLM.from_pretrained(tiny_llama), load_tokenizer()
    monkeypatch.setattr(assemble, "Calibration", no_calibration)
    options = dict(quantization="fp8", device="cpu", extra={"progress": False})
    llm = LLM.from_model(model, tokenizer, load_format="random", **options)
    assert isinstance(llm._rank.bundle.forward.layers[0].attn.qkv, Fp8RowLinear)
    with pytest.raises(AssertionError, match="calibrated"):  # without it, the model's weights calibrate
        LLM.from_model(model, tokenizer, **options)
