"""layoutlab's fastest configuration against PyTorch's fastest, per model, mode and batch: the
number a user choosing a framework looks at, beside the per-precision ratios.

For each workload (model, input, mode, batch) the fastest ok layoutlab row over every
precision, layout and setting (the ``--baseline-plain`` rows are a baseline, not a choice)
is set against the fastest ok row of each PyTorch family (eager, ``torch.compile``) over every
precision and memory format. Where both are of one precision class they were timed in the
same interleaved rounds and the ratio is the paired one of ``vs PyTorch best``
(``results.ratio_interval``). Rows of different precision classes ran in different groups
(``bench.sweep``), so there is no round to pair: the ratio is of the medians and its interval
runs from the lowest to the highest ratio the two medians' 95% intervals allow, marked "not
interleaved". Above 1, layoutlab is faster.
"""

from __future__ import annotations

from layoutlab.bench.report import markdown_grid, ratio_text
from layoutlab.bench.results import UNTRUSTED, ratio_fields, ratio_interval, variant
from layoutlab.bench.stats import Interval

__all__ = ["FAMILIES", "best_vs_best", "markdown_best_vs_best"]

FAMILIES = {"torch": "PyTorch eager", "torch.compile": "torch.compile"}
_WORKLOAD = ("model", "model_kwargs", "input_shape", "mode", "batch_size")


def _fastest(rows: list[dict]) -> dict | None:
    return max(rows, key=lambda r: r["images_per_sec"], default=None)


def _label(row: dict) -> str:
    if row["framework"] != "layoutlab":
        return f"{row.get('memory_format')}/{row['precision']}"
    return " ".join(p for p in (row["layout"], row["precision"], variant(row)) if p)


def _unpaired(theirs: dict, ours: dict) -> dict:
    """``theirs / ours`` step time from the two medians and their intervals."""
    try:
        value = theirs["step_ms_median"] / ours["step_ms_median"]
        low = theirs["step_ms_ci_low"] / ours["step_ms_ci_high"]
        high = theirs["step_ms_ci_high"] / ours["step_ms_ci_low"]
    except (KeyError, TypeError, ZeroDivisionError):
        return {"ratio_vs_torch_best": ours["images_per_sec"] / theirs["images_per_sec"]}
    return ratio_fields(Interval(value, low, high))


def _compare(theirs: dict, ours: dict) -> dict:
    interleaved = theirs.get("precision_class") == ours.get("precision_class")
    out = {"ratio_vs_torch_best": ours["images_per_sec"] / theirs["images_per_sec"]}
    out.update(ratio_interval(theirs, ours) if interleaved else _unpaired(theirs, ours))
    out.update(
        best=_label(theirs), images_per_sec=theirs["images_per_sec"], interleaved=interleaved
    )
    if ours.get("unstable") or theirs.get("unstable"):
        out["ratio_verdict"] = UNTRUSTED
    return out


def best_vs_best(rows: list[dict]) -> list[dict]:
    """One record per workload with a layoutlab and a PyTorch ok row: the workload's fields,
    ``layoutlab`` (the fastest row's label) and ``images_per_sec``, and per PyTorch family
    present (``FAMILIES``) its fastest row's label, images/s and the ratio columns."""
    ok = [r for r in rows if r.get("status") == "ok" and r.get("images_per_sec")]
    out = []
    for key in dict.fromkeys(tuple(r.get(k) for k in _WORKLOAD) for r in ok):
        same = [r for r in ok if tuple(r.get(k) for k in _WORKLOAD) == key]
        ours = _fastest([r for r in same if r["framework"] == "layoutlab"
                         and r.get("defaults") != "plain"])  # fmt: skip
        theirs = {f: _fastest([r for r in same if r["framework"] == f]) for f in FAMILIES}
        theirs = {f: row for f, row in theirs.items() if row is not None}
        if ours is None or not theirs:
            continue
        record = dict(zip(_WORKLOAD, key, strict=True))
        record.update(layoutlab=_label(ours), images_per_sec=ours["images_per_sec"])
        record.update({f: _compare(row, ours) for f, row in theirs.items()})
        out.append(record)
    return out


def markdown_best_vs_best(rows: list[dict]) -> str:
    """The ``best_vs_best`` records as a Markdown table under a heading; "" without any."""
    records = best_vs_best(rows)
    if not records:
        return ""
    families = [f for f in FAMILIES if any(f in r for r in records)]
    header = ["mode", "batch", "layoutlab best", "images/s"]
    for f in families:
        header += [f"{FAMILIES[f]} best", "images/s", f"layoutlab best vs {FAMILIES[f]} best"]
    table = []
    for r in sorted(records, key=lambda r: (r["mode"], r["batch_size"])):
        cells = [r["mode"], r["batch_size"], r["layoutlab"], f"{r['images_per_sec']:.1f}"]
        for f in families:
            c = r.get(f)
            if c is None:
                cells += ["", "", ""]
                continue
            ratio = ratio_text(c) + ("" if c["interleaved"] else " (not interleaved)")
            cells += [c["best"], f"{c['images_per_sec']:.1f}", ratio]
        table.append(cells)
    title = "Best against best (each framework's fastest precision and layout):"
    return "\n".join([title, "", *markdown_grid(header, table)])
