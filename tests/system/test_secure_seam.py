"""Secure aggregation is a transport and a plan, nothing more: no branch on it anywhere else.

Every ``if``, conditional expression, ``while``, boolean operand, comprehension filter and ``match``
subject in the shipped code is read (AST); one that tests a name or attribute mentioning ``secure``
(``plan.secure``, ``summed_securely``, ``secure_round`` ...) or compares with a string naming a
secure threat model must sit in the transport (both halves and the protocol) or its planner. Every
other module asks a declared fact instead: the plan's participation rule
(common/privacy/participation.py), the transport by name (server/transport.py,
client/transport.py), or a ``TransportSpec``'s capabilities (common/privacy/threat.py).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ("server", "client", "common", "autoencoder")

#: the transport (client and server halves, the protocol) and its planner
SEAM = {
    "client/secure.py",
    "client/transport.py",
    "server/secure_round.py",
    "server/transport.py",
    "common/privacy/plan.py",
    "common/privacy/secure_plan.py",
    "common/privacy/secure_release.py",
    "common/privacy/threat.py",
}
SEAM_DIRS = ("common/secagg/",)


def _mentions_secure(node: ast.AST) -> bool:
    for sub in ast.walk(node):
        word = sub.id if isinstance(sub, ast.Name) else sub.attr if isinstance(sub, ast.Attribute) else ""
        if "secure" in word.lower() and "insecure" not in word.lower():
            return True
        if isinstance(sub, ast.Compare):
            strings = [c.value for c in (sub.left, *sub.comparators) if isinstance(c, ast.Constant)]
            if any(isinstance(v, str) and "secure" in v for v in strings):
                return True
    return False


def _tests(tree: ast.AST):
    """Every expression the module branches on, with its line."""
    for node in ast.walk(tree):
        if isinstance(node, ast.If | ast.IfExp | ast.While | ast.Assert):
            yield node.test
        elif isinstance(node, ast.BoolOp):
            yield from node.values
        elif isinstance(node, ast.comprehension):
            yield from node.ifs
        elif isinstance(node, ast.Match):
            yield node.subject


def secure_branches(root: Path = ROOT) -> list[str]:
    """``path:line`` of every branch on secure aggregation outside the transport and its planner."""
    found = []
    for top in SHIPPED:
        for path in sorted((root / top).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            if rel in SEAM or rel.startswith(SEAM_DIRS):
                continue
            tree = ast.parse(path.read_text(encoding="utf-8"))
            found += [f"{rel}:{t.lineno}" for t in _tests(tree) if _mentions_secure(t)]
    return found


def test_no_branch_on_secure_aggregation_outside_its_transport_and_planner():
    assert secure_branches() == []


def test_the_check_finds_a_branch_on_secure_aggregation(tmp_path):
    """The check is not blind: a module that forks on the plan's secure half, on the transport's
    fact or on a threat model's name is reported, line by line; one that asks the declared
    participation rule is not."""
    (tmp_path / "server").mkdir()
    (tmp_path / "server" / "forks.py").write_text(
        "def f(plan, cfg, threat):\n"
        "    if plan.secure:\n"
        "        return 1\n"
        "    x = 2 if threat.summed_securely else 3\n"
        "    ok = cfg.threat_model == 'secure-aggregation-hidden' or x\n"
        "    return [n for n in plan.nodes if plan.participation.contributes()]\n"
    )
    assert secure_branches(tmp_path) == ["server/forks.py:2", "server/forks.py:4", "server/forks.py:5"]
