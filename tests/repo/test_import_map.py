"""The repository map holds: every ``layoutlab`` import, lazy ones inside functions included,
goes from a package to one at or below it in this order (docs/development.md, "Repository map")."""

import ast
import functools
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "layoutlab"
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


@functools.cache
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text())


def _imports(path: Path):
    for node in ast.walk(_tree(path)):
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


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in SRC.rglob("*.py")}


def _imported_modules(path: Path):
    """``(node, module, names)`` for each ``layoutlab`` import in ``path``, lazy ones and
    ``TYPE_CHECKING`` ones included; ``from layoutlab.models import resnet`` imports the
    module ``layoutlab.models.resnet``, ``from layoutlab.models import create`` the package."""
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in MODULES:
            yield node, node.module, [a.name for a in node.names]
            for alias in node.names:
                if f"{node.module}.{alias.name}" in MODULES:
                    yield node, f"{node.module}.{alias.name}", []
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in MODULES:
                    yield node, alias.name, []


def test_no_import_cycles():
    """No module reaches itself through imports, even lazy or type-checking ones: a cycle is
    two modules that cannot be read, tested or moved apart (a shared piece goes to a third)."""
    import graphlib

    graph = {
        name: {module for _, module, _ in _imported_modules(path)} - {name}
        for name, path in MODULES.items()
    }
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as e:
        raise AssertionError(f"import cycle: {' -> '.join(e.args[1])}") from None


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def test_no_module_uses_another_modules_private_names():
    """A name two modules share is public in the module that owns it: no ``from
    layoutlab.x import _y``, and no ``module._y`` on an imported ``layoutlab`` module."""
    found = []
    for name, path in sorted(MODULES.items()):
        modules = {}  # local name -> the layoutlab module bound to it
        for node, module, names in _imported_modules(path):
            found += [f"{name}:{node.lineno} imports {module}.{n}" for n in names if _private(n)]
            for alias in node.names:
                bound = (
                    alias.name if isinstance(node, ast.Import) else f"{node.module}.{alias.name}"
                )
                if bound == module and (alias.asname or isinstance(node, ast.ImportFrom)):
                    modules[alias.asname or alias.name] = module
        for node in ast.walk(_tree(path)):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and modules.get(node.value.id, name) != name
                and _private(node.attr)
            ):
                found.append(f"{name}:{node.lineno} uses {modules[node.value.id]}.{node.attr}")
    assert not found, "\n".join(found)
