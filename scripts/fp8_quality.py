"""What FP8 costs in quality on the embedded model (SmolLM2-135M-Instruct), and where it is lost.

For each variant, beside the unquantized model (same prompts, same device and dtype):
- the share of a varied prompt set whose first ``--tokens`` greedy tokens equal the unquantized model's;
- the mean difference of log-probabilities of a fixed text's tokens (teacher-forced, in one prefill through
  the paged cache, so an FP8 cache is written and read), the mean absolute difference, and the share of
  its positions whose most likely next token is unchanged;
- teacher-forced on each prompt followed by the unquantized model's greedy tokens: the share of those
  tokens still the most likely, and the mean absolute log-prob difference (a smoother measure than the
  first: each position is judged on the same context).

The package's configurations are ``fp8`` (``--quantization fp8``: weight-only, GPTQ's codes), ``fp8+kv``
(with ``--kv-cache-dtype fp8``) and ``kv`` (the cache alone). ``w8a8`` is what ``fp8`` was before (e4m3
weights rounded to nearest, per-token e4m3 activations); the others change one thing of ``w8a8`` through a
hook of this script, to find which part of the quantization costs the agreement:

- ``w-only``: e4m3 weights per output channel, activations left unquantized;
- ``act-tensor``: one dynamic activation scale per projection call (the step's rows together), not per
  token; ``act-g128``: one per token per 128 columns; ``act-g128+kv``: that with an FP8 cache;
- ``x-qkv`` / ``x-o`` / ``x-gate_up`` / ``x-down``: that projection's input left unquantized in every layer
  (its weights e4m3); ``g128-<projection>``: that input per token per 128 columns;
- ``keep-first`` / ``keep-last`` / ``keep-ends``: the first / last / both decoder layers unquantized;
- ``keep-qkv`` / ``keep-o`` / ``keep-gate_up`` / ``keep-down``: that projection unquantized in every layer;
  ``keep-attn`` / ``keep-mlp``: both of the attention's / the MLP's;
- ``block128``: weights in 128 x 128 blocks with activations per token per 128 columns (the layout of
  block-quantized checkpoints, through the package's ``Fp8BlockLinear``); ``row-g128``: weights per row per
  128 columns, activations alike;
- ``fp32-2threads``: no quantization, two CPU threads instead of ``--threads``: whether the thread count
  alone changes any token;
- ``w-gptq``: ``w-only`` with the weights rounded by GPTQ (``scripts/gptq.py``: each row's scale as the
  package's, the rounding errors spread over later columns by calibration inputs' inverse Hessian, the
  model's own answers in the text); ``gptq``: those weights with ``w8a8``'s activations; suffixes
  (``gptq.FORMS``): ``-seq`` calibrated layer by layer, ``-act`` columns by decreasing Hessian diagonal
  (act-order), ``-cal4`` 4x the calibration text, ``-g128``
  (``gptq-`` only) rounded under ``row-g128``'s scales, with its activations per token per 128 columns;
- ``gptq-smooth5`` / ``-smooth65`` / ``-smooth8``: SmoothQuant (alpha 0.5 / 0.65 / 0.8) before ``gptq-act``;
- ``w-bf16``: no FP8 at all, the projections' weights rounded to bf16 (fp32 arithmetic): what any rounding
  of the weights costs on this measure, a floor for the others.

The activation hooks quantize and dequantize in fp32 (the value the e4m3 product sees), which is the
CPU path's function up to the order of its fp32 sums. The e4m3 cast itself rounds to nearest even.

    PYTHONPATH=. python3 scripts/fp8_quality.py [--device cuda] [--variants fp8 w-only ...] [--out q.json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from batchgen import LLM, SamplingParams  # noqa: E402
from batchgen.bench.workloads import VARIED_PROMPTS, mixed_prompts  # noqa: E402
from batchgen.kernels import fp8_format  # noqa: E402
from batchgen.kernels.fp8_format import ActQuant, Fp8Act  # noqa: E402
from batchgen.model.fused import DenseMLP, Layer  # noqa: E402
from batchgen.model.kv_cache import cache_dtype  # noqa: E402
from batchgen.model.loader import default_model_dir  # noqa: E402
from batchgen.model.paged_sequence import sequence_logits  # noqa: E402
from batchgen.model.weights.formats import DenseLinear  # noqa: E402
from batchgen.model.weights.fp8 import Fp8BlockLinear, Fp8RowLinear  # noqa: E402
from scripts import gptq  # noqa: E402

PROMPTS = VARIED_PROMPTS
TEXT = (
    "The history of the bicycle begins in the early nineteenth century, when inventors in Europe built "
    "wooden machines that riders pushed along with their feet. Pedals attached to the front wheel came "
    "decades later, and the safety bicycle, with two wheels of equal size and a chain driving the rear "
    "wheel, made cycling popular in the 1880s. Pneumatic tyres followed soon after, and within a few years "
    "millions of people used bicycles to travel to work, to explore the countryside and to race. Today the "
    "bicycle remains one of the most efficient ways to turn human energy into motion."
)
QUANTIZE_ACT = fp8_format.quantize_act  # the package's, whatever a hook puts in its place
PACKAGE = {"fp8": dict(quantization="fp8"), "fp8+kv": dict(quantization="fp8", kv_cache_dtype="fp8"),
           "kv": dict(kv_cache_dtype="fp8")}  # fmt: skip


# --- activation hooks: what each projection's input becomes ----------------------------------------------


def _fake(x: torch.Tensor, scale: torch.Tensor) -> Fp8Act:
    """x rounded to e4m3 under ``scale`` (broadcast over x) and dequantized: an ``Fp8Act`` whose data is that
    value in fp32 with unit scales, which the CPU's e4m3 product multiplies as it would the e4m3 bytes."""
    q = (x.float() / scale).clamp(-fp8_format.FP8_MAX, fp8_format.FP8_MAX).to(fp8_format.FP8).float()
    return Fp8Act(q * scale, torch.ones(x.shape[0], 1, device=x.device))


def _unquantized(x: torch.Tensor, quant: ActQuant) -> Fp8Act:
    return Fp8Act(x.float(), torch.ones(x.shape[0], 1, device=x.device))


def _per_tensor(x: torch.Tensor, quant: ActQuant) -> Fp8Act:
    scale = (x.abs().amax().float() / fp8_format.FP8_MAX).clamp(min=fp8_format.MIN_SCALE)
    return _fake(x, scale)


def _per_group(group: int):
    def quantize(x: torch.Tensor, quant: ActQuant) -> Fp8Act:
        act = QUANTIZE_ACT(x, ActQuant(group))
        return Fp8Act(fp8_format.dequantize_act(act, group), torch.ones(x.shape[0], 1, device=x.device))

    return quantize


@contextlib.contextmanager
def activations(quantize, only: set[int] | None = None):
    """Projection inputs quantized by ``quantize`` (both the CPU backend's fused ops and the FP8 linears
    look ``fp8_format.quantize_act`` up at each call); ``only``: just the inputs whose ``ActQuant`` is one
    of these objects (each projection has its own, which its producer is handed). Load-time weight
    quantization is over by then."""

    def hooked(x: torch.Tensor, quant: ActQuant) -> Fp8Act:
        if quant.static_scale is not None or (only is not None and id(quant) not in only):
            return QUANTIZE_ACT(x, quant)
        return quantize(x, quant)

    fp8_format.quantize_act = hooked
    try:
        yield
    finally:
        fp8_format.quantize_act = QUANTIZE_ACT


def inputs_of(llm: LLM, name: str) -> set[int]:
    """The ``ActQuant`` objects of projection ``name`` in every layer."""
    layers = llm._rank.bundle.forward.layers
    pick = {"qkv": lambda a, m: a.qkv, "o": lambda a, m: a.o_proj, "gate_up": lambda a, m: m.gate_up,
            "down": lambda a, m: m.down}[name]  # fmt: skip
    return {id(pick(layer.attn, layer.mlp).act_quant) for layer in layers}


# --- layer hooks: which projections are quantized --------------------------------------------------------


@contextlib.contextmanager
def layers(llm: LLM, replace):
    """The forward's decoder layers replaced by ``replace(i, layer)`` while measuring, then restored."""
    forward = llm._rank.bundle.forward
    saved = list(forward.layers)
    forward.layers[:] = [replace(i, layer) for i, layer in enumerate(saved)]
    try:
        yield
    finally:
        forward.layers[:] = saved


def keep_layers(base: LLM, which):
    """Layers ``which(i, n)`` taken whole from the unquantized model (same cache, same scales of 1)."""
    plain, n = base._rank.bundle.forward.layers, len(base._rank.bundle.forward.layers)

    def replace(i: int, layer: Layer) -> Layer:
        if not which(i, n):
            return layer
        return plain[i]._replace(attn=plain[i].attn._replace(kv_scales=layer.attn.kv_scales))

    return replace


def keep_projections(base: LLM, names: tuple[str, ...]):
    """Projections ``names`` of every layer taken from the unquantized model (their producers then write
    fp32)."""
    plain = base._rank.bundle.forward.layers

    def one(name: str, i: int, layer: Layer) -> Layer:
        attn, mlp, dense = layer.attn, layer.mlp, plain[i]
        if name == "qkv":
            return layer._replace(attn=attn._replace(qkv=dense.attn.qkv))
        if name == "o":
            return layer._replace(attn=attn._replace(o_proj=dense.attn.o_proj))
        if name == "gate_up":
            return layer._replace(mlp=DenseMLP(dense.mlp.gate_up, mlp.down), mlp_quant=None)
        return layer._replace(mlp=DenseMLP(mlp.gate_up, dense.mlp.down))

    def replace(i: int, layer: Layer) -> Layer:
        for name in names:
            layer = one(name, i, layer)
        return layer

    return replace


def from_file(make):
    """Every projection built by ``make(fp32 weight [N, K])`` from the checkpoint's weights. (The unquantized
    model's CPU projections hold oneDNN's packed copies, so the weights are read from the file.)"""
    from safetensors.torch import load_file

    weights = load_file(str(default_model_dir() / "model.safetensors"))

    def linear(prefix: str, names: tuple[str, ...]):
        return make(torch.cat([weights[f"{prefix}{n}.weight"].float() for n in names]))

    def replace(i: int, layer: Layer) -> Layer:
        attn, mlp = f"model.layers.{i}.self_attn.", f"model.layers.{i}.mlp."
        return gptq.with_projections(layer, {
            "qkv": linear(attn, ("q_proj", "k_proj", "v_proj")), "o": linear(attn, ("o_proj",)),
            "gate_up": linear(mlp, ("gate_proj", "up_proj")), "down": linear(mlp, ("down_proj",)),
        })  # fmt: skip

    return replace


def blocks(rows: int, cols: int):
    """e4m3 weights with one scale per ``rows`` x ``cols`` block, inputs per token per ``cols`` columns (the
    arithmetic of a block-quantized checkpoint, through the package's ``Fp8BlockLinear``)."""

    def make(weight: torch.Tensor) -> Fp8BlockLinear:
        data, scale = fp8_format.quantize_blocks(weight, rows, cols)
        return Fp8BlockLinear(data, scale, rows, cols, None, torch.float32)

    return make


def gptq_variants(base: LLM, table: dict) -> None:
    """``w-gptq`` / ``gptq`` in each of ``gptq.FORMS`` (no ``w-`` with ``-g128``: its Fp8BlockLinear wants
    group scales); each calibration text and each rounding is made once, at its first variant."""
    made: dict = {}

    def hook(form: str, acts: bool):
        def enter(llm: LLM) -> contextlib.ExitStack:
            stack = contextlib.ExitStack()
            stack.enter_context(gptq.rounded(llm, gptq.cached(base, form, made), gptq.FORMS[form][3]))
            if not acts:
                stack.enter_context(activations(_unquantized))
            return stack

        return enter

    for form, (*_, group) in gptq.FORMS.items():
        if group is None:
            table[f"w-gptq{form}"] = (PACKAGE["fp8"], hook(form, False))
        table[f"gptq{form}"] = (PACKAGE["fp8"], hook(form, True))
    for form in gptq.SMOOTH:
        table[f"gptq{form}"] = (PACKAGE["fp8"], lambda llm, f=form: layers(llm, gptq.smoothed(base, f, made)))


def on_w8a8(hook):
    """``hook`` over the arithmetic ``--quantization fp8`` had before it became weight-only with GPTQ's
    codes: e4m3 weights rounded to nearest, per-token e4m3 activations (the activation and layer hooks
    were measured on it, and change only it)."""

    def enter(llm: LLM) -> contextlib.ExitStack:
        stack = contextlib.ExitStack()
        stack.enter_context(layers(llm, from_file(lambda w: Fp8RowLinear(*fp8_format.quantize_rows(w), None,
                                                                         torch.float32))))  # fmt: skip
        stack.enter_context(hook(llm))
        return stack

    return enter


def variants(base: LLM) -> dict:
    """name -> (the package's options it starts from, a context manager factory over that LLM)."""
    none = lambda llm: contextlib.nullcontext()  # noqa: E731
    table = {name: (opts, none) for name, opts in PACKAGE.items()}
    table.update(_w8a8_variants(base))
    gptq_variants(base, table)
    return table


def _w8a8_variants(base: LLM) -> dict:
    none = lambda llm: contextlib.nullcontext()  # noqa: E731
    table = {}
    fp8, fp8_kv = PACKAGE["fp8"], PACKAGE["fp8+kv"]
    table["fp32-2threads"] = ({"threads": 2}, none)
    table["w-only"] = (fp8, lambda llm: activations(_unquantized))
    table["act-tensor"] = (fp8, lambda llm: activations(_per_tensor))
    table["act-g128"] = (fp8, lambda llm: activations(_per_group(128)))
    table["act-g128+kv"] = (fp8_kv, lambda llm: activations(_per_group(128)))
    table["w-only+kv"] = (fp8_kv, lambda llm: activations(_unquantized))
    for proj in ("qkv", "o", "gate_up", "down"):
        table[f"x-{proj}"] = (fp8, lambda llm, proj=proj: activations(_unquantized, inputs_of(llm, proj)))
        table[f"g128-{proj}"] = (fp8, lambda llm, p=proj: activations(_per_group(128), inputs_of(llm, p)))
    ends = {"first": lambda i, n: i == 0, "last": lambda i, n: i == n - 1,
            "ends": lambda i, n: i in (0, n - 1)}  # fmt: skip
    for name, which in ends.items():
        table[f"keep-{name}"] = (fp8, lambda llm, which=which: layers(llm, keep_layers(base, which)))
    for proj in ("qkv", "o", "gate_up", "down"):
        table[f"keep-{proj}"] = (fp8, lambda llm, proj=proj: layers(llm, keep_projections(base, (proj,))))
    table["keep-attn"] = (fp8, lambda llm: layers(llm, keep_projections(base, ("qkv", "o"))))
    table["keep-mlp"] = (fp8, lambda llm: layers(llm, keep_projections(base, ("gate_up", "down"))))
    table["block128"] = (fp8, lambda llm: layers(llm, from_file(blocks(128, 128))))
    table["row-g128"] = (fp8, lambda llm: layers(llm, from_file(blocks(1, 128))))
    table["w-bf16"] = (
        fp8,
        lambda llm: layers(llm, from_file(lambda w: DenseLinear(w.bfloat16().float(), None))),
    )
    table["w8a8"] = (fp8, none)
    plain = ("fp32-2threads", "block128", "row-g128", "w-bf16")  # they replace every projection themselves
    return {name: (opts, hook if name in plain else on_w8a8(hook)) for name, (opts, hook) in table.items()}


# --- the measurement ---------------------------------------------------------------------------------------


def greedy(llm: LLM, prompts: list[str], tokens: int) -> list[list[int]]:
    params = SamplingParams(max_new_tokens=tokens, ignore_eos=True)
    return [o.token_ids for o in llm.generate_samples(prompts, params)]


def scores(llm: LLM, ids: torch.Tensor, start: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """(log p(ids[t] | ids[:t]), the most likely token after ids[:t]) for t >= ``start``, teacher-forced in
    one prefill chunk (attention reads the cache)."""
    rank, dtype = llm._rank, cache_dtype(llm.config.kv_cache_dtype, llm._rank.dtype)
    bundle, backend = rank.bundle, rank.runner.backend
    with torch.inference_mode():
        logits = sequence_logits(bundle.forward, ids, [len(ids)], bundle.kv_shape, dtype, backend)
    logp = torch.log_softmax(logits.float(), dim=-1)[start - 1 : -1]
    return logp.gather(1, ids[start:, None]).squeeze(1), logp.argmax(-1)


def forced(llm: LLM, runs: list[tuple[torch.Tensor, int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """``scores`` of each prompt + the unquantized model's greedy tokens: each judged on the same context."""
    parts = [scores(llm, ids, start) for ids, start in runs]
    return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])


def common_prefix(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default=None)
    ap.add_argument("--dtype", default=None, help="[bf16 on CUDA, fp32 on CPU]")
    ap.add_argument("--tokens", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1, help="CPU threads, the same for every variant [1]")
    ap.add_argument("--extra", type=int, default=0, help="add this many of B4's short questions (<= 130)")
    ap.add_argument("--variants", nargs="+", default=list(PACKAGE), help="[the package's: fp8 fp8+kv kv]")
    ap.add_argument("--out")
    args = ap.parse_args()
    # No prefix cache: a variant must not reuse another's cached prompts. A fixed thread count, the same for
    # every variant, rather than the automatic one that follows the machine's load; one thread by default,
    # as two oversubscribe a machine whose other core is busy (``fp32-2threads`` checks the count changes
    # no token).
    cpu = args.device in (None, "cpu")
    base_opts = dict(device=args.device, dtype=args.dtype, cuda_graphs=False, prefix_caching=False,
                     threads=args.threads if cpu else None, extra={"progress": False})  # fmt: skip
    base = LLM(**base_opts)
    table = variants(base)
    unknown = [v for v in args.variants if v not in table]
    if unknown:
        ap.error(f"unknown variants {unknown}; known: {' '.join(table)}")
    hooked = [v for v in args.variants if v not in PACKAGE]
    if hooked and base.device.type != "cpu":
        ap.error(f"{hooked} hook the CPU path's arithmetic: run them with --device cpu")
    prompts = PROMPTS + (mixed_prompts(args.extra, long_notes=()) if args.extra else [])
    ids = torch.tensor(base.tokenizer.encode(TEXT), device=base.device)
    want, (want_lp, want_top) = greedy(base, prompts, args.tokens), scores(base, ids)
    runs = [(torch.tensor(base.encode(p) + w[: args.tokens], device=base.device), len(base.encode(p)))
            for p, w in zip(prompts, want, strict=True)]  # fmt: skip
    want_run_lp, want_run_top = forced(base, runs)
    results = {"prompts": len(prompts), "tokens": args.tokens, "text_tokens": len(ids) - 1,
               "device": str(base.device), "dtype": str(base.dtype), "variants": {}}  # fmt: skip
    for name in args.variants:
        opts, hook = table[name]
        # A fresh engine per variant: one that has run another variant (its cache pool, its backend's
        # plans) was seen to change the next variant's greedy tokens.
        llm = LLM(**(base_opts | opts))
        if cpu:  # the process's count: the last engine loaded set it
            torch.set_num_threads(opts.get("threads", args.threads))
        started = time.perf_counter()
        with hook(llm):
            got, (lp, top) = greedy(llm, prompts, args.tokens), scores(llm, ids)
            run_lp, run_top = forced(llm, runs)
        prefix = [common_prefix(a[: args.tokens], b[: args.tokens]) for a, b in zip(want, got, strict=True)]
        same = sum(p == args.tokens for p in prefix)
        same48 = sum(p == args.tokens for p in prefix[: len(PROMPTS)])  # the set earlier figures used
        diff = lp - want_lp
        row = {
            "same": same, "share": same / len(prompts), "same_of_first_48": same48,
            "mean_prefix": sum(prefix) / len(prefix), "text_top1": float((top == want_top).float().mean()),
            "mean_logprob_diff": float(diff.mean()), "mean_abs_logprob_diff": float(diff.abs().mean()),
            "forced_top1": float((run_top == want_run_top).float().mean()),
            "forced_abs_logprob_diff": float((run_lp - want_run_lp).abs().mean()),
        }  # fmt: skip
        results["variants"][name] = row
        took = time.perf_counter() - started
        print(
            f"{name:14s} {same}/{len(prompts)} ({100 * row['share']:.1f} %) first {args.tokens} equal "
            f"({same48}/{len(PROMPTS)} of the first), prefix {row['mean_prefix']:.2f}; text: top-1 "
            f"{100 * row['text_top1']:.1f} %, log-prob diff {diff.mean():+.4f}, "
            f"|diff| {diff.abs().mean():.4f}; forced on the greedy tokens: top-1 "
            f"{100 * row['forced_top1']:.2f} %, |diff| {row['forced_abs_logprob_diff']:.4f} ({took:.0f} s)",
            flush=True,
        )
        llm.close()
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
