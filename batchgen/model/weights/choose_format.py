"""Which weight format a checkpoint loads in: the factory above the formats (``formats.py``, ``fp8.py``,
``fp8_checkpoint.py``), so that no format needs to know the others."""

from __future__ import annotations

import torch

from batchgen.config import check_quantization
from batchgen.model.weights.formats import DenseFormat, WeightFormat


def weight_format(hf_config, dtype: torch.dtype, quantization: str | None = None) -> WeightFormat:
    """The format of a checkpoint's projections (``quantization``: what the user asked for at load).

    A pre-quantized checkpoint loads as published (FP8 only; any other method is refused, naming it);
    ``--quantization fp8`` on it changes nothing. Otherwise ``fp8`` quantizes the projections at load."""
    check_quantization(quantization)
    qc = quantization_config(hf_config)
    if qc is not None:
        from batchgen.model.weights.fp8_checkpoint import checkpoint_format

        return checkpoint_format(qc, dtype)
    if quantization == "fp8":
        from batchgen.model.weights.fp8 import Fp8QuantizeFormat

        return Fp8QuantizeFormat(dtype)
    return DenseFormat(dtype)


def quantization_config(hf_config) -> dict | None:
    """The checkpoint's ``quantization_config`` as a dict (transformers may hold it as an object)."""
    qc = getattr(hf_config, "quantization_config", None)
    if qc is None or isinstance(qc, dict):
        return qc
    return qc.to_dict() if hasattr(qc, "to_dict") else dict(vars(qc))
