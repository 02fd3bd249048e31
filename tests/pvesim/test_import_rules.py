"""The simulator's import rules, read from the code itself (issue 15; pvesim/__init__.py).

* pvesim imports nothing of proxyhub's product (``provisioning``, ``healthchecks``,
  ``proxyhub``) nor Django: not in any line of its code, and not at run time once every one of
  its modules is loaded;
* the product never imports pvesim, except ``manage.py pvesim``, and that one only inside its
  methods, so loading a module of the product never loads the simulator;
* pvesim's modules keep to the layers its ``__init__`` lists, and no two of them import each
  other, even through others.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pvesim

REPO = Path(__file__).resolve().parents[2]
PVESIM = REPO / "pvesim"
PRODUCT = ("provisioning", "healthchecks", "proxyhub")
NOT_IN_PVESIM = (*PRODUCT, "django")
# The one runtime door from the product to the simulator in Python (bin/run-local, the other
# one, starts `python -m pvesim` as a child process and imports nothing of it).
DOOR = REPO / "provisioning" / "management" / "commands" / "pvesim.py"


def _imports(path: Path, package: str | None = None) -> list[tuple[str, int, bool]]:
    """``(module, line, at module level)`` for every import in ``path``.

    Relative imports are resolved against ``package`` when it is given; ``from . import x``
    names the module ``package.x``. "At module level" is everything outside a function body:
    what runs when the file is loaded.
    """
    found: list[tuple[str, int, bool]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inside = in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)
            if isinstance(child, ast.Import):
                found.extend((alias.name, child.lineno, not in_function) for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                if child.level and package is None:
                    # Inside the product: a relative import stays in its own package.
                    names = ["." * child.level + (child.module or "")]
                elif child.level:
                    assert child.level == 1, f"{path}:{child.lineno}: pvesim is one package"
                    base = f"{package}.{child.module}" if child.module else package
                    names = [base] if child.module else [f"{base}.{a.name}" for a in child.names]
                else:
                    names = [child.module or ""]
                found.extend((name, child.lineno, not in_function) for name in names)
            visit(child, inside)

    visit(ast.parse(path.read_text(), filename=str(path)), in_function=False)
    return found


def _pvesim_modules() -> dict[str, Path]:
    return {path.stem: path for path in sorted(PVESIM.glob("*.py")) if path.stem != "__init__"}


def _layers() -> dict[str, list[int]]:
    """Module name -> the layers pvesim's docstring puts it in (a numbered list of names)."""
    layers: dict[str, list[int]] = {}
    current: int | None = None
    for line in (pvesim.__doc__ or "").splitlines():
        head = re.match(r"(\d+)\. [^:]+:(.*)", line)
        if head:
            current, names = int(head[1]), head[2]
        elif current is not None and line.startswith("   ") and line.strip():
            names = line
        else:
            current = None
            continue
        for name in names.split(","):
            if name.strip():
                layers.setdefault(name.strip(), []).append(current)
    return layers


def _internal_imports() -> dict[str, set[str]]:
    """pvesim module -> the pvesim modules it imports (anywhere in its code)."""
    modules = _pvesim_modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets = set()
        for module, _line, _top in _imports(path, package="pvesim"):
            parts = module.split(".")
            if parts[0] == "pvesim" and len(parts) > 1:
                assert parts[1] in modules, f"pvesim/{name}.py imports {module}, not a module"
                targets.add(parts[1])
        graph[name] = targets
    return graph


def test_every_module_stands_in_exactly_one_layer() -> None:
    layers = _layers()
    assert sorted(layers) == sorted(_pvesim_modules())
    assert {name: where for name, where in layers.items() if len(where) != 1} == {}


def test_no_module_imports_from_a_layer_above_its_own() -> None:
    layer = {name: where[0] for name, where in _layers().items()}
    upward = [
        f"{name} (layer {layer[name]}) imports {target} (layer {layer[target]})"
        for name, targets in sorted(_internal_imports().items())
        for target in sorted(targets)
        if layer[target] > layer[name]
    ]
    assert upward == []
    # The rule has something to hold: the engine is built on the state, control on the engine.
    graph = _internal_imports()
    assert "state" in graph["engine"] and "engine" in graph["control"]


def test_no_modules_import_each_other_even_through_others() -> None:
    graph = _internal_imports()
    circles: list[list[str]] = []
    # Tarjan's strongly connected components: any component of two or more is a circle.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in sorted(graph[node]):
            if target not in index:
                connect(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1 or node in graph[node]:
                circles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            connect(node)
    assert circles == []


def test_pvesim_code_imports_nothing_of_the_product_nor_django() -> None:
    offending = [
        f"pvesim/{path.name}:{line} imports {module}"
        for path in sorted(PVESIM.glob("*.py"))
        for module, line, _top in _imports(path, package="pvesim")
        if module.split(".")[0] in NOT_IN_PVESIM
    ]
    assert offending == []


def test_loading_every_pvesim_module_loads_nothing_of_the_product_nor_django() -> None:
    # A fresh interpreter: this one has Django and the product loaded already.
    script = f"""
import importlib, json, pkgutil, sys
import pvesim
names = ["pvesim." + m.name for m in pkgutil.iter_modules(pvesim.__path__)]
for name in names:
    importlib.import_module(name)
roots = {NOT_IN_PVESIM!r}
print(json.dumps({{
    "loaded": sorted(n for n in names if n in sys.modules),
    "foreign": sorted(n for n in sys.modules if n.split(".")[0] in roots),
}}))
"""
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["loaded"] == sorted(f"pvesim.{name}" for name in _pvesim_modules())
    assert result["foreign"] == []


def test_the_product_imports_pvesim_only_inside_manage_py_pvesim() -> None:
    files = [path for package in PRODUCT for path in sorted((REPO / package).rglob("*.py"))]
    assert DOOR in files
    offending = []
    door_imports = []
    for path in files:
        for module, line, at_module_level in _imports(path):
            if module.split(".")[0] != "pvesim":
                continue
            if path == DOOR and not at_module_level:
                door_imports.append(module)
            else:
                offending.append(f"{path.relative_to(REPO)}:{line} imports {module}")
    assert offending == []
    # The command does reach the simulator, and only once it runs.
    assert door_imports and set(door_imports) == {"pvesim.__main__"}
