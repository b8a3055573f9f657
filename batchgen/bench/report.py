"""Render bench records as markdown (runs + ratios) and write them out as JSON and markdown."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

_COLUMNS = [  # (header, record key, format)
    ("workload", "workload", "{}"),
    ("requests x (prompt + new)", "shape", "{}"),
    ("mode", "mode", "{}"),
    ("wall s", "wall_s", "{:.2f}"),
    ("out tok/s", "tok_s", "{:.1f}"),
    ("GPU active %", "gpu_active_pct", "{:.1f}"),
    ("CPU ms/step", "cpu_ms_step", "{:.2f}"),
    ("GPU ms/step", "gpu_ms_step", "{:.2f}"),
    ("roofline", "roofline", "{:.2f}"),
    ("peak GiB", "peak_mem_gib", "{:.2f}"),
    ("tokens", "tokens", "{}"),
    ("load 1m", "load_1m", "{:.1f}"),
    ("note", "note", "{}"),
]
BASELINES = ("generate_batch", "hf_loop", "hf_padded", "hf_forward")


def _cell(record: dict, key: str, fmt: str) -> str:
    if key == "tokens":
        return _tokens_cell(record)
    if key == "note" and record.get("error"):
        return f"FAILED: {_short(record['error'])}"
    value = record.get(key)
    return "-" if value is None or value == "" else fmt.format(value)


def _tokens_cell(record: dict) -> str:
    got, want = record.get("output_tokens"), record.get("expected_tokens")
    if got is None:
        return "-"
    return f"{got}" if got == want else f"{got} (want {want})"


def _short(text: str, limit: int = 80) -> str:
    text = " ".join(str(text).split()).replace("|", "/")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def runs_table(records: list[dict]) -> str:
    lines = [
        "| " + " | ".join(h for h, _, _ in _COLUMNS) + " |",
        "|" + "|".join(" --- " for _ in _COLUMNS) + "|",
    ]
    for r in records:
        lines.append("| " + " | ".join(_cell(r, k, f) for _, k, f in _COLUMNS) + " |")
    return "\n".join(lines)


def _rate(records: list[dict], workload: str, mode: str) -> float | None:
    """The median rate of the mode's runs (several with ``--repeat``)."""
    rates = sorted(
        r["tok_s"] for r in records if r["workload"] == workload and r["mode"] == mode and r.get("tok_s")
    )
    return rates[len(rates) // 2] if rates else None


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}x" if a and b else "-"


def ratios_table(records: list[dict]) -> str:
    """Output tok/s ratios: async over sync, then batchgen (its faster mode) over each baseline.

    Rates, not wall times, because a baseline may run a shorter decode to fit the time budget. With
    repeated runs, each mode's median rate.
    """
    lines = [
        "| workload | async / sync | " + " | ".join(f"batchgen / {b}" for b in BASELINES) + " |",
        "|" + "|".join(" --- " for _ in range(2 + len(BASELINES))) + "|",
    ]
    for workload in dict.fromkeys(r["workload"] for r in records):
        a, s = _rate(records, workload, "async"), _rate(records, workload, "sync")
        best = max((x for x in (a, s, _rate(records, workload, "run")) if x), default=None)
        cells = [_ratio(a, s)] + [_ratio(best, _rate(records, workload, b)) for b in BASELINES]
        lines.append(f"| {workload} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def render(records: list[dict]) -> str:
    return runs_table(records) + "\n\n" + ratios_table(records) + "\n"


def write(records: list[dict], out_dir: str | Path, header: dict[str, Any]) -> list[Path]:
    """``bench.json`` (machine, command, every record) and ``bench.md`` (the two tables)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    js, md = out / "bench.json", out / "bench.md"
    js.write_text(json.dumps({**header, "runs": records}, indent=1, default=str) + "\n")
    lines = [f"- {k}: {v}" for k, v in header.items()]
    md.write_text("\n".join(lines) + "\n\n" + render(records))
    return [js, md]
