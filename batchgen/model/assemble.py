"""Assemble batchgen's fused forward: a model's structure (``ModelSpec``) + its tensors (a
``WeightSource``) + how projections are stored (a ``WeightFormat``) + the rank's share (``ParallelGroup``).

Checkpoint names are transformers' (``model.layers.{i}.self_attn.q_proj.weight``, ...). With one
process nothing is sliced (an in-memory model's projections merge into views, copying nothing).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch

from batchgen.distributed.group import ParallelGroup
from batchgen.distributed.layers import LMHead, VocabEmbedding
from batchgen.distributed.shard import HeadShard, Span, config_problem, even_span, head_shard, vocab_span
from batchgen.model.calibrate import Calibration
from batchgen.model.fused import Attention, DenseMLP, FusedForward, Layer, ProjectionNorm
from batchgen.model.kv_cache import KVShape
from batchgen.model.moe_layer import moe_mlp
from batchgen.model.moe_layout import MoELayout
from batchgen.model.spec import ModelSpec, ModelStructure, rope_tables
from batchgen.model.weights.formats import DenseFormat, WeightFormat
from batchgen.model.weights.fp8 import kv_scales
from batchgen.model.weights.rank_loader import Loader
from batchgen.model.weights.sources import Part, WeightSource


class Assembled(NamedTuple):
    forward: FusedForward
    spec: ModelSpec
    heads: HeadShard  # this rank's query and KV heads
    vocab: Span  # this rank's vocabulary range


def assemble(
    structure: ModelStructure, source: WeightSource, fmt: WeightFormat, group: ParallelGroup,
    dtype: torch.dtype, max_positions: int, fp8_cache: bool = False,
    calibration: Sequence[Sequence[int]] = (),
) -> Assembled:  # fmt: skip
    """``fp8_cache``: the KV cache is FP8, so each layer takes the checkpoint's KV scales (else 1.0).
    ``calibration``: token sequences that a format which calibrates (``--quantization fp8``) records each
    layer's inputs on (``model/calibrate.py``); one process only (ranks would record their shards apart)."""
    spec = structure.spec
    problem = config_problem(structure.config, group.size)
    if problem is not None:
        raise ValueError(problem)
    heads = head_shard(spec.q_heads, spec.kv_heads, group.rank, group.size)
    vocab = vocab_span(spec.vocab, group.rank, group.size)
    load = Loader(source, fmt, group, dtype)
    embed = load.dense("model.embed_tokens.weight", load.span(vocab))
    head_name = "model.embed_tokens.weight" if spec.tied_embeddings else "lm_head.weight"
    head = embed if spec.tied_embeddings else load.dense(head_name, load.span(vocab))
    bias = load.dense("lm_head.bias", load.span(vocab)) if source.has("lm_head.bias") else None
    rope = rope_tables(spec, max_positions, dtype, source.device)
    embedding, lm_head = VocabEmbedding(embed, vocab, group), LMHead(head, bias, vocab)
    forward = FusedForward(
        [], embedding, load.dense("model.norm.weight"), lm_head, rope, (heads.q.size, heads.kv.size),
        spec.scale, spec.eps,
    )  # fmt: skip
    calibrate = None
    if calibration and hasattr(fmt, "hessians") and not group.is_parallel:
        kv = KVShape(spec.num_layers, heads.kv.size, spec.head_dim)
        sequences = [ids[:max_positions] for ids in calibration]  # a chat longer than the model's window
        calibrate = Calibration(forward, sequences, kv, dtype, source.device)
        dense = Loader(source, DenseFormat(dtype), group, dtype)
    for i, moe in enumerate(structure.layers):
        if calibrate is not None:  # layer i in 16 bits first: its projections' inputs for GPTQ
            fmt.hessians.update(
                calibrate.record(i, _layer(dense, spec, moe, i, heads, False), f"model.layers.{i}.")
            )
        forward.layers.append(_layer(load, spec, moe, i, heads, fp8_cache))
        if calibrate is not None:
            fmt.hessians.clear()  # any a layer did not take (a projection built otherwise)
    return Assembled(forward, spec, heads, vocab)


def _layer(
    load: Loader, spec: ModelSpec, moe: MoELayout | None, i: int, heads: HeadShard, fp8_cache: bool
) -> Layer:
    """Decoder layer ``i``; ``moe``: its sparse MLP, None for a dense one (all layers of a dense model, and
    the layers between MoE ones that ``mlp_only_layers`` or ``decoder_sparse_step`` leave dense)."""
    prefix = f"model.layers.{i}."
    attn = _attention(load, spec, prefix + "self_attn.", heads, spec.sliding_windows[i])
    if fp8_cache:
        attn = attn._replace(kv_scales=kv_scales(load.source, prefix))
    if moe is not None:
        mlp, mlp_quant = moe_mlp(load, moe, prefix), None
    else:
        mlp = _dense_mlp(load, spec, prefix + "mlp.")
        mlp_quant = mlp.gate_up.act_quant  # the post-attention norm writes the MLP's input as it wants it
    norms = [load.dense(prefix + n) for n in ("input_layernorm.weight", "post_attention_layernorm.weight")]
    return Layer(norms[0], attn, norms[1], mlp, mlp_quant)


def _attention(load: Loader, spec: ModelSpec, prefix: str, heads: HeadShard, window: int | None) -> Attention:
    q_rows, kv_rows = load.span(heads.q.scaled(spec.head_dim)), load.span(heads.kv.scaled(spec.head_dim))
    parts = [Part(prefix + "q_proj.weight", q_rows), Part(prefix + "k_proj.weight", kv_rows),
             Part(prefix + "v_proj.weight", kv_rows)]  # fmt: skip
    qkv = load.fmt.linear(load.source, parts, bias=True)
    norms = [load.dense(prefix + n) if spec.qk_norm else None for n in ("q_norm.weight", "k_norm.weight")]
    o_proj = load.row_parallel(prefix + "o_proj.weight", heads.q.scaled(spec.head_dim))
    full_norm = _projection_norm(load, spec, prefix, q_rows, kv_rows) if spec.qk_norm_full else None
    return Attention(qkv, *norms, o_proj, window, full_norm)


def _projection_norm(load: Loader, spec: ModelSpec, prefix: str, q_rows, kv_rows) -> ProjectionNorm:
    """OLMoE's full-width q/k norms, cut like the projections' rows."""
    widths = (spec.q_heads * spec.head_dim, spec.kv_heads * spec.head_dim)
    copies = max(1, load.group.size // spec.kv_heads)  # ranks sharing one replicated KV head
    q_weight = load.dense(prefix + "q_norm.weight", q_rows)
    k_weight = load.dense(prefix + "k_norm.weight", kv_rows)
    return ProjectionNorm(q_weight, k_weight, widths, spec.eps, load.group, copies)


def _dense_mlp(load: Loader, spec: ModelSpec, prefix: str) -> DenseMLP:
    rows = even_span(spec.intermediate, load.group.rank, load.group.size)
    parts = [
        Part(prefix + "gate_proj.weight", load.span(rows)),
        Part(prefix + "up_proj.weight", load.span(rows)),
    ]
    return DenseMLP(
        load.fmt.linear(load.source, parts, bias=True), load.row_parallel(prefix + "down_proj.weight", rows)
    )
