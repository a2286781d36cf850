"""The repository map holds: every ``layoutlab`` import, lazy ones inside functions included,
goes from a package to one at or below it in this order (docs/development.md, "Repository map")."""

import ast
import functools
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "layoutlab"
ORDER = [
    ("layout", "precision", "loss_scale", "lazy", "arguments", "fast_defaults", "version"),
    ("nn",),
    ("models",),
    ("data",),
    ("train",),
    ("host",),
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

    for name in ("lazy", "arguments", "version"):
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
    module ``layoutlab.models.resnet`` (and the package only as ``from
    layoutlab.models.resnet import ...`` does: not its exports), ``from layoutlab.models
    import create`` the package."""
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in MODULES:
            names = [a.name for a in node.names if f"{node.module}.{a.name}" not in MODULES]
            if names:
                yield node, node.module, names
            for alias in node.names:
                if f"{node.module}.{alias.name}" in MODULES:
                    yield node, f"{node.module}.{alias.name}", []
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in MODULES:
                    yield node, alias.name, []


def _strings(node: ast.AST | None) -> list[str]:
    """The string constants ``node`` is (a constant) or holds (a tuple, list, set or dict's
    values)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return [s for e in node.elts for s in _strings(e)]
    if isinstance(node, ast.Dict):
        return [s for v in node.values for s in _strings(v)]
    return []


def _module_constants(tree: ast.Module) -> dict[str, list[str]]:
    """``{name: strings}`` of the module-level assignments of ``tree``."""
    found = {}
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else []
        if isinstance(node, ast.AnnAssign):
            targets = [node.target]
        for target in targets:
            if isinstance(target, ast.Name):
                found[target.id] = _strings(node.value)
    return found


def _importlib_modules(path: Path) -> set[str]:
    """What ``importlib.import_module(arg)`` calls of ``path`` import: ``arg`` a string, a
    module-level constant, or the loop variable over one (``for name in COMMANDS``)."""
    tree = _tree(path)
    constants = _module_constants(tree)
    loops = {
        node.target.id: constants.get(node.iter.id, [])
        for node in ast.walk(tree)
        if isinstance(node, ast.For)
        and isinstance(node.target, ast.Name)
        and isinstance(node.iter, ast.Name)
    }
    found = set()
    for node in ast.walk(tree):
        if not (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "import_module"
            and node.args
        ):
            continue
        arg = node.args[0]
        names = _strings(arg)
        if isinstance(arg, ast.Name):
            names = constants.get(arg.id) or loops.get(arg.id, [])
        found |= {n for n in names if n in MODULES}
    return found


@functools.cache
def _lazy_table(package: str) -> dict[str, str]:
    """``{name: module}`` of ``package``'s lazy exports: its ``__init__``'s dicts of names to
    submodules (``{"Conv": "conv"}``, as ``layoutlab.lazy.lazy_exports`` reads them) and
    sets of its submodules' names."""
    path = MODULES.get(package)
    if path is None or path.name != "__init__.py":
        return {}
    table = {}
    for node in _tree(path).body:
        value = node.value if isinstance(node, ast.Assign | ast.AnnAssign) else None
        if isinstance(value, ast.Dict):
            for key, item in zip(value.keys, value.values, strict=True):
                if isinstance(key, ast.Constant) and isinstance(item, ast.Constant):
                    if f"{package}.{item.value}" in MODULES:
                        table[key.value] = f"{package}.{item.value}"
        for item in _strings(value) if isinstance(value, ast.Set) else []:
            if f"{package}.{item}" in MODULES:
                table[item] = f"{package}.{item}"
    return table


def _depends_on(path: Path) -> set[str]:
    """The modules ``path``'s ``layoutlab`` imports run: ``from pkg import name`` of a lazily
    exported name runs the module the name lives in (not every one ``pkg`` exports), as does
    ``pkg.name`` on a package bound by an import; ``importlib`` imports included."""
    found, packages = set(), {}  # packages: local name -> package bound to it
    for node, module, names in _imported_modules(path):
        table = _lazy_table(module)
        found |= {table[n] for n in names if n in table}
        if not names or any(n not in table for n in names):
            found.add(module)
        for alias in node.names:
            bound = alias.name if isinstance(node, ast.Import) else f"{node.module}.{alias.name}"
            if bound == module and _lazy_table(module):
                packages[alias.asname or alias.name.split(".")[0]] = module
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            table = _lazy_table(packages.get(node.value.id, ""))
            if node.attr in table:
                found.add(table[node.attr])
    return found | _importlib_modules(path)


def _import_graph() -> dict[str, set[str]]:
    return {name: _depends_on(path) - {name} for name, path in MODULES.items()}


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(graph.get(node, ())):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_cycles():
    """No module reaches itself through imports, even lazy, type-checking, ``importlib``
    (a module's name as a string) or lazy-export ones: a cycle is two modules that cannot be
    read, tested or moved apart (a shared piece goes to a third)."""
    import sys

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(MODULES)))
    circles = _circles(_import_graph())
    assert not circles, "import circles:\n" + "\n".join(" <-> ".join(c) for c in circles)


def test_the_import_graph_sees_importlib_and_lazy_export_edges():
    """The graph above holds the edges no ``import`` statement shows."""
    graph = _import_graph()
    assert "layoutlab.train.command" in graph["layoutlab.cli"]  # importlib, over cli.COMMANDS
    # `from layoutlab.nn import Conv, ...`: the modules nn's lazy table names, not nn itself
    assert {"layoutlab.nn.conv", "layoutlab.nn.norm"} <= graph["layoutlab.models.torch_weights"]
    assert "layoutlab.nn" not in graph["layoutlab.models.torch_weights"]
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


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
