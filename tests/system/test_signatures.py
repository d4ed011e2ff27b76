"""No function of the code base takes 8 or more parameters (issue 31): what travels together is one
context object (a frozen dataclass in the module that owns the concept, e.g. common.tasks.training's
``Trainee`` and ``StepSchedule``, server.releases' ``RunHandles``, server.round's ``RoundContext``).

Parameters are counted as a caller sees them: positional and keyword-only, without ``self`` / ``cls``
of a method and without ``*args`` / ``**kwargs``. Every ``.py`` file outside ``tests/`` counts,
nested functions and methods included. :data:`ALLOWED` lists the few that keep a long list, each
with its reason; an entry must still exist and still be long, so the list cannot go stale."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LIMIT = 8  # this many parameters or more is a long list

#: ``path:qualname`` -> why the function keeps a long parameter list
ALLOWED: dict[str, str] = {
    "common/privacy/mechanisms/wishart.py:wishart_epsilon": "the inputs of a formula (Wishart paper Thm 5: σ, p, "
    "rounds, δ, the projection's rank, dim and gradient rank, the failure share of δ), as the "
    "`fedlora privacy` CLI and the tests pass them",
    "common/privacy/mechanisms/wishart.py:wishart_sigma": "the inverse of wishart_epsilon: the same formula inputs, "
    "target ε in place of σ",
    "client/node/sdk.py:prepare_data": "a data owner's one public call for their data: each keyword one "
    "of fedlora node's data options (the file's columns, the federation's dataset or label names), "
    "the instruction-file options already grouped in sdk.Instructions",
    "client/dp/sample_plan.py:plan_sample_noise": "the accountant's inputs for σ (examples, expected "
    "batch, steps, clip, δ, exactly one of ε or σ, wishart's projection); it returns them as one "
    "SamplePlan",
}


def python_files() -> list[Path]:
    """Every ``.py`` of the code base outside ``tests/`` and hidden folders (``.venv``, ``.cache``)."""
    out = []
    for path in sorted(REPO.rglob("*.py")):
        parts = path.relative_to(REPO).parts
        if parts[0] != "tests" and not any(p.startswith(".") for p in parts):
            out.append(path)
    return out


def parameter_counts(path: Path) -> dict[str, int]:
    """``qualname`` -> parameters of every function and method in ``path`` (nested ones as
    ``outer.<locals>.inner``)."""
    found: dict[str, int] = {}

    def visit(node: ast.AST, prefix: str, in_class: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                args = child.args
                names = [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)]
                if in_class and names and names[0] in ("self", "cls"):
                    names = names[1:]
                found[prefix + child.name] = len(names)
                visit(child, f"{prefix}{child.name}.<locals>.", False)
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.", True)
            else:
                visit(child, prefix, in_class)

    visit(ast.parse(path.read_text(encoding="utf-8"), filename=str(path)), "", False)
    return found


def long_signatures() -> dict[str, int]:
    """``path:qualname`` -> parameter count of every function with at least :data:`LIMIT`."""
    out = {}
    for path in python_files():
        rel = path.relative_to(REPO).as_posix()
        for name, count in parameter_counts(path).items():
            if count >= LIMIT:
                out[f"{rel}:{name}"] = count
    return out


def test_no_function_takes_a_long_parameter_list():
    found = {k: n for k, n in long_signatures().items() if k not in ALLOWED}
    if found:
        pytest.fail(
            f"functions with {LIMIT} or more parameters (group what travels together in a frozen "
            "dataclass, or add the function to ALLOWED with its reason):\n"
            + "\n".join(f"{k}: {n}" for k, n in sorted(found.items())),
            pytrace=False,
        )


def test_every_allowed_long_signature_still_exists_and_is_long():
    long = long_signatures()
    stale = [k for k in ALLOWED if k not in long]
    assert not stale, f"ALLOWED entries that are gone or now take fewer than {LIMIT} parameters: {stale}"


def test_the_count_sees_methods_nested_functions_and_keyword_only_parameters(tmp_path):
    source = tmp_path / "mod.py"
    source.write_text(
        "def f(a, /, b, *args, c, **kw):\n"
        "    def inner(x, y): ...\n"
        "class K:\n"
        "    def m(self, a): ...\n"
        "    @classmethod\n"
        "    def c(cls, a, b): ...\n"
        "    @staticmethod\n"
        "    def s(a, b, c): ...\n"
        "async def g(*, a, b): ...\n"
    )
    assert parameter_counts(source) == {"f": 3, "f.<locals>.inner": 2, "K.m": 1, "K.c": 2, "K.s": 3, "g": 2}
