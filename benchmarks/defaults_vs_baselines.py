"""The defaults of a ``layoutlab bench`` run against every baseline in the same rounds.

    layoutlab bench ... --torch --torch-compile --baseline-plain --out DIR
    python benchmarks/defaults_vs_baselines.py DIR/results.json [...]

One Markdown row per mode, batch and layout: the ``defaults`` row's median step time and
its ratio to PyTorch eager's faster memory format, to torch.compile's faster one and to
the plain-XLA row. A ratio is the median of the per-round paired ratios (baseline ms /
defaults ms, above 1 the defaults are faster) with its 95% interval
(``bench.stats.paired_ratio``): every case of a group takes one step per round, so round i
of each is paired. A group flagged unstable is marked.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from layoutlab.bench.report import markdown_grid
from layoutlab.bench.stats import paired_ratio


def _ok(rows, **match):
    return [
        r for r in rows
        if r["status"] == "ok" and all(r.get(k) == v for k, v in match.items())
    ]  # fmt: skip


def _fastest(rows):
    return min(rows, key=lambda r: r["step_ms_median"]) if rows else None


def _ratio(baseline, defaults) -> str:
    if baseline is None:
        return "-"
    ci = paired_ratio(json.loads(baseline["round_ms"]), json.loads(defaults["round_ms"]))
    if ci is None:
        return "-"
    mark = "**" if ci[1] < 1 else ""  # below 1 with separation or a tie: in bold
    return f"{mark}{ci[0]:.2f} [{ci[1]:.2f}, {ci[2]:.2f}]{mark}"


def table(rows: list[dict]) -> list[str]:
    body = []
    ours_all = _ok(rows, framework="layoutlab")
    keys = sorted(
        {(r["model"], r["mode"], r["batch_size"], r["layout"]) for r in ours_all},
        key=lambda k: (k[0], k[1] != "infer", k[2], k[3] != "NHWC"),
    )
    for model, mode, batch, layout in keys:
        same = dict(model=model, mode=mode, batch_size=batch)
        ours = _ok(rows, framework="layoutlab", layout=layout, defaults="fast", **same)
        if not ours:
            continue
        d = ours[0]
        plain = next(
            iter(_ok(rows, framework="layoutlab", layout=layout, defaults="plain", **same)), None
        )
        eager = _fastest(_ok(rows, framework="torch", **same))
        compiled = _fastest(_ok(rows, framework="torch.compile", **same))
        flag = " (unstable)" if d.get("unstable") else ""
        body.append((
            model, mode, batch, layout, f"{d['step_ms_median']:.2f}{flag}",
            "-" if eager is None else f"{eager['step_ms_median']:.2f}",
            _ratio(eager, d),
            "-" if compiled is None else f"{compiled['step_ms_median']:.2f}",
            _ratio(compiled, d),
            "-" if plain is None else f"{plain['step_ms_median']:.2f}",
            _ratio(plain, d),
        ))  # fmt: skip
    return markdown_grid(
        ("model", "mode", "batch", "layout", "defaults ms", "PyTorch eager best ms",
         "vs eager [95%]", "torch.compile best ms", "vs compile [95%]", "plain XLA ms",
         "vs plain [95%]"),
        body,
    )  # fmt: skip


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("results", nargs="+", type=Path)
    args = p.parse_args(argv)
    rows = [r for path in args.results for r in json.loads(path.read_text())["rows"]]
    print("\n".join(table(rows)))


if __name__ == "__main__":
    main()
