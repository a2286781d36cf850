"""PNG charts of benchmark rows (matplotlib figures rendered with Agg; no display needed).

- ``plot_throughput``: images/s against batch size, one panel per mode, one line per
  framework x layout x precision;
- ``plot_memory``: XLA's temporary and argument bytes against batch size (PyTorch rows
  only on GPU, where its allocator reports a peak);
- ``plot_ratios``: layoutlab's speed over the best PyTorch eager configuration (1 = parity).
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from layoutlab.bench.results import variant

__all__ = ["plot_all", "plot_memory", "plot_ratios", "plot_throughput", "ratio_figure"]

_STYLE = {"layoutlab": "-", "torch": "--", "torch.compile": ":"}


def _figure(**kw):
    # A bare Figure renders with Agg and never touches pyplot's global backend or state.
    from matplotlib.figure import Figure

    return Figure(**kw)


def _ok(rows) -> list[dict]:
    return [r for r in rows if r.get("status") == "ok"]


def _title(rows) -> str:
    first = rows[0]
    kwargs = first.get("model_kwargs") or "{}"
    extra = "" if kwargs == "{}" else f" {kwargs}"
    return f"{first['model']}{extra}, input {first['input_shape']}"


def _series(rows, value) -> dict:
    lines = defaultdict(list)
    for r in rows:
        v = value(r)
        if v is not None:
            key = (r["framework"], r["layout"], f"{r['precision']} {variant(r)}".strip())
            lines[key].append((r["batch_size"], v))
    return {k: sorted(v) for k, v in sorted(lines.items())}


def _line_panels(rows, value, ylabel: str, path: Path, title: str) -> Path:
    modes = sorted({r["mode"] for r in rows})
    fig = _figure(figsize=(6 * len(modes), 4.2))
    axes = fig.subplots(1, len(modes), squeeze=False)[0]
    for ax, mode in zip(axes, modes, strict=False):
        mode_rows = [r for r in rows if r["mode"] == mode]
        for (fw, layout, prec), pts in _series(mode_rows, value).items():
            xs, ys = zip(*pts, strict=True)
            ax.plot(xs, ys, _STYLE.get(fw, "-."), marker="o", label=f"{fw} {layout} {prec}")
        # Unstable rows (bench.stats) get a red ring: their values are not to be trusted.
        shaky = [(r["batch_size"], value(r)) for r in mode_rows if r.get("unstable")]
        shaky = [(x, y) for x, y in shaky if y is not None]
        if shaky:
            ax.scatter(*zip(*shaky, strict=True), s=120, facecolors="none", edgecolors="red",
                       label="unstable (see table)", zorder=3)  # fmt: skip
        ax.set_title(f"{mode}")
        ax.set_xlabel("batch size")
        ax.set_ylabel(ylabel)
        ax.set_xscale("log", base=2)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path


def plot_throughput(rows, path) -> Path:
    rows = _ok(rows)
    if not rows:
        raise ValueError("No ok rows to plot; every configuration failed.")
    return _line_panels(
        rows,
        lambda r: r.get("images_per_sec"),
        "images / s",
        Path(path),
        f"Throughput: {_title(rows)}",
    )


def plot_memory(rows, path) -> Path:
    rows = _ok(rows)
    if not rows:
        raise ValueError("No ok rows to plot; every configuration failed.")

    def mib(r):
        if r["framework"] == "layoutlab":
            parts = [r.get("temp_bytes"), r.get("argument_bytes")]
            return None if parts[0] is None else sum(p or 0 for p in parts) / 2**20
        peak = r.get("device_peak_bytes")
        return None if peak is None else peak / 2**20

    return _line_panels(
        rows,
        mib,
        "MiB (XLA temp + arguments; torch: device peak)",
        Path(path),
        f"Memory: {_title(rows)}",
    )


def plot_ratios(rows, path) -> Path | None:
    """Bar chart of ``ratio_vs_torch_best``; None when no row has one (no PyTorch run)."""
    fig = ratio_figure(rows)
    if fig is None:
        return None
    fig.savefig(path, dpi=110)
    return Path(path)


def ratio_figure(rows):
    """``plot_ratios``' figure (a matplotlib ``Figure``), or None with no ratio to draw."""
    rows = [r for r in _ok(rows) if r.get("ratio_vs_torch_best") is not None]
    if not rows:
        return None
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter

    rows = sorted(
        rows, key=lambda r: (r["mode"], r["batch_size"], r["precision"], r["layout"], variant(r))
    )
    labels = [
        f"{r['mode']} b{r['batch_size']}\n{r['layout']} {r['precision']}\n{variant(r)}".strip()
        for r in rows
    ]
    ratios = [r["ratio_vs_torch_best"] for r in rows]
    fig = _figure(figsize=(max(6, 0.8 * len(rows) + 2), 4.5))
    ax = fig.subplots()
    colors = ["tab:green" if v >= 1 else "tab:red" for v in ratios]
    # The paired-ratio interval as an error bar around the median per-round ratio drawn
    # (clipped at the bar for rows without rounds); unstable rows hatched.
    low = [max(0.0, v - (r.get("ratio_ci_low") or v)) for v, r in zip(ratios, rows, strict=True)]
    high = [max(0.0, (r.get("ratio_ci_high") or v) - v) for v, r in zip(ratios, rows, strict=True)]
    hatch = ["//" if r.get("unstable") else "" for r in rows]
    bars = ax.bar(range(len(rows)), ratios, color=colors, yerr=[low, high], capsize=3)
    for bar, h in zip(bars, hatch, strict=True):
        bar.set_hatch(h)
    ax.axhline(1.0, color="black", linewidth=1)
    # Log scale: 0.5x and 2x sit at the same distance from parity. Labels only at 1-2-5
    # ratios (powers of ten over a wide range): a label on every minor tick, as the log
    # axis' own formatter gives, put 0.9 on top of 1 and 9 on top of 10.
    ax.set_yscale("log")
    ax.yaxis.set_major_locator(FixedLocator(_ratio_ticks(*ax.get_ylim())))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())
    # Upright three-line labels take about 0.4 inch of the 0.8 each bar has: tilted ones
    # ran into their neighbours and the axis label.
    ax.set_xticks(range(len(rows)), labels, fontsize=7, rotation=90, ha="center")
    ax.set_ylabel("layoutlab / best PyTorch eager (images/s)")
    ax.set_title(f"layoutlab vs PyTorch: {_title(rows)}")
    for i, (v, up) in enumerate(zip(ratios, high, strict=True)):
        ax.text(i, v + up, f"{v:.2f}", ha="center", va="bottom", fontsize=7)  # over the bar
    fig.tight_layout()
    return fig


# At most this many labelled ratios on the axis, which stay apart on a 4.5 inch figure.
_MAX_RATIO_TICKS = 12


def _ratio_ticks(low: float, high: float) -> list[float]:
    """The 1-2-5 ratios from ``low`` to ``high`` (powers of ten only if there are too many)."""
    import math

    decades = range(math.floor(math.log10(low)), math.ceil(math.log10(high)) + 1)
    for steps in ((1, 2, 5), (1,)):
        ticks = [m * 10.0**e for e in decades for m in steps if low <= m * 10.0**e <= high]
        if len(ticks) <= _MAX_RATIO_TICKS:
            break
    return ticks


def plot_all(rows, directory) -> list[Path]:
    """Writes throughput.png, memory.png and (with PyTorch rows) ratio_vs_torch.png."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    if not _ok(rows):
        return []
    paths = [
        plot_throughput(rows, out / "throughput.png"),
        plot_memory(rows, out / "memory.png"),
    ]
    ratio = plot_ratios(rows, out / "ratio_vs_torch.png")
    return paths + ([ratio] if ratio is not None else [])
