"""Every ``fedlora`` command in README.md and docs/*.md parses with the real ``fedlora`` parser.

Commands are taken from fenced code blocks (```bash, ```sh, ```shell, ```console and plain ```):
each line that starts with ``fedlora `` (backslash continuations joined, ``# comments`` dropped),
or, in a transcript (a block with ``$ `` prompts), each prompt line that runs ``fedlora``. They are
parsed, never run: the parser is built as ``common.cli.main`` builds it, and an argparse error
(exit 2) fails the test with the document's line. Usage synopses (``[--option X]``, ``a|b``) go in
```text blocks; there every ``--option`` named must exist for the subcommand(s) named. Inline code
spans outside the fences that hold a ``fedlora`` command with options (the commands in the results
tables) are parsed too. Commands that start with ``flwr``, ``make`` or ``docker`` are out of scope.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest

from common import cli

REPO = Path(__file__).resolve().parents[2]
DOCUMENTS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]

#: fenced blocks whose ``fedlora`` lines are commands to parse
COMMAND_LANGUAGES = {"", "bash", "sh", "shell", "console"}
#: fenced blocks whose ``fedlora`` lines are usage synopses
SYNOPSIS_LANGUAGES = {"text"}
FENCE = re.compile(r"^\s*(`{3,})\s*([\w+-]*)\s*$")
OPTION = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")


@dataclass(frozen=True)
class Snippet:
    path: Path
    line: int  # 1-based line of the command's first physical line
    text: str  # the logical line (continuations joined)

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(REPO)}:{self.line}"


def fenced_blocks(text: str) -> list[tuple[str, int, list[str]]]:
    """(language, 1-based line of the block's first content line, content lines) per fenced block."""
    blocks, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        fence, language, start, body = opening.group(1), opening.group(2).lower(), i + 2, []
        i += 1
        while i < len(lines) and lines[i].strip() != fence:
            body.append(lines[i])
            i += 1
        blocks.append((language, start, body))
        i += 1  # the closing fence
    return blocks


def logical_lines(body: list[str], start: int) -> list[tuple[int, str]]:
    """(line number, stripped text) with backslash continuations joined."""
    out, i = [], 0
    while i < len(body):
        first, text = start + i, body[i].strip()
        while text.endswith("\\") and i + 1 < len(body):
            i += 1
            text = text[:-1].rstrip() + " " + body[i].strip()
        out.append((first, text))
        i += 1
    return out


def commands_in(body: list[str], start: int) -> list[tuple[int, str]]:
    """The ``fedlora`` commands of one command block: prompt lines in a transcript, else every line."""
    lines = logical_lines(body, start)
    transcript = any(text.startswith("$ ") for _, text in lines)
    found = []
    for number, text in lines:
        if transcript:
            if not text.startswith("$ "):
                continue  # program output
            text = text[2:].strip()
        if text.startswith("fedlora "):
            found.append((number, text))
    return found


def synopses_in(body: list[str], start: int) -> list[tuple[int, str]]:
    """Synopsis entries: a line starting with ``fedlora `` plus the indented lines that follow it."""
    found: list[tuple[int, str]] = []
    for offset, raw in enumerate(body):
        text = re.sub(r"\s#\s.*$", "", raw).rstrip()
        if text.lstrip().startswith("fedlora ") and not raw[:1].isspace():
            found.append((start + offset, text.strip()))
        elif found and raw[:1].isspace() and text.strip():
            number, previous = found[-1]
            found[-1] = (number, previous + " " + text.strip())
    return found


def inline_commands(text: str) -> list[tuple[int, str]]:
    """``fedlora`` commands with at least one option in inline code spans outside fenced blocks."""
    lines, inside, fence = text.splitlines(), False, ""
    for i, line in enumerate(lines):  # blank the fenced blocks, keeping line numbers
        opening = FENCE.match(line)
        if inside or opening:
            if not inside:
                inside, fence = True, opening.group(1)
            elif line.strip() == fence:
                inside = False
            lines[i] = ""
    prose = "\n".join(lines)
    found = []
    for match in re.finditer(r"`(fedlora [^`]+)`", prose):
        command = " ".join(match.group(1).split())
        if OPTION.search(command):
            found.append((prose.count("\n", 0, match.start()) + 1, command))
    return found


def collect() -> tuple[list[Snippet], list[Snippet]]:
    commands, synopses = [], []
    for path in DOCUMENTS:
        text = path.read_text(encoding="utf-8")
        for language, start, body in fenced_blocks(text):
            if language in COMMAND_LANGUAGES:
                commands += [Snippet(path, n, t) for n, t in commands_in(body, start)]
            elif language in SYNOPSIS_LANGUAGES:
                synopses += [Snippet(path, n, t) for n, t in synopses_in(body, start)]
        commands += [Snippet(path, n, t) for n, t in inline_commands(text)]
    return sorted(commands, key=lambda s: (s.path, s.line)), synopses


COMMANDS, SYNOPSES = collect()


@pytest.fixture(scope="module")
def parser() -> argparse.ArgumentParser:
    """The parser ``common.cli.main`` builds, with every subcommand's arguments loaded."""
    return cli.build_parser(None)


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def options(parser: argparse.ArgumentParser) -> set[str]:
    return {s for action in parser._actions for s in action.option_strings}


@pytest.mark.parametrize("snippet", COMMANDS, ids=lambda s: s.where)
def test_documented_command_parses(parser, snippet):
    argv = shlex.split(snippet.text, comments=True)[1:]
    err, code = io.StringIO(), None
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            parser.parse_args(argv)
    except SystemExit as exc:  # argparse: exit 2 on an error, 0 after --help
        code = exc.code
    if code not in (0, None):
        pytest.fail(f"{snippet.where}: `{snippet.text}` does not parse:\n{err.getvalue()}", pytrace=False)


@pytest.mark.parametrize("snippet", SYNOPSES, ids=lambda s: s.where)
def test_synopsis_names_existing_options(parser, snippet):
    words = snippet.text.split()[1:]
    parsers, level = [parser], 0
    # walk the subcommand path: `privacy epsilon|sigma`, `bench gauge|prism-step|codec|scale`
    while level < len(words) and all(subcommands(p) for p in parsers):
        names = words[level].split("|")
        unknown = [n for n in names if not all(n in subcommands(p) for p in parsers)]
        assert not unknown, f"{snippet.where}: no subcommand {unknown} in `{snippet.text}`"
        parsers = [subcommands(p)[n] for p in parsers for n in names]
        level += 1
    assert level, f"{snippet.where}: `{snippet.text}` names no subcommand"
    missing = sorted({o for o in OPTION.findall(snippet.text) if not all(o in options(p) for p in parsers)})
    assert not missing, f"{snippet.where}: `{snippet.text}` names options that do not exist: {missing}"


def test_the_extraction_sees_what_it_should():
    text = "\n".join(
        [
            "```bash",
            "fedlora simulate --preset default \\",
            "    --rounds 2   # a comment",
            "make run",
            "```",
            "```console",
            "$ fedlora privacy ledger x.sqlite",
            "fedlora run summary  (output, not a command)",
            "```",
            "```text",
            "fedlora bench gauge|codec [--json]",
            "               [--seed S]",
            "```",
            "```python",
            "fedlora = 1",
            "```",
        ]
    )
    blocks = fenced_blocks(text)
    assert [(language, start) for language, start, _ in blocks] == [
        ("bash", 2),
        ("console", 7),
        ("text", 11),
        ("python", 15),
    ]
    assert commands_in(blocks[0][2], 2) == [(2, "fedlora simulate --preset default --rounds 2   # a comment")]
    assert commands_in(blocks[1][2], 7) == [(7, "fedlora privacy ledger x.sqlite")]
    assert synopses_in(blocks[2][2], 11) == [(11, "fedlora bench gauge|codec [--json] [--seed S]")]
    assert shlex.split(commands_in(blocks[0][2], 2)[0][1], comments=True)[-1] == "2"
    prose = "Run `fedlora simulate\n--rounds 2` or `fedlora privacy`.\n```bash\n`fedlora node --x`\n```\n"
    assert inline_commands(prose) == [(1, "fedlora simulate --rounds 2")]


def test_the_documents_have_commands():
    where = {s.path.stem for s in COMMANDS}
    assert {
        "README",
        "privacy",
        "prism",
        "dr-encoder",
        "small-federations",
        "RESULTS",
        "sdk",
        "deployment",
    } <= where
    assert any(s.path.stem == "README" for s in SYNOPSES)


def test_readme_stays_a_guide():
    """README.md is a user guide of at most 250 lines (issue 31): what it is, the quickstart, choosing
    a mechanism, deployment, the SDK and the CLI; measurements live in docs/ and are linked."""
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 250
    headings = [line for line in text.splitlines() if line.startswith("## ")]
    for wanted in ("Quickstart", "Choosing a mechanism", "Deployment", "Client SDK", "The `fedlora` command"):
        assert any(wanted in h for h in headings), wanted
    assert "docs/RESULTS.md" in text
