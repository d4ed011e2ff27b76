"""Citations in the code point at things a reader of the repository has.

Comments and docstrings cite papers (``PRISM Eq. 39``, ``DR-Encoder Algorithm 1``) or
``docs/design.md §N``; never design notes or research notes kept outside the repository
(``DESIGN §n``, ``research/*.md``, or those notes by their bare names). Every ``docs/design.md §N``
(also ``§N.M``, and lists such as ``§2, §7.9``) must name a numbered heading of docs/design.md.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("common", "autoencoder", "client", "server", "tests")
DESIGN = REPO / "docs" / "design.md"

#: citations of documents outside the repository
OUTSIDE = re.compile(
    r"DESIGN(?:\.md)?\s*§"  # the shared design notes, by section
    r"|research/\S*\.md"  # the shared research notes
    r"|(?<![\w/.-])(?:prism|anchors2?|flower|deps|wishart_sparta)\.md"  # ... by their bare names
    r"|\banchors2?\s*§"
)
#: ``docs/design.md §7.6`` or ``docs/design.md §2, §7.9``: the whole list of section numbers
DESIGN_CITATION = re.compile(r"docs/design\.md((?:(?:\s*,\s*|\s+and\s+|\s+)§\d+(?:\.\d+)*)+)")
SECTION = re.compile(r"§(\d+(?:\.\d+)*)")
#: ``## 7. PRISM`` or ``### 7.6 Horizontal ...`` (a trailing dot is optional)
HEADING = re.compile(r"^#{2,4}\s+(\d+(?:\.\d+)*)\.?\s", re.MULTILINE)


def python_files() -> list[Path]:
    """Every .py file of the packages and tests (this file excluded; no virtual environments)."""
    files = []
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            parts = path.relative_to(REPO).parts
            if ".venv" in parts or path.resolve() == Path(__file__).resolve():
                continue
            files.append(path)
    return files


def design_sections() -> set[str]:
    return set(HEADING.findall(DESIGN.read_text(encoding="utf-8")))


def test_no_citations_of_documents_outside_the_repository():
    found = []
    for path in python_files():
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if match := OUTSIDE.search(line):
                found.append(f"{path.relative_to(REPO)}:{number}: {match.group(0)!r} in {line.strip()}")
    if found:
        pytest.fail(
            "cite the paper (e.g. 'PRISM Eq. 39') or docs/design.md §N instead of notes outside the "
            "repository:\n" + "\n".join(found),
            pytrace=False,
        )


def test_design_md_citations_name_existing_sections():
    sections = design_sections()
    assert {str(n) for n in range(1, 8)} <= sections, "docs/design.md lost its numbered sections"
    missing = []
    for path in python_files():
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for cited in DESIGN_CITATION.findall(line):
                missing += [
                    f"{path.relative_to(REPO)}:{number}: §{s}"
                    for s in SECTION.findall(cited)
                    if s not in sections
                ]
    if missing:
        pytest.fail(
            "docs/design.md has no section for:\n" + "\n".join(missing),
            pytrace=False,
        )


def test_the_checks_see_what_they_should():
    assert OUTSIDE.search("DR-Encoder on the server (DESIGN §4): ...")
    assert OUTSIDE.search("(research/prism.md §4.6)") and OUTSIDE.search("prism.md §5 'DP subtlety'")
    assert OUTSIDE.search("# anchors §7.4 (PRV est 5.148)")
    assert not OUTSIDE.search("README.md, docs/design.md §6, docs/privacy.md, PRISM Eq. 39")
    assert [SECTION.findall(c) for c in DESIGN_CITATION.findall("(docs/design.md §2, §7.9; the paper)")] == [
        ["2", "7.9"]
    ]
    assert HEADING.findall("## 7. PRISM\n### 7.6 Horizontal lift\n### 7.10. Tests\n## Notes\n") == [
        "7",
        "7.6",
        "7.10",
    ]
