"""Docstrings say what and why; the measurements behind a choice live in docs/performance/
(issue 68): no docstring in ``src/`` holds a speed-up figure, ``src/`` names
``benchmarks/results`` in at most 5 places, and every link from ``src/`` into
docs/performance/ names a page and a section that exist."""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "layoutlab"
PERFORMANCE = ROOT / "docs" / "performance"
# A ratio of times or rates: "1.34x", "3-5x faster", "1.2-1.6x as long", "2.5% faster". A
# size ("3 x 3", "8x8") or a factor that is no speed ("magnify the rounding about 20x") is not.
SPEEDUP = re.compile(
    r"\b\d+\.\d+x\b"
    r"|\b\d+(?:\.\d+)?(?:-\d+(?:\.\d+)?)?x (?:faster|slower|as long|as fast|of)\b"
    r"|\b\d+(?:\.\d+)?(?:-\d+(?:\.\d+)?)?% (?:faster|slower)\b"
)
LINK = re.compile(r"docs/performance/([\w-]+\.md)(?:#([\w-]+))?")


def _docstrings(path: Path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            text = ast.get_docstring(node, clean=False)
            if text:
                yield getattr(node, "name", "<module>"), getattr(node, "lineno", 1), text


def test_the_pattern_tells_speed_ups_from_sizes():
    for text in ("ran 1.34x", "3-5x faster", "1.2-1.6x as long", "measured 2.5% faster"):
        assert SPEEDUP.search(text), text
    for text in ("a 3 x 3 kernel", "8x8 inputs", "magnify the rounding about 20x", "5% of"):
        assert not SPEEDUP.search(text), text


def test_no_docstring_holds_a_speed_up_figure():
    found = [
        f"{path.relative_to(SRC)}:{line} {name}: {match.group(0)!r}"
        for path in sorted(SRC.rglob("*.py"))
        for name, line, text in _docstrings(path)
        for match in SPEEDUP.finditer(text)
    ]
    assert not found, "\n".join(found)


def test_src_names_benchmark_results_in_at_most_5_places():
    places = [
        f"{path.relative_to(SRC)}:{i}"
        for path in sorted(SRC.rglob("*"))
        if path.is_file() and path.suffix in (".py", ".md", ".txt", ".json", ".toml")
        for i, line in enumerate(path.read_text().splitlines(), 1)
        if "benchmarks/results" in line
    ]
    assert len(places) <= 5, "\n".join(places)


def _slug(heading: str) -> str:
    """MyST's anchor for a heading (``myst_heading_anchors``): lower case, punctuation
    dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    return {
        _slug(line.lstrip("#")) for line in page.read_text().splitlines() if line.startswith("#")
    }


def test_links_into_docs_performance_name_a_section():
    links = [
        (path, match)
        for path in sorted(SRC.rglob("*.py"))
        for match in LINK.finditer(path.read_text())
    ]
    assert links
    broken = [
        f"{path.relative_to(SRC)}: {match.group(0)}"
        for path, match in links
        if not (PERFORMANCE / match.group(1)).exists()
        or (match.group(2) and match.group(2) not in _anchors(PERFORMANCE / match.group(1)))
    ]
    assert not broken, "\n".join(broken)


def test_the_records_a_performance_page_cites_exist():
    for page in PERFORMANCE.glob("*.md"):
        for name in re.findall(r"benchmarks/results/[\w./-]+?\.(?:md|json|csv)", page.read_text()):
            assert (ROOT / name).exists(), (page.name, name)
