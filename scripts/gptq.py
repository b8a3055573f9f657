"""GPTQ rounding of e4m3 weights for ``scripts/fp8_quality.py``'s ``w-gptq`` / ``gptq`` variants.

``gptq_round`` quantizes a projection's input columns one at a time, each to e4m3 under the row's fixed
scale (the package's cast, ``fp8_format._cast``), and spreads the column's rounding error onto the columns
not yet quantized through the inverse Hessian ``H = X^T X`` of calibration inputs X, so that the layer's
output ``X W^T`` moves as little as it can (Frantar et al., "GPTQ", 2022: the block-wise form with a
Cholesky factor of the inverse).

Calibration (``hessians``): chat prompts disjoint from the measured ones (other topics, other asks: see
``calibration_prompts``), each followed by the unquantized model's own greedy answer, run through the
unquantized model in one prefill with every projection's input recorded. ``sequential=True`` records
layer i's inputs with layers 0..i-1 already GPTQ-rounded (weights e4m3, activations unquantized);
otherwise every layer's come from the unquantized model (one pass).
"""

from __future__ import annotations

import contextlib
import time

import torch

from batchgen import SamplingParams
from batchgen.kernels import fp8_format
from batchgen.model.fused import DenseMLP, Layer
from batchgen.model.kv_cache import cache_dtype
from batchgen.model.loader import default_model_dir
from batchgen.model.paged_sequence import sequence_logits
from batchgen.model.weights.formats import DenseLinear

ANSWER_TOKENS = 24  # the unquantized model's greedy answer after each calibration prompt
_TOPICS = (
    "tigers", "submarines", "origami", "thunderstorms", "pottery", "satellites", "tulips", "penguins",
    "violins", "rainforests", "marathons", "telescopes", "cheese making", "hurricanes", "kites", "fossils",
)  # fmt: skip
_ASKS = (
    "Tell me something interesting about {}.",
    "How would you teach a teenager about {}?",
    "Write two sentences about {} for a travel guide.",
    "What mistakes do beginners make with {}?",
)


def gptq_round(weight: torch.Tensor, scale: torch.Tensor, hessian: torch.Tensor, block: int = 128,
               damp: float = 0.01) -> torch.Tensor:  # fmt: skip
    """[N, K] weight, [N] row scales, [K, K] Hessian of the inputs -> e4m3 [N, K] (value ``q * scale``).

    Column j is rounded to nearest under its row's scale; its error, divided by the inverse Hessian's
    Cholesky diagonal, is subtracted from the later columns along that factor's row j (inside the block
    at once, onto the later blocks when the block is done). ``damp`` x the mean diagonal is added to H."""
    w = weight.double().T.contiguous()  # [K, N]: a column of the weight is a row here
    h = hessian.double().clone()
    dead = h.diagonal() == 0  # inputs never seen: their columns do not matter, round them as they are
    h[dead, dead] = 1.0
    h.diagonal().add_(damp * h.diagonal().mean())
    u = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(h)), upper=True)
    rows, cast_scale = scale.double(), scale.float()  # the cast divides in fp32, as the package's does
    q = torch.empty(w.shape, dtype=fp8_format.FP8)
    for b0 in range(0, w.shape[0], block):
        b1 = min(b0 + block, w.shape[0])
        errors = torch.empty_like(w[b0:b1])
        for j in range(b0, b1):
            q[j] = fp8_format._cast(w[j], cast_scale)
            errors[j - b0] = (w[j] - q[j].double() * rows) / u[j, j]
            w[j:b1] -= u[j, j:b1, None] * errors[j - b0]
        w[b1:] -= u[b0:b1, b1:].T @ errors
    q = q.T.contiguous()
    return q


def calibration(llm) -> list[torch.Tensor]:
    """Token ids of 64 chat questions (16 topics x 4 asks, none among the measured prompts' topics or
    asks), each with the chat template and followed by ``llm``'s greedy answer of ``ANSWER_TOKENS``."""
    prompts = [ask.format(topic) for topic in _TOPICS for ask in _ASKS]
    params = SamplingParams(max_new_tokens=ANSWER_TOKENS, ignore_eos=True)
    answers = [o.token_ids for o in llm.generate_samples(prompts, params)]
    return [torch.tensor(llm.encode(p) + a, device=llm.device) for p, a in zip(prompts, answers, strict=True)]


class _Recorder:
    """A projection that adds its inputs' X^T X (fp64) into ``hessian``, then computes as before."""

    def __init__(self, linear, hessian: torch.Tensor) -> None:
        self.linear, self.hessian = linear, hessian
        self.act_quant, self.out_features = linear.act_quant, linear.out_features

    def __call__(self, x: torch.Tensor, summed: bool = True) -> torch.Tensor:
        flat = x.reshape(-1, self.hessian.shape[0]).double()
        self.hessian += flat.T @ flat
        return self.linear(x, summed)


def _recording(layer: Layer, found: dict[str, torch.Tensor], widths: dict[str, int]) -> Layer:
    def rec(name: str, linear) -> _Recorder:
        found[name] = torch.zeros(widths[name], widths[name], dtype=torch.float64)
        return _Recorder(linear, found[name])

    attn = layer.attn._replace(qkv=rec("qkv", layer.attn.qkv), o_proj=rec("o", layer.attn.o_proj))
    return layer._replace(
        attn=attn, mlp=DenseMLP(rec("gate_up", layer.mlp.gate_up), rec("down", layer.mlp.down))
    )


def _dequantized(layer: Layer, rounded: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> Layer:
    """``layer`` computing with e4m3 weights ``rounded`` (codes, row scales) in fp32, inputs unquantized."""
    dense = {name: DenseLinear(q.float() * s[:, None], None) for name, (q, s) in rounded.items()}
    attn = layer.attn._replace(qkv=dense["qkv"], o_proj=dense["o"])
    return layer._replace(attn=attn, mlp=DenseMLP(dense["gate_up"], dense["down"]))


def file_weights(layers: int) -> list[dict[str, torch.Tensor]]:
    """Each layer's four projections' fp32 weights from the checkpoint, stacked as the engine stacks them."""
    from safetensors.torch import load_file

    file = load_file(str(default_model_dir() / "model.safetensors"))
    parts = {"qkv": ("self_attn.", ("q_proj", "k_proj", "v_proj")), "o": ("self_attn.", ("o_proj",)),
             "gate_up": ("mlp.", ("gate_proj", "up_proj")), "down": ("mlp.", ("down_proj",))}  # fmt: skip
    return [
        {name: torch.cat([file[f"model.layers.{i}.{sub}{n}.weight"].float() for n in names])
         for name, (sub, names) in parts.items()}
        for i in range(layers)
    ]  # fmt: skip


def quantize(llm, sequences: list[torch.Tensor], sequential: bool) -> list[dict[str, tuple]]:
    """Every layer's projections as (e4m3 codes, row scales) by ``gptq_round``, calibrated on ``sequences``
    (token ids) run through the unquantized engine ``llm`` (its layers are restored afterwards)."""
    rank = llm._rank
    forward, backend = rank.bundle.forward, rank.runner.backend
    plain = list(forward.layers)
    weights = file_weights(len(plain))
    widths = {name: w.shape[1] for name, w in weights[0].items()}
    dtype = cache_dtype(llm.config.kv_cache_dtype, rank.dtype)
    found: list[dict[str, torch.Tensor]] = [{} for _ in plain]
    done: list[dict[str, tuple]] = []

    def run(upto: int, first: int) -> None:  # layers first..upto-1 record, earlier ones are rounded
        forward.layers[:] = [_dequantized(plain[i], done[i]) if i < first else
                             _recording(plain[i], found[i], widths) for i in range(upto)]  # fmt: skip
        with torch.inference_mode():
            for ids in sequences:
                sequence_logits(forward, ids, [len(ids)], rank.bundle.kv_shape, dtype, backend)

    started = time.perf_counter()
    try:
        for i in range(len(plain)):
            if sequential or i == 0:
                run(i + 1 if sequential else len(plain), i)
            scales = {name: fp8_format.quantize_rows(w)[1] for name, w in weights[i].items()}
            done.append({name: (gptq_round(w, scales[name], found[i][name]), scales[name])
                         for name, w in weights[i].items()})  # fmt: skip
    finally:
        forward.layers[:] = plain
    tokens, took = sum(map(len, sequences)), time.perf_counter() - started
    print(f"GPTQ ({'sequential' if sequential else 'one pass'}, {tokens} tokens): {took:.0f} s", flush=True)
    return done


@contextlib.contextmanager
def rounded(llm, quantized: list[dict[str, tuple]]):
    """The FP8 ``llm``'s row-quantized projections given ``quantized``'s codes (their scales are the package's
    absmax ones: checked), restored on exit."""
    saved = []
    for layer, codes in zip(llm._rank.bundle.forward.layers, quantized, strict=True):
        attn, mlp = layer.attn, layer.mlp
        for linear, (q, scale) in zip(
            (attn.qkv, attn.o_proj, mlp.gate_up, mlp.down), codes.values(), strict=True
        ):
            assert torch.equal(linear.scale, scale), "the package's scales differ from the absmax ones"
            saved.append((linear, linear.weight))
            linear.weight = q
    try:
        yield
    finally:
        for linear, weight in saved:
            linear.weight = weight
