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


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """``(line, absolute module)`` for every import statement in ``path``."""
    rel = path.relative_to(REPO)
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


def test_tests_mirror_the_packages():
    """Every test file sits in the folder of the package it tests (tests/<package>/...) or in
    tests/system/ (whole-system checks); tests/ itself holds only the shared fixtures."""
    tests = REPO / "tests"
    assert sorted(p.name for p in tests.glob("*.py")) == ["__init__.py", "conftest.py", "harness.py"]
    folders = {p.relative_to(tests).parts[0] for p in tests.rglob("test_*.py")}
    assert folders <= {*FORBIDDEN, "system"}, folders
    for folder in {p.parent for p in tests.rglob("test_*.py")}:
        assert (folder / "__init__.py").exists(), folder  # imported as tests.<folder>.test_x
