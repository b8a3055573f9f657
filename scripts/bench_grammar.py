"""Host cost of structured output per constrained row and step: advancing a grammar by one token and
filling its bitmask row, on the real code path (engine/grammar.py), no model.

ROWS matchers walk B3j's schema (batchgen.bench.workloads.RECORDS_SCHEMA) as a random model would: each
step every row takes a random token among those its mask allows. Prints microseconds per row and per
step of 256 rows, which is what the engine adds to the host's share of a decode step (it must stay
under the GPU's step time: docs/structured-output.md).

    python scripts/bench_grammar.py [--rows 256] [--steps 100] [--threads 1] [--vocab 151936]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from batchgen.bench.workloads import RECORDS_SCHEMA  # noqa: E402
from batchgen.config import SamplingParams  # noqa: E402
from batchgen.engine.grammar import GrammarCompiler  # noqa: E402
from tests.support.models import tokenizer_path  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--threads", type=int, default=None, help="mask-filling threads [half the cores]")
    parser.add_argument("--vocab", type=int, default=151936, help="the LM head's width (Qwen3's by default)")
    args = parser.parse_args()
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path())
    grammars = GrammarCompiler(tokenizer, args.vocab, [tokenizer.eos_token_id])
    params = SamplingParams(json_schema=RECORDS_SCHEMA)
    t0 = time.perf_counter()
    compiled = grammars.compile(params)
    compile_ms = 1000 * (time.perf_counter() - t0)
    if args.threads is not None:
        import xgrammar as xgr

        grammars._batch = xgr.BatchGrammarMatcher(args.threads)
    guides = [grammars.guide(compiled) for _ in range(args.rows)]
    masks = torch.empty((args.rows, grammars.mask_width), dtype=torch.int32)
    rng = np.random.default_rng(0)
    fill_s = accept_s = 0.0
    for _ in range(args.steps):
        t0 = time.perf_counter()
        grammars.fill_masks(guides, masks)
        fill_s += time.perf_counter() - t0
        bits = np.unpackbits(masks.numpy().view(np.uint8), axis=1, bitorder="little")
        tokens = [int(rng.choice(np.flatnonzero(row))) for row in bits]  # a random model's pick
        t0 = time.perf_counter()
        for guide, token in zip(guides, tokens, strict=True):
            assert guide.accept(token)
        accept_s += time.perf_counter() - t0
    per_row = 1e6 / (args.steps * args.rows)
    result = {
        "rows": args.rows,
        "steps": args.steps,
        "vocab": args.vocab,
        "grammar_vocab": grammars.vocab,
        "threads": args.threads or "auto",
        "compile_ms": round(compile_ms, 1),
        "fill_us_row": round(fill_s * per_row, 2),
        "accept_us_row": round(accept_s * per_row, 2),
        "host_ms_step": round(1000 * (fill_s + accept_s) / args.steps, 3),
        "load_1m": os.getloadavg()[0],
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
