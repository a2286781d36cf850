"""An autotune cache as tables: per objective, batch and conv shape, XLA's conv against the
fastest other candidate, with the paired per-round ratio and the autotuner's verdict.

    layoutlab autotune convs --model resnet18 --stem cifar --image-size 32 --batch-size 8 \
        --mode train --repeats 8 --cache CACHE.json     # once per batch and mode
    python benchmarks/conv_autotune_table.py CACHE.json [...] --out benchmarks/results/NAME

Writes ``NAME.md`` (the table, with the machine fingerprint and versions the entries carry)
and ``NAME.json`` (every entry: per-round times, whether each candidate passed its check
against float64 NumPy, verdicts). The ratio is ``bench.stats.paired_ratio(xla, best)``:
above 1 the other candidate is faster.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from layoutlab.bench.report import markdown_grid
from layoutlab.bench.stats import paired_ratio


def _shape(spec_key: str) -> tuple[int, str]:
    """``(batch, "HxW:in->out:kKxK:sSxS")`` of a spec key ``NHWC:n8:16x16:...:float32``."""
    parts = spec_key.split(":")
    return int(parts[1][1:]), ":".join(parts[2:6])


def _row(entry: dict) -> tuple:
    rounds = entry["rounds_ms"]
    batch, shape = _shape(entry["spec_key"])
    medians = {a: statistics.median(t) for a, t in rounds.items() if t}
    others = sorted((m, a) for a, m in medians.items() if a != "xla")
    best_ms, best = others[0] if others else (None, "-")
    ci = paired_ratio(rounds["xla"], rounds[best]) if best in rounds else None
    cell = "-" if ci is None else f"{ci[0]:.2f} [{ci[1]:.2f}, {ci[2]:.2f}]"
    return (
        entry["objective"], batch, shape, len(rounds.get("xla", ())),
        f"{medians.get('xla', float('nan')):.3f}", best,
        "-" if best_ms is None else f"{best_ms:.3f}", cell,
        f"{entry['choice']} ({entry['verdict']})",
    )  # fmt: skip


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("caches", nargs="+", type=Path)
    p.add_argument("--title", default="Conv autotune: XLA's conv against the fastest other")
    p.add_argument("--out", required=True, help="path without suffix: writes .json and .md")
    args = p.parse_args(argv)
    entries = [
        e for c in args.caches for e in json.loads(c.read_text())["entries"].values()
        if e.get("kind", "conv") == "conv" and e.get("rounds_ms")
    ]  # fmt: skip
    rows = sorted((_row(e) for e in entries), key=lambda r: (r[0], r[1]))
    machines = sorted({e.get("fingerprint", "?") for e in entries})
    versions = sorted({json.dumps(e.get("versions", {}), sort_keys=True) for e in entries})
    lines = [f"# {args.title}", "", f"Machine: {'; '.join(machines)}.",
             f"Versions: {'; '.join(versions)}.", ""]  # fmt: skip
    lines += markdown_grid(
        ("objective", "batch", "shape (NHWC)", "rounds", "xla ms", "fastest other", "its ms",
         "xla/other per round [95%]", "choice (verdict)"),
        rows,
    )  # fmt: skip
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    out.with_suffix(".json").write_text(json.dumps([_compact(e) for e in entries]) + "\n")


def _compact(entry: dict) -> dict:
    """``entry`` with times to 1 us, each candidate's numerics check as passed or its error,
    and no cache key (the spec, options and machine are fields of their own)."""
    out = {k: v for k, v in entry.items() if k not in ("cache_key", "fingerprint")}
    out["rounds_ms"] = {a: [round(t, 3) for t in ts] for a, ts in entry["rounds_ms"].items()}
    out["candidates"] = [
        {"algorithm": c["algorithm"], "passed": c["passed"], "error": c.get("error")}
        for c in entry.get("candidates", [])
    ]
    return out


if __name__ == "__main__":
    main()
