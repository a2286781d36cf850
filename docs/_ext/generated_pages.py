"""Pages written at build time from the code and files they describe, so they cannot drift:
the ``TrainConfig`` reference (fields, types, defaults, the comment above each field, the
``train`` flag that sets it), the notebooks, and the benchmark results. They go to
``docs/_generated/`` (ignored by git), which the toctrees point into."""

from __future__ import annotations

import ast
import dataclasses
import json
import re
import shutil
from pathlib import Path

DOCS = Path(__file__).resolve().parents[1]
ROOT = DOCS.parent
OUT = DOCS / "_generated"


def _field_comments(source: str, cls: str) -> dict[str, str]:
    """The ``#`` comment lines directly above each annotated field of class ``cls``."""
    lines = source.splitlines()
    tree = ast.parse(source)
    node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls)
    out, previous = {}, None
    for stmt in node.body:
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            above, i = [], stmt.lineno - 2
            while i >= 0 and lines[i].strip().startswith("#"):
                above.insert(0, lines[i].strip().lstrip("#").strip())
                i -= 1
            # A field right below a commented one, with no comment of its own, shares it.
            if not above and previous is not None and previous.end_lineno == stmt.lineno - 1:
                out[stmt.target.id] = out[previous.target.id]
            else:
                out[stmt.target.id] = " ".join(above)
            previous = stmt
    return out


def _train_flags() -> dict[str, list[str]]:
    from layoutlab import cli

    parser = cli.build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    flags: dict[str, list[str]] = {}
    for action in sub.choices["train"]._actions:
        if action.option_strings:
            flags.setdefault(action.dest, []).append(max(action.option_strings, key=len))
    return flags


def _default(field: dataclasses.Field) -> str:
    if field.default is not dataclasses.MISSING:
        return json.dumps(field.default)
    return json.dumps(field.default_factory())  # type: ignore[misc]


def config_reference() -> str:
    from layoutlab.train.config import TrainConfig

    source = (ROOT / "src/layoutlab/train/config.py").read_text()
    comments = _field_comments(source, "TrainConfig")
    flags = _train_flags()
    aliases = {"learning_rate": "lr", "num_steps": "steps"}
    rows = []
    for f in dataclasses.fields(TrainConfig):
        note = comments.get(f.name, "")
        flag = flags.get(f.name) or flags.get(aliases.get(f.name, ""), [])
        flag_text = ", ".join(f"`{x}`" for x in flag) or f"`--set {f.name}=...`"
        note = note.replace("|", "\\|")
        rows.append(f"| `{f.name}` | `{f.type}` | `{_default(f)}` | {flag_text} | {note} |")
    return "\n".join(
        [
            "# Configuration reference",
            "",
            "Every field of `layoutlab.train.TrainConfig`, generated from the class: its type, "
            "its default, the `layoutlab train` flag that sets it (any field can also be set "
            "with `--set NAME=VALUE` or in a `--config` file), and what it means. `config.json` "
            "in a run's workdir holds these fields, resolved.",
            "",
            "| field | type | default | flag | meaning |",
            "|---|---|---|---|---|",
            *rows,
            "",
        ]
    )


def _title(markdown: Path) -> str:
    for line in markdown.read_text().splitlines():
        if line.startswith("# "):
            return line[2:].strip()
    return markdown.stem


def results_pages() -> list[str]:
    """Each ``benchmarks/results/*.md`` as a page; returns the page names."""
    dest = OUT / "results"
    dest.mkdir(parents=True, exist_ok=True)
    names = []
    for src in sorted((ROOT / "benchmarks/results").glob("*.md")):
        text = src.read_text()
        if not text.lstrip().startswith("# "):
            # A file of sections only (a sweep's table per model): its name as the title,
            # and its headings moved up so that they start one level below it.
            levels = [len(m) for m in re.findall(r"^(#+) ", text, re.M)]
            shift = min(levels, default=2) - 2
            text = re.sub(rf"^#{{{shift}}}(#+ )", r"\1", text, flags=re.M) if shift else text
            text = f"# {src.stem.replace('_', ' ')}\n\n{text}"
        (dest / src.name).write_text(text)
        names.append(src.stem)
    return names


def notebooks() -> list[str]:
    dest = OUT / "notebooks"
    dest.mkdir(parents=True, exist_ok=True)
    names = []
    for src in sorted((ROOT / "notebooks").glob("*.ipynb")):
        shutil.copyfile(src, dest / src.name)
        names.append(src.stem)
    return names


def write_all() -> None:
    if OUT.exists():
        shutil.rmtree(OUT)
    OUT.mkdir(parents=True)
    (OUT / "config.md").write_text(config_reference())
    _index_page(
        "results",
        "Benchmark results",
        "Every results file under `benchmarks/results/`, as committed: each names its machine, "
        "versions, command and spread.",
        results_pages(),
    )
    _index_page(
        "notebooks",
        "Notebooks",
        "The notebooks under `notebooks/`, with the outputs of their last run; the test suite "
        "runs each of them (nbmake).",
        notebooks(),
    )


def _index_page(folder: str, title: str, text: str, pages: list[str]) -> None:
    toctree = "\n".join(f"{folder}/{name}" for name in pages)
    (OUT / f"{folder}.md").write_text(
        f"# {title}\n\n{text}\n\n```{{toctree}}\n:maxdepth: 1\n\n{toctree}\n```\n"
    )


def setup(app):
    # At import of the extension: the pages must exist before Sphinx collects its sources.
    write_all()
    return {"parallel_read_safe": True, "version": "1"}
