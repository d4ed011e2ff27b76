"""A noise family or transport is its own modules, nothing more: no branch on it anywhere else.

Every ``if``, conditional expression, ``while``, ``assert``, boolean operand, comprehension filter and
``match`` subject in the shipped code is read (AST); one that tests a name or attribute mentioning a
family (``secure``: ``summed_securely``, ``secure_round`` ...; ``ftrl`` or ``correlated``:
``CORRELATED``, ``FtrlPlan`` ...; ``drencoder``) or compares with a string naming it (a secure threat
model, ``dp-ftrl``, ``dr-encoder``) must sit in that family's own modules. Every other module asks a declared fact
instead: the plan's family (common/privacy/planning/plan.py ``Family``: its events, accountants,
participation rule, noise share, statement line), a planner or check registered by transport or
release name, a release kind's declared facts (common/privacy/registry.py), the transport by name (server/transport.py, client/transport.py), or a
``TransportSpec``'s capabilities (common/privacy/participation/threat.py).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ("server", "client", "common", "autoencoder")


@dataclass(frozen=True)
class Family:
    """An identifier containing one of ``words`` (lower case; not ``unless``), or a compared string
    containing one of ``names``, names the family; ``own``: its modules, whitespace-separated (files,
    or folders ending in /)."""

    words: tuple[str, ...]
    names: tuple[str, ...]
    own: str
    unless: str = "\0"

    def named_by(self, word: str) -> bool:
        word = word.lower()
        return any(w in word for w in self.words) and self.unless not in word

    def named_in(self, value: str) -> bool:
        return any(n in value for n in self.names)

    def owns(self, rel: str) -> bool:
        return any(rel == o or (o.endswith("/") and rel.startswith(o)) for o in self.own.split())


#: each family or transport and its own modules
FAMILIES: dict[str, Family] = {
    "secure aggregation": Family(
        ("secure",),
        ("secure",),
        """client/secure.py client/transport.py server/secure_round.py server/transport.py
        common/privacy/planning/secure_plan.py common/privacy/mechanisms/skellam_mechanism.py common/privacy/participation/threat.py
        common/secagg/""",
        unless="insecure",
    ),
    "dr-encoder": Family(
        ("drencoder", "dr_encoder"),
        ("dr-encoder",),
        "server/drencoder.py server/releases/dr_encoder.py client/drencoder/ client/releases.py autoencoder/",
    ),
    "correlated noise": Family(
        ("ftrl", "correlated"),
        ("dp-ftrl",),
        """common/privacy/planning/ftrl_plan.py common/privacy/mechanisms/ftrl_mechanism.py common/privacy/planning/factorization.py
        common/privacy/mechanisms/banded_noise.py""",
    ),
}


def _mentions(node: ast.AST, family: Family) -> bool:
    for sub in ast.walk(node):
        word = sub.id if isinstance(sub, ast.Name) else sub.attr if isinstance(sub, ast.Attribute) else ""
        if word and family.named_by(word):
            return True
        if isinstance(sub, ast.Compare):
            strings = [c.value for c in (sub.left, *sub.comparators) if isinstance(c, ast.Constant)]
            if any(isinstance(v, str) and family.named_in(v) for v in strings):
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


def family_branches(family: Family, root: Path = ROOT) -> list[str]:
    """``path:line`` of every branch on ``family`` outside its own modules."""
    found = []
    for top in SHIPPED:
        for path in sorted((root / top).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            if family.owns(rel):
                continue
            tree = ast.parse(path.read_text(encoding="utf-8"))
            found += [f"{rel}:{t.lineno}" for t in _tests(tree) if _mentions(t, family)]
    return found


@pytest.mark.parametrize("name", FAMILIES)
def test_no_branch_on_a_family_outside_its_own_modules(name):
    assert family_branches(FAMILIES[name]) == []


def test_the_check_finds_a_branch_on_a_family(tmp_path):
    """The check is not blind: a module that forks on the plan's family, on the transport's fact, on
    a threat model's or a mechanism's name is reported, line by line; one that asks the declared
    participation rule is not."""
    (tmp_path / "server").mkdir()
    (tmp_path / "server" / "forks.py").write_text(
        "def f(plan, cfg, threat):\n"
        "    if plan.secure:\n"
        "        return 1\n"
        "    x = 2 if threat.summed_securely else 3\n"
        "    ok = cfg.threat_model == 'secure-aggregation-hidden' or x\n"
        "    y = isinstance(plan.family, FtrlPlan) or cfg.mechanism == 'dp-ftrl'\n"
        "    z = 4 if cfg.release_kind == CORRELATED else 5\n"
        "    return [n for n in plan.nodes if plan.participation.contributes()]\n"
    )
    secure = family_branches(FAMILIES["secure aggregation"], tmp_path)
    assert secure == ["server/forks.py:2", "server/forks.py:4", "server/forks.py:5"]
    correlated = family_branches(FAMILIES["correlated noise"], tmp_path)
    assert correlated == ["server/forks.py:6", "server/forks.py:6", "server/forks.py:7"]
