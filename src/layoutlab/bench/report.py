"""Benchmark rows as a Markdown table, absolute numbers with the PyTorch ratios beside them."""

from __future__ import annotations

from layoutlab.bench.results import IMPRECISE, UNTRUSTED, variant

__all__ = ["markdown_grid", "markdown_table", "ratio_text"]


def markdown_grid(header, rows) -> list[str]:
    """A Markdown table as lines: ``header`` (column names), a rule, one line per row
    (cells formatted with ``str``)."""
    header = [str(h) for h in header]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        cells = [str(c) for c in row]
        if len(cells) != len(header):
            raise ValueError(f"a row of {len(cells)} cells in a table of {len(header)} columns.")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _num(value, fmt: str) -> str:
    return "" if value is None else format(value, fmt)


def ratio_text(r) -> str:
    """``1.12 [1.05, 1.19]``; ``(same)`` when the interval contains 1; ``(not trustworthy:
    unstable)`` when this row or the PyTorch row it is compared with is unstable; ``(not
    trustworthy: interval too wide, ...)`` when outlier rounds made the interval imprecise."""
    ratio = _num(r.get("ratio_vs_torch_best"), ".2f")
    if ratio and r.get("ratio_ci_low") is not None:
        ratio += f" [{r['ratio_ci_low']:.2f}, {r['ratio_ci_high']:.2f}]"
        if r.get("ratio_verdict") == "indistinguishable":
            ratio += " (same)"
    if ratio and (r.get("unstable") or r.get("ratio_verdict") == UNTRUSTED):
        ratio += " (not trustworthy: unstable)"
    elif ratio and r.get("ratio_verdict") == IMPRECISE:
        ratio += " (not trustworthy: interval too wide, rerun with a longer --time-budget)"
    return ratio


def _rate(r) -> str:
    rate = _num(r.get("gflops_per_sec"), ".1f")
    if rate and r.get("pct_of_peak") is not None:
        rate += f" ({r['pct_of_peak']:.0f}%)"
    return rate


def _status(r) -> str:
    if r["status"] != "ok":
        return f"**{r['status']}**"
    if r.get("unstable"):
        return f"**unstable**: {r.get('unstable_reason') or ''}"
    return "ok"


def markdown_table(rows, *, frameworks: tuple[str, ...] | None = None) -> str:
    """One line per row: configuration (``variant``: conv algorithm, kernel storage, XLA
    options when not the defaults), images/s, median ms with its 95% interval, spread (IQR
    over median), compile s, the ratio to PyTorch's best with its interval, status (an
    unstable row says why)."""
    header = (
        "| framework | mode | batch | layout | precision | variant | images/s | step ms median "
        "[95% interval] | IQR/median | GFLOP/s (% of peak) | compile s | vs PyTorch best "
        "[95% interval] | status |"
    )
    lines = [header, "|" + "---|" * 13]
    order = lambda r: (
        r["mode"],
        r["batch_size"],
        r.get("precision_class") or "",
        r["framework"],
        r["layout"],
        r["precision"],
        variant(r),
    )
    for r in sorted(rows, key=order):
        if frameworks is not None and r["framework"] not in frameworks:
            continue
        ms = ""
        if r.get("step_ms_median") is not None:
            ms = f"{r['step_ms_median']:.2f}"
            if r.get("step_ms_ci_low") is not None:
                ms += f" [{r['step_ms_ci_low']:.2f}, {r['step_ms_ci_high']:.2f}]"
        spread = "" if r.get("dispersion") is None else f"{r['dispersion']:.1%}"
        lines.append(
            f"| {r['framework']} | {r['mode']} | {r['batch_size']} | {r['layout']} | "
            f"{r['precision']} | {variant(r)} | {_num(r.get('images_per_sec'), '.1f')} | {ms} | "
            f"{spread} | {_rate(r)} | {_num(r.get('compile_s'), '.1f')} | {ratio_text(r)} | "
            f"{_status(r)} |"
        )
    return "\n".join(lines)
