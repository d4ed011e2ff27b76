"""The package layers: common <- autoencoder <- client, server.

``common`` imports none of the others, ``autoencoder`` only ``common``, ``client`` no ``server``,
and ``server`` no ``client``: the server reaches client code only through component references,
strings such as ``client.app:app`` (the simulation's ClientApp, an audit's canary node, the scale
bench's FLOP count) or a command table's module names, as Flower's ServerApp reaches its ClientApp.
No folder is exempt, benches and audits included. Every ``import`` statement counts, inside
functions too."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

#: package -> the packages it must not import
FORBIDDEN: dict[str, frozenset[str]] = {
    "common": frozenset({"autoencoder", "client", "server"}),
    "autoencoder": frozenset({"client", "server"}),
    "client": frozenset({"server"}),
    "server": frozenset({"client"}),
}


def imported_modules(path: Path, root: Path | None = None, names: bool = False) -> list[tuple[int, str]]:
    """``(line, absolute module)`` for every import statement in ``path`` (under ``root``, the repository
    by default); with ``names``, also ``module.name`` for each name a ``from`` import takes (a submodule
    or an attribute: the caller tells them apart)."""
    rel = path.relative_to(root or REPO)
    package = list(rel.parent.parts) if rel.name == "__init__.py" else list(rel.with_suffix("").parts[:-1])
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(rel))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from the file's package, one level up per extra dot
                base = package[: len(package) - node.level + 1]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            found.append((node.lineno, module))
            if names:
                found += [(node.lineno, f"{module}.{alias.name}".lstrip(".")) for alias in node.names]
    return found


def violations() -> list[str]:
    """``file:line: package imports module`` for every import that crosses a layer downwards."""
    out = []
    for package, forbidden in FORBIDDEN.items():
        for path in sorted((REPO / package).rglob("*.py")):
            rel = path.relative_to(REPO).as_posix()
            for line, module in sorted(imported_modules(path)):
                if module.split(".")[0] in forbidden:
                    out.append(f"{rel}:{line}: {package} imports {module}")
    return out


def test_packages_import_only_lower_layers():
    if found := violations():
        pytest.fail(
            "imports against the layer order common <- autoencoder <- client, server:\n" + "\n".join(found),
            pytrace=False,
        )


def test_the_check_sees_nested_and_relative_imports(tmp_path, monkeypatch):
    pkg = tmp_path / "client" / "sub"
    pkg.mkdir(parents=True)
    (pkg / "mod.py").write_text("from ..node import policy\n\ndef f():\n    from server.app import app\n")
    monkeypatch.setattr(f"{__name__}.REPO", tmp_path)
    assert sorted(imported_modules(pkg / "mod.py")) == [(1, "client.node"), (4, "server.app")]
    assert violations() == ["client/sub/mod.py:4: client imports server.app"]


#: the import circles that stand today (files importing each other in a loop, through any import
#: statement, lazy and TYPE_CHECKING ones included): none may be added, and a shrunken one is edited here
KNOWN_CIRCLES = {
    frozenset(
        {
            "common.data.chitchat",
            "common.data.corpora",
            "common.data.multiple_choice",
            "common.data.shakespeare",
        }
    ),
    frozenset({"common.data", "common.data.federated", "common.data.files"}),
    frozenset({"server.deploy.deployment", "server.deploy.processes", "server.deploy.tls"}),
}


def import_circles(root: Path = REPO) -> set[frozenset[str]]:
    """The modules of the shipped packages that import each other in a loop: the strongly connected
    components (more than one module) of the graph of every import statement."""
    modules: dict[str, Path] = {}
    for package in FORBIDDEN:
        for path in (root / package).rglob("*.py"):
            rel = path.relative_to(root).with_suffix("")
            modules[".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)] = path
    edges: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        for _, target in imported_modules(path, root, names=True):
            while target and target not in modules:  # "from pkg.mod import name": the module
                target = target.rpartition(".")[0]
            if target and target != name:
                edges[name].add(target)
    return {c for c in _components(edges) if len(c) > 1}


def _components(edges: dict[str, set[str]]) -> list[frozenset[str]]:
    """Strongly connected components (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []
    for start in edges:
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.add(member)
                        if member == node:
                            break
                    found.append(frozenset(component))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(edges[child]))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return found


def test_no_new_import_circle():
    circles = import_circles()
    new = [sorted(c) for c in circles - KNOWN_CIRCLES]
    assert not new, f"files that import each other in a loop: {new}"
    assert circles == KNOWN_CIRCLES, "a known circle shrank or went: edit KNOWN_CIRCLES to what stands"


def test_the_circle_check_finds_a_loop(tmp_path):
    for package in FORBIDDEN:
        (tmp_path / package).mkdir()
    (tmp_path / "common" / "a.py").write_text("def f():\n    from common import b\n")
    (tmp_path / "common" / "b.py").write_text("from common.c import x\n")
    (tmp_path / "common" / "c.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import common.a\n"
    )
    (tmp_path / "common" / "d.py").write_text("import common.a\n")
    assert import_circles(tmp_path) == {frozenset({"common.a", "common.b", "common.c"})}


def test_tests_mirror_the_packages():
    """Every test file sits in the folder of the package it tests (tests/<package>/...) or in
    tests/system/ (whole-system checks); tests/ itself holds only the shared fixtures."""
    tests = REPO / "tests"
    assert sorted(p.name for p in tests.glob("*.py")) == ["__init__.py", "conftest.py", "harness.py"]
    folders = {p.relative_to(tests).parts[0] for p in tests.rglob("test_*.py")}
    assert folders <= {*FORBIDDEN, "system"}, folders
    for folder in {p.parent for p in tests.rglob("test_*.py")}:
        assert (folder / "__init__.py").exists(), folder  # imported as tests.<folder>.test_x
