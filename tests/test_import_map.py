"""The repository map holds: every ``layoutlab`` import, lazy ones inside functions included,
goes from a package to one at or below it in this order (docs/development.md, "Repository map")."""

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "layoutlab"
ORDER = [
    ("layout", "precision", "loss_scale", "lazy", "arguments", "fast_defaults"),
    ("nn",),
    ("models",),
    ("data",),
    ("train",),
    ("xla",),
    ("compare",),
    ("infer",),
    ("bench",),
    ("cli", "__init__"),
]
RANK = {name: i for i, names in enumerate(ORDER) for name in names}


def _unit(module: str) -> str:
    """``layoutlab.train.loop`` -> ``train``; ``layoutlab`` itself -> ``__init__``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _imports(path: Path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "layoutlab":
                # ``from layoutlab import models`` names packages; a plain name is __init__'s.
                for alias in node.names:
                    yield node.lineno, alias.name if alias.name in RANK else "__init__"
            elif node.module.startswith("layoutlab."):
                yield node.lineno, _unit(node.module)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("layoutlab."):
                    yield node.lineno, _unit(alias.name)


def test_every_unit_is_on_the_map():
    units = {p.stem if p.parent == SRC else p.relative_to(SRC).parts[0] for p in SRC.rglob("*.py")}
    assert units <= set(RANK), sorted(units - set(RANK))


def test_imports_go_one_way():
    upward = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC)
        here = rel.stem if len(rel.parts) == 1 else rel.parts[0]
        for line, there in _imports(path):
            if RANK[there] > RANK[here]:
                upward.append(f"{rel}:{line} imports {there} (above {here})")
    assert not upward, "\n".join(upward)


def test_standard_library_leaves_import_nothing_else():
    """``lazy.py`` and ``arguments.py`` are imported by every package's ``__init__`` and
    ``command`` module to keep ``--help`` free of JAX: they import the standard library only."""
    import sys

    for name in ("lazy", "arguments"):
        tree = ast.parse((SRC / f"{name}.py").read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                roots = [alias.name.split(".")[0] for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                roots = [(node.module or "").split(".")[0]]
            else:
                continue
            for root in roots:
                assert root in sys.stdlib_module_names or root == "__future__", (name, root)
