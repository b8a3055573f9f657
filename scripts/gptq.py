"""GPTQ rounding of e4m3 weights for ``scripts/fp8_quality.py``'s ``w-gptq`` / ``gptq`` variants: the
package's ``model/weights/gptq.gptq_round`` (what ``--quantization fp8`` runs at load; its damping and fp32
updates since session 60, the figures before them came from this script's own copy at damp 0.01 in fp64),
with this script's own calibration and forms. ``order=True`` is GPTQ's act-order (the package's default);
``group``: scales per row per ``group`` columns (``fp8_format.quantize_blocks(w, 1, group)``'s) instead of
per row. ``smooth``: SmoothQuant's column factors first (``SMOOTH``, ``Smoothed``).

Calibration (``hessians``): chat prompts disjoint from the measured ones (other topics, other asks: see
``calibration``), each followed by the unquantized model's own greedy answer, run through the
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
from batchgen.model.weights.fp8 import Fp8BlockLinear, Fp8RowLinear
from batchgen.model.weights.gptq import InputRecorder, gptq_round

ANSWER_TOKENS = 24  # the unquantized model's greedy answer after each calibration prompt
# Neither B4's topics or asks (``bench/workloads.py``) nor issue 11's prompts. The first 16 x 4 are the
# default set (``calibration``'s order); the rest make the 4x set (32 x 8 = 256 prompts).
_TOPICS = (
    "tigers", "submarines", "origami", "thunderstorms", "pottery", "satellites", "tulips", "penguins",
    "violins", "rainforests", "marathons", "telescopes", "cheese making", "hurricanes", "kites", "fossils",
    "dinosaurs", "bamboo", "coral reefs", "hot air balloons", "pyramids", "octopuses", "knitting",
    "skyscrapers", "elephants", "wolves", "volleyball", "typewriters", "caves", "sunflowers", "canals",
    "jigsaw puzzles",
)  # fmt: skip
_ASKS = (
    "Tell me something interesting about {}.",
    "How would you teach a teenager about {}?",
    "Write two sentences about {} for a travel guide.",
    "What mistakes do beginners make with {}?",
    "Why do so many people find {} fascinating?",
    "Summarise what experts agree on about {}.",
    "Ask a question a student might have about {}, then answer it.",
    "Compare {} with something from everyday life.",
)


def full_scales(scale: torch.Tensor, cols: int, group: int | None) -> torch.Tensor:
    """[N] row scales, or [N, cdiv(K, group)] per row per ``group`` columns -> one per weight, [N, K]."""
    return scale[:, None].expand(-1, cols) if group is None else fp8_format.expand_groups(scale, group, cols)


# The forms, by variant suffix: (layer by layer, act-order, calibration's (topics, asks), scales' group)
FORMS = {"": (False, False, (16, 4), None), "-seq": (True, False, (16, 4), None),
         "-act": (False, True, (16, 4), None), "-cal4": (False, False, (32, 8), None),
         "-act-cal4": (False, True, (32, 8), None), "-g128": (False, False, (16, 4), 128),
         "-act-g128": (False, True, (16, 4), 128)}  # fmt: skip


def calibration(llm, topics: int = 16, asks: int = 4) -> list[torch.Tensor]:
    """Token ids of ``topics`` x ``asks`` chat questions (64 by default; none among the measured prompts'
    topics or asks), each with the chat template and followed by ``llm``'s greedy answer of
    ``ANSWER_TOKENS``."""
    prompts = [ask.format(topic) for topic in _TOPICS[:topics] for ask in _ASKS[:asks]]
    params = SamplingParams(max_new_tokens=ANSWER_TOKENS, ignore_eos=True)
    answers = [o.token_ids for o in llm.generate_samples(prompts, params)]
    return [torch.tensor(llm.encode(p) + a, device=llm.device) for p, a in zip(prompts, answers, strict=True)]


class AmaxRecorder(InputRecorder):
    """The package's recorder, also keeping each input column's largest |x| (``amax``, [K])."""

    def __call__(self, x: torch.Tensor, summed: bool = True) -> torch.Tensor:
        top = x.reshape(-1, x.shape[-1]).abs().amax(0).float()
        self.amax = top if getattr(self, "amax", None) is None else torch.maximum(self.amax, top)
        return super().__call__(x, summed)


def _recording(layer: Layer, found: dict[str, InputRecorder]) -> Layer:
    """``layer`` with recorders (X^T X of each projection's inputs, and their columns' maxima) around its
    projections."""

    def rec(name: str, linear) -> InputRecorder:
        found[name] = AmaxRecorder(linear)
        return found[name]

    attn = layer.attn._replace(qkv=rec("qkv", layer.attn.qkv), o_proj=rec("o", layer.attn.o_proj))
    return layer._replace(
        attn=attn, mlp=DenseMLP(rec("gate_up", layer.mlp.gate_up), rec("down", layer.mlp.down))
    )


def _dequantized(layer: Layer, rounded: dict[str, tuple], group: int | None) -> Layer:
    """``layer`` computing with e4m3 weights ``rounded`` (codes, scales) in fp32, inputs unquantized."""
    dense = {name: DenseLinear(q.float() * full_scales(s, q.shape[1], group), None)
             for name, (q, s) in rounded.items()}  # fmt: skip
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


def quantize(llm, sequences: list[torch.Tensor], sequential: bool, order: bool = False,
             group: int | None = None, smooth: float | None = None) -> list[dict[str, tuple]]:  # fmt: skip
    """Every layer's projections as (e4m3 codes, scales: per row, or per row per ``group`` columns) by
    ``gptq_round``, calibrated on ``sequences`` (token ids) run through the unquantized engine ``llm`` (its
    layers are restored afterwards)."""
    rank = llm._rank
    forward, backend = rank.bundle.forward, rank.runner.backend
    plain = list(forward.layers)
    weights = file_weights(len(plain))
    dtype = cache_dtype(llm.config.kv_cache_dtype, rank.dtype)
    found: list[dict[str, InputRecorder]] = [{} for _ in plain]
    done: list[dict[str, tuple]] = []

    def run(upto: int, first: int) -> None:  # layers first..upto-1 record, earlier ones are rounded
        forward.layers[:] = [_dequantized(plain[i], done[i], group) if i < first else
                             _recording(plain[i], found[i]) for i in range(upto)]  # fmt: skip
        with torch.inference_mode():
            for ids in sequences:
                sequence_logits(forward, ids, [len(ids)], rank.bundle.kv_shape, dtype, backend)

    started = time.perf_counter()
    try:
        for i in range(len(plain)):
            if sequential or i == 0:
                run(i + 1 if sequential else len(plain), i)
            if smooth is None:
                done.append({name: _rounded(w, found[i][name].hessian, order, group)
                             for name, w in weights[i].items()})  # fmt: skip
            else:
                done.append({name: _smoothed(w, found[i][name], smooth, order)
                             for name, w in weights[i].items()})  # fmt: skip
    finally:
        forward.layers[:] = plain
    tokens, took = sum(map(len, sequences)), time.perf_counter() - started
    form = f"{'sequential' if sequential else 'one pass'}{', act-order' if order else ''}, group {group}"
    print(f"GPTQ ({form}, {len(sequences)} sequences, {tokens} tokens): {took:.0f} s", flush=True)
    return done


def _rounded(weight: torch.Tensor, hessian: torch.Tensor, order: bool, group: int | None) -> tuple:
    """(e4m3 codes, the package's absmax scales) of one projection: per row, or per row per ``group``."""
    if group is None:
        scale = fp8_format.quantize_rows(weight)[1]
    else:
        scale = fp8_format.quantize_blocks(weight, 1, group)[1]
    return gptq_round(weight, full_scales(scale, weight.shape[1], group), hessian, act_order=order), scale


def _smoothed(weight: torch.Tensor, rec: AmaxRecorder, alpha: float, order: bool) -> tuple:
    """SmoothQuant (Xiao et al., 2022) before GPTQ: input column j divided by s_j = amax_j^alpha /
    max|W[:, j]|^(1 - alpha) and weight column j multiplied by it (the product unchanged), so the
    per-token activation scale is set less by a few outlier columns. (e4m3 codes of W * s, their absmax
    row scales, 1 / s [K])."""
    w_max = weight.abs().amax(0).clamp(min=1e-5)
    s = (rec.amax.clamp(min=1e-5).pow(alpha) / w_max.pow(1 - alpha)).clamp(min=1e-5)
    smoothed = weight * s
    hessian = rec.hessian / s[:, None] / s[None, :]
    scale = fp8_format.quantize_rows(smoothed)[1]
    return gptq_round(smoothed, scale, hessian, act_order=order), scale, 1 / s


SMOOTH = {"-smooth5": 0.5, "-smooth65": 0.65, "-smooth8": 0.8}  # form -> alpha (act-order, one pass)


def cached_smooth(base, form: str, made: dict) -> list[dict[str, tuple]]:
    if (16, 4) not in made:
        made[(16, 4)] = calibration(base, 16, 4)
    if form not in made:
        made[form] = quantize(base, made[(16, 4)], False, True, None, SMOOTH[form])
    return made[form]


def smoothed(base, form: str, made: dict):
    """A layer replacement (``fp8_quality.layers``): every projection smoothed as ``form`` says, its codes
    by GPTQ, its input quantized per token."""

    def replace(i: int, layer: Layer) -> Layer:
        return with_projections(layer, {
            name: Smoothed(Fp8RowLinear(q, scale, None, torch.float32), inv_s)
            for name, (q, scale, inv_s) in cached_smooth(base, form, made)[i].items()
        })  # fmt: skip

    return replace


class Smoothed:
    """An FP8 projection whose input is divided by the smoothing factors first (what folding 1/s into the
    producer, an RMSNorm's weight, v_proj's or up_proj's rows, would give); the producer leaves the
    input unquantized (``act_quant`` None) and the inner projection quantizes it per token."""

    def __init__(self, inner, inv_s: torch.Tensor) -> None:
        self.inner, self.inv_s, self.act_quant, self.out_features = inner, inv_s, None, inner.out_features

    def __call__(self, x: torch.Tensor, summed: bool = True) -> torch.Tensor:
        return self.inner(x.float() * self.inv_s, summed)


def with_projections(layer: Layer, new: dict) -> Layer:
    """``layer`` with projections ``new`` (qkv, o, gate_up, down); the MLP's producer quantizes gate|up's
    input as gate|up's ``act_quant`` says."""
    attn = layer.attn._replace(qkv=new["qkv"], o_proj=new["o"])
    mlp = DenseMLP(new["gate_up"], new["down"])
    return layer._replace(attn=attn, mlp=mlp, mlp_quant=new["gate_up"].act_quant)


def cached(base, form: str, made: dict) -> list[dict[str, tuple]]:
    """``form``'s codes (``FORMS``), calibrated on the unquantized ``base``; ``made`` keeps each calibration
    text and each rounding for the next variant that wants it."""
    sequential, order, calib, group = FORMS[form]
    if calib not in made:
        made[calib] = calibration(base, *calib)
    if form not in made:
        made[form] = quantize(base, made[calib], sequential, order, group)
    return made[form]


@contextlib.contextmanager
def grouped(llm, quantized: list[dict[str, tuple]], group: int):
    """The FP8 ``llm``'s layers with ``quantized``'s codes and per-row-per-``group`` scales as
    ``Fp8BlockLinear``s (1-row blocks: ``row-g128``'s arithmetic, activations per token per ``group``
    columns), restored on exit."""
    forward = llm._rank.bundle.forward
    saved = list(forward.layers)
    forward.layers[:] = [
        with_projections(layer, {name: Fp8BlockLinear(q, s, 1, group, None, torch.float32)
                                 for name, (q, s) in codes.items()})
        for layer, codes in zip(saved, quantized, strict=True)
    ]  # fmt: skip
    try:
        yield
    finally:
        forward.layers[:] = saved


@contextlib.contextmanager
def rounded(llm, quantized: list[dict[str, tuple]], group: int | None = None):
    """The FP8 ``llm``'s row-quantized projections given ``quantized``'s codes (their scales are the package's
    absmax ones: checked), restored on exit; with ``group``, ``grouped``."""
    if group is not None:
        with grouped(llm, quantized, group):
            yield
        return
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
