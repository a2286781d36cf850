"""Facts of the library's structure (issue 68), read from the source: every module says what
it exports (``__all__``), no package exports more than 25 names, and a package's lazy exports
are imported under ``if TYPE_CHECKING:`` too, so IDEs and type checkers see them."""

import ast
import functools
import importlib
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "layoutlab"
MAX_EXPORTS = 25


def _name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_name(p): p for p in sorted(SRC.rglob("*.py"))}
PACKAGES = {name: path for name, path in MODULES.items() if path.name == "__init__.py"}


@functools.cache
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text())


def _assigned(path: Path, name: str):
    """The value node of the module-level assignment to ``name``, or None."""
    for node in _tree(path).body:
        targets = node.targets if isinstance(node, ast.Assign) else []
        if isinstance(node, ast.AnnAssign):
            targets = [node.target]
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            return node.value
    return None


def _all(path: Path) -> list[str]:
    return ast.literal_eval(_assigned(path, "__all__"))


def test_every_module_has_all():
    missing = [name for name, path in MODULES.items() if _assigned(path, "__all__") is None]
    assert not missing, missing


def test_all_is_a_literal_list_of_unique_names():
    """A literal, so that readers and tools see it without running the module."""
    for name, path in MODULES.items():
        names = _all(path)
        assert isinstance(names, list) and len(names) == len(set(names)), name


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_no_package_exports_more_than_25_names(package):
    names = _all(PACKAGES[package])
    assert len(names) <= MAX_EXPORTS, (package, len(names))


def _lazy_map(path: Path) -> dict[str, str]:
    for name in ("_EXPORTS", "_HOMES"):
        value = _assigned(path, name)
        if isinstance(value, ast.Dict):
            return ast.literal_eval(value)
    return {}


def _type_checking_imports(path: Path) -> dict[str, str]:
    """``name -> module`` of each ``from module import name`` under ``if TYPE_CHECKING:``."""
    out = {}
    for node in _tree(path).body:
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            for stmt in ast.walk(node):
                if isinstance(stmt, ast.ImportFrom):
                    for alias in stmt.names:
                        out[alias.asname or alias.name] = stmt.module
    return out


LAZY = {name: path for name, path in PACKAGES.items() if _lazy_map(path)}


def test_the_lazy_packages_are_found():
    assert {"layoutlab", "layoutlab.bench", "layoutlab.xla", "layoutlab.host"} <= set(LAZY)


@pytest.mark.parametrize("package", sorted(LAZY))
def test_lazy_exports_are_imported_for_type_checkers(package):
    """Each lazily exported name is imported under ``if TYPE_CHECKING:`` from the module the
    lazy map loads it from, and every name in ``__all__`` is either that or the package's own."""
    path = LAZY[package]
    lazy, seen = _lazy_map(path), _type_checking_imports(path)
    wrong = {
        name: (seen.get(name), f"{package}.{module}")
        for name, module in lazy.items()
        if seen.get(name) != f"{package}.{module}"
    }
    assert not wrong, wrong
    own = {n.id for n in ast.walk(_tree(path)) if isinstance(n, ast.Name)} | set(seen)
    assert set(_all(path)) <= set(lazy) | own, set(_all(path)) - set(lazy) - own


@pytest.mark.parametrize("package", sorted(LAZY))
def test_every_export_resolves(package):
    """``__all__`` names nothing the package cannot give."""
    if package == "layoutlab.compare":
        pytest.importorskip("torch")  # its torch mirror needs the optional extra
    module = importlib.import_module(package)
    for name in _all(LAZY[package]):
        assert getattr(module, name) is not None, (package, name)


ROOT = SRC.parents[1]


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _unit(module: str) -> str:
    """``layoutlab.train.loop`` -> ``layoutlab.train``: the package a module belongs to."""
    parts = module.split(".")
    return ".".join(parts[:2])


def _private_imports(path: Path, here: str | None, every_module: bool):
    """``(line, what)`` for each private name or private module imported by ``path`` from a
    package other than ``here`` (None: outside the library); ``every_module``: names from
    any module count, not only layoutlab's (a benchmark script's from another script)."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            ours = node.module.split(".")[0] == "layoutlab"
            if not (ours or every_module) or (ours and _unit(node.module) == here):
                continue
            names = [a.name for a in node.names if _private(a.name)]
            names += [node.module] if any(map(_private, node.module.split(".")[1:])) else []
            yield from ((node.lineno, f"from {node.module} import {n}") for n in names)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == "layoutlab" and any(map(_private, parts[1:])):
                    if _unit(alias.name) != here:
                        yield node.lineno, f"import {alias.name}"


def test_no_private_name_is_imported_across_packages():
    """What another package, a benchmark or a test needs is public where it is defined: a
    refactor that renames a private name then breaks nothing outside its package. The
    benchmark scripts import nothing private at all, from layoutlab or from each other."""
    found = []
    for path in sorted(SRC.rglob("*.py")):
        here = _unit(_name(path))
        found += [
            f"{path.relative_to(ROOT)}:{n}: {w}" for n, w in _private_imports(path, here, False)
        ]
    for folder, every in (("benchmarks", True), ("tests", False)):
        for path in sorted((ROOT / folder).rglob("*.py")):
            found += [
                f"{path.relative_to(ROOT)}:{n}: {w}" for n, w in _private_imports(path, None, every)
            ]
    assert not found, "\n".join(found)
    # The one-off scripts are apart, and say that they are not maintained.
    assert "not maintained" in (ROOT / "benchmarks" / "archive" / "README.md").read_text()


def test_one_build_model():
    # Issue 68: three `build_model`s with three signatures made "the model of a run" three
    # ideas; train.program.build_model(spec, inputs) is the one, the others are named for
    # what they take (bench.jax_runner.case_model).
    found = [
        str(path.relative_to(SRC))
        for path in SRC.rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == "build_model"
    ]
    assert found == ["train/program.py"], found
