"""Check the package's layer contract from its import statements (``make lint``).

The contract (docs/development/layout.md):
* ``runtime/`` imports nothing of the package outside ``runtime/``;
* ``himitsu/`` imports neither ``runtime/`` nor ``sync/`` (nor any other part of the
  package but its ``__init__``'s version), and no Kubernetes client;
* ``sync/`` imports neither ``kube.py`` nor ``cli.py``, and of ``runtime/`` only the
  ``Result`` type of ``runtime.controller``;
* ``kube.py`` (the adapter) imports of ``sync/`` only ``sync.ports``;
* no import cycle between the package's modules.

Every ``import`` statement counts, including those under ``if TYPE_CHECKING:`` and
inside functions (a cycle or a layer breach hidden from the runtime is still one for a
reader), and so do attribute chains into a submodule (``himitsu_controller.kube.X``
after ``import himitsu_controller``), ``importlib.import_module``/``__import__`` of a
string, and whatever the package ``__init__``s on an import's path import.
Usage: ``python hack/check_layers.py [SRC_DIR]`` (default ``src``); prints each
breach and exits 1 when there is any.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

PACKAGE = "himitsu_controller"


@dataclass(frozen=True)
class Import:
    importer: str  # dotted module name
    target: str  # dotted module name imported (a module, or the package a name came from)
    names: tuple[str, ...]  # for ``from X import a, b``: a, b; empty for ``import X``
    line: int


def module_name(src: Path, path: Path) -> str:
    parts = list(path.relative_to(src).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _resolve(importer: str, is_package: bool, level: int, module: str | None) -> str:
    if level == 0:
        return module or ""
    base = importer.split(".") if is_package else importer.split(".")[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join([*base, module] if module else base)


def _direct_imports(src: Path, known: set[str]) -> dict[str, list[Import]]:
    """Each module's own imports: statements, attribute chains, and string imports."""
    out: dict[str, list[Import]] = {}
    for path in sorted(src.rglob("*.py")):
        importer = module_name(src, path)
        is_package = path.name == "__init__.py"
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        found = out.setdefault(importer, [])
        bound: dict[str, str] = {}  # local name -> the module it is bound to
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    found.append(Import(importer, alias.name, (), node.lineno))
                    if alias.asname:
                        bound[alias.asname] = alias.name
                    else:
                        top = alias.name.split(".")[0]
                        bound[top] = top
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(importer, is_package, node.level, node.module)
                names = tuple(a.name for a in node.names)
                # ``from pkg import mod`` imports the module pkg.mod: count it as such.
                submodules = [n for n in names if f"{base}.{n}" in known]
                for alias in node.names:
                    if alias.name in submodules:
                        found.append(Import(importer, f"{base}.{alias.name}", (), node.lineno))
                        bound[alias.asname or alias.name] = f"{base}.{alias.name}"
                rest = tuple(n for n in names if n not in submodules)
                if rest or not submodules:
                    found.append(Import(importer, base, rest, node.lineno))
            elif isinstance(node, ast.Call) and _is_string_import(node):
                target = node.args[0]
                assert isinstance(target, ast.Constant)
                found.append(Import(importer, str(target.value), (), node.lineno))
        # ``import himitsu_controller`` then ``himitsu_controller.kube.X``: the chain reaches
        # a module that only some other import happened to load; count it as an import.
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute):
                chain = _dotted(node)
                if chain is None or chain[0] not in bound:
                    continue
                full = ".".join([bound[chain[0]], *chain[1:]]).split(".")
                deepest = next((".".join(full[:i]) for i in range(len(full), 0, -1)
                                if ".".join(full[:i]) in known), None)
                if deepest is not None and deepest != bound[chain[0]]:
                    found.append(Import(importer, deepest, (), node.lineno))
    return out


def _is_string_import(node: ast.Call) -> bool:
    func = node.func
    named = (isinstance(func, ast.Name) and func.id == "__import__") or (
        isinstance(func, ast.Attribute) and func.attr == "import_module")
    return named and bool(node.args) and isinstance(node.args[0], ast.Constant) and isinstance(
        node.args[0].value, str)


def _dotted(node: ast.Attribute) -> list[str] | None:
    parts: list[str] = []
    cur: ast.expr = node
    while isinstance(cur, ast.Attribute):
        parts.append(cur.attr)
        cur = cur.value
    if not isinstance(cur, ast.Name):
        return None
    return [cur.id, *reversed(parts)]


def imports_of(src: Path) -> Iterator[Import]:
    """Every import a module makes, including those its targets' package ``__init__``s make.

    Importing ``pkg.sub.mod`` runs ``pkg/__init__`` and ``pkg/sub/__init__`` first, so
    whatever those import is imported too (a re-export there is an import here).
    """
    known = {module_name(src, p) for p in src.rglob("*.py")}
    direct = _direct_imports(src, known)
    for importer, imports in direct.items():
        seen: set[str] = set()
        for imp in imports:
            yield imp
            parts = imp.target.split(".")
            for i in range(1, len(parts)):
                parent = ".".join(parts[:i])
                if parent in seen or parent not in known or _within_pkg(importer, parent):
                    continue
                seen.add(parent)
                for inner in direct.get(parent, ()):
                    yield Import(importer, inner.target, inner.names, imp.line)


def _within_pkg(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _within(module: str, layer: str) -> bool:
    full = f"{PACKAGE}.{layer}" if layer else PACKAGE
    return module == full or module.startswith(full + ".")


def breaches(src: Path) -> list[str]:
    found: list[str] = []
    edges: dict[str, set[str]] = {}
    for imp in imports_of(src):
        who, what = imp.importer, imp.target
        where = f"{who} (line {imp.line}) imports {what}"
        if _within(what, ""):
            edges.setdefault(who, set()).add(what)
        if _within(who, "runtime") and _within(what, "") and not _within(what, "runtime"):
            found.append(f"{where}: runtime/ must not import the package outside runtime/")
        if _within(who, "himitsu"):
            if _within(what, "") and not _within(what, "himitsu") and (
                what != PACKAGE or set(imp.names) - {"__version__"}
            ):
                found.append(f"{where}: himitsu/ must not import other parts of the package")
            if what == "kubernetes" or what.startswith("kubernetes."):
                found.append(f"{where}: himitsu/ must know nothing of Kubernetes")
        if _within(who, "sync"):
            if what in (f"{PACKAGE}.kube", f"{PACKAGE}.cli"):
                found.append(f"{where}: sync/ must not import the adapter or the CLI")
            if _within(what, "runtime") and (
                what != f"{PACKAGE}.runtime.controller" or set(imp.names) != {"Result"}
            ):
                found.append(f"{where}: sync/ may use only runtime.controller.Result")
        if who == f"{PACKAGE}.kube" and _within(what, "sync") and what != f"{PACKAGE}.sync.ports":
            found.append(f"{where}: kube.py may use only sync.ports of sync/")
    found.extend(f"import cycle: {' -> '.join(c)}" for c in _cycles(edges))
    return found


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(edges.get(node, ())):
            if nxt == node:
                continue
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                out.append([*sorted(component), sorted(component)[0]])

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return out


def main(argv: list[str]) -> int:
    src = Path(argv[1] if len(argv) > 1 else "src")
    found = breaches(src)
    for line in found:
        print(f"check_layers: {line}")
    if not found:
        print("check_layers: layer contract holds (runtime/, himitsu/, sync/, kube.py; no cycles)")
    return 1 if found else 0


if __name__ == "__main__":
    sys.setrecursionlimit(10_000)
    sys.exit(main(sys.argv))
