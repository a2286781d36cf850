"""Benchmark rows as a Markdown table, absolute numbers with the PyTorch ratios beside them."""

from __future__ import annotations

from layoutlab.bench.results import variant

__all__ = ["markdown_grid", "markdown_table"]


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


def markdown_table(rows, *, frameworks: tuple[str, ...] | None = None) -> str:
    """One line per row: configuration (``variant``: conv algorithm, kernel storage, XLA
    options when not the defaults), images/s, median/min/max ms, compile s, ratio."""
    header = (
        "| framework | mode | batch | layout | precision | variant | images/s | step ms median "
        "(min-max) | compile s | vs PyTorch best | status |"
    )
    lines = [header, "|" + "---|" * 11]
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
            ms = f"{r['step_ms_median']:.2f} ({r['step_ms_min']:.2f}-{r['step_ms_max']:.2f})"
        ratio = _num(r.get("ratio_vs_torch_best"), ".2f")
        status = r["status"] if r["status"] == "ok" else f"**{r['status']}**"
        lines.append(
            f"| {r['framework']} | {r['mode']} | {r['batch_size']} | {r['layout']} | "
            f"{r['precision']} | {variant(r)} | {_num(r.get('images_per_sec'), '.1f')} | {ms} | "
            f"{_num(r.get('compile_s'), '.1f')} | {ratio} | {status} |"
        )
    return "\n".join(lines)
