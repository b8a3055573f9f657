"""FP8 (e4m3) projections: ``--quantization fp8`` on a 16/32-bit checkpoint, and the ``Linear``s that
pre-quantized checkpoints load into (``fp8_checkpoint.py`` reads those).

- ``Fp8RowLinear``: one weight scale per output row (per channel; a per-tensor scale repeats over its
  rows), the input quantized per token at run time (or with the checkpoint's static scale), or left in
  the model dtype (weight-only: ``--quantization fp8``). CUDA: ``torch._scaled_mm`` (cuBLASLt) or the
  Triton kernel (``kernels/gemm/fp8_gemm.py``).
- ``Fp8BlockLinear``: one weight scale per block of rows x ``group`` columns (128 x 128 in the Qwen3 FP8
  releases), the input quantized per token per ``group`` columns. CUDA: the Triton kernel.

A projection's ``act_quant`` tells the producer of its input how to quantize it: the fused RMSNorm and
SiLU-and-multiply kernels write e4m3 + scales directly (an ``Fp8Act``); anything else arrives in the model
dtype and is quantized here. Off CUDA the same function is computed by dequantizing to fp32
(``kernels/fp8_format.py``), so CPU runs test the loading and the arithmetic.

Memory: ``Fp8QuantizeFormat`` reads one checkpoint part at a time and keeps only its e4m3 copy, so a model
read from safetensors (or random weights) never holds its 16-bit projections. A model built in memory
(``LLM.from_model``) keeps its own weights: they belong to the caller, and the e4m3 copies come on top.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from batchgen.kernels import fp8_format as ref
from batchgen.kernels.fp8_format import ActQuant, Fp8Act
from batchgen.kernels.gemm.split_sums import SplitSums
from batchgen.model.weights import gptq
from batchgen.model.weights.formats import stacked_bias
from batchgen.model.weights.sources import Part, WeightSource


def quantize_input(x: torch.Tensor | Fp8Act, quant: ActQuant) -> Fp8Act:
    if isinstance(x, Fp8Act):
        return x
    if x.is_cuda:
        from batchgen.kernels.gemm.fp8_quant import quantize_act

        return quantize_act(x, quant)
    return ref.quantize_act(x, quant)


class Fp8RowLinear:
    """``weight_only``: the input stays in the model dtype (W8A16; ``act_quant`` None), else it is
    quantized per token, or with the checkpoint's static ``input_scale``."""

    def __init__(
        self, weight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype,
        input_scale: torch.Tensor | None = None, weight_only: bool = False,
    ) -> None:  # fmt: skip
        self.weight, self.scale, self.bias, self.dtype = weight, scale.float().contiguous(), bias, dtype
        self.out_features = weight.shape[0]  # weight: [N, K] e4m3; scale: [N] fp32
        static = None if input_scale is None else input_scale.float().reshape(())
        self.act_quant = None if weight_only else ActQuant(None, static)

    def __call__(self, x: torch.Tensor | Fp8Act, summed: bool = True) -> torch.Tensor | SplitSums:
        summed = summed or self.bias is not None  # a bias is added to the summed product
        y = self._product(x, summed)
        return y if self.bias is None else y + self.bias

    def _product(self, x: torch.Tensor | Fp8Act, summed: bool) -> torch.Tensor | SplitSums:  # [T, N]
        if self.act_quant is None:  # weight-only
            if self.weight.is_cuda:
                from batchgen.kernels.gemm.fp8_gemm import triton_fp8_matmul

                return triton_fp8_matmul(x, self.weight, self.scale, self.dtype, summed=summed)
            return ref.linear_weight_only(x, self.weight, self.scale, self.dtype)
        act = quantize_input(x, self.act_quant)
        if self.weight.is_cuda:
            from batchgen.kernels.gemm.fp8_gemm import rowwise_matmul

            return rowwise_matmul(act, self.weight, self.scale, self.dtype, summed=summed)
        return ref.linear_rows(act, self.weight, self.scale, self.dtype)

    def silu_mul(self, x: torch.Tensor | Fp8Act, quant: ActQuant | None) -> Fp8Act | torch.Tensor | None:
        """silu(gate) * up of this gate|up projection ([T, 2I] -> [T, I]), quantized per row as ``quant``
        asks (weight-only: left in the model dtype), where the product's kernel applies SiLU itself (CUDA,
        decode sizes: ``gate_up_silu.silu_mul_product``); else None, and the caller runs the product,
        then SiLU-and-multiply."""
        if not (self.weight.is_cuda and self.bias is None):
            return None
        from batchgen.kernels.gemm.fp8_gemm_tma import weight_only_tma
        from batchgen.kernels.layer_ops.gate_up_silu import silu_mul_product

        if self.act_quant is None:  # weight-only: h stays 16-bit for a weight-only down_proj
            if quant is None and weight_only_tma() and isinstance(x, torch.Tensor):
                return silu_mul_product(x, self.weight, self.scale, self.dtype)
            return None
        if quant is None or quant.group is not None or quant.static_scale is not None:
            return None
        return silu_mul_product(quantize_input(x, self.act_quant), self.weight, self.scale, self.dtype)


class Fp8BlockLinear:
    def __init__(
        self, weight: torch.Tensor, scale: torch.Tensor, scale_rows: int, group: int,
        bias: torch.Tensor | None, dtype: torch.dtype,
    ) -> None:  # fmt: skip
        self.weight, self.scale, self.bias, self.dtype = weight, scale.float().contiguous(), bias, dtype
        self.scale_rows, self.group = scale_rows, group  # scale: [cdiv(N, scale_rows), cdiv(K, group)]
        self.out_features = weight.shape[0]
        self.act_quant = ActQuant(group)

    def __call__(self, x: torch.Tensor | Fp8Act, summed: bool = True) -> torch.Tensor | SplitSums:
        act = quantize_input(x, self.act_quant)  # [T, K] -> [T, N]
        if self.weight.is_cuda:
            from batchgen.kernels.gemm.fp8_gemm import triton_fp8_matmul

            y = triton_fp8_matmul(
                act, self.weight, self.scale, self.dtype, group=self.group, scale_rows=self.scale_rows,
                summed=summed or self.bias is not None,
            )  # fmt: skip
        else:
            y = ref.linear_blocks(act, self.group, self.weight, self.scale, self.scale_rows, self.dtype)
        return y if self.bias is None else y + self.bias


class Fp8QuantizeFormat:
    """``--quantization fp8``: each projection of a 16/32-bit checkpoint in e4m3 at load, one scale per
    output row, its input left in the model dtype (W8A16: quantizing the activations too loses greedy
    agreement that no rounding of the weights wins back; ``docs/results.md``). A projection whose
    inputs were recorded on calibration text (``hessians``, by the name of its first checkpoint part:
    ``model/calibrate.py``) gets GPTQ's codes (``gptq.py``), others round to nearest."""

    name = "fp8"

    def __init__(self, dtype: torch.dtype) -> None:
        self.dtype = dtype
        self.hessians: dict[str, torch.Tensor] = {}  # filled layer by layer while a model calibrates

    def linear(self, source: WeightSource, parts: Sequence[Part], bias: bool) -> Fp8RowLinear:
        weight, scale = self._quantized(source, parts)
        stacked = stacked_bias(source, parts, self.dtype) if bias else None
        return Fp8RowLinear(weight, scale, stacked, self.dtype, weight_only=True)

    def _quantized(self, source: WeightSource, parts: Sequence[Part]) -> tuple[torch.Tensor, torch.Tensor]:
        hessian = self.hessians.pop(parts[0].name, None)
        if hessian is not None:  # GPTQ rounds the stacked rows together: they share the input
            return gptq.quantize_rows(source.stack_rows(parts), hessian)
        weights, scales = [], []
        for part in parts:  # one part in 16 bits at a time: the peak is the largest part, not the model
            w, s = ref.quantize_rows(source.get(part))
            weights.append(w)
            scales.append(s)
        return (torch.cat(weights), torch.cat(scales)) if len(weights) > 1 else (weights[0], scales[0])


# Names under which FP8 checkpoints store a layer's KV-cache scales, in order of preference: llm-compressor
# and the ``fp8`` method (``self_attn.k_scale``), ModelOpt, older compressed-tensors, the old shared one.
_KV_SCALE_NAMES = (
    ("self_attn.k_scale", "self_attn.v_scale"),
    ("self_attn.k_proj.k_scale", "self_attn.v_proj.v_scale"),
    ("self_attn.k_proj.output_scale", "self_attn.v_proj.output_scale"),
    ("self_attn.kv_scale", "self_attn.kv_scale"),
)


def kv_scales(source: WeightSource, layer_prefix: str) -> tuple[float, float]:
    """A layer's (k_scale, v_scale) for an FP8 cache: the checkpoint's, else 1.0 (host floats: they are
    constants of the kernels' launches, captured as such in CUDA graphs)."""
    for k_name, v_name in _KV_SCALE_NAMES:
        k_name, v_name = layer_prefix + k_name, layer_prefix + v_name
        if source.has(k_name) and source.has(v_name):
            return tuple(float(source.get(Part(n)).float().reshape(-1)[0]) for n in (k_name, v_name))
    return 1.0, 1.0
